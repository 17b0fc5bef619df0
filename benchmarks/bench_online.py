"""Training tokens/s with hidden states from stage 01's files (offline) against states vLLM makes as packs are
read (online, `training.online`), the same draft, data, seed and steps, one after the other in one process; and
the disk each keeps (BENCHMARKS.md, "Online hidden states").

    python benchmarks/bench_online.py --dataset smollm2-ci --steps 40 --pack-len 512
    python benchmarks/bench_online.py --dataset smollm2-ci --loader-workers 4   # online: 4 processes ask vLLM at once

The median step excludes the first `--skip` steps (the loader's first pack; online, the server's first requests).
Run folders go under /tmp, so the notebooks' own runs are untouched.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def du(path: Path) -> int:
    """Bytes under `path` (0 where it is absent)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) if Path(path).exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="smollm2-ci", help="data/runs/<dataset> written by notebook 01")
    ap.add_argument("--kind", default="eagle3", choices=["eagle3", "dflash"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=5)
    ap.add_argument("--pack-len", type=int, default=512)
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument(
        "--loader-workers", type=int, default=None, help="processes reading packs ahead (default: what draftlab picks)"
    )
    args = ap.parse_args()

    import torch
    from loguru import logger

    from draftlab.data.verifier import load_verifier
    from draftlab.drafts import draft
    from draftlab.layout import RunLayout
    from draftlab.training import train

    logger.remove()
    data = RunLayout(args.dataset, "bench").data
    v = load_verifier("smollm2")
    cfg = json.loads((data / "config.json").read_text())["config"]  # stage 01's resolved settings
    results = {}
    for mode in ("offline", "online"):
        torch.manual_seed(0)
        d = draft.build_draft(args.kind, v, data / "train", draft_vocab_size=cfg.get("draft_vocab_size"))
        s = train.Settings(
            train_steps=args.steps, pack_len=args.pack_len, eval_every=args.steps, checkpoint_every=args.steps,
            eval_packs=1, hidden_states=mode, loader_workers=args.loader_workers,
        )  # fmt: skip
        run = Path(tempfile.mkdtemp(prefix=f"bench-online-{mode}-"))
        t0 = time.perf_counter()
        train.train(d, data, s, run_dir=run)
        wall = time.perf_counter() - t0
        recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in recs if r["split"] == "train"][args.skip :]
        log = run / "vllm-online.log"
        results[mode] = {
            "median tokens/s": statistics.median(r["tokens_per_s"] for r in steps),
            "median step s": statistics.median(r["seconds"] for r in steps),
            "wall s (start included)": round(wall, 1),
            "hidden states on disk (bytes)": du(data / "train" / "hidden_states") + du(data / "eval" / "hidden_states")
            if mode == "offline"
            else 0,
            "final loss": steps[-1]["loss"],
            "server log": str(log) if log.exists() else None,
        }
        subprocess.run(["rm", "-rf", str(run)], check=False)
    off, on = results["offline"], results["online"]
    ratio = on["median step s"] / off["median step s"]
    print("| mode | median step (s) | median tokens/s | wall (s) | states on disk | final loss |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode, r in results.items():
        print(
            f"| {mode} | {r['median step s']:.3f} | {r['median tokens/s']:,.0f} | {r['wall s (start included)']} | "
            f"{r['hidden states on disk (bytes)'] / 2**20:.1f} MiB | {r['final loss']:.4f} |"
        )
    print(f"online / offline time per step: {ratio:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "online/offline step": ratio}, indent=1))


if __name__ == "__main__":
    main()
