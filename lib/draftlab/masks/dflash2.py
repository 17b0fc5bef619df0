"""DFlash-2's token mixing: its attention mask, built by speculators' own mask function, and its local convolution.

Attention: DFlash's anchor blocks (`masks.dflash`), asked of speculators' `create_anchor_block_mask_mod` as
`DFlash2DraftModel` asks it for a sliding layer (every draft layer, by speculators' default): block j sees its
document's base tokens in the window [anchor_j - W, anchor_j) and the whole of its own block, as
`sliding_window_non_causal` (True for this family only) makes the block bidirectional there. A full-attention
layer (only with `full_attention_indices`) has DFlash's own mask, drawn by `masks.dflash`.

Convolution: each layer's `GroupedDynamicCausalConv` (around attention, and around the MLP) mixes block slots
outside attention: output slot p reads input slots p-K+1..p of its own block (K = `conv_kernel_size`), slot =
row % block_size. It is drawn as a [slot, slot] dependence mask over the first blocks, read off speculators'
module itself (random weights; each input slot perturbed in turn), and checked like a mask.

Both are checked against the intent written here from the paper's description, not from speculators' code.

    python -m draftlab.masks.dflash2 --anchors 4 --block-size 8 --window 24    # outputs/masks/dflash2*.png
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask

from draftlab.masks.common import MaskView, anchor_extra, anchor_regions, demo, demo_pack, demo_parser, doc_bounds
from draftlab.masks.dflash import generate_dflash_anchors

PACK_WHOLE_FLEX_BLOCKS = False  # as DFlash: the anchor blocks' BlockMask is built once, for the pack as it is


SHAPE = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def defaults() -> dict:
    """speculators' own DFlash-2 defaults (its TrainConfig resolved for the family): window, block, conv, selector."""
    from speculators.train.config.schema import TrainConfig

    flat = TrainConfig(speculator_type="dflash2", verifier={"verifier_name_or_path": "."}).flatten()
    keep = ("block_size", "sliding_window", "sliding_window_non_causal", *SHAPE)
    return {k: flat[k] for k in keep}


def _attention_intent(doc, anchors, size: int, window: int | None, non_causal: bool):
    """What DFlash-2 intends: block j sees the base tokens of its anchor's document strictly before the anchor,
    only the last `window` of them in a sliding layer, and its own block: all of it when bidirectional (always in a
    full layer), else the slots up to its own; nothing of other blocks."""
    n, q_len = doc.numel(), anchors.numel() * size
    a = torch.repeat_interleave(anchors, size)[:, None]
    k = torch.arange(n)[None, :]
    base = (doc[k] == doc[a]) & (doc[a] != -1) & (k < a) & ((k >= a - window) if window is not None else True)
    q, kb = torch.arange(q_len)[:, None], torch.arange(q_len)[None, :]
    own = (q // size == kb // size) & ((kb <= q) if window is not None and not non_causal else True)
    return base, own


def dflash2_mask(
    document_ids,
    loss_mask,
    n_anchors: int,
    block_size: int,
    window: int | None,
    non_causal: bool = True,
    flex_block: int = 128,
    seed: int = 0,
    device="cpu",
) -> MaskView:
    """The mask of a DFlash-2 layer (window W: sliding; None: full) over one pack, anchors drawn as training draws."""
    from speculators.models.dflash.attention import create_anchor_block_mask_mod

    doc = document_ids.reshape(-1).to(device)
    n = doc.numel()
    anchors, valid = generate_dflash_anchors(loss_mask, n_anchors, block_size, seed, device)
    mod, q_len, kv_len = create_anchor_block_mask_mod(doc, n, anchors, block_size, window, non_causal)
    block = create_block_mask(mod, None, None, q_len, kv_len, device=device, BLOCK_SIZE=flex_block)
    dense = create_mask(mod, None, None, q_len, kv_len, device=device)[0, 0]
    base, own = _attention_intent(doc.cpu(), anchors.cpu(), block_size, window, non_causal)

    def intent(d):
        return [
            (
                "no query sees a base token outside its window before its anchor, or in another document",
                not (d[:, :n] & ~base).any(),
                f"window {window}",
            ),
            ("no query sees another anchor's block", not (d[:, n:] & ~own).any(), ""),
            (
                "each query sees its whole own block"
                if window is None or non_causal
                else "each query sees its own block up to itself",
                bool(d[:, n:][own].all()),
                "",
            ),
            ("token mask == DFlash-2 intent exactly", torch.equal(d, torch.cat([base, own], 1)), ""),
        ]

    kind = (
        "full layer"
        if window is None
        else f"sliding layer W={window}, block " + ("bidirectional" if non_causal else "causal")
    )
    arith = (
        f"q_len = n_anchors * block_size = {n_anchors} * {block_size} = {q_len}; kv_len = L + q_len = {n} + {q_len} "
        f"= {kv_len}. {kind}: base keys of anchor a lie in [a - {window}, a)"
        if window is not None
        else f"q_len = {q_len}; kv_len = {kv_len}. {kind}: every base key of the document before the anchor."
    )
    return MaskView(
        f"DFlash-2 attention ({kind}), {n_anchors} anchors x block {block_size}",
        mod,
        dense,
        block,
        arith,
        anchor_regions(anchors, block_size),
        [("packed base sequence", 0, n), ("anchor blocks", n, kv_len)],
        doc_bounds(doc),
        anchor_extra(anchors, valid, block_size, doc, flex_block, window=window, non_causal=non_causal, intent=intent),
    )


def dependence(f, x: torch.Tensor) -> torch.Tensor:
    """[out slot, in slot] bool: which input rows of x [Q, H] change which output rows of f, one perturbed at a time
    (a row outside the conv's reach meets a zero coefficient, so its outputs are exactly unchanged)."""
    with torch.no_grad():
        ref = f(x)
        cols = []
        for j in range(x.shape[0]):
            y = x.clone()
            y[j] += torch.randn_like(y[j])
            cols.append((f(y) != ref).any(-1))
    return torch.stack(cols, 1)


def conv_mask(
    block_size: int,
    kernel_size: int,
    group_size: int,
    n_blocks: int = 3,
    flex_block: int = 128,
    seed: int = 0,
    shift: int = 0,
) -> MaskView:
    """Which block slots speculators' `GroupedDynamicCausalConv` mixes (prepare, around attention's input; finish,
    around its output: the same pattern), over `n_blocks` whole blocks from row 0. `shift` moves the rows' slot
    numbering (a negative control: blocks that do not start at row 0)."""
    from speculators.models.dflash2.model_definitions import GroupedDynamicCausalConv

    g = torch.Generator().manual_seed(seed)
    hidden, q_len = 2 * group_size, n_blocks * block_size
    conv = GroupedDynamicCausalConv(hidden, block_size=block_size, kernel_size=kernel_size, group_size=group_size)
    with torch.no_grad():  # random, not speculators' identity initialisation, so every tap shows
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(q_len + shift, hidden, generator=g)
    kernel = conv.prepare(x)[1]
    prep = dependence(lambda h: conv.prepare(h)[0][shift:], x)[:, shift:]
    fin = dependence(lambda h: conv.finish(h, kernel)[shift:], x)[:, shift:]

    def mod(_b, _h, q, kv):
        return prep[q, kv]

    block = create_block_mask(mod, None, None, q_len, q_len, device="cpu", BLOCK_SIZE=flex_block)
    dense = create_mask(mod, None, None, q_len, q_len, device="cpu")[0, 0]
    q, k = torch.arange(q_len)[:, None], torch.arange(q_len)[None, :]
    want = (q // block_size == k // block_size) & (k <= q) & (k > q - kernel_size)  # the paper's causal local conv

    def intent(d):
        return [
            ("conv: no slot reads another block", not (d & (q // block_size != k // block_size)).any(), ""),
            ("conv: no slot reads a later slot", not (d & (k > q)).any(), ""),
            (f"conv: slot p reads exactly slots p-{kernel_size - 1}..p of its block", torch.equal(d, want), ""),
            ("conv: finish() (around the output) mixes the same slots", torch.equal(fin, want), ""),
        ]

    arith = (
        f"{n_blocks} blocks x {block_size} slots, kernel K = {kernel_size}: output slot p depends on input slots "
        f"max(0, p-{kernel_size - 1})..p of its own block (slot = row % {block_size}); in every layer, twice."
    )
    regions = [(f"block {j}", j * block_size, (j + 1) * block_size) for j in range(n_blocks)]
    return MaskView(
        f"DFlash-2 local convolution, K={kernel_size}",
        mod,
        dense,
        block,
        arith,
        regions,
        regions,
        [],
        {"block_size": block_size, "flex_block": flex_block, "intent": intent},
    )


def views(pack: dict, cfg, device="cpu") -> list[tuple[str, MaskView]]:
    """Notebook 02's figures for DFlash-2 over a real pack: its sliding layers' mask (speculators' window and
    bidirectional block; the profile's block size and anchors) and its convolution's slot mixing."""
    d = defaults()
    doc, loss, size = pack["document_ids"][0], pack["loss_mask"], cfg.dflash_block_size
    att = dflash2_mask(
        doc,
        loss,
        cfg.n_anchors,
        size,
        d["sliding_window"],
        d["sliding_window_non_causal"],
        cfg.flex_block,
        cfg.seed,
        device,
    )
    conv = conv_mask(size, d["conv_kernel_size"], d["conv_group_size"], min(cfg.n_anchors, 3), cfg.flex_block)
    return [("dflash2", att), ("dflash2_conv", conv)]


def main(argv=None) -> None:
    """Draws DFlash-2's sliding-layer mask and convolution over a small synthetic pack."""
    p = demo_parser("Draw DFlash-2's attention mask and local-convolution mixing over a synthetic pack.")
    p.add_argument("--anchors", type=int, default=4, help="anchor blocks per pack")
    p.add_argument("--block-size", type=int, default=8, help="queries per anchor block")
    p.add_argument("--window", type=int, default=24, help="sliding window (speculators' default: 2048)")
    p.add_argument("--kernel", type=int, default=2, help="conv_kernel_size")
    args = p.parse_args(argv)
    pack = demo_pack(args)
    demo(
        dflash2_mask(pack["document_ids"], pack["loss_mask"], args.anchors, args.block_size, args.window),
        args,
        "dflash2",
    )
    demo(conv_mask(args.block_size, args.kernel, 16, min(args.anchors, 3), args.flex_block), args, "dflash2_conv")


if __name__ == "__main__":
    main()
