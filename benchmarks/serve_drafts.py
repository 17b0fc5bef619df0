"""vLLM's acceptance for trained drafts on a dataset's bench prompts: notebook 05's served section alone.

For checkpoints trained elsewhere and brought back (a lease's `final/` folders, placed where `RunLayout` looks:
data/runs/<dataset>/drafts/<run>/<kind>/final), served by this machine's vLLM on the same bench prompts notebook 05
draws (`load_spec_prompts`, the first N), one request in flight so every request's counts are its own, with 95%
bootstrap intervals over prompts (`intervals.estimate`). `--loop` puts beside it the draftlab-loop figure that
notebook 05's metrics.json holds for the same checkpoint and prompts (its ids are checked to be the same).
    python benchmarks/serve_drafts.py --dataset smollm2-gpu --drafts eagle3=gpu dflash=gpu-dflash --prompts 32 \
      --max-new-tokens 96 --dtype bfloat16 --loop eagle3=<05/metrics.json> --out served.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from draftlab import DraftlabError
from draftlab.acceptance import served, workload
from draftlab.acceptance.evaluate import load_spec_prompts
from draftlab.acceptance.intervals import POOLED, estimate
from draftlab.acceptance.reported import ci
from draftlab.data.verifier import load_verifier
from draftlab.layout import RunLayout
from draftlab.training.launch import trained_draft


def pairs(items: list[str], what: str) -> dict[str, str]:
    bad = [x for x in items if "=" not in x]
    if bad:
        raise DraftlabError(f"{what}: {bad} are not kind=value (e.g. eagle3=gpu)")
    return dict(x.split("=", 1) for x in items)


def loop_figures(loops: dict[str, str], prompts: list[dict]) -> dict[str, dict]:
    """Each kind's loop tau from notebook 05's metrics.json, refused where it was measured on other prompts."""
    out = {}
    for kind, path in loops.items():
        m = json.loads(Path(path).read_text())
        ids = m["settings"]["prompt_ids"]
        if ids != [p["id"] for p in prompts]:
            raise DraftlabError(f"{path} measured {len(ids)} other prompts: pass --prompts {len(ids)} (same dataset)")
        out[kind] = {"tau": m["intervals"][kind]["tau"][POOLED], "hardware": m["settings"]["hardware"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="smollm2-gpu")
    ap.add_argument("--verifier", default="smollm2", help="the dataset's verifier: smollm2 or a local HF directory")
    ap.add_argument("--drafts", nargs="+", default=["eagle3=gpu"], help="kind=run: data/runs/<dataset>/drafts/<run>/")
    ap.add_argument("--prompts", type=int, default=32, help="the first N bench prompts, as notebook 05 draws them")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--dtype", default="bfloat16", help="the verifier's, as vLLM serves it")
    ap.add_argument("--ngram", type=int, default=3, help="vLLM's n-gram beside the drafts (0: none)")
    ap.add_argument("--loop", nargs="*", default=[], help="kind=<notebook 05's metrics.json> for the same drafts")
    ap.add_argument("--out", type=Path, help="write every figure here as JSON")
    args = ap.parse_args()
    v = load_verifier(args.verifier, device="cpu", dtype=args.dtype)
    prompts = load_spec_prompts(RunLayout(args.dataset, "bench").prompts, v.tokenizer, "bench", args.prompts)
    drafts = {}
    for kind, run in pairs(args.drafts, "--drafts").items():
        where = RunLayout(args.dataset, run).draft(kind)
        drafts[kind] = trained_draft(where)
        if drafts[kind] is None:
            raise DraftlabError(f"no trained {kind} under {where}: put its final/ there")
    loops = loop_figures(pairs(args.loop, "--loop"), prompts)
    logs = Path(tempfile.mkdtemp(prefix="serve-drafts-"))
    print(f"{len(prompts)} bench prompts of {args.dataset}, k {args.k}, {args.max_new_tokens} new tokens; logs {logs}")
    got = served.measure(v, drafts, prompts, args.k, args.max_new_tokens, logs, (1,), ngram=args.ngram or None)
    if not got.get("available"):
        raise DraftlabError(f"vLLM did not serve: {got.get('reason')}")
    alone = got["runs"]["verifier alone"]
    rows = {}
    cols = ["proposer", "vLLM tau (95%)", "draftlab loop tau (95%), where measured", "drafted", "accepted", "steps"]
    print("| " + " | ".join([*cols, "tokens/s", "speed-up"]) + " |\n|" + " --- |" * (len(cols) + 2))
    for kind, run in got["runs"].items():
        if kind == "verifier alone" or "error" in run:
            print(f"| {kind} | {run.get('error', '-')} | | | | | {run.get('tokens_per_s', 0):.1f} | |")
            continue
        table, _ = workload.step_table(run)
        est = estimate(table, args.k)
        loop = loops.get(kind)
        rows[kind] = {"vllm": est, "loop": loop, "tokens_per_s": run["tokens_per_s"], "counts": run["counts"]}
        c = run["counts"]
        print(
            f"| {kind} | {ci(est['tau'][POOLED])} | {ci(loop['tau']) + ' (' + loop['hardware'] + ')' if loop else '-'} "
            f"| {c['draft_tokens']:.0f} | {c['accepted']:.0f} | {c['drafts']:.0f} | {run['tokens_per_s']:.1f} "
            f"| {run['tokens_per_s'] / alone['tokens_per_s']:.3f}x |"
        )
    if args.out:
        keep = {"dataset": args.dataset, "prompt_ids": [p["id"] for p in prompts], "k": args.k, "dtype": args.dtype}
        args.out.write_text(json.dumps({**keep, "verifier_tokens_per_s": alone["tokens_per_s"], "drafts": rows}))


if __name__ == "__main__":
    main()
