"""Writes the machine refuses (a full disk, a file-size limit, a read-only folder), named.

The OS's own message ("File too large", "Permission denied" on a temporary file, torch's "unexpected
pos") names neither the file draftlab was writing nor what to do; `writing` turns any such failure into a
DraftlabError naming the path, the operation and the fix. Every writer it wraps writes under a temporary
name and renames, so the message can also say what the failure left untouched.
"""

from __future__ import annotations

import errno
import os
import re
import resource
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from draftlab import DraftlabError

FULL = {errno.ENOSPC, errno.EDQUOT}
TOO_LARGE = {errno.EFBIG}
NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}
# safetensors (Rust) words an OS error "... (os error 27)"; torch.save's zip writer words a short write
# "[enforce fail at inline_container.cc:...] unexpected pos" or "PytorchStreamWriter failed writing".
_RUST_ERRNO = re.compile(r"os error (\d+)")
_TORCH_WRITE = ("inline_container", "PytorchStreamWriter")
ELSEWHERE = "set DRAFTLAB_HOME to a checkout on another disk (data/ and outputs/ live under it)"


def failed_errno(exc: BaseException) -> int | None:
    """The OS error number behind a failed write, where the exception carries one."""
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    m = _RUST_ERRNO.search(str(exc))
    return int(m.group(1)) if m else None


def is_write_failure(exc: BaseException) -> bool:
    """An OSError, or a safetensors / torch.save error that is one underneath."""
    if isinstance(exc, OSError):
        return True
    if type(exc).__name__ == "SafetensorError":
        return failed_errno(exc) is not None
    return isinstance(exc, RuntimeError) and any(w in str(exc) for w in _TORCH_WRITE)


def _existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _machine(path: Path) -> str:
    """Free space on the disk holding `path` and the file-size limit: the two usual causes, as they are now."""
    try:
        free = f"{shutil.disk_usage(_existing(path)).free / 2**20:.0f} MiB free on that disk"
    except OSError:
        free = "free space unknown"
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    limit = "no file-size limit" if soft == resource.RLIM_INFINITY else f"file-size limit {soft} bytes (ulimit -f)"
    return f"{free}, {limit}"


def fix_for(err: int | None, folder: Path, elsewhere: str) -> str:
    """What to do about write failure `err` (an errno, or None when the writer did not say) in `folder`."""
    if err in FULL:
        return f"the disk is full: free space on it, or {elsewhere}"
    if err in TOO_LARGE:
        return "a file-size limit stopped it: raise the limit (`ulimit -f unlimited` in the shell that starts draftlab)"
    if err in NOT_WRITABLE:
        return f"{folder} is not writable: make it writable (chmod u+w), or {elsewhere}"
    return (
        f"free disk space, raise the file-size limit (`ulimit -f unlimited`) or make {folder} writable, or {elsewhere}"
    )


SPARE = 256 << 20  # left free beside what a step writes: manifests, logs, the rest of the machine


def room_for(folder: Path, need: int, what: str, fixes: str) -> None:
    """Refuse, before anything is written, `need` bytes the disk holding `folder` cannot take with `SPARE` beside
    them, saying what needs them, what is free and `fixes`: a disk that fills hours into a step stops it there."""
    where = _existing(folder)
    free = shutil.disk_usage(where).free
    if need + SPARE > free:
        raise DraftlabError(
            f"{what} need about {need / 2**30:.2f} GiB on disk and {where} has {free / 2**30:.2f} GiB free: {fixes}"
        )


@contextmanager
def writing(
    path, operation: str, kept: str = "nothing else was changed", elsewhere: str = ELSEWHERE, remove: Path | None = None
):
    """Run a write of `path`; a failure the machine caused becomes a DraftlabError naming `path`, `operation`
    (what was being written), the cause and fix, `kept` (what the failure left as it was) and `elsewhere`
    (the setting that puts the file on another disk or folder). `remove`: a temporary folder the write fills,
    deleted on any failure or interruption (its space back; it never looks like a result)."""
    try:
        yield
    except BaseException as e:
        if remove is not None:
            shutil.rmtree(remove, ignore_errors=True)
        if isinstance(e, DraftlabError) or not is_write_failure(e):
            raise
        path, err = Path(path), failed_errno(e)
        folder = path if path.is_dir() else path.parent
        raise DraftlabError(
            f"could not write {path} ({operation}): {str(e).splitlines()[0] if str(e) else type(e).__name__}; "
            f"{fix_for(err, folder, elsewhere)} ({_machine(path)}). No partial file was left in its place; "
            f"{kept}. Then run the same step again."
        ) from e


def writable_folder(folder: Path, what: str, elsewhere: str) -> None:
    """Refuse a folder that cannot be written (read-only, disk full) before work starts, naming it and the fix:
    papermill, say, would fail on its first save with the OS's words only."""
    import os
    import tempfile

    with writing(folder, what, elsewhere=elsewhere):
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as fh:
            fh.write(b"draftlab")
            fh.flush()
            os.fsync(fh.fileno())


def publish(final: Path, fill, operation: str, kept: str) -> Path:
    """`fill(tmp)` writes the folder under a temporary name, renamed to `final` once complete. A write the
    machine refuses (disk full, file-size limit, read-only folder) removes the temporary folder, giving its
    space back, and is named with its fix (`writing`); `final` as it was is untouched. A writer that wrote no
    folder there (transformers' `save_pretrained` only logs "should be a directory, not a file" and returns
    when something else sits at the temporary name) is a DraftlabError naming that path, never a result."""
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp)  # what an interrupted write of this folder left
    for path in (tmp, final):  # what sits there is not draftlab's: named, left as it is
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise DraftlabError(
                f"could not write {final} ({operation}): {path} is {'a link' if path.is_symlink() else 'a file'}, "
                f"not a folder draftlab writes, so nothing was written in its place. Move {path} away (or delete "
                f"it), then run the same step again; {kept}."
            )
    with writing(final, operation, kept, remove=tmp):
        final.parent.mkdir(parents=True, exist_ok=True)
        fill(tmp)
        if not tmp.is_dir() or tmp.is_symlink() or not any(tmp.iterdir()):
            raise DraftlabError(
                f"could not write {final} ({operation}): the writer left no files in {tmp}; {kept}. Then run the "
                "same step again."
            )
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    return final


def write_atomic(path: Path, data: str | bytes, what: str = "a file written all or nothing", **kept) -> None:
    """`data` at `path`, all or nothing: written under a name no other writer uses (two training
    processes verify one split at once), then renamed over `path`. A full disk, a file-size limit or a
    read-only folder is named with `what` (`writes.writing`, which `kept` is passed to)."""
    path = Path(path)
    with writing(path, what, **kept):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data.encode() if isinstance(data, str) else data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
