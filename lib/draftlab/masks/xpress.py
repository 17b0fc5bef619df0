"""XPress's masks: DFlash's anchor blocks for the backbone, and the refiner's causal mixing inside each block.

The backbone trains under DFlash's mask unchanged (`XPressDraftModel` inherits `_build_attention_mask`), so
`masks.dflash` draws it with speculators' `select_anchors` and `create_anchor_block_mask_mod`, and
`masks.checks` holds it to DFlash's intent.

The refiner head adds what a block's slots see of the tokens themselves. Slot k's logit bias is computed from
the block's "previous tokens" prev[0..k], mixed causally by `XPressRefinerHead.causal_tril` (speculators' only
mask for it: the head has no mask function); in training prev[i] is the data token at a+i-1 for the block at
anchor a, prev[0] being the token before the anchor in its document, or the anchor itself at a document start
(`XPressDraftModel.forward`). Its token mask (block slot by base position) is that buffer laid over those
positions, drawn with flex's `create_mask` / `create_block_mask` like every other mask, and checked against an
intent written from the paper's description: slot k drafts token a+k from the tokens before it, so it sees the
block's tokens up to a+k-1 and never its own label. The hidden input of the head (per slot, plus the mean over
the block) comes from the backbone, whose mask is DFlash's.

    python -m draftlab.masks.xpress --anchors 8 --block-size 8     # draws it: outputs/masks/xpress_refiner.png
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask

from draftlab.masks.common import MaskView, anchor_extra, anchor_regions, demo, demo_pack, demo_parser, doc_bounds
from draftlab.masks.dflash import dflash_mask

PACK_WHOLE_FLEX_BLOCKS = False  # DFlash's anchor blocks: the BlockMask is built once, for the pack as it is


def speculators_tril(block_size: int) -> torch.Tensor:
    """[B, B] bool: the `causal_tril` buffer speculators' refiner head builds for this block size."""
    from speculators.models.xpress.model_definitions import XPressRefinerHead

    with torch.random.fork_rng(devices=[]):  # the head draws its weights; the caller's random stream stays
        head = XPressRefinerHead(
            verifier_vocab_size=1, draft_vocab_size=1, hidden_size=1, block_size=block_size, rank=1
        )
    return head.causal_tril.bool()


def refiner_mask_mod(document_ids: torch.Tensor, anchors: torch.Tensor, block_size: int, tril: torch.Tensor):
    """mask_mod(b, h, slot, base position): the refiner's mixer `tril` over the tokens training feeds it as prev."""
    doc, tril = document_ids.reshape(-1), tril.to(document_ids.device)

    def mod(b, h, q, kv):
        a, k = anchors[q // block_size], q % block_size
        same = (a > 0) & (doc[(a - 1).clamp(min=0)] == doc[a])
        first = torch.where(same, a - 1, a)  # prev[0]
        i = kv - a + 1  # the prev index holding base token kv, for i >= 1
        inside = (i >= 1) & (i < block_size) & tril[k, i.clamp(0, block_size - 1)]
        return inside | ((kv == first) & tril[k, 0])

    return mod


def intended(doc: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """What XPress intends, written from its description rather than from speculators' code: slot k of the block at
    anchor a drafts the token at a+k from the tokens before it in the block (a..a+k-1) and the token before the
    anchor when that is in the anchor's document; slot 0, the anchor itself (not drafted), sees that token, or
    itself at a document start."""
    want = torch.zeros(anchors.numel() * block_size, doc.numel(), dtype=torch.bool)
    for j, a in enumerate(anchors.tolist()):
        before = a - 1 if a > 0 and doc[a - 1] == doc[a] else a
        for k in range(block_size):
            want[j * block_size + k, before] = True
            want[j * block_size + k, a : a + k] = True
    return want


def dependency(tril: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """[B, B] bool measured on speculators' refiner head mixing with `tril` (mixer weights drawn non-zero):
    D[k, j] when changing prev token j moves slot k's logit bias."""
    from speculators.models.xpress.model_definitions import XPressRefinerHead

    size, vocab, hidden = tril.shape[0], 16, 8
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        head = XPressRefinerHead(
            verifier_vocab_size=vocab, draft_vocab_size=vocab, hidden_size=hidden, block_size=size, rank=4
        )
        head.mix_l.normal_(0, 0.5)  # zero at init: no mixing to see
        head.causal_tril.copy_(tril.float())
        h, prev = torch.randn(1, size, hidden), torch.randint(0, vocab, (1, size))
        base, out = head.block_bias(prev, hidden_states=h)[0], torch.zeros(size, size, dtype=torch.bool)
        for j in range(size):
            moved = prev.clone()
            moved[0, j] = (moved[0, j] + 1) % vocab
            out[:, j] = (head.block_bias(moved, hidden_states=h)[0] - base).abs().amax(-1) > 1e-6
    return out


def intent_checks(dense: torch.Tensor, doc: torch.Tensor, anchors: torch.Tensor, block_size: int, tril) -> list:
    """`run_checks`' family checks: (name, passed, detail) of the token mask against `intended`."""
    want, n = intended(doc, anchors, block_size), doc.numel()
    a = torch.repeat_interleave(anchors, block_size)[:, None]
    k, kv = (torch.arange(anchors.numel() * block_size) % block_size)[:, None], torch.arange(n)[None, :]
    drafted = k >= 1
    causal = torch.arange(block_size)[:, None] >= torch.arange(block_size)[None, :]
    leak = (dense & drafted & (kv >= a + k)).any()
    return [
        ("refiner: no drafted slot sees its own label or a later token", not leak, ""),
        ("refiner: a token before the anchor comes from its document", not (dense & (kv < a) & ~want).any(), ""),
        ("refiner: each drafted slot sees every block token before it", bool(dense[want & (kv >= a)].all()), ""),
        (
            "refiner: speculators' block_bias moves slot k with prev token j only for j <= k",
            torch.equal(dependency(tril), causal),
            f"perturbation, block {block_size}",
        ),
        ("token mask == XPress refiner intent exactly", torch.equal(dense, want), ""),
    ]


def refiner_mask(document_ids, anchors, block_size: int, flex_block: int = 128, device="cpu", tril=None) -> MaskView:
    """The refiner's token mask over one pack for the given anchors (drawn by `masks.dflash`); `tril` replaces
    speculators' buffer (a wrong mixer, for the checks' negative controls)."""
    doc = document_ids.reshape(-1).to(device)
    anchors = anchors.to(device)
    tril = speculators_tril(block_size) if tril is None else tril.bool()
    n, q_len = doc.numel(), anchors.numel() * block_size
    mod = refiner_mask_mod(doc, anchors, block_size, tril)
    dense = create_mask(mod, None, None, q_len, n, device=device)[0, 0]
    block = create_block_mask(mod, None, None, q_len, n, device=device, BLOCK_SIZE=flex_block)
    arith = (
        f"q_len = n_anchors * block_size = {anchors.numel()} * {block_size} = {q_len} block slots; kv_len = {n}: the "
        f"pack's tokens, as the refiner reads them (prev). Slot k of the block at anchor a sees the token before a "
        f"and a..a+k-1: its mixer is speculators' causal_tril, {int(tril.sum())} of {block_size * block_size} pairs."
    )
    return MaskView(
        f"XPress refiner, {anchors.numel()} anchors x block {block_size}",
        mod,
        dense,
        block,
        arith,
        anchor_regions(anchors, block_size),
        [("packed base sequence (tokens fed as prev)", 0, n)],
        doc_bounds(doc),
        anchor_extra(
            anchors,
            None,
            block_size,
            doc,
            flex_block,
            intent=lambda d: intent_checks(d, doc.cpu(), anchors.cpu(), block_size, tril.cpu()),
        ),
    )


def views(pack: dict, cfg, device="cpu") -> list[tuple[str, MaskView]]:
    """Notebook 02's figures for XPress over a real pack: the backbone's anchor blocks (DFlash's mask, anchors drawn
    with the profile's seed) and the refiner's mixing over the same anchors."""
    doc, loss = pack["document_ids"][0], pack["loss_mask"]
    backbone = dflash_mask(doc, loss, cfg.n_anchors, cfg.dflash_block_size, cfg.flex_block, cfg.seed, device)
    backbone.name = f"XPress backbone (DFlash), {cfg.n_anchors} anchors x block {cfg.dflash_block_size}"
    refiner = refiner_mask(doc, backbone.extra["anchors"], cfg.dflash_block_size, cfg.flex_block, device)
    return [("xpress", backbone), ("xpress_refiner", refiner)]


def main(argv=None) -> None:
    """Draws the XPress refiner's mask over a small synthetic pack."""
    p = demo_parser("Draw XPress's refiner mask (token view and BlockMask) over a synthetic pack.")
    p.add_argument("--anchors", type=int, default=8, help="anchor blocks per pack")
    p.add_argument("--block-size", type=int, default=8, help="slots per anchor block")
    p.add_argument("--seed", type=int, default=0, help="seed of the anchor draw")
    args = p.parse_args(argv)
    pack = demo_pack(args)
    backbone = dflash_mask(
        pack["document_ids"], pack["loss_mask"], args.anchors, args.block_size, args.flex_block, seed=args.seed
    )
    view = refiner_mask(pack["document_ids"], backbone.extra["anchors"], args.block_size, args.flex_block)
    demo(view, args, "xpress_refiner")


if __name__ == "__main__":
    main()
