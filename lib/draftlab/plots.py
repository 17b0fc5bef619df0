"""Figures and coloured text for the notebooks; each plot returns its Figure (and can save a PNG)."""

from __future__ import annotations

import html
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch


def save(fig, out_dir: Path | None, name: str):
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        fig.savefig(Path(out_dir) / f"{name}.png", dpi=110, bbox_inches="tight")
    return fig


def loss_mask_html(tok, input_ids, loss_mask, max_tokens: int = 400) -> str:
    """Tokens on a grey (masked out) or green (trained on) background, special tokens in bold."""
    spans = []
    for tid, m in list(zip(list(map(int, input_ids)), list(map(int, loss_mask)), strict=True))[:max_tokens]:
        piece = tok.decode([tid])
        text = html.escape(piece).replace("\n", "⏎<br>") or "∅"
        bg = "#b7e4c7" if m else "#e5e5e5"
        weight = "bold" if tid in tok.all_special_ids else "normal"
        spans.append(
            f'<span title="{tid}" '
            f'style="background:{bg};font-weight:{weight};border-radius:3px;margin:1px;padding:0 1px">{text}</span>'
        )
    legend = (
        '<p><span style="background:#b7e4c7">trained on (loss_mask=1)</span> '
        '<span style="background:#e5e5e5">context only (0)</span></p>'
    )
    return legend + '<div style="font-family:monospace;line-height:1.9">' + "".join(spans) + "</div>"


def hidden_state_norms(samples: list[torch.Tensor], slots: list[int], out_dir=None):
    """Per-token L2 norm of each captured slot: spread (left) and mean against position (right)."""
    norms = [s.float().norm(dim=-1) for s in samples]  # [T, n_slots] each
    allnorm = torch.cat(norms).numpy()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    a.boxplot([allnorm[:, k] for k in range(len(slots))], showfliers=False)
    a.set_xticks(
        range(1, len(slots) + 1), [f"id {s}" + (" (final)" if k == len(slots) - 1 else "") for k, s in enumerate(slots)]
    )
    a.set_ylabel("‖h‖₂ per token")
    a.set_title("Hidden-state norms per captured layer")
    width = max(len(n) for n in norms)
    pad = np.full((len(norms), width, len(slots)), np.nan)
    for r, n in enumerate(norms):
        pad[r, : len(n)] = n.numpy()
    for k, s in enumerate(slots):
        b.plot(np.nanmean(pad[:, :, k], axis=0), label=f"id {s}")
    b.set_xlabel("position")
    b.set_yscale("log")
    b.set_title("Mean norm against position")
    b.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, out_dir, "hidden_state_norms")


def coverage_plot(curve: np.ndarray, chosen: int, target_vocab: int, heldout: float | None = None, out_dir=None):
    """Share of supervised tokens a draft vocabulary of size k covers, with the chosen k marked."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    k = np.arange(1, len(curve) + 1)
    ax.plot(k, curve)
    cov = curve[min(chosen, len(curve)) - 1]
    ax.axvline(chosen, color="C3", ls="--")
    ax.annotate(
        f"draft vocab {chosen}: {cov:.1%}", (chosen, cov), xytext=(8, -18), textcoords="offset points", color="C3"
    )
    if heldout is not None:
        ax.plot([chosen], [heldout], "o", color="C2", label=f"held-out (eval) coverage {heldout:.1%}")
        ax.legend(loc="lower right")
    ax.set_xscale("log")
    ax.set_xlabel(f"draft vocabulary size (target vocab {target_vocab}; {len(curve)} distinct tokens seen)")
    ax.set_ylabel("share of target tokens covered")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title("Vocabulary coverage")
    fig.tight_layout()
    return save(fig, out_dir, "vocab_coverage")


def length_histogram(lengths: dict[str, list[int]], max_length: int, out_dir=None):
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for name, ls in lengths.items():
        ax.hist(ls, bins=30, alpha=0.6, label=f"{name} ({len(ls)})")
    ax.axvline(max_length, color="k", ls=":", label="max_length")
    ax.set_xlabel("tokens per row")
    ax.legend()
    fig.tight_layout()
    return save(fig, out_dir, "lengths")


BLOCK_COLOURS = ("#ffffff", "#f4a259", "#3d5a80")  # skipped, partial, full


def screen_cells(dense: torch.Tensor, max_rows: int = 1024, max_cols: int = 2048) -> tuple[np.ndarray, int, int]:
    """(share of visible keys per cell, rows per cell, keys per cell): a mask larger than a figure
    has pixels is averaged over whole cells first (avg_pool2d; edge cells over the tokens they hold),
    on its own device. matplotlib resampling an 8192 x 24576 token mask itself takes 10-25 s a figure."""
    q, kv = dense.shape
    fq, fk = -(-q // max_rows), -(-kv // max_cols)
    cells = torch.nn.functional.avg_pool2d(dense[None, None].float(), (fq, fk), ceil_mode=True)[0, 0]
    return cells.cpu().numpy(), fq, fk


def mask_heatmap(view, ax=None, max_labels: int = 12, max_cells: tuple[int, int] | None = (1024, 2048)):
    """Token-level mask (query rows, key columns) with documents, TTT steps and anchor blocks outlined;
    drawn over at most `max_cells` (rows, columns) screen cells, token by token when None."""
    from matplotlib.colors import LinearSegmentedColormap

    ax = ax or plt.subplots(figsize=(7, 5))[1]
    img, fq, fk = screen_cells(view.dense, *(max_cells or view.dense.shape))
    ax.imshow(
        img,
        cmap=LinearSegmentedColormap.from_list("mask", ["#f7f7f7", "#1f6f8b"]),
        aspect="auto",
        interpolation="antialiased",
        vmin=0,
        vmax=1,
        extent=(-0.5, img.shape[1] * fk - 0.5, img.shape[0] * fq - 0.5, -0.5),
    )
    ax.set_xlim(-0.5, view.kv_len - 0.5)
    ax.set_ylim(view.q_len - 0.5, -0.5)
    n_base = view.kv_regions[0][2]
    for _label, start, _end in view.kv_regions[1:]:
        ax.axvline(start - 0.5, color="k", lw=1.2)
    offsets = [s for _, s, _ in view.kv_regions] if "anchors" not in view.extra else [0]
    for b in view.doc_bounds:
        for off in offsets:
            ax.axvline(off + b - 0.5, color="#c0392b", lw=0.6, ls=":")
        if "anchors" not in view.extra:
            ax.axhline(b - 0.5, color="#c0392b", lw=0.6, ls=":")
    for label, start, end in view.kv_regions:
        ax.text(
            (start + end) / 2, 1.005, label, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=8
        )
    if "anchors" in view.extra:
        for _label, start, _end in view.q_regions[1:]:
            ax.axhline(start - 0.5, color="#888", lw=0.5)
        if len(view.q_regions) <= max_labels:
            for label, start, end in view.q_regions:
                ax.text(
                    0.005,
                    (start + end) / 2,
                    label,
                    transform=ax.get_yaxis_transform(),
                    ha="left",
                    va="center",
                    fontsize=7,
                    color="#c0392b",
                    bbox={"facecolor": "white", "alpha": 0.7, "lw": 0, "pad": 1},
                )
        for a in view.extra["anchors"].tolist():
            ax.plot([a], [-0.5], marker="v", color="#c0392b", ms=4, clip_on=False)
    ax.set_xlabel(f"key position (kv_len = {view.kv_len}; base sequence {n_base})")
    ax.set_ylabel(f"query (q_len = {view.q_len})")
    ax.set_title(f"{view.name}: token mask, sparsity {view.sparsity:.1%}", fontsize=10, pad=16)
    return ax


def block_heatmap(view, ax=None):
    """The BlockMask flex attention receives: which tiles it skips, evaluates, or takes whole."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    from draftlab.masks.checks import block_states

    ax = ax or plt.subplots(figsize=(5, 4))[1]
    states = block_states(view.block).cpu().numpy()
    ax.imshow(states, cmap=ListedColormap(BLOCK_COLOURS), vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    counts = [(states == s).mean() for s in range(3)]
    ax.legend(
        handles=[
            Patch(facecolor=c, edgecolor="#999", label=f"{name} {share:.0%}")
            for c, name, share in zip(BLOCK_COLOURS, ("skipped", "partial", "full"), counts, strict=True)
        ],
        loc="upper right",
        fontsize=7,
        framealpha=0.9,
    )
    tile = view.extra.get("flex_block", 128)
    ax.set_title(
        f"BlockMask.to_dense(): {states.shape[0]} x {states.shape[1]} tiles of {tile}x{tile} tokens",
        fontsize=10,
        pad=16,
    )
    for axis, n in ((ax.xaxis, states.shape[1]), (ax.yaxis, states.shape[0])):
        if n <= 24:
            axis.set_ticks(range(n))
        else:
            axis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("key block")
    ax.set_ylabel("query block")
    return ax


def mask_figure(view, out_dir=None, name: str | None = None):
    """Token view and block view side by side; returns the Figure (PNG saved when out_dir is given)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1.6, 1]})
    mask_heatmap(view, a)
    block_heatmap(view, b)
    fig.tight_layout()
    return save(fig, out_dir, name or view.name.split(",")[0].lower().replace("-", "").replace(" ", "_"))


def _series(records: list[dict], split: str, key):
    rows = [r for r in records if r["split"] == split]
    return [r["step"] for r in rows], [key(r) if callable(key) else r.get(key, np.nan) for r in rows]


def training_curves(runs: dict[str, list[dict]], out_dir=None):
    """Per draft kind: loss and first-position accuracy (train thin, eval dots), learning rate, tokens/s."""
    from draftlab.training.train import first_accuracy

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
    return save(fig, out_dir, "training_curves")


def position_curves(runs: dict[str, list[dict]], out_dir=None):
    """Accuracy of each drafted position against step, one panel per kind (eval solid, train faint)."""
    from draftlab.training.train import position_accuracies

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
    return save(fig, out_dir, "position_accuracy")
