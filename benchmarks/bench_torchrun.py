"""Issue 21, side by side on one GPU: draftlab's loop and speculators' trainer (the command
`launch.torchrun_command` writes) on the same stage-01 data for the same optimizer steps.
`benchmarks/gpu_pipeline.sh torchrun` runs the steps in order; each writes one JSON:

    python benchmarks/bench_torchrun.py draftlab --profile gpu --run-dir R --save-path S --command C --out A.json
    bash C 2>&1 | python benchmarks/bench_torchrun.py stamp > L      # the torchrun command, each line timed
    python benchmarks/bench_torchrun.py parse --log L --peak P --smi M --save-path S --out B.json
    python benchmarks/bench_torchrun.py eval --profile gpu --run-dir R --save-path S --out E.json
    python benchmarks/bench_torchrun.py table A.json B.json E.json bench.json

`draftlab` trains draftlab's EAGLE-3 (train.train, the profile's settings) and writes the torchrun
command for the same draft and settings; `--standin` (a dry run without CUDA) then writes draftlab's
weights in speculators' save layout with speculators' own checkpointer, so the later steps have a folder
to find. `eval` reloads both final checkpoints into the same training-mode draft and evaluates them on
draftlab's held-out eval split (the same packs), runs draftlab's reload check on speculators' checkpoint,
and loads it the way notebook 05 does (`load_draft` on the save path).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path


def setup(args):
    import torch

    from draftlab import config
    from draftlab.data.verifier import load_verifier
    from draftlab.drafts import draft
    from draftlab.layout import RunLayout
    from draftlab.training import train

    p = config.load_profile(args.profile)
    data = RunLayout(p["dataset_name"], args.profile).data  # the runs here train in --run-dir / --save-path
    v = load_verifier(p["verifier"], device=args.device or p["device"], dtype=args.dtype or p["dtype"])
    torch.manual_seed(p["seed"])
    d = draft.build_eagle3(
        v,
        data / "train",
        num_layers=p["draft_layers"],
        draft_vocab_size=p["draft_vocab_size"],
        attention=p["attention"],
        loss=p["loss_implementation"],
    )
    names = (
        "learning_rate",
        "warmup_steps",
        "pack_len",
        "grad_clip",
        "ttt_steps",
        "ttt_step_loss_decay",
        "n_anchors",
        "seed",
        "eval_every",
        "checkpoint_every",
    )
    s = train.Settings(train_steps=args.steps or p["train_steps"], **{k: p[k] for k in names})
    return data, v, d, s


def accuracies(records_or_eval) -> dict:
    from draftlab.training import train

    return {k: round(a, 4) for k, a in train.position_accuracies("eagle3", records_or_eval).items()}


def run_draftlab(args) -> dict:
    import torch

    from draftlab.training import launch, train

    data, v, d, s = setup(args)
    cmd = launch.torchrun_command(d, data, s, nproc=1, save_path=args.save_path)
    Path(args.command).write_text(launch.as_shell(cmd) + "\n")
    flags = dict(zip(cmd, cmd[1:], strict=False))  # flag -> the value after it
    cuda = v.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    run = train.train(d, data, s, run_dir=Path(args.run_dir), resume=False, progress=False)  # timed from step 1
    wall = time.perf_counter() - t0
    records = train.read_metrics(run)
    evals = [r for r in records if r["split"] == "eval"]
    summ = train.summary("eagle3", records)
    if args.standin:
        standin(d, Path(args.save_path))
    return {
        "steps": s.train_steps,
        "wall_s": round(wall, 1),
        "first_step_s": round(summ["first step (s)"], 1),
        "tokens_per_s_median": round(summ["train tokens/s (median)"]),
        "peak_mib": round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None,
        "eval_acc_0": round(train.first_accuracy("eagle3", evals[-1]), 4),
        "eval_positions": accuracies(evals[-1]),
        "evals": [round(train.first_accuracy("eagle3", r), 4) for r in evals],
        "saves": sorted(p.name for p in (run / "checkpoints").iterdir()),
        "choices": d.report(),
        "device": str(v.device),
        "dtype": str(d.dtype),
        "torchrun": {k: flags[f"--{k}"] for k in ("epochs", "checkpoint-freq", "total-seq-len")},
    }


def standin(d, save: Path) -> None:
    """Dry run only: draftlab's trained weights in speculators' layout, by speculators' own checkpointer."""
    import torch
    from speculators.train.checkpointer import SingleGPUCheckpointer

    saver = SingleGPUCheckpointer(save)
    opt = torch.optim.AdamW([p for p in d.model.parameters() if p.requires_grad])
    for epoch in (0, 1):
        saver.save_checkpoint(d.model, opt, epoch)
        (save / f"epoch{epoch}_end").symlink_to(str(epoch))
    saver.update_best_symlink(1)
    (save / "STANDIN.txt").write_text(
        "dry run: draftlab's weights, saved by speculators' checkpointer; speculators trained nothing\n"
    )


def stamp(_args) -> None:
    for line in sys.stdin:
        sys.stdout.write(f"{time.time():.3f} {line.rstrip()}\n")
        sys.stdout.flush()


PAIR = re.compile(r"([A-Za-z_][\w/]*)=([-+0-9.eE]+|nan|inf)(?=,|\s|$)")


def median(values, digits=None):
    values = list(values)
    return round(statistics.median(values), digits) if values else None


def parse_log(args) -> dict:
    """speculators' console log (rich, one record a line with COLUMNS wide, each line timed by `stamp`)."""
    from draftlab.training.launch import epochs_in, find_checkpoint

    steps, vals, saves = [], [], 0
    for line in Path(args.log).read_text(errors="replace").splitlines():
        ts, _, text = line.partition(" ")
        pairs = {k: float(x) for k, x in PAIR.findall(text)}
        saves += "Saving checkpoint to" in text
        if "train/loss" in pairs and "global_step" in pairs:
            steps.append((float(ts), pairs))
        elif any(k.startswith("val/") for k in pairs):
            vals.append(pairs)
    out: dict = {"steps_logged": len(steps), "val": vals[-1] if vals else None, "val_epochs": len(vals), "saves": saves}
    if steps:
        later = [p for _, p in steps[1:]] or [steps[0][1]]  # the first step compiles
        tokens = [p["profile/tokens_per_s"] * p["profile/step_ms"] / 1000 for _, p in steps]  # 3 significant digits
        gaps = [b[0] - a[0] for a, b in zip(steps, steps[1:], strict=False)]
        out.update(
            start_to_first_step_s=round(steps[0][0] - args.start, 1) if args.start else None,
            train_s=round(steps[-1][0] - steps[0][0], 1),
            tokens_per_s_median=median((n / t for n, t in zip(tokens[1:], gaps, strict=True) if t > 0), 0),
            profile_tokens_per_s_median=median((p["profile/tokens_per_s"] for p in later), 0),
            fetch_frac_median=median((p["profile/fetch_frac"] for p in later), 3),
            fetch_frac_mean=round(statistics.mean(p["profile/fetch_frac"] for p in later), 3),
            last_step=steps[-1][1],
        )
    peak = Path(args.peak)
    peaks = [json.loads(x) for x in peak.read_text().splitlines()] if peak.exists() else []
    out["peak_mib"] = round(max(p["max_allocated_mib"] for p in peaks)) if peaks else None
    out["peak_reserved_mib"] = round(max(p["max_reserved_mib"] for p in peaks)) if peaks else None
    smi = [int(x) for x in Path(args.smi).read_text().split()] if Path(args.smi).exists() else []
    out["smi_peak_over_idle_mib"] = max(smi) - smi[0] if smi else None
    save = Path(args.save_path)
    out["saved_epochs"] = epochs_in(save)
    for prefer in ("best", "last"):
        try:
            out[f"checkpoint_{prefer}"] = str(find_checkpoint(save, prefer=prefer))
        except Exception as err:  # noqa: BLE001  (reported, not raised: the table says what is missing)
            out[f"checkpoint_{prefer}"] = f"none: {err}"
    out["wall_s"], out["rc"] = args.wall, args.rc
    return out


def run_eval(args) -> dict:
    from draftlab.acceptance.proposers import load_draft
    from draftlab.training import checkpoint as ckpt
    from draftlab.training import launch

    data, v, d, s = setup(args)
    spec = launch.find_checkpoint(args.save_path, "last")  # the same step count as draftlab's final/
    both = ckpt.compare({"draftlab": Path(args.run_dir) / "final", "speculators": spec}, d, data / "eval", s)
    out: dict = {
        name: {
            "path": r["checkpoint"],
            "eval_acc_0": round(r["eval first-position accuracy"], 4),
            "eval_loss": round(r["eval loss"], 4),
            "eval_positions": {k.split()[1]: round(a, 4) for k, a in r.items() if k.startswith("position ")},
        }
        for name, r in both.items()
    }
    reload = ckpt.check_reload(ckpt.reload(spec, d), spec, data, s)
    out["speculators"]["reload_check"] = {k: reload[k] for k in ("identical tensors", "identical outputs")}
    out["speculators"]["load_draft"] = load_draft(args.save_path, v).choices["checkpoint"][0]  # notebook 05's path
    return out


def table(args) -> None:
    a, b, e, bench = (json.loads(Path(f).read_text()) if Path(f).exists() else {} for f in args.files)
    tau = {k: r.get("all", {}).get("tau") for k, r in bench.get("results", {}).items()}
    val, dl, sp = b.get("val") or {}, e.get("draftlab", {}), e.get("speculators", {})

    def positions(x):
        return " / ".join(f"{y:.3f}" for y in list(x.get("eval_positions", {}).values())[:3])

    rows = [
        ("optimizer steps", a.get("steps"), b.get("steps_logged")),
        ("wall (s)", a.get("wall_s"), b.get("wall_s")),
        ("first step (s) / start to first step (s)", a.get("first_step_s"), b.get("start_to_first_step_s")),
        ("draft tokens/s (median step)", a.get("tokens_per_s_median"), b.get("tokens_per_s_median")),
        (
            "speculators' own tokens/s, fetch_frac (medians)",
            "-",
            f"{b.get('profile_tokens_per_s_median')}, {b.get('fetch_frac_median')}",
        ),
        ("peak GPU memory, torch max allocated (MiB)", a.get("peak_mib"), b.get("peak_mib")),
        ("nvidia-smi peak over idle (MiB, all processes)", "-", b.get("smi_peak_over_idle_mib")),
        ("held-out first-position accuracy (draftlab eval split)", dl.get("eval_acc_0"), sp.get("eval_acc_0")),
        ("positions 1 / 2 / 3", positions(dl), positions(sp)),
        (
            "own held-out full_acc_0 (draftlab: eval split; speculators: its 10% split, last epoch)",
            (a.get("evals") or [None])[-1],
            val.get("val/full_acc_0_epoch"),
        ),
        (
            f"tau, k 5, bench prompts (n-gram: {tau.get('ngram')})",
            tau.get("eagle3-draftlab"),
            tau.get("eagle3-speculators"),
        ),
        (
            "checkpoint folders left (speculators: saves written)",
            ", ".join(a.get("saves", [])) + ", final",
            f"epochs {b.get('saved_epochs')} ({b.get('saves')} saves)",
        ),
        ("checkpoint measured", dl.get("path"), sp.get("path")),
    ]
    print("| EAGLE-3, same data and steps | draftlab loop | speculators (torchrun, nproc 1) |\n| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join("-" if x is None else str(x) for x in row) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("draftlab", "eval"):
        sp = sub.add_parser(name)
        sp.add_argument("--profile", default="gpu")
        sp.add_argument("--steps", type=int, default=None, help="default: the profile's train_steps")
        sp.add_argument("--device", default=None)
        sp.add_argument("--dtype", default=None)
        for flag in ("--run-dir", "--save-path", "--out"):
            sp.add_argument(flag, required=True)
        if name == "draftlab":
            sp.add_argument("--command", required=True, help="write the torchrun command line here")
            sp.add_argument("--standin", action="store_true")
    sub.add_parser("stamp")
    sp = sub.add_parser("parse")
    for flag in ("--log", "--peak", "--smi", "--save-path", "--out"):
        sp.add_argument(flag, required=True)
    sp.add_argument("--start", type=float, default=None, help="time.time() when the command started")
    sp.add_argument("--wall", type=float, default=None)
    sp.add_argument("--rc", type=int, default=None)
    sub.add_parser("table").add_argument("files", nargs=4)
    args = ap.parse_args()
    if args.what in ("stamp", "table"):
        return {"stamp": stamp, "table": table}[args.what](args)
    if args.what in ("draftlab", "eval"):
        from loguru import logger

        logger.remove()  # speculators logs every file it opens
    out = {"draftlab": run_draftlab, "parse": parse_log, "eval": run_eval}[args.what](args)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps(out, default=str)[:3000])


if __name__ == "__main__":
    main()
