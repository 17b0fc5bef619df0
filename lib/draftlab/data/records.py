"""The records of a user's prompt file, read streaming: JSON lines, a JSON array, Parquet, a `datasets` folder
written by `save_to_disk`, or a folder of such files.

Each reader yields `(where, record)` in file order, `where` naming the record (a line number, an array index, a
row), and a `NotJSON` in place of a record that cannot be decoded, so that the caller counts it instead of the
whole file failing. `datasets.load_dataset("json")` stops a whole file at the first line that is not JSON, so
JSON lines are decoded here line by line; Parquet goes through pyarrow's batches and a `save_to_disk` folder
through `datasets.load_from_disk` (memory-mapped), both a batch at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from draftlab import DraftlabError

FORMATS = (".jsonl", ".json", ".parquet")  # and a folder: `save_to_disk`'s, or one of these files
CHUNK = 1 << 20  # characters read at a time from a JSON array
BATCH = 1024  # rows read at a time from Parquet and Arrow
_BETWEEN_RECORDS = re.compile(r"[\s,]*")


class NotJSON(NamedTuple):
    """A record that could not be decoded, and why (counted by the caller as `not JSON`)."""

    why: str


def is_saved_dataset(folder: Path) -> bool:
    """A folder `Dataset.save_to_disk` (or `DatasetDict.save_to_disk`) wrote."""
    return any((folder / f).exists() for f in ("state.json", "dataset_dict.json"))


def data_files(path: Path) -> list[Path]:
    """The files a path names: itself, or a folder's files of the formats read here, in sorted order."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in FORMATS)


def read_records(path: Path, split: str | None = None) -> Iterator[tuple[str, object]]:
    """Every record of a file or folder, streaming, in order; a folder's files one after the other."""
    path = Path(path)
    if path.is_dir() and is_saved_dataset(path):
        yield from _saved_dataset(path, split)
        return
    for f in data_files(path):
        tag = f"{f.relative_to(path)}:" if f != path else ""
        for where, rec in _file_records(f):
            yield f"{tag}{where}", rec


def _file_records(f: Path) -> Iterator[tuple[str, object]]:
    if f.suffix == ".parquet":
        return _parquet(f)
    with f.open(encoding="utf-8", errors="surrogateescape") as fh:
        head = fh.read(4096).lstrip()
    return json_array(f) if head.startswith("[") else _json_lines(f)


def _json_lines(f: Path) -> Iterator[tuple[str, object]]:
    """One record a line; a line that is not JSON is yielded as `NotJSON`. Bytes that are not UTF-8 are kept as
    lone surrogates, for the caller to count the record as not text."""
    with f.open(encoding="utf-8", errors="surrogateescape") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield f"line {n}", json.loads(line)
            except json.JSONDecodeError as e:
                yield f"line {n}", NotJSON(f"line {n}: {e.msg}")


def json_array(f: Path) -> Iterator[tuple[str, object]]:
    """The records of a JSON array, decoded one by one from chunks of the file: a record cut at the end (the
    bundled ShareGPT file is) or a broken one is yielded as `NotJSON`, and the array cannot be read past it."""
    dec = json.JSONDecoder()
    with f.open(encoding="utf-8", errors="surrogateescape") as fh:
        buf, done = fh.read(CHUNK), False
        pos, i = buf.find("[") + 1, 0
        if pos == 0:
            raise DraftlabError(f"{f} is not a JSON array of records.")
        while True:
            pos = _BETWEEN_RECORDS.match(buf, pos).end()
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                rec, end = dec.raw_decode(buf, pos) if pos < len(buf) else (None, -1)
                more = end == -1 or (end == len(buf) and not done)  # a number at the chunk's end may go on
            except json.JSONDecodeError as e:
                more = not done and (e.pos >= len(buf) - 1 or e.msg.startswith("Unterminated"))
                if not more:
                    yield f"record {i}", NotJSON(f"record {i} (character {e.pos}): {e.msg}")
                    return
            if more:
                if done:
                    if pos < len(buf):
                        yield f"record {i}", NotJSON(f"record {i}: cut at the end of the file")
                    return
                chunk = fh.read(max(CHUNK, len(buf) - pos))
                buf, pos, done = buf[pos:] + chunk, 0, not chunk
                continue
            yield f"record {i}", rec
            pos, i = end, i + 1


def _parquet(f: Path) -> Iterator[tuple[str, object]]:
    """pyarrow's batches: `datasets`' streaming Parquet reader holds a whole row group (half a gigabyte for a
    million conversations written by `Dataset.to_parquet`), pyarrow a batch (BENCHMARKS)."""
    import pyarrow.parquet as pq

    n = 0
    for batch in pq.ParquetFile(f).iter_batches(batch_size=BATCH):
        for rec in batch.to_pylist():
            yield f"row {n}", rec
            n += 1


def _saved_dataset(folder: Path, split: str | None) -> Iterator[tuple[str, object]]:
    import datasets

    ds = datasets.load_from_disk(str(folder))
    if isinstance(ds, datasets.DatasetDict):
        pick = split or ("train" if "train" in ds else None)
        if pick not in ds:
            raise DraftlabError(
                f"prompts: {folder} is a DatasetDict with splits {list(ds)}; name one with `split:` in its entry, "
                f"e.g. {{path: {folder}, split: {next(iter(ds), 'train')}}}."
            )
        ds = ds[pick]
    n = 0
    for batch in ds.iter(batch_size=BATCH):
        keys = list(batch)
        for values in zip(*(batch[k] for k in keys), strict=True):
            yield f"row {n}", dict(zip(keys, values, strict=True))
            n += 1
