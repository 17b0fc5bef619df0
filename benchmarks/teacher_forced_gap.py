"""Held-out (teacher-forced) accuracy against live acceptance, taken apart: notebook 05's table for one trained
EAGLE-3 draft on one split's prompts, without the rest of the notebook (`acceptance.replay`).
    python benchmarks/teacher_forced_gap.py --dataset smollm2-default --run-name default --prompts 32
    python benchmarks/teacher_forced_gap.py --dataset smollm2-gpu --run-name gpu --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json

from draftlab.acceptance.evaluate import load_spec_prompts, offline_alpha, run_prompts
from draftlab.acceptance.proposers import load_run_drafts
from draftlab.acceptance.replay import gap_rows
from draftlab.data.verifier import load_verifier
from draftlab.layout import RunLayout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--run-name", default="default", help="whose draft: data/runs/<dataset>/drafts/<run-name>/")
    ap.add_argument("--split", default="bench", help="whose prompts the chain decodes")
    ap.add_argument("--prompts", type=int, default=32, help="0: every prompt of the split")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--eval-rows", type=int, default=64, help="stage 01 eval rows for speculators' metric (0: none)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    layout = RunLayout(args.dataset, args.run_name)
    v = load_verifier("smollm2", device=args.device, dtype=args.dtype)
    loaded = load_run_drafts(layout, v, kinds=("eagle3",))
    draft = loaded.drafts["eagle3"]
    prompts = load_spec_prompts(layout.prompts, v.tokenizer, args.split, args.prompts or None)
    gens = run_prompts(v, loaded.proposers["eagle3"], prompts, args.k, args.max_new_tokens, 0.0, 0)
    # 0 rows: no stage-01 eval states here (a draft trained elsewhere, brought back): that row is left out
    offline = offline_alpha(draft, layout.split("eval"), args.k, max_rows=args.eval_rows) if args.eval_rows else None
    rows = gap_rows(draft, gens, args.k, args.max_new_tokens, offline)
    where = f"{len(prompts)} {args.split} prompts, k {args.k}, {args.max_new_tokens} new tokens, {v.dtype}, {v.device}"
    print(f"EAGLE-3 of {layout.draft('eagle3')}, {where}")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + " --- |" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in keys) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
