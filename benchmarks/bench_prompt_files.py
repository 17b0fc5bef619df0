"""Peak memory and time of reading a user's prompt file of a million records (issue 49), in each format.

A million two-round ShareGPT-shape conversations (tests/prompt_files.py) are written once as JSON lines, a JSON
array, Parquet and a `datasets` folder; then each measurement runs in a fresh process (peak RSS from
`resource.getrusage`, less what draftlab's imports took): every record read and counted (`records.read_records`),
and `load_prompts` taking the first n conversations (the read stops there) or every one (the prompts kept are then
the memory).
    python benchmarks/bench_prompt_files.py --records 1000000 --dir /tmp/prompt-files
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import resource, sys, time
import datasets, pyarrow.parquet  # noqa: F401  (imported by the readers; counted with the imports)
from draftlab.data.prompts import load_prompts
from draftlab.data.records import read_records
path, what = sys.argv[1], sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # draftlab's imports (torch among them)
t = time.perf_counter()
if what == "count":
    n = sum(1 for _ in read_records(path))
else:
    entry = {"path": path} if what == "all" else {"path": path, "n": int(what)}
    n = len(load_prompts(0, 0, 0.2, 0, 0.15, 2000, files=[entry]))
print(n, round(time.perf_counter() - t, 1), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - base, base)
"""


def write_files(folder: Path, n: int) -> dict[str, Path]:
    import datasets

    sys.path.insert(0, str(ROOT / "tests"))
    from prompt_files import conversations, sharegpt

    folder.mkdir(parents=True, exist_ok=True)
    paths = {f: folder / f"million.{f}" for f in ("jsonl", "json", "parquet")} | {"saved": folder / "million"}
    if all(p.exists() for p in paths.values()):
        return paths
    recs = (sharegpt(c, i) for i, c in enumerate(conversations(n)))
    with paths["jsonl"].open("w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in recs)
    with paths["json"].open("w") as fh, paths["jsonl"].open() as src:
        fh.write("[\n" + ",\n".join(line.rstrip("\n") for line in src) + "\n]\n")
    ds = datasets.load_dataset("json", data_files=str(paths["jsonl"]), split="train", cache_dir=str(folder / "cache"))
    ds.to_parquet(str(paths["parquet"]))
    ds.save_to_disk(str(paths["saved"]))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/prompt-files"))
    ap.add_argument("--n", type=int, default=1000)
    args = ap.parse_args()
    paths = write_files(args.dir, args.records)
    print(
        "| file | size MiB | measurement | records or prompts | seconds | peak RSS above the imports, MiB | imports |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for fmt, path in paths.items():
        size = sum(f.stat().st_size for f in ([path] if path.is_file() else path.rglob("*"))) / 2**20
        for what in ("count", str(args.n), *(("all",) if fmt == "jsonl" else ())):
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), what], capture_output=True, text=True)
            n, sec, rss, base = (out.stdout.split() or ["error", out.stderr[-300:], "", ""])[:4]
            label = {"count": "every record read", "all": "load_prompts, every conversation"}.get(
                what, f"load_prompts n={what}"
            )
            print(f"| {fmt} | {size:.0f} | {label} | {n} | {sec} | {rss} | {base} |", flush=True)


if __name__ == "__main__":
    main()
