"""Each dataset's EAGLE-3 draft on each dataset's eval split, teacher-forced first-position accuracy
(issue 17: a draft trained on bf16-written answers against one trained on fp32-written answers, both
read on the same held-out text; issue 31: a draft trained on ShareGPT's first turns against one trained on every
turn). A dataset may name its run as `dataset:run` (else --run-name).
    python benchmarks/cross_eval.py --datasets smollm2-default smollm2-default-bf16
    python benchmarks/cross_eval.py --datasets smollm2-gpu:gpu smollm2-gpu-all:gpu-all --rows 1024
"""

from __future__ import annotations

import argparse
import json

from draftlab.acceptance.evaluate import offline_alpha
from draftlab.acceptance.proposers import load_draft
from draftlab.data.verifier import load_verifier
from draftlab.layout import RunLayout
from draftlab.training.launch import trained_draft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", required=True)
    ap.add_argument("--rows", type=int, default=64, help="eval rows per split (all when fewer)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--run-name", default="default", help="whose drafts: data/runs/<dataset>/drafts/<run-name>/")
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    v = load_verifier("smollm2", device=args.device, dtype=args.dtype)
    layouts = {ds: RunLayout(*(ds.split(":", 1) if ":" in ds else (ds, args.run_name))) for ds in args.datasets}
    table = {}
    for trained, layout in layouts.items():
        d = load_draft(trained_draft(layout.draft("eagle3")), v)
        table[trained] = {
            ev: round(offline_alpha(d, on.split("eval"), 1, max_rows=args.rows)[0], 4) for ev, on in layouts.items()
        }
    print(
        "| EAGLE-3 trained on | "
        + " | ".join(f"{ev} eval" for ev in args.datasets)
        + " |\n|"
        + " --- |" * (len(args.datasets) + 1)
    )
    for trained, row in table.items():
        print(f"| {trained} | " + " | ".join(f"{row[ev]:.3f}" for ev in args.datasets) + " |")
    print(json.dumps(table))


if __name__ == "__main__":
    main()
