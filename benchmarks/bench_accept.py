"""Online tau (tokens per verifier pass) on held-out prompts: the BENCHMARKS.md acceptance target.

Greedy, chain of k, the stage-01 eval split of one dataset; every proposer available: the n-gram
baseline always, EAGLE-3 / DFlash when stage 04 saved `data/runs/<dataset>/drafts/<kind>/final/`.
    python benchmarks/bench_accept.py --dataset smollm2-default --prompts 32 --k 5
    python benchmarks/bench_accept.py --dataset smollm2-gpu --device cuda --dtype bfloat16 --prompts 0
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from draftlab import config
from draftlab.accept_eval import hardware, load_spec_prompts, run_prompts, summarize
from draftlab.proposers import NGramProposer, load_draft, make_proposer
from draftlab.verifier import load_verifier


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="smollm2-default")
    ap.add_argument("--prompts", type=int, default=32, help="prompts of the split; 0 for all")
    ap.add_argument("--split", default="bench", help="bench (what numbers are quoted on) or eval (tuned on)")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    v = load_verifier("smollm2", device=args.device, dtype=args.dtype)
    if v.device.type == "cpu":
        torch.set_num_threads(1)  # latency-bound decode on a shared CPU; see notebook 05
    run_dir = config.data_dir() / "runs" / args.dataset
    prompts = load_spec_prompts(run_dir, v.tokenizer, args.split, args.prompts or None)
    proposers = {"ngram": NGramProposer(3)}
    for kind in ("eagle3", "dflash"):
        path = run_dir / "drafts" / kind / "final"
        if (path / "config.json").exists():
            proposers[kind] = make_proposer(load_draft(path, v), v.vocab_size)
    out = {"dataset": args.dataset, "split": args.split, "prompts": len(prompts), "k": args.k, "topology": "chain", "temperature": 0.0,
           "max_new_tokens": args.max_new_tokens, "hardware": hardware(v.device), "results": {}}
    for name, prop in proposers.items():
        t0 = time.perf_counter()
        s = summarize(run_prompts(v, prop, prompts, args.k, args.max_new_tokens), args.k)
        out["results"][name] = {src: {"tau": round(m["tau"], 3), "acceptance_rate": round(m["acceptance_rate"], 3)} for src, m in s.items()}
        out["results"][name]["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
