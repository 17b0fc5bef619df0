"""One training at a time in a run folder: two `draftlab run --only 04` under one run name would
both append to its metrics.jsonl and overwrite each other's checkpoints.

The lock is `flock` on `<run folder>/.lock`, which holds the holder's pid for the message. The
kernel drops it when its file closes, so it is released on every path, a killed process included;
the file itself stays (removing a lock file races with the next process opening it). A process
re-enters a lock it holds (`jobs.train_drafts` holds the folder of every draft it trains, then
`train.train` takes it again), and a training process started for a run (`jobs._in_processes`)
trains under its parent's lock.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from draftlab import DraftlabError

LOCK = ".lock"
_held: dict[Path, int] = {}  # run folder -> how many nested `run_lock`s of this process hold it


@contextmanager
def run_lock(run_dir: Path):
    """Hold `run_dir` for this process for the `with` block; refused at once, naming the holder, if
    another process holds it."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held or _parent_holds(run_dir):
        _held[run_dir] = _held.get(run_dir, 0) + 1
        try:
            yield
        finally:
            _held[run_dir] -= 1
            if not _held[run_dir]:
                del _held[run_dir]
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _take(fd, run_dir)
        _held[run_dir] = 1
        try:
            yield
        finally:
            del _held[run_dir]
    finally:
        os.close(fd)  # releases the flock


def _take(fd: int, run_dir: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise DraftlabError(
            f"{run_dir} is in use: another training (pid {holder(run_dir)}) holds {run_dir / LOCK}. Wait for it "
            "to finish, or train under another run name (draftlab run --run-name NAME)."
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())


def holder(run_dir: Path) -> int | None:
    """The pid the last holder of the lock wrote (None if it wrote none)."""
    text = (Path(run_dir) / LOCK).read_text().strip() if (Path(run_dir) / LOCK).exists() else ""
    return int(text) if text.isdigit() else None


def _parent_holds(run_dir: Path) -> bool:
    """The process that started this one holds the lock: it started this process to train that run."""
    if holder(run_dir) != os.getppid():
        return False
    fd = os.open(run_dir / LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True  # held, and by the parent
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)  # free: the parent wrote its pid, then let go
        return False
    finally:
        os.close(fd)
