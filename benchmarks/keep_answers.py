"""`gpu_pipeline.sh keep`'s answers: a device call's `answers-<dataset>.tar.xz` (or its parts) joined with the
archive of that dataset already in `.answers/`, so that fewer answers never replace more.

A lease's notebook 01 resumes what `stage` carried and appends to it, so what comes back normally holds all that was
carried. A lease that started without `.answers`, or ran another recipe under the same dataset name, brings back
fewer, and a rule of the newest replacing the older loses the rest: by 2026-12-07 `.answers` held the one-lease
recipe's 15,347 answers under `smollm2-gpu`, and the `gpu` profile's 37,337 (brought back 2026-12-04) were gone. So each
`responses*.jsonl` becomes the union by prompt id of the two (the newest line of an id wins), taking from the older
archive only lines written with the newest lines' settings (01 refuses a file that mixes settings); `prompts.jsonl`
is the newest's (01 writes it again anyway).

    python benchmarks/keep_answers.py .answers answers-smollm2-gpu.tar.xz.part-aa answers-smollm2-gpu.tar.xz.part-ab
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

PART = 15_000_000  # bytes a part (a file a device call brings back is at most 16 MiB)


def read_archive(parts: list[Path]) -> dict[str, bytes]:
    """The files of an answers archive (its parts concatenated, in name order): member name -> bytes."""
    data = b"".join(p.read_bytes() for p in sorted(parts))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def records(data: bytes) -> list[tuple[dict, bytes]]:
    """(record, its line) for each whole line; a line an interruption cut is left out (01 answers it again)."""
    out = []
    for line in data.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "id" in rec:
            out.append((rec, line))
    return out


def union(older: bytes, newest: bytes) -> tuple[bytes, int]:
    """The newest file's lines, then the older file's lines of other prompt ids written with the same settings; with
    how many lines came from the older file."""
    new = records(newest)
    if not new:
        return older, len(records(older))
    ids, settings = {rec["id"] for rec, _ in new}, new[0][0].get("settings")
    extra = [line for rec, line in records(older) if rec["id"] not in ids and rec.get("settings") == settings]
    return b"".join(line + b"\n" for line in [*(line for _, line in new), *extra]), len(extra)


def keep(folder: Path, came: list[Path]) -> str:
    """Write the dataset's archive in `folder` from the call's parts `came` joined with the one already there."""
    name = came[0].name.split(".tar.xz")[0]
    before = sorted(folder.glob(f"{name}.tar.xz*"))
    newest = read_archive(came)
    files, added = dict(newest), 0
    try:
        older = read_archive(before) if before else {}
    except (tarfile.TarError, EOFError, OSError) as e:  # an archive cut or unreadable: the newest stands alone
        print(f"{folder / name}: the archive kept before is unreadable ({e}); the newest replaces it", file=sys.stderr)
        older = {}
    for member, data in older.items():
        if Path(member).name.startswith("responses"):
            files[member], n = union(data, newest.get(member, b""))
            added += n
        else:
            files.setdefault(member, data)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=3) as tar:
        for member, data in sorted(files.items()):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for old in before:
        old.unlink()
    blob = buf.getvalue()
    if len(blob) <= PART:
        (folder / f"{name}.tar.xz").write_bytes(blob)
    else:
        for i in range(0, len(blob), PART):
            n = i // PART
            (folder / f"{name}.tar.xz.part-{chr(97 + n // 26)}{chr(97 + n % 26)}").write_bytes(blob[i : i + PART])
    answers = sum(len(records(d)) for m, d in files.items() if Path(m).name.startswith("responses"))
    return f"kept {folder / name}: {answers} answers ({added} of them kept from before, which this call lacked)"


if __name__ == "__main__":
    print(keep(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]))
