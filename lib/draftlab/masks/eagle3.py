"""EAGLE-3's attention mask, built by speculators' own mask functions.

Causal + same-document over the packed sequence of L tokens, extended by one block of L keys per
training-time-test (TTT) step, of which each query sees only its own position: speculators'
`create_combined_mask_mod` (whose diagonal term already covers later steps) and, between steps,
`extend_mask_for_draft_tokens` for the BlockMask.

    python -m draftlab.masks.eagle3 --ttt-step 2     # draws it: outputs/masks/eagle3_ttt2.png
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask

from draftlab.masks.common import MaskView, check_block_lengths, demo, demo_pack, demo_parser, doc_bounds

# Under flex, speculators extends the BlockMask once per TTT step (`extend_mask_for_draft_tokens`) from block counts:
# a pack must be whole flex blocks long (`masks.packing.pack_length`).
PACK_WHOLE_FLEX_BLOCKS = True


def generate_eagle3_mask_mod(document_ids: torch.Tensor):
    """mask_mod over keys [packed sequence | one block of L per TTT step] (speculators' create_combined_mask_mod)."""
    from speculators.models.eagle3.attention import create_combined_mask_mod

    doc = document_ids.reshape(-1)
    return create_combined_mask_mod(doc, doc.numel())


def eagle3_block_mask(
    document_ids: torch.Tensor, ttt_step: int = 0, flex_block: int = 128, device="cpu", builder=create_block_mask
):
    """(mask_mod, BlockMask) exactly as EAGLE-3 training builds them at step `ttt_step`; no dense mask."""
    from speculators.models.eagle3.attention import extend_mask_for_draft_tokens

    doc = document_ids.reshape(-1).to(device)
    n = doc.numel()
    mod = generate_eagle3_mask_mod(doc)
    block = builder(mod, None, None, n, n, device=device, BLOCK_SIZE=flex_block)
    for _ in range(ttt_step):
        block = extend_mask_for_draft_tokens(block)  # what speculators does between steps
    check_block_lengths(block, n, (ttt_step + 1) * n)
    return mod, block


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
        doc_bounds(doc),
        {"document_ids": doc, "flex_block": flex_block},
    )


def views(pack: dict, cfg, device="cpu") -> list[tuple[str, MaskView]]:
    """Notebook 02's figures for EAGLE-3 over a real pack: (file name, mask) at each TTT step of the profile."""
    doc = pack["document_ids"][0]
    return [(f"eagle3_ttt{s}", eagle3_mask(doc, s, cfg.flex_block, device=device)) for s in range(cfg.ttt_steps)]


def main(argv=None) -> None:
    """Draws the EAGLE-3 mask of a small synthetic pack at one TTT step."""
    p = demo_parser("Draw EAGLE-3's attention mask (token view and BlockMask) over a synthetic pack.")
    p.add_argument("--ttt-step", type=int, default=2, help="training-time-test step (0: the plain packed sequence)")
    args = p.parse_args(argv)
    view = eagle3_mask(demo_pack(args)["document_ids"], args.ttt_step, args.flex_block)
    demo(view, args, f"eagle3_ttt{args.ttt_step}")


if __name__ == "__main__":
    main()
