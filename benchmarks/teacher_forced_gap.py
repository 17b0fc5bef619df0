"""Held-out (teacher-forced) accuracy against live acceptance, taken apart: notebook 05's table for one trained
EAGLE-3 draft on one split's prompts, without the rest of the notebook (`acceptance.replay`).
    python benchmarks/teacher_forced_gap.py --dataset smollm2-default --run-name default --prompts 32
    python benchmarks/teacher_forced_gap.py --dataset smollm2-gpu --run-name gpu --device cuda --dtype bfloat16
Two drafts' tables side by side, and which part of the gap closed (`replay.gap_parts`): each file this script's
--json or a notebook 05 metrics.json (metrics.partial.json of a run cut before its end); --held-out OLD NEW stands
in for a table without the held-out row (04's figure):
    python benchmarks/teacher_forced_gap.py compare OLD.json NEW/05/metrics.json --held-out 0.782 0.794
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftlab.acceptance.evaluate import load_spec_prompts, offline_alpha, run_prompts
from draftlab.acceptance.proposers import load_run_drafts
from draftlab.acceptance.replay import HELD_OUT, LIVE, LIVE_TEXT, REPLAYED, WHOLE_VOCAB, gap_parts, gap_rows
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


def rows_of(path: str) -> list[dict]:
    """The gap's rows: this script's --json, or notebook 05's metrics.json or metrics.partial.json (its EAGLE-3's)."""
    got = json.loads(Path(path).read_text())
    return got["rows"] if "rows" in got else got["teacher_forced_gap"]["eagle3"]


def compare(argv: list[str]) -> str:
    """`compare OLD NEW [--held-out A B]`: the first-position acceptance of each way of counting for two drafts, then
    the gap by part (`gap_parts`) and how much of each part the second closed."""
    ap = argparse.ArgumentParser(prog="teacher_forced_gap.py compare")
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--held-out", type=float, nargs=2, default=(None, None), help="04's held-out figure of each")
    args = ap.parse_args(argv)
    old, new = rows_of(args.old), rows_of(args.new)
    tau = next(k for k in old[0] if k.startswith("tau at k"))
    by = [{r["counted"]: r for r in rows} for rows in (old, new)]
    order = (HELD_OUT, LIVE_TEXT, WHOLE_VOCAB, REPLAYED, LIVE)  # a row either table lacks reads "-"
    labels = sorted({*by[0], *by[1]}, key=lambda c: next((i for i, o in enumerate(order) if o in c), len(order)))
    lines = [f"| counted | first position, old | new | {tau}, old | new |", "| --- | --- | --- | --- | --- |"]
    for c in labels:
        cells = [str(b.get(c, {}).get(key, "-")) for key in ("first position", tau) for b in by]
        lines.append("| " + " | ".join([c, *cells]) + " |")
    parts = [gap_parts(rows, held) for rows, held in zip((old, new), args.held_out, strict=True)]
    lines += ["", "| part of the gap (first position) | old | new | closed |", "| --- | --- | --- | --- |"]
    for name in parts[0]:
        a, b = parts[0][name], parts[1][name]
        cells = ["-" if v is None else f"{v:+.4f}" for v in (a, b, None if a is None or b is None else b - a)]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["compare"]:
        print(compare(sys.argv[2:]))
    else:
        main()
