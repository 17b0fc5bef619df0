"""Stage 01's pictures: a row's tokens coloured by its loss mask, the captured hidden states' norms,
the draft vocabulary's coverage and the row lengths; each plot returns its Figure (the notebook saves it)."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import numpy as np
import torch


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


def hidden_state_norms(samples: list[torch.Tensor], slots: list[int]):
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
    return fig


def coverage_plot(curve: np.ndarray, chosen: int, target_vocab: int, heldout: float | None = None):
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
    return fig


def length_histogram(lengths: dict[str, list[int]], max_length: int):
    """Tokens per row of each split, with `max_length` (where longer rows were cut) marked."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for name, ls in lengths.items():
        ax.hist(ls, bins=30, alpha=0.6, label=f"{name} ({len(ls)})")
    ax.axvline(max_length, color="k", ls=":", label="max_length")
    ax.set_xlabel("tokens per row")
    ax.legend()
    fig.tight_layout()
    return fig
