"""Stage 02's pictures: a mask as a token-level heatmap (documents, TTT steps and anchor blocks
outlined) beside the BlockMask's tiles; `mask_figure` returns the Figure (the caller saves it)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch

from draftlab.masks.checks import block_states

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


def mask_figure(view):
    """Token view and block view side by side; returns the Figure."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1.6, 1]})
    mask_heatmap(view, a)
    block_heatmap(view, b)
    fig.tight_layout()
    return fig
