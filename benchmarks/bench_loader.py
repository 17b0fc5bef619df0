"""What a training step waits for when loader processes are ahead: the hand-over of each pack to the training process.

On an H100 the `gpu` profile's 04 waited 10-12 ms a step with 4 and with 8 loader processes alike, flat in every epoch
(BENCHMARKS.md, "The `gpu` profile from a clean checkout"): not a supply limit. This reads stage 01's real packs
through `Packs.stream` with loader processes that are far ahead (a sleep stands in for the GPU's step), and times
apart the two things the training process does between steps: freeing the last pack (its shared memory, read as a
copy to the device reads it) and receiving the next, under each of torch's sharing strategies: `file_descriptor`
(the default: one socket connection to the loader process per tensor) and `file_system` (shared memory by name).
Medians over the packs, one process per strategy, in turn, repeated. Since 2026-12-07 the training loop frees each
pack during its own step (`training.train`), so only the receiving is left in the wait; `--in-training` reads that
wait from the loop itself (run it at a commit and at its parent to compare two loops).

    python benchmarks/bench_loader.py --dataset smollm2-ci --pack-len 8192 --workers 2 --steps 20 --gpu-step-s 1.0
    python benchmarks/bench_loader.py --dataset smollm2-ci --pack-len 8192 --workers 2 --steps 14 --in-training
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def draft_and_data(dataset: str):
    """An EAGLE-3 draft for the embedded verifier and the dataset's data folder, loguru quiet."""
    from loguru import logger

    from draftlab.data.verifier import load_verifier
    from draftlab.drafts import draft
    from draftlab.layout import RunLayout

    logger.remove()
    data = RunLayout(dataset, "bench").data
    return draft.build_draft("eagle3", load_verifier("smollm2"), data / "train"), data


def one(dataset: str, pack_len: int, workers: int, steps: int, gpu_step_s: float, strategy: str) -> dict:
    """Median milliseconds, in this process, to receive a pack (`next()` on the stream) and to free the one before
    (its tensors read first, as a copy to the device reads them)."""
    import torch.multiprocessing as mp

    from draftlab.training.data import Packs, open_split

    mp.set_sharing_strategy(strategy)
    d, data = draft_and_data(dataset)
    packs = Packs(d, open_split(d, data / "train", pack_len), pack_len, 0)
    stream = iter(packs.stream(0, steps, workers))
    receive, free = [], []
    batch, _ = next(stream)
    for i in range(steps - 1):
        sum(float(v.float().sum()) for v in batch.values() if hasattr(v, "float"))  # read, as a copy would
        time.sleep(gpu_step_s)  # the GPU's step: the processes get ahead
        t0 = time.perf_counter()
        del batch
        t1 = time.perf_counter()
        batch, _ = next(stream)
        if i >= 2 * workers:  # the processes' first packs, read while the stream starts, left out
            free.append(t1 - t0)
            receive.append(time.perf_counter() - t1)
    return {
        "strategy": strategy,
        "tensors a pack": sum(hasattr(v, "float") for v in batch.values()),
        "free ms": 1e3 * statistics.median(free),
        "receive ms": 1e3 * statistics.median(receive),
    }


def in_training(dataset: str, pack_len: int, workers: int, steps: int) -> dict:
    """The training loop's own wait for its packs (`data_s`, median over the steps after the fourth), and its step."""
    import tempfile
    from pathlib import Path

    import torch

    from draftlab.training import train

    torch.manual_seed(0)
    d, data = draft_and_data(dataset)
    s = train.Settings(
        train_steps=steps, learning_rate=1e-3, warmup_steps=2, pack_len=pack_len, ttt_steps=1,
        eval_every=10**9, checkpoint_every=10**9, loader_workers=workers,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        rows = [
            r for r in train.read_metrics(train.train(d, data, s, Path(tmp), progress=False)) if r["split"] == "train"
        ]
    return {
        "wait ms": 1e3 * statistics.median(r["data_s"] for r in rows[4:]),
        "step s": statistics.median(r["seconds"] for r in rows[4:]),
        "first losses": [round(r["loss"], 4) for r in rows[:3]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="smollm2-ci")
    ap.add_argument("--pack-len", type=int, default=8192)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--gpu-step-s", type=float, default=0.3, help="the sleep standing in for a step; long enough here")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a strategy, measured in this process
    ap.add_argument("--in-training", action="store_true", help="the training loop's own wait instead, --steps steps")
    args = ap.parse_args()
    if args.in_training:
        print(json.dumps(in_training(args.dataset, args.pack_len, args.workers, args.steps)))
        return
    if args.one:
        got = one(args.dataset, args.pack_len, args.workers, args.steps, args.gpu_step_s, args.one)
        print(json.dumps(got))
        return
    rows = []
    for _ in range(args.repeats):
        for strategy in ("file_descriptor", "file_system"):
            cmd = [sys.executable, __file__, "--one", strategy] + [
                f"--{k.replace('_', '-')}={v}"
                for k, v in vars(args).items()
                if k not in ("one", "repeats", "in_training")
            ]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"| strategy | tensors a pack | free the last pack, ms | receive the next, ms (median of {args.repeats}) |")
    print("| --- | --- | --- | --- |")
    for strategy in ("file_descriptor", "file_system"):
        mine = [r for r in rows if r["strategy"] == strategy]
        free, receive = (statistics.median(r[key] for r in mine) for key in ("free ms", "receive ms"))
        print(f"| {strategy} | {mine[0]['tensors a pack']} | {free:.1f} | {receive:.1f} |")


if __name__ == "__main__":
    main()
