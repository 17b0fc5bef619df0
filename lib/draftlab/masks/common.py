"""What every mask family shares: the `MaskView` each builder returns, the packed batches masks are
built over (synthetic, or stage 01's data packed as training packs it), and the BlockMask length check.

A pack is what speculators' `CollateFn` returns: `document_ids` ([1, L], -1 on padding) and
`loss_mask` are what the masks read. `demo` is the body of each family's `main()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn.attention.flex_attention import BlockMask

from draftlab import DraftlabError


@dataclass
class MaskView:
    """One mask as a dense token mask, the BlockMask flex gets, and what the plots outline."""

    name: str
    mask_mod: object
    dense: torch.Tensor  # bool [q_len, kv_len]
    block: BlockMask
    arithmetic: str
    q_regions: list[tuple[str, int, int]] = field(default_factory=list)  # (label, start, end)
    kv_regions: list[tuple[str, int, int]] = field(default_factory=list)
    doc_bounds: list[int] = field(default_factory=list)  # base positions where a document starts
    extra: dict = field(default_factory=dict)

    @property
    def q_len(self) -> int:
        return self.dense.shape[0]

    @property
    def kv_len(self) -> int:
        return self.dense.shape[1]

    @property
    def sparsity(self) -> float:
        """Share of (query, key) pairs masked out."""
        return 1.0 - self.dense.float().mean().item()


def document_lengths(seq_len: int, docs: int, fill: float = 0.9, seed: int = 0) -> list[int]:
    """`docs` documents of uneven length filling about `fill` of the pack (the rest is padding)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(docs, generator=g) + 0.5
    lengths = (w / w.sum() * seq_len * fill).long().clamp(min=2)
    return lengths.tolist()


def synthetic_pack(lengths: list[int], total_len: int, prompt_share: float = 0.4) -> dict:
    """A packed batch made by speculators' own CollateFn (`training.data.collate`, as training packs),
    from documents of the given lengths."""
    from draftlab.data.packing import collate

    samples = []
    for n in lengths:
        k = int(n * prompt_share)
        samples.append(
            {
                "input_ids": torch.zeros(n, dtype=torch.long),
                "loss_mask": torch.tensor([0] * k + [1] * (n - k)),
                "hidden_states": torch.zeros(n, 1),
                "verifier_last_hidden_states": torch.zeros(n, 1),
                "lengths": torch.tensor([n]),
                "position_ids": torch.arange(n),
            }
        )
    return collate(samples, total_len, 1, 1, torch.float32)


def real_pack(datapath, total_len: int, start: int = 0) -> dict:
    """A packed batch of the stage-01 dataset, exactly as training packs it."""
    from pathlib import Path

    from draftlab.data.packing import collate, rows

    if not (Path(datapath) / "dataset_info.json").exists():
        raise DraftlabError(f"No stage-01 dataset at {datapath}: run notebook 01 (or `draftlab run --only 01`) first.")
    ds = rows(datapath, total_len, torch.float32)
    items, used = [], 0
    for i in range(start, len(ds)):
        if used >= total_len:
            break
        items.append(ds[i])
        used += items[-1]["input_ids"].shape[0]
    hidden = items[0]["verifier_last_hidden_states"].shape[-1]
    n_aux = items[0]["hidden_states"].shape[-1] // hidden
    return collate(items, total_len, hidden, n_aux, torch.float32)


def anchor_regions(anchors: torch.Tensor, block_size: int) -> list[tuple[str, int, int]]:
    """The query regions of a block family's mask: one block of `block_size` slots per anchor, named by its position."""
    return [(f"anchor {j} @ {int(a)}", j * block_size, (j + 1) * block_size) for j, a in enumerate(anchors.tolist())]


def anchor_extra(anchors, valid, block_size: int, doc, flex_block: int, **more) -> dict:
    """A block family's `MaskView.extra`: what `checks.run_checks` reads of its anchors, plus the family's own."""
    extra = {"anchors": anchors, "block_size": block_size, "document_ids": doc, "flex_block": flex_block}
    return {**extra, **({"anchor_valid": valid} if valid is not None else {}), **more}


def doc_bounds(document_ids: torch.Tensor) -> list[int]:
    """Positions where a new document starts (the outlines the plots draw)."""
    d = document_ids.tolist()
    return [i for i in range(1, len(d)) if d[i] != d[i - 1]]


def check_block_lengths(block: BlockMask, q_len: int, kv_len: int) -> None:
    """The failure seen on the H200 with 8191-token packs, caught before flex_attention raises it.

    speculators' `extend_mask_for_draft_tokens` rebuilds the BlockMask with torch's default
    128-token blocks, so its recorded lengths are whole multiples of 128; flex attention refuses a
    mask recorded for more tokens than it gets ("block_mask was created for a larger length").
    """
    if tuple(block.seq_lengths) != (q_len, kv_len):
        fix = -(-q_len // 128) * 128
        raise DraftlabError(
            f"The BlockMask describes (q, kv) = {tuple(block.seq_lengths)} but attention gets ({q_len}, {kv_len}): "
            f"speculators' TTT extension rounds to 128-token blocks. Pad the pack to a multiple of 128 "
            f"({fix} tokens here) and build it with flex_block=128."
        )


def demo_parser(description: str):
    """The options both families' `main()` share: the synthetic pack's shape and where the picture goes."""
    import argparse
    from pathlib import Path

    from draftlab import config

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--seq-len", type=int, default=256, help="tokens in the synthetic pack (a multiple of 128)")
    p.add_argument("--docs", type=int, default=3, help="documents in the pack; the rest is padding")
    p.add_argument("--flex-block", type=int, default=128, help="BlockMask tile size")
    p.add_argument("--out", type=Path, default=config.outputs_dir() / "masks", help="folder the PNG is written to")
    p.add_argument("--show", action="store_true", help="also open the figure in a window")
    return p


def demo_pack(args) -> dict:
    """The synthetic pack a family's `main()` draws its mask over."""
    return synthetic_pack(document_lengths(args.seq_len, args.docs), args.seq_len)


def demo(view: MaskView, args, name: str) -> None:
    """A family's `main()`: the view's arithmetic printed, its figure written to `args.out/<name>.png`."""
    import matplotlib.pyplot as plt

    from draftlab import figures
    from draftlab.masks.plots import mask_figure

    figures.save(mask_figure(view), args.out, name)
    print(view.arithmetic)
    print("figure ->", args.out / f"{name}.png")
    if args.show:
        plt.show()
