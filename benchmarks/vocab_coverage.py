"""Issue 51's vocabulary lever before any device time: the share of a dataset's supervised tokens that draft
vocabularies of several sizes can emit, on its train split (what they are chosen from) and held out on eval, through
speculators' mapping (`arms.vocab_coverage`). A token outside the draft vocabulary is never proposed, so the eval
share bounds every drafted position's acceptance: what a larger vocabulary can buy at most. `sweep_levers.py` prints
the same line for its base dataset after stage 01.
    python benchmarks/vocab_coverage.py --dataset smollm2-default --sizes 2048 16384
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftlab.layout import RunLayout
from draftlab.training.arms import coverage_line, vocab_coverage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True)
    ap.add_argument(
        "--sizes", type=int, nargs="*", default=[], help="beside its own, twice it and the whole vocabulary"
    )
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    rows = vocab_coverage(RunLayout(args.dataset, "_"), args.sizes)
    print(f"{args.dataset}: {coverage_line(rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
