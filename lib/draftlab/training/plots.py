"""Stage 04's pictures: loss, accuracy, learning rate and throughput against step, and accuracy per
drafted position; each returns its Figure (the notebook saves it)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from draftlab.training.train import first_accuracy, position_accuracies


def _series(records: list[dict], split: str, key):
    rows = [r for r in records if r["split"] == split]
    return [r["step"] for r in rows], [key(r) if callable(key) else r.get(key, np.nan) for r in rows]


def training_curves(runs: dict[str, list[dict]]):
    """Per draft kind: loss and first-position accuracy (train thin, eval dots), learning rate, tokens/s."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    for i, (kind, rec) in enumerate(runs.items()):
        c = f"C{i}"
        for ax, key in ((axes[0, 0], "loss"), (axes[0, 1], lambda r, k=kind: first_accuracy(k, r))):
            ax.plot(*_series(rec, "train", key), color=c, lw=0.8, alpha=0.6, label=f"{kind} train")
            ax.plot(*_series(rec, "eval", key), "o-", color=c, ms=4, label=f"{kind} eval (held-out)")
        axes[1, 0].plot(*_series(rec, "train", "lr"), color=c, label=kind)
        axes[1, 1].plot(*_series(rec, "train", "tokens_per_s"), color=c, lw=0.8, label=kind)
    titles = ("loss", "first-position accuracy", "learning rate (warm-up, then cosine)", "training tokens/s")
    for ax, title in zip(axes.flat, titles, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0, 1].set_ylim(0, 1)
    fig.tight_layout()
    return fig


def position_curves(runs: dict[str, list[dict]]):
    """Accuracy of each drafted position against step, one panel per kind (eval solid, train faint)."""
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 3.8), squeeze=False)
    for ax, (kind, rec) in zip(axes[0], runs.items(), strict=True):
        positions = sorted(position_accuracies(kind, rec[-1]))
        for j, p in enumerate(positions):
            get = lambda r, p=p, k=kind: position_accuracies(k, r).get(p, np.nan)  # noqa: E731
            ax.plot(
                *_series(rec, "train", get), color=plt.cm.viridis(j / max(1, len(positions) - 1)), lw=0.6, alpha=0.35
            )
            ax.plot(
                *_series(rec, "eval", get),
                "o-",
                ms=3,
                color=plt.cm.viridis(j / max(1, len(positions) - 1)),
                label=f"position {p}",
            )
        ax.set_title(f"{kind}: accuracy per drafted position (dots: held-out)", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def arm_curves(arms: dict[str, dict[str, list[dict]]]):
    """The arms of a sweep side by side (`arms.read_arms`), a row per kind: the last held-out accuracy at each drafted
    position, a line per arm (where chains are lost), and held-out first-position accuracy against the training
    seconds it cost (what a lever buys per device-second)."""
    from draftlab.training.arms import seconds_at

    kinds = list(next(iter(arms.values())))
    fig, axes = plt.subplots(len(kinds), 2, figsize=(12, 3.8 * len(kinds)), squeeze=False)
    for row, kind in zip(axes, kinds, strict=True):
        for i, (arm, runs) in enumerate(arms.items()):
            rec = runs[kind]
            evals = [r for r in rec if r["split"] == "eval"]
            acc = position_accuracies(kind, evals[-1])
            row[0].plot(list(acc), list(acc.values()), "o-", color=f"C{i}", label=f"{arm} ({evals[-1]['step']} steps)")
            at = seconds_at(rec)
            row[1].plot(
                [at.get(r["step"], 0.0) for r in evals], [first_accuracy(kind, r) for r in evals], "o-", color=f"C{i}"
            )
        row[0].set_title(f"{kind}: held-out accuracy per drafted position, last evaluation", fontsize=10)
        row[0].set_xlabel("drafted position")
        row[0].xaxis.set_major_locator(MaxNLocator(integer=True))
        if not row[0].lines[0].get_xdata().size:
            row[0].text(0.5, 0.5, f"{kind} logs no accuracy per position", ha="center", transform=row[0].transAxes)
        row[1].set_title(f"{kind}: held-out first-position accuracy against training seconds", fontsize=10)
        row[1].set_xlabel("training seconds (device time)")
        for ax in row:
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def levers_cost(rows: list[dict]):
    """A sweep's arms (`benchmarks/sweep_levers.py` rows): bench tau with its interval against the seconds the arm
    cost (its training, and its own notebook 01 where it made a dataset of its own: what a lever buys per
    device-second), against its training steps (log scale: the steps lever's curve, where it levels off) and against
    the train split's supervised tokens (a more-text lever's curve: how much more of the verifier's text would reach a
    target). The text axis spans at least a tenth of its mean: answers written again move a dataset by a few hundredths
    of a percent, which would otherwise be drawn as far apart as doubling the text."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    panels = (
        (lambda r: r["training seconds"] + (r.get("01 seconds") or 0.0), "seconds: training + its own 01"),
        (lambda r: r.get("steps"), "training steps (log scale)"),
        (lambda r: r["data"]["train tokens"], "train split's supervised tokens (the verifier's text)"),
    )
    for ax, (x_of, label) in zip(axes, panels, strict=True):
        for i, r in enumerate(rows):
            t, x = r["bench tau"], x_of(r)
            if x is None:
                continue
            err = [[t["value"] - t["lo"]], [t["hi"] - t["value"]]]
            ax.errorbar([x], [t["value"]], yerr=err, fmt="o", color=f"C{i}")
            ax.annotate(r["arm"], (x, t["value"]), textcoords="offset points", xytext=(5, 4), fontsize=8)
        ax.set_xlabel(label)
        ax.set_ylabel("bench tau, pooled, 95% interval")
        ax.grid(alpha=0.3)
    if any(r.get("steps") for r in rows):
        axes[1].set_xscale("log", base=2)
    tokens = [r["data"]["train tokens"] for r in rows]
    mid, half = (
        (max(tokens) + min(tokens)) / 2,
        max((max(tokens) - min(tokens)) * 0.6, 0.05 * sum(tokens) / len(tokens)),
    )
    axes[2].set_xlim(mid - half, mid + half)
    axes[0].set_title("what each lever buys, against what it cost", fontsize=10)
    axes[1].set_title("bench tau against training steps", fontsize=10)
    axes[2].set_title("bench tau against the text the draft learned from", fontsize=10)
    fig.tight_layout()
    return fig
