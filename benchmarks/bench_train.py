"""Held-out first-position accuracy against training cost, on existing stage-01 data.

Trains one EAGLE-3 (or DFlash) draft per setting, side by side in one process on the same data,
and prints a markdown row per setting (BENCHMARKS.md, "Draft training quality"). Run folders go
under /tmp so the notebook's own runs are untouched.

    python benchmarks/bench_train.py --dataset smollm2-default --steps 300 --pack-len 512 --lr 3e-3 --ttt 1 2 3
    python benchmarks/bench_train.py --dataset smollm2-default --ttt 1 --draft-vocab-size 2048 4096 8192 --weight-decay 0.01 0.1

A draft vocabulary without its d2t/t2d files is mapped from the stage-01 token counts for the run
and its files removed after, so the data folder is left as notebook 01 wrote it.
"""  # noqa: E501

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="smollm2-default", help="data/runs/<dataset> written by notebook 01")
    ap.add_argument("--kind", default="eagle3", choices=["eagle3", "dflash"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--pack-len", type=int, default=512)
    ap.add_argument("--lr", type=float, nargs="+", default=[3e-3])
    ap.add_argument("--ttt", type=int, nargs="+", default=[3], help="EAGLE-3 TTT steps to compare")
    ap.add_argument("--draft-vocab-size", type=int, nargs="+", default=[4096])
    ap.add_argument("--weight-decay", type=float, nargs="+", default=[0.01])
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument(
        "--loader-workers", type=int, nargs="+", default=[-1], help="processes reading packs ahead; -1: draftlab picks"
    )
    ap.add_argument(
        "--compile-times",
        action="store_true",
        help="print torch.compile's time per phase after each setting (CUDA); "
        "with TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 each setting compiles from scratch",
    )
    args = ap.parse_args()

    from loguru import logger

    from draftlab.data import vocab
    from draftlab.data.verifier import load_verifier
    from draftlab.drafts import draft
    from draftlab.layout import RunLayout
    from draftlab.training import train

    logger.remove()
    data = RunLayout(args.dataset, "bench").data  # each measured run trains in a temporary folder
    v = load_verifier("smollm2")
    print(
        f"| {args.kind} | TTT steps | lr | draft vocab | weight decay | loader "
        "workers | steps x pack | wall (s) | first step (s) | train tokens/s (median) "
        "| eval s (first / median) | held-out first-position accuracy (per eval) | per position (last eval) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ttts = args.ttt if args.kind == "eagle3" else [0]
    for lr, ttt, dv, wd, lw in itertools.product(
        args.lr, ttts, args.draft_vocab_size, args.weight_decay, args.loader_workers
    ):
        files = [data / "train" / f"{m}-{dv}.npy" for m in ("d2t", "t2d")]
        made = [] if files[0].exists() else files
        if made:
            vocab.build_mapping(
                torch.load(data / "train" / "token_freq.pt", weights_only=True), dv, v.vocab_size, data / "train"
            )
        try:
            torch.manual_seed(0)
            d = draft.build_draft(args.kind, v, data / "train", draft_vocab_size=dv)
        finally:
            for f in made:
                f.unlink()
        s = train.Settings(
            train_steps=args.steps,
            learning_rate=lr,
            warmup_steps=20,
            pack_len=args.pack_len,
            ttt_steps=max(ttt, 1),
            eval_every=args.eval_every,
            checkpoint_every=10**9,
            weight_decay=wd,
            loader_workers=None if lw < 0 else lw,
        )
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            run = train.train(d, data, s, run_dir=Path(tmp), progress=False)
            wall = time.perf_counter() - t0
            records = train.read_metrics(run)
            evals = [r for r in records if r["split"] == "eval"]
            summ = train.summary(args.kind, records)
            workers = d.choices["data loading"][0]
        accs = ", ".join(f"{train.first_accuracy(args.kind, r):.3f}" for r in evals)
        pos = ", ".join(f"{k}: {a:.3f}" for k, a in train.position_accuracies(args.kind, evals[-1]).items() if k <= 5)
        print(
            f"| {args.dataset} | {ttt or '-'} | {lr:g} | {dv} | {wd:g} | {workers} | {args.steps} x {args.pack_len} "
            f"| {wall:.0f} | {summ['first step (s)']:.1f} | {summ['train tokens/s (median)']:.0f} | "
            f"{evals[0]['seconds']:.1f} / {statistics.median(r['seconds'] for r in evals):.1f} | {accs} | {pos} |",
            flush=True,
        )
        if args.compile_times:
            from torch._dynamo.utils import compile_times

            print(compile_times(repr="str", aggregate=True), flush=True)


if __name__ == "__main__":
    main()
