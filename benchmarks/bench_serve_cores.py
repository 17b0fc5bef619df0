"""vLLM CPU with one core reserved for its API server (vLLM's default) and with none (draftlab's on two cores),
side by side in one run: bf16 generation tokens/s through one server, and notebook 05's served section
(`served.measure`: the verifier alone and with each draft, started together) on the bench prompts.
    python benchmarks/bench_serve_cores.py --dataset smollm2-default --gen-prompts 96 --prompts 8 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from draftlab.acceptance import served, workload
from draftlab.acceptance.evaluate import load_spec_prompts
from draftlab.data.verifier import load_verifier
from draftlab.layout import RunLayout
from draftlab.serving.server import Server
from draftlab.training.launch import trained_draft

KEY = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def generation(v, rows: list[dict], max_tokens: int, log: Path) -> dict:
    with Server(v.path, None, dtype="bfloat16", log_path=log) as s:
        return {**workload.run(s, rows, max_tokens, 0), "startup_s": s.startup_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="smollm2-default")
    ap.add_argument("--run-name", default="default", help="whose drafts: data/runs/<dataset>/drafts/<run-name>/")
    ap.add_argument("--gen-prompts", type=int, default=96, help="train prompts answered at once for tokens/s")
    ap.add_argument("--gen-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=8, help="bench prompts for the served section")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--reserved", nargs="+", default=["1", "0"], help=f"values of {KEY} to compare")
    args = ap.parse_args()
    v = load_verifier("smollm2", device="cpu", dtype="float32")
    layout = RunLayout(args.dataset, args.run_name)
    lines = layout.prompts.read_text().splitlines()
    rows = [json.loads(line) for line in lines][: args.gen_prompts]  # prompt-set rows, sent as their chats
    prompts = load_spec_prompts(layout.prompts, v.tokenizer, "bench", args.prompts)
    drafts = {k: p for k in ("eagle3", "dflash") if (p := trained_draft(layout.draft(k))) is not None}
    logs = Path(tempfile.mkdtemp(prefix="bench-serve-cores-"))
    print(f"logs under {logs}; {len(rows)} prompts x {args.gen_tokens} tokens (bf16); {len(prompts)} bench prompts")
    print("| reserved cores | gen start-up s | gen tok/s | served section s | workloads s (alone, drafts) | vLLM tau |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in args.reserved:
        os.environ[KEY] = r  # server_env keeps a value set by the user
        g = generation(v, rows, args.gen_tokens, logs / f"gen-{r}.log")
        t0 = time.perf_counter()
        got = served.measure(v, drafts, prompts, 5, args.max_new_tokens, logs / f"served-{r}")
        total = time.perf_counter() - t0
        runs = got.get("runs", {})
        walls = " / ".join(f"{x['wall_s']:.1f}" for x in runs.values() if "wall_s" in x)
        taus = ", ".join(f"{k} {x['tau']:.3f}" for k, x in runs.items() if "tau" in x)
        print(f"| {r} | {g['startup_s']:.1f} | {g['tokens_per_s']:.1f} | {total:.1f} | {walls} | {taus} |", flush=True)


if __name__ == "__main__":
    main()
