"""Time the one-off GGUF -> safetensors conversion of the embedded verifier, with and without
parsing the file once (transformers' own path re-reads it for config, weights and tokenizer).

Each conversion runs in a fresh process (imports and caches as on a fresh machine; the order of the
two paths alternates), into a temporary folder; the two results must hold the same tensors and
tokenizer files.
    python benchmarks/bench_convert.py --repeats 3
"""

from __future__ import annotations

import argparse
import filecmp
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

CHILD = (
    "import sys, time; from draftlab.data.embedded import convert_embedded; t = time.perf_counter(); "
    "convert_embedded(sys.argv[1], parse_once=sys.argv[2] == '1'); print('SECONDS', time.perf_counter() - t)"
)


def convert(dest: Path, parse_once: bool) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(dest), str(int(parse_once))], capture_output=True, text=True, check=True
    ).stdout
    return float(out.split("SECONDS")[-1])


def same(a: Path, b: Path) -> bool:
    ta, tb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    tensors = ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    files = sorted(p.name for p in a.iterdir())
    return (
        tensors
        and files == sorted(p.name for p in b.iterdir())
        and all(filecmp.cmp(a / f, b / f, shallow=False) for f in files if f != "model.safetensors")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for parse_once in (False, True) if r % 2 == 0 else (True, False):
                dest = Path(tmp) / f"{r}-{int(parse_once)}"
                times[parse_once].append(convert(dest, parse_once))
                print(f"repeat {r}: parse_once={parse_once} {times[parse_once][-1]:.1f} s", flush=True)
        identical = all(same(Path(tmp) / f"{r}-0", Path(tmp) / f"{r}-1") for r in range(args.repeats))
    old, new = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"\n{platform.node()} {time.strftime('%Y-%m-%d')} {torch.get_num_threads()} threads, "
        f"{args.repeats} repeats, fresh process each\n"
    )
    print("| conversion | median (s) | runs (s) |\n| --- | --- | --- |")
    for name, key in (("transformers' path", False), ("parsed once (draftlab)", True)):
        print(f"| {name} | {statistics.median(times[key]):.1f} | {', '.join(f'{t:.1f}' for t in times[key])} |")
    print(f"\nspeed-up {old / new:.2f}x; same tensors and tokenizer files: {identical}")
    if not identical:
        sys.exit("the two conversions differ")


if __name__ == "__main__":
    main()
