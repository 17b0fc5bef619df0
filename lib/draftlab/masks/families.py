"""The attention masks speculators' drafts train with, built by speculators' own mask functions.

EAGLE-3: causal + same-document over the packed sequence, extended by one diagonal block per
training-time-test (TTT) step (speculators' `create_combined_mask_mod`, whose diagonal term
already covers later steps, and `extend_mask_for_draft_tokens` for the BlockMask).
DFlash: one block of `block_size` synthetic queries per anchor; it sees its document's base tokens
before the anchor and its own block (speculators' `select_anchors` + `create_anchor_block_mask_mod`).
Each builder returns a `MaskView`: the token-level mask, the BlockMask flex would get, and what
the plots need to outline documents, TTT steps and anchor blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask

from draftlab import DraftlabError


@dataclass
class MaskView:
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


def synthetic_pack(lengths: list[int], total_len: int, prompt_share: float = 0.4) -> dict:
    """A packed batch made by speculators' own CollateFn, from documents of the given lengths."""
    from speculators.train.data import CollateFn

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
    return CollateFn(total_len, hidden_size=1, num_target_layers=1, dtype=torch.float32)(samples)


def real_pack(datapath, total_len: int, start: int = 0) -> dict:
    """A packed batch of the stage-01 dataset, exactly as training packs it."""
    from pathlib import Path

    from draftlab.training.data import collate, rows

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


def _doc_bounds(document_ids: torch.Tensor) -> list[int]:
    d = document_ids.tolist()
    return [i for i in range(1, len(d)) if d[i] != d[i - 1]]


def eagle3_block_mask(
    document_ids: torch.Tensor, ttt_step: int = 0, flex_block: int = 128, device="cpu", builder=create_block_mask
):
    """(mask_mod, BlockMask) exactly as EAGLE-3 training builds them at step `ttt_step`; no dense mask."""
    from speculators.models.eagle3.attention import create_combined_mask_mod, extend_mask_for_draft_tokens

    doc = document_ids.reshape(-1).to(device)
    n = doc.numel()
    mod = create_combined_mask_mod(doc, n)
    block = builder(mod, None, None, n, n, device=device, BLOCK_SIZE=flex_block)
    for _ in range(ttt_step):
        block = extend_mask_for_draft_tokens(block)  # what speculators does between steps
    check_block_lengths(block, n, (ttt_step + 1) * n)
    return mod, block


def dflash_block_mask(
    document_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    n_anchors: int,
    block_size: int,
    flex_block: int = 128,
    seed: int = 0,
    device="cpu",
    builder=create_block_mask,
):
    """(mask_mod, BlockMask, anchors, anchor_valid) as DFlash training builds them; no dense mask."""
    from speculators.models.dflash.attention import create_anchor_block_mask_mod
    from speculators.models.dflash.utils import select_anchors

    doc = document_ids.reshape(-1).to(device)
    torch.manual_seed(seed)
    anchors, valid = select_anchors(loss_mask.reshape(1, -1).to(device), n_anchors, block_size)
    mod, q_len, kv_len = create_anchor_block_mask_mod(doc, doc.numel(), anchors, block_size)
    return mod, builder(mod, None, None, q_len, kv_len, device=device, BLOCK_SIZE=flex_block), anchors, valid


def eagle3_mask(document_ids: torch.Tensor, ttt_step: int = 0, flex_block: int = 128, device="cpu") -> MaskView:
    """The mask EAGLE-3 attends with at TTT step `ttt_step` (0 = the plain packed sequence)."""
    doc = document_ids.reshape(-1).to(device)
    n = doc.numel()
    mod, block = eagle3_block_mask(doc, ttt_step, flex_block, device)
    kv_len = (ttt_step + 1) * n
    dense = create_mask(mod, None, None, n, kv_len, device=device)[0, 0]
    kv_regions = [("packed sequence", 0, n)] + [(f"TTT step {s}", s * n, (s + 1) * n) for s in range(1, ttt_step + 1)]
    arith = (
        f"q_len = L = {n} (one query per packed token). kv_len = (ttt_step + 1) * L = {ttt_step + 1} * {n} = {kv_len}: "
        f"the packed sequence, then one block of L keys per earlier TTT step, of which each query sees only its own "
        f"position (the diagonal)."
    )
    return MaskView(
        f"EAGLE-3, TTT step {ttt_step}",
        mod,
        dense,
        block,
        arith,
        [("queries", 0, n)],
        kv_regions,
        _doc_bounds(doc),
        {"document_ids": doc, "flex_block": flex_block},
    )


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


def dflash_mask(
    document_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    n_anchors: int,
    block_size: int,
    flex_block: int = 128,
    seed: int = 0,
    device="cpu",
) -> MaskView:
    """The DFlash anchor-block mask, anchors drawn by speculators' `select_anchors` (seeded)."""
    doc = document_ids.reshape(-1).to(device)
    n = doc.numel()
    mod, block, anchors, valid = dflash_block_mask(doc, loss_mask, n_anchors, block_size, flex_block, seed, device)
    q_len, kv_len = n_anchors * block_size, n + n_anchors * block_size
    dense = create_mask(mod, None, None, q_len, kv_len, device=device)[0, 0]
    q_regions = [
        (f"anchor {j} @ {int(a)}", j * block_size, (j + 1) * block_size) for j, a in enumerate(anchors.tolist())
    ]
    arith = (
        f"q_len = n_anchors * block_size = {n_anchors} * {block_size} = {q_len} synthetic queries. "
        f"kv_len = L + q_len = {n} + {q_len} = {kv_len}: the packed base sequence, then the anchor blocks. "
        f"{int(valid.sum())} of {n_anchors} anchors are valid (supervised positions at least block_size from the end)."
    )
    return MaskView(
        f"DFlash, {n_anchors} anchors x block {block_size}",
        mod,
        dense,
        block,
        arith,
        q_regions,
        [("packed base sequence", 0, n), ("anchor blocks", n, kv_len)],
        _doc_bounds(doc),
        {
            "anchors": anchors,
            "anchor_valid": valid,
            "block_size": block_size,
            "document_ids": doc,
            "flex_block": flex_block,
        },
    )
