"""Training tokens/s with hidden states from stage 01's files (offline) against states vLLM makes as packs are
read (online, `training.online`), the same draft, data, seed and steps, one after the other in one process; and
the disk each keeps (BENCHMARKS.md, "Online hidden states").

    python benchmarks/bench_online.py --dataset smollm2-ci --steps 40 --pack-len 512
    python benchmarks/bench_online.py --dataset smollm2-ci --loader-workers 4   # online: 4 processes ask vLLM at once
    python benchmarks/bench_online.py --dataset smollm2-ci --online-requests 1,16   # rows asked at once: 1 or 16
    python benchmarks/bench_online.py --dataset smollm2-gpu --rows 256 --pack-len 8192 --loader-workers 4,12
        # the gpu profile's data (online stage 01 kept its first 256 train rows' states): online with 4, then 12
        # loader processes, both on one extraction server

Both paces leave out the first `--skip` steps (the loader's first pack; online, the server's first requests): the
median step (packs ready) and the mean (the whole run, what a user waits for). Compare online with offline by the
mean, over enough steps that the loaders' read-ahead cannot hide the server's pace: on the H200 a 30-step run said
online took 1.11x offline's median step, while notebook 04's 1500 online steps took 0.032 s at the median and
0.189 s on average, one step in seven waiting 0.6-2.2 s for its pack (BENCHMARKS.md, "Online hidden states").
Run folders go under /tmp, so the notebooks' own runs are untouched.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path


def du(path: Path) -> int:
    """Bytes under `path` (0 where it is absent)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) if Path(path).exists() else 0


def first_rows(data: Path, n: int, into: Path) -> Path:
    """A copy of stage-01 dataset `data` whose train split is its first `n` rows, the hidden-state files linked, not
    copied. An online stage 01 keeps states for its first rows only (`extract.PREVIEW_ROWS`): on those rows offline
    and online training can be timed side by side on the profile's own data."""
    import shutil

    from datasets import load_from_disk

    into.mkdir(parents=True)
    shutil.copy(data / "config.json", into / "config.json")
    (into / "eval").symlink_to((data / "eval").resolve())
    src, dst = data / "train", into / "train"
    man = json.loads((src / "manifest.json").read_text())
    if man.get("num_samples", 0) < n:
        raise SystemExit(f"{src} holds states for {man.get('num_samples')} rows; ask for --rows at most that")
    load_from_disk(str(src)).select(range(n)).save_to_disk(str(dst))
    man.update(num_samples=n, files={k: f for k, f in man["files"].items() if int(k) < n})
    man["num_tokens"] = sum(f["tokens"] for f in man["files"].values())
    (dst / "manifest.json").write_text(json.dumps(man))
    (dst / "hidden_states").symlink_to((src / "hidden_states").resolve())
    for f in src.glob("*.npy"):
        shutil.copy(f, dst / f.name)
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="smollm2-ci", help="data/runs/<dataset> written by notebook 01")
    ap.add_argument("--kind", default="eagle3", choices=["eagle3", "dflash"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=5)
    ap.add_argument("--pack-len", type=int, default=512)
    ap.add_argument("--rows", type=int, help="train on the first ROWS train rows only (those an online stage 01 kept)")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument(
        "--loader-workers",
        default="",
        help="processes reading packs ahead, comma-separated for several online runs on one server "
        "(default: what draftlab picks, offline and online)",
    )
    ap.add_argument(
        "--online-requests",
        default="16",
        help="rows of a pack each reader asks vLLM for at once, comma-separated for several online runs "
        "(1: one row after another, as before 2026-12-03)",
    )
    args = ap.parse_args()

    import torch
    from loguru import logger

    from draftlab.data.verifier import load_verifier
    from draftlab.drafts import draft
    from draftlab.layout import RunLayout
    from draftlab.training import train
    from draftlab.training.online import longest_row, state_server

    logger.remove()
    data = RunLayout(args.dataset, "bench").data
    tmp = Path(tempfile.mkdtemp(prefix="bench-online-"))
    if args.rows:
        data = first_rows(data, args.rows, tmp / "data")
    v = load_verifier("smollm2")
    cfg = json.loads((data / "config.json").read_text())["config"]  # stage 01's resolved settings
    workers = [int(w) for w in args.loader_workers.split(",") if w] or [None]
    results = {}

    def run(name, mode, n_workers, online=None, requests=16):
        torch.manual_seed(0)
        d = draft.build_draft(args.kind, v, data / "train", draft_vocab_size=cfg.get("draft_vocab_size"))
        s = train.Settings(
            train_steps=args.steps, pack_len=args.pack_len, eval_every=args.steps, checkpoint_every=args.steps,
            eval_packs=1, hidden_states=mode, loader_workers=n_workers, online_requests=requests,
        )  # fmt: skip
        out = tmp / name
        t0 = time.perf_counter()
        train.train(d, data, s, run_dir=out, online=online)
        wall = time.perf_counter() - t0
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        pace = train.summary(args.kind, recs, skip=args.skip)  # notebook 04's figures, after the first --skip steps
        median_step, mean_step = pace["step seconds (median / mean)"]
        results[name] = {
            "loader": d.choices["data loading"][0],
            "median tokens/s": pace["train tokens/s (median)"],
            "median step s": median_step,
            "mean step s": mean_step,
            "tokens/s (whole run)": pace["train tokens/s (whole run)"],
            "share of a step waiting for its pack": pace["share of a step waiting for its pack (median)"],
            "wall s": round(wall, 1),
            "hidden states on disk (bytes)": du(data / "train" / "hidden_states") + du(data / "eval" / "hidden_states")
            if mode == "offline"
            else 0,
            "final loss": [r for r in recs if r["split"] == "train"][-1]["loss"],
        }

    run("offline", "offline", workers[0])
    t0 = time.perf_counter()
    n = longest_row(data / "train", data / "eval") + 1
    with state_server(v, json.loads((data / "train" / "manifest.json").read_text())["layer_ids"], n) as online:
        start = round(time.perf_counter() - t0, 1)
        for w in workers:
            for r in [int(x) for x in args.online_requests.split(",")]:
                run(f"online, {w if w is not None else 'picked'} loaders, {r} at once", "online", w, online, r)
    subprocess.run(["rm", "-rf", str(tmp)], check=False)
    off = results["offline"]
    print(f"one extraction server for the online runs, ready after {start} s")
    print(
        "| mode | loader | median / mean step (s) | tokens/s (whole run) | waiting for the pack (median step) |"
        " wall (s) | states on disk | final loss | online / offline step (median / mean) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        ratio = r["median step s"] / off["median step s"]
        r["online/offline step"], r["online/offline mean step"] = ratio, r["mean step s"] / off["mean step s"]
        print(
            f"| {name} | {r['loader']} | {r['median step s']:.3f} / {r['mean step s']:.3f} | "
            f"{r['tokens/s (whole run)']:,.0f} | {r['share of a step waiting for its pack']:.0%} | {r['wall s']} | "
            f"{r['hidden states on disk (bytes)'] / 2**20:.1f} MiB | {r['final loss']:.4f} | "
            f"{ratio:.2f}x / {r['online/offline mean step']:.2f}x |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "server start s": start}, indent=1))


if __name__ == "__main__":
    main()
