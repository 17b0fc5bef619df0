"""Online tau (tokens per verifier pass) on held-out prompts: the BENCHMARKS.md acceptance target.

Greedy, chain of k, the stage-01 eval split of one dataset; every proposer available: the n-gram
baseline always, EAGLE-3 / DFlash when stage 04 saved `RunLayout(dataset, run_name).final(kind)` (or
speculators under torchrun saved `.../<kind>/speculators/`; the newer of the two, `launch.trained_draft`).
    python benchmarks/bench_accept.py --dataset smollm2-default --prompts 32 --k 5
    python benchmarks/bench_accept.py --dataset smollm2-gpu --run-name gpu --device cuda --dtype bfloat16 --prompts 0
Two datasets' drafts on one prompt set (issue 16's before / after ShareGPT): `--prompts-from` names the
dataset whose split is measured, so both drafts meet the same prompts.
    python benchmarks/bench_accept.py --dataset smollm2-gpu-nosharegpt --run-name gpu-nosharegpt \
        --prompts-from smollm2-gpu --kinds eagle3
Any other checkpoint by name (issue 21: a speculators `--save-path` is taken as it is, its checkpoint found):
    python benchmarks/bench_accept.py --dataset smollm2-gpu --kinds ngram \
        --draft eagle3-speculators=data/runs/smollm2-gpu/drafts/gpu/eagle3/speculators
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from draftlab.acceptance.evaluate import hardware, load_spec_prompts, run_prompts, summarize
from draftlab.acceptance.proposers import load_run_drafts
from draftlab.data.verifier import load_verifier
from draftlab.layout import RunLayout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="smollm2-default")
    ap.add_argument("--run-name", default="default", help="whose drafts: data/runs/<dataset>/drafts/<run-name>/")
    ap.add_argument("--prompts", type=int, default=32, help="prompts of the split; 0 for all")
    ap.add_argument(
        "--prompts-from", default=None, help="dataset whose prompts.jsonl gives the prompts (default: --dataset)"
    )
    ap.add_argument("--kinds", default="ngram,eagle3,dflash", help="proposers to measure, comma-separated")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--split", default="bench", help="bench (what numbers are quoted on) or eval (tuned on)")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument(
        "--draft",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also measure this checkpoint (final/, an epoch folder, or a speculators --save-path)",
    )
    args = ap.parse_args()
    v = load_verifier("smollm2", device=args.device, dtype=args.dtype)
    layout = RunLayout(args.dataset, args.run_name)
    prompt_set = RunLayout(args.prompts_from or args.dataset, args.run_name).prompts
    prompts = load_spec_prompts(prompt_set, v.tokenizer, args.split, args.prompts or None)
    loaded = load_run_drafts(layout, v, args.kinds.split(","), dict(d.split("=", 1) for d in args.draft))
    proposers, drafts = loaded.proposers, loaded.drafts
    out = {
        "dataset": args.dataset,
        "prompts_from": args.prompts_from or args.dataset,
        "split": args.split,
        "prompts": len(prompts),
        "k": args.k,
        "topology": "chain",
        "temperature": 0.0,
        "max_new_tokens": args.max_new_tokens,
        "hardware": hardware(v.device),
        "drafts": {name: d.choices["checkpoint"][0] for name, d in drafts.items()},
        "results": {},
    }
    for name, prop in proposers.items():
        t0 = time.perf_counter()
        s = summarize(run_prompts(v, prop, prompts, args.k, args.max_new_tokens), args.k)
        out["results"][name] = {
            src: {
                "tau": round(m["tau"], 3),
                "acceptance_rate": round(m["acceptance_rate"], 3),
                "alpha_n": [None if a is None else round(a, 3) for a in m["alpha_n"]],
            }
            for src, m in s.items()
        }
        out["results"][name]["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
