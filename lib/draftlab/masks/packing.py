"""How long a pack must be for a family's mask, and what a pack holds.

A family whose mask is extended once per drafting step under flex attention (EAGLE-3's
`extend_mask_for_draft_tokens`) only fits packs of whole flex blocks: `pack_length` says the length
and why, `check_pack` refuses a pack that does not fit before the forward does, `pad_batch` pads one.
"""

from __future__ import annotations

import inspect

import torch
from torch.nn.attention.flex_attention import create_block_mask

from draftlab import DraftlabError
from draftlab.families import stage_module
from draftlab.masks.attention import FLEX

# The block speculators' BlockMasks are built with: it calls create_block_mask without BLOCK_SIZE,
# so torch's default for that parameter (torch keeps the constant itself private).
FLEX_BLOCK = inspect.signature(create_block_mask).parameters["BLOCK_SIZE"].default


def tokens(batch: dict) -> int:
    return int((batch["document_ids"] != -1).sum())


def supervised(batch: dict) -> int:
    return int(torch.as_tensor(batch["loss_mask"]).sum())


def pack_length(max_len: int, kind: str, attn_impl: str) -> tuple[int, str]:
    """The length to pack batches to, and why.

    EAGLE-3 under flex attention extends its BlockMask once per TTT step with
    `extend_mask_for_draft_tokens`, which rebuilds it from block counts: its lengths become whole
    multiples of the flex block (128). A pack of 8191 tokens then meets a mask made for 8192
    ("block_mask was created for a larger length"). Padding the pack to a multiple of the block
    makes both agree; the padded tail has document id -1 and no loss.
    """
    whole = stage_module("masks", kind).PACK_WHOLE_FLEX_BLOCKS  # the family's mask module says
    if whole and attn_impl == FLEX and max_len % FLEX_BLOCK:
        padded = -(-max_len // FLEX_BLOCK) * FLEX_BLOCK
        return padded, f"{kind} + flex: {max_len} padded to {padded}, a multiple of the {FLEX_BLOCK}-token flex block"
    return (
        max_len,
        "no padding needed" if not whole or attn_impl != FLEX else f"already a multiple of {FLEX_BLOCK}",
    )


def check_pack(batch: dict, kind: str, attn_impl: str) -> None:
    n = batch["input_ids"].shape[1]
    want, _ = pack_length(n, kind, attn_impl)
    if want != n:
        raise DraftlabError(
            f"A pack of {n} tokens fails EAGLE-3 with flex attention (its extended BlockMask covers {want}); "
            f"collate with max_len={want} (draftlab.masks.packing.pack_length) or pad with pad_batch(batch, {want})."
        )


def pad_batch(batch: dict, length: int) -> dict:
    """Right-pad a packed [1, T, ...] batch to `length`: zeros, document id -1, no loss."""
    out = dict(batch)
    for key, t in batch.items():
        if not torch.is_tensor(t) or t.dim() < 2 or t.shape[1] >= length:
            continue
        fill = -1 if key == "document_ids" else 0
        pad = t.new_full((t.shape[0], length - t.shape[1], *t.shape[2:]), fill)
        if key == "position_ids":
            pad = torch.arange(t.shape[1], length, device=t.device, dtype=t.dtype).expand(t.shape[0], -1)
        out[key] = torch.cat([t, pad], dim=1)
    return out
