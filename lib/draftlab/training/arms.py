"""The arms of a sweep side by side: other runs' metrics read beside this run's (`compare_runs`).

A lever (more TTT steps, noise on the states, another draft vocabulary, longer training, more text) is one run
of its own, trained under its own `--run-name` (on its own dataset where it changes stage 01). What it buys is
read on the held-out split, at what device cost: the training seconds each run logged. Notebook 04 draws the
arms with `plots.arm_curves` and tabulates them with `arm_table`, so a sweep's levers table is read off runs
already trained, never re-run.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from draftlab import DraftlabError
from draftlab.layout import RunLayout
from draftlab.training.start import read_metrics
from draftlab.training.train import first_accuracy, position_accuracies

if TYPE_CHECKING:
    import torch


def arm_layout(name: str, layout: RunLayout) -> RunLayout:
    """`run` (a run on this run's dataset) or `dataset/run` (an arm that changed stage 01) -> its layout."""
    dataset, _, run = name.rpartition("/")
    return RunLayout(dataset or layout.dataset_name, run, layout.root)


def untrained(name: str, arm: RunLayout, lacks: str) -> DraftlabError:
    """The refusal of an arm that `lacks` something (a kind's run, its held-out evaluation), naming the run to train."""
    return DraftlabError(
        f"compare_runs: arm {name!r} has {lacks}. Train it first (draftlab run --only 04 --run-name {arm.run_name} "
        "with that arm's profile), or take it out of compare_runs."
    )


def read_arms(layout: RunLayout, names: list[str], kinds: list[str]) -> dict[str, dict[str, list[dict]]]:
    """{arm: {kind: metrics records}}: this run first (named by its run), then each of `names` in their order.
    An arm without a held-out evaluation of a kind is refused, naming its folder and the run that makes it."""
    arms = {layout.run_name: layout, **{name: arm_layout(name, layout) for name in names}}
    out = {}
    for name, arm in arms.items():
        out[name] = {kind: read_metrics(arm.draft(kind)) for kind in kinds}
        empty = [k for k, rec in out[name].items() if not any(r["split"] == "eval" for r in rec)]
        if empty:
            raise untrained(name, arm, f"no held-out evaluation of {', '.join(empty)} in {arm.draft(empty[0])}")
    return out


def seconds_at(records: list[dict]) -> dict[int, float]:
    """step -> training seconds logged up to it (the device cost of reaching that evaluation)."""
    total, at = 0.0, {}
    for r in records:
        if r["split"] == "train":
            total += r.get("seconds", 0.0)
            at[r["step"]] = total
    return at


def arm_table(arms: dict[str, dict[str, list[dict]]]) -> list[dict]:
    """One row per arm and kind: steps, training seconds and the last held-out accuracy at each drafted position (a
    levers table's columns; live tau is notebook 05's, on each arm's own run)."""
    rows = []
    for arm, runs in arms.items():
        for kind, rec in runs.items():
            last = [r for r in rec if r["split"] == "eval"][-1]
            rows.append(
                {
                    "arm": arm,
                    "kind": kind,
                    "steps": last["step"],
                    "training seconds": round(max(seconds_at(rec).values(), default=0.0), 1),
                    "first-position accuracy": round(first_accuracy(kind, last), 4),
                    **{f"position {p}": round(a, 4) for p, a in sorted(position_accuracies(kind, last).items())},
                }
            )
    return rows


def stage01_vocab(layout: RunLayout) -> tuple[int, dict[str, dict[int, int]], torch.Tensor]:
    """What stage 01 wrote of a dataset's vocabulary: the draft vocabulary size it ran with, the train and eval
    splits' supervised token counts, and its t2d (one entry per verifier token). A dataset whose 01 has not written
    them is refused, naming the stage to run."""
    import numpy as np
    import torch

    paths = [layout.split(s) / "token_freq.pt" for s in ("train", "eval")] + [layout.resolved_config("01")]
    if missing := [p for p in paths if not p.is_file()]:
        raise DraftlabError(
            f"{missing[0]} is missing: run stage 01 on {layout.dataset_name} first (draftlab run --only 01)."
        )
    n = json.loads(paths[2].read_text())["config"]["draft_vocab_size"]
    freq = {s: torch.load(p, weights_only=True) for s, p in zip(("train", "eval"), paths[:2], strict=True)}
    return n, freq, torch.from_numpy(np.load(layout.vocab(n)[1]))


def arm_data(layout: RunLayout) -> dict:
    """What an arm trained on, read off its dataset: the draft vocabulary, the share of the eval split's supervised
    tokens it can emit (what a vocabulary lever buys) and the train split's supervised tokens (the verifier's text the
    draft learns from: the x of a more-text lever's curve; the same for every arm that shares a dataset)."""
    from draftlab.data.vocab import heldout_coverage

    n, freq, t2d = stage01_vocab(layout)
    return {
        "draft vocabulary": n,
        "eval coverage": round(heldout_coverage(freq["eval"], t2d), 4),
        "train tokens": int(sum(freq["train"].values())),
    }


def vocab_coverage(layout: RunLayout, sizes: list[int] = ()) -> list[dict]:
    """A dataset's supervised tokens that draft vocabularies can emit, train and eval (`vocab.coverage_by_size`), at
    its own size, twice it, the verifier's whole vocabulary and `sizes`, from the token counts its stage 01 wrote: the
    ceiling of a vocabulary lever, read before any arm of it is trained. A dataset without them is refused."""
    from draftlab.data.vocab import coverage_by_size

    n, freq, t2d = stage01_vocab(layout)
    target = len(t2d)
    return coverage_by_size(freq["train"], freq["eval"], sorted({n, min(2 * n, target), target, *sizes}), target)


def coverage_line(rows: list[dict]) -> str:
    """`vocab_coverage`'s rows as one line: size: train / eval."""
    cells = [f"{r['draft vocabulary']}: {r['train coverage']:.4f} / {r['eval coverage']:.4f}" for r in rows]
    return "supervised tokens the draft vocabulary can emit, train / eval: " + ", ".join(cells)


def steps_curve(rows: list[dict], split: str = "bench", target: float | None = None) -> dict | None:
    """Where the steps lever levels off: `split` tau of the arms that change nothing but `train_steps` (the base
    included) fitted as tau = ceiling - c * (steps / 1000) ** -a (least squares, `a` on a grid), the usual shape of a
    quantity that saturates with training. With `target`, the steps the fit needs to reach it (None above the
    ceiling). It extrapolates: read it as where the curve is heading, not a measurement. None under three step
    counts; a curve that no rising fit matches (tau falling with steps) has no ceiling (`ceiling` None)."""
    import numpy as np

    pts = sorted({(r["steps"], r[f"{split} tau"]["value"]) for r in rows if set(r["settings"]) <= {"train_steps"}})
    if len({s for s, _ in pts}) < 3:
        return None
    x, tau = np.array([s for s, _ in pts]) / 1000.0, np.array([t for _, t in pts])
    fits = []
    for a in np.linspace(0.05, 3.0, 296):
        design = np.stack([np.ones_like(x), -(x**-a)], axis=1)
        (ceiling, c), *_ = np.linalg.lstsq(design, tau, rcond=None)
        if c > 0:  # rising towards the ceiling
            fits.append((float(((design @ [ceiling, c] - tau) ** 2).mean()), float(a), float(ceiling), float(c)))
    if not fits:
        return {"split": split, "points": pts, "ceiling": None, "target": target, "steps for target": None}
    mse, a, ceiling, c = min(fits)
    need = None if target is None or target >= ceiling else round(1000 * (c / (ceiling - target)) ** (1 / a))
    return {
        "split": split,
        "points": pts,
        "ceiling": round(ceiling, 3),
        "c": float(f"{c:.3g}"),
        "a": round(a, 2),
        "rms": round(mse**0.5, 4),
        "target": target,
        "steps for target": need,
    }


def curve_line(curve: dict) -> str:
    """`steps_curve` as one line."""
    steps = ", ".join(f"{s}: {t:.3f}" for s, t in curve["points"])
    if curve["ceiling"] is None:
        return f"{curve['split']} tau against steps ({steps}) does not rise with steps: no ceiling to read off"
    head = (
        f"{curve['split']} tau against steps ({steps}) levels off at {curve['ceiling']:.3f} "
        f"(tau = ceiling - {curve['c']} * (steps/1000)^-{curve['a']}, rms {curve['rms']})"
    )
    if curve["target"] is None:
        return head
    need = curve["steps for target"]
    return head + (
        f"; {curve['target']} at about {need:,} steps" if need else f"; {curve['target']} not reached by steps"
    )
