"""DFlash's attention mask, built by speculators' own mask functions.

One block of `block_size` synthetic queries per anchor; block j sees its document's base tokens
before anchor j and the whole of its own block. Anchors are drawn by speculators' `select_anchors`
(seeded here), the mask by its `create_anchor_block_mask_mod`.

    python -m draftlab.masks.dflash --anchors 8 --block-size 8     # draws it: outputs/masks/dflash.png
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask

from draftlab.masks.common import MaskView, anchor_extra, anchor_regions, demo, demo_pack, demo_parser, doc_bounds

PACK_WHOLE_FLEX_BLOCKS = False  # the anchor blocks' BlockMask is built once, for the pack as it is


def generate_dflash_anchors(loss_mask: torch.Tensor, n_anchors: int, block_size: int, seed: int = 0, device="cpu"):
    """(anchors, anchor_valid): speculators' `select_anchors` over the supervised positions, seeded."""
    from speculators.models.dflash.utils import select_anchors

    torch.manual_seed(seed)
    return select_anchors(loss_mask.reshape(1, -1).to(device), n_anchors, block_size)


def generate_dflash_mask_mod(document_ids: torch.Tensor, anchors: torch.Tensor, block_size: int):
    """(mask_mod, q_len, kv_len) of the anchor blocks, as speculators' create_anchor_block_mask_mod gives them."""
    from speculators.models.dflash.attention import create_anchor_block_mask_mod

    doc = document_ids.reshape(-1)
    return create_anchor_block_mask_mod(doc, doc.numel(), anchors, block_size)


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
    doc = document_ids.reshape(-1).to(device)
    anchors, valid = generate_dflash_anchors(loss_mask, n_anchors, block_size, seed, device)
    mod, q_len, kv_len = generate_dflash_mask_mod(doc, anchors, block_size)
    return mod, builder(mod, None, None, q_len, kv_len, device=device, BLOCK_SIZE=flex_block), anchors, valid


def dflash_mask(
    document_ids, loss_mask, n_anchors: int, block_size: int, flex_block: int = 128, seed: int = 0, device="cpu"
) -> MaskView:
    """The DFlash anchor-block mask over one pack's `document_ids` and `loss_mask` tensors, anchors drawn
    by speculators' `select_anchors` (seeded)."""
    doc = document_ids.reshape(-1).to(device)
    n = doc.numel()
    mod, block, anchors, valid = dflash_block_mask(doc, loss_mask, n_anchors, block_size, flex_block, seed, device)
    q_len, kv_len = n_anchors * block_size, n + n_anchors * block_size
    dense = create_mask(mod, None, None, q_len, kv_len, device=device)[0, 0]
    q_regions = anchor_regions(anchors, block_size)
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
        doc_bounds(doc),
        anchor_extra(anchors, valid, block_size, doc, flex_block),
    )


def views(pack: dict, cfg, device="cpu") -> list[tuple[str, MaskView]]:
    """Notebook 02's figure for DFlash over a real pack: its anchor blocks, anchors drawn with the profile's seed."""
    doc, loss = pack["document_ids"][0], pack["loss_mask"]
    view = dflash_mask(doc, loss, cfg.n_anchors, cfg.dflash_block_size, cfg.flex_block, seed=cfg.seed, device=device)
    return [("dflash", view)]


def main(argv=None) -> None:
    """Draws the DFlash mask of a small synthetic pack."""
    p = demo_parser("Draw DFlash's anchor-block attention mask (token view and BlockMask) over a synthetic pack.")
    p.add_argument("--anchors", type=int, default=8, help="anchor blocks per pack")
    p.add_argument("--block-size", type=int, default=8, help="queries per anchor block")
    p.add_argument("--seed", type=int, default=0, help="seed of the anchor draw")
    args = p.parse_args(argv)
    pack = demo_pack(args)
    view = dflash_mask(
        pack["document_ids"], pack["loss_mask"], args.anchors, args.block_size, args.flex_block, seed=args.seed
    )
    demo(view, args, "dflash")


if __name__ == "__main__":
    main()
