"""Notebook 05's decoding on 1 and on 2 torch threads, one after the other in one process: the greedy
references and every proposer's speculative loop on the same bench prompts (wall seconds).
    python benchmarks/bench_decode_threads.py --dataset smollm2-default --prompts 8 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import time

import torch

from draftlab.acceptance.evaluate import hardware, load_spec_prompts, run_all, verifier_greedy
from draftlab.acceptance.proposers import NGramProposer, load_draft, make_proposer
from draftlab.data.verifier import load_verifier
from draftlab.layout import RunLayout
from draftlab.training.launch import trained_draft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="smollm2-default")
    ap.add_argument("--run-name", default="default", help="whose drafts: data/runs/<dataset>/drafts/<run-name>/")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    v = load_verifier("smollm2", device="cpu", dtype="float32")
    layout = RunLayout(args.dataset, args.run_name)
    prompts = load_spec_prompts(layout.prompts, v.tokenizer, "bench", args.prompts)
    proposers = {"ngram": NGramProposer(3)}
    for kind in ("eagle3", "dflash"):
        path = trained_draft(layout.draft(kind))
        if path is not None:
            proposers[kind] = make_proposer(load_draft(path, v), v.vocab_size)
    print(
        "| torch threads | greedy references (s) | "
        + " | ".join(f"{n} (s)" for n in proposers)
        + " |\n|"
        + " --- |" * (len(proposers) + 2)
    )
    for n in args.threads:
        torch.set_num_threads(n)
        t0 = time.perf_counter()
        for p in prompts:
            verifier_greedy(v, p["ids"], args.max_new_tokens)
        refs = time.perf_counter() - t0
        _, seconds = run_all(v, proposers, prompts, 5, args.max_new_tokens)
        print(f"| {n} | {refs:.1f} | " + " | ".join(f"{seconds[k]:.1f}" for k in proposers) + " |")
    print(
        hardware(v.device),
        f"{len(prompts)} bench prompts of {args.dataset}, {args.max_new_tokens} new tokens, chain k 5, greedy, fp32",
    )


if __name__ == "__main__":
    main()
