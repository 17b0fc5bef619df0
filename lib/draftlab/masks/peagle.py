"""P-EAGLE's attention mask, built by speculators' own mask functions.

P-EAGLE trains an EAGLE-3 draft to propose k tokens in one forward. Its rows are drawn by Conditional-On-Distribution
(COD) sampling (speculators' `generate_cod_sample_indices`): every packed position at depth 0 (EAGLE-3's first pass),
then chains anchored at supervised positions, whose depth-d row stands at position anchor+d with the mask token's
embedding and a learnt `mask_hidden` in place of the token and verifier states not known yet when drafting. The mask
(speculators' `create_peagle_mask_mod`) lets row (a, d) see its document's depth-0 rows up to its anchor a (within the
sliding window, counted back from its own position a+d) and the rows of its own chain up to depth d; padding rows see
nothing, so `real_rows` names the rows that must see something (eager attention turns an empty row into NaN: the
draft refuses eager at build, `drafts/peagle.py`).

The depth count and sampling ratios are speculators' defaults (`PEagleArgs`), the window is its default draft
window: a profile has no keys for them. `n_anchors` caps the chain seeds as `max_anchors` does in training.

    python -m draftlab.masks.peagle --anchors 16     # draws it: outputs/masks/peagle.png
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask

from draftlab.masks.common import MaskView, demo, demo_pack, demo_parser

PACK_WHOLE_FLEX_BLOCKS = False  # the COD rows' BlockMask is built once, for the rows as they are; never extended


def defaults() -> dict:
    """speculators' own P-EAGLE training defaults: depths, COD ratios (`PEagleArgs`), the draft's sliding window."""
    from speculators.train.config.schema import DraftArgs, PEagleArgs

    return {**PEagleArgs().model_dump(), "sliding_window": DraftArgs.model_fields["sliding_window"].default}


def generate_peagle_rows(loss_mask: torch.Tensor, n_anchors: int | None, seed: int = 0, device="cpu", **cod):
    """(anchor_pos, depth) of every row, by speculators' `generate_cod_sample_indices`, seeded (it draws with
    torch.randperm). `cod`: num_depths, down_sample_ratio, down_sample_ratio_min (default: speculators')."""
    from speculators.models.peagle.data import generate_cod_sample_indices

    opts = {k: v for k, v in defaults().items() if k != "sliding_window"} | cod
    lm = loss_mask.reshape(1, -1).to(device)
    torch.manual_seed(seed)
    return generate_cod_sample_indices(seq_length=lm.shape[1], loss_mask=lm, max_anchors=n_anchors, **opts)


def peagle_intent(doc: torch.Tensor, anchor: torch.Tensor, depth: torch.Tensor, window: int | None) -> torch.Tensor:
    """What P-EAGLE intends, written from the paper's description rather than speculators' code: a row drafting
    position a+d from anchor a sees the context its drafting step would have (the real tokens of its document at
    positions up to a, the last `window` positions before a+d in a sliding layer) and the positions its own parallel
    group drafts before it (its anchor's chain, depths up to d); nothing of another group, nothing on padding."""
    pos = anchor + depth  # the position each row stands at
    d_of = doc[anchor.clamp(min=0)]  # a row belongs to its anchor's document
    qa, ka, qd, kd = anchor[:, None], anchor[None, :], depth[:, None], depth[None, :]
    same_doc = (d_of[:, None] == d_of[None, :]) & (d_of[:, None] != -1)
    context = (kd == 0) & (ka <= qa)
    if window is not None:
        context &= ka > pos[:, None] - window
    group = (ka == qa) & (kd <= qd)
    return same_doc & (context | group)


def intent_checks(doc, anchor, depth, window):
    """view.extra['intent']: named comparisons of the token mask with `peagle_intent` (`masks.checks.run_checks`)."""

    def checks(dense: torch.Tensor) -> list[tuple[str, bool, str]]:
        want = peagle_intent(doc, anchor, depth, window)
        ctx, chain = depth[None, :] == 0, depth[None, :] > 0
        own = (anchor[:, None] == anchor[None, :]) & (depth[None, :] <= depth[:, None])
        n_chain = int((depth > 0).sum())
        return [
            (
                "no row sees a context token after its anchor, outside its window, or in another document",
                not (dense & ctx & ~want).any(),
                f"window {window}",
            ),
            ("no row sees another chain's mask rows", not (dense & chain & ~want).any(), f"{n_chain} mask rows"),
            ("each real row sees its own anchor and its chain's earlier rows", bool(dense[want & own].all()), ""),
            ("token mask == P-EAGLE intent exactly", torch.equal(dense, want), ""),
        ]

    return checks


def peagle_mask(
    document_ids, loss_mask, n_anchors: int | None = None, flex_block: int = 128, seed: int = 0, device="cpu", **opts
) -> MaskView:
    """The P-EAGLE mask over one pack's `document_ids` and `loss_mask`: rows drawn by speculators' COD sampling
    (seeded), mask by its `create_peagle_mask_mod`. `opts`: sliding_window (None: full attention), num_depths,
    down_sample_ratio, down_sample_ratio_min; speculators' defaults where not given."""
    from speculators.models.peagle.attention import create_peagle_mask_mod

    opts = defaults() | opts
    window = opts.pop("sliding_window")
    doc = document_ids.reshape(-1).to(device)
    anchor, depth = generate_peagle_rows(loss_mask, n_anchors, seed, device, **opts)
    n = anchor.numel()
    mod = create_peagle_mask_mod(anchor, depth, doc, window)
    block = create_block_mask(mod, None, None, n, n, device=device, BLOCK_SIZE=flex_block)
    dense = create_mask(mod, None, None, n, n, device=device)[0, 0]
    counts = torch.bincount(depth.cpu()).tolist()
    starts = [sum(counts[:d]) for d in range(len(counts) + 1)]
    q_regions = [(f"depth {d}", starts[d], starts[d + 1]) for d in range(len(counts))]
    row_doc = doc[anchor.clamp(min=0)].cpu()
    cpu = (doc.cpu(), anchor.cpu(), depth.cpu())
    arith = (
        f"q_len = kv_len = {n} COD rows: {counts[0]} at depth 0 (every packed position), then "
        f"{' + '.join(map(str, counts[1:])) or '0'} chain rows at depths 1..{len(counts) - 1} (each depth keeps "
        f"max(r^d, r_min) of the chains, r = {opts['down_sample_ratio']}, r_min = {opts['down_sample_ratio_min']}). "
        f"Row (a, d) stands at position a + d; window {window}."
    )
    return MaskView(
        f"P-EAGLE, {len(counts)} depths, {counts[1] if len(counts) > 1 else 0} chains",
        mod,
        dense,
        block,
        arith,
        q_regions,
        [(f"COD rows: depth 0 | {' | '.join(str(d) for d in range(1, len(counts)))}", 0, n)],
        [i for i in range(1, n) if row_doc[i] != row_doc[i - 1]],  # where a row's document changes
        {
            "document_ids": doc,
            "anchor_pos": anchor,
            "depth": depth,
            "sliding_window": window,
            "flex_block": flex_block,
            "real_rows": row_doc != -1,  # padding rows see nothing, and have no loss
            "intent": intent_checks(*cpu, window),
        },
    )


def views(pack: dict, cfg, device="cpu") -> list[tuple[str, MaskView]]:
    """Notebook 02's figure for P-EAGLE over a real pack: its COD rows drawn with the profile's seed, `n_anchors`
    chain seeds at most (training's max_anchors), speculators' default depths, ratios and window."""
    doc, loss = pack["document_ids"][0], pack["loss_mask"]
    return [("peagle", peagle_mask(doc, loss, cfg.n_anchors, cfg.flex_block, seed=cfg.seed, device=device))]


def main(argv=None) -> None:
    """Draws the P-EAGLE mask of a small synthetic pack."""
    p = demo_parser("Draw P-EAGLE's COD-row attention mask (token view and BlockMask) over a synthetic pack.")
    p.add_argument("--anchors", type=int, default=16, help="chain seeds at most (speculators' max_anchors)")
    p.add_argument("--depths", type=int, default=None, help="parallel depths (speculators' default: 8)")
    p.add_argument("--window", type=int, default=None, help="sliding window (default: speculators', 2048)")
    p.add_argument("--seed", type=int, default=0, help="seed of the COD draw")
    args = p.parse_args(argv)
    pack = demo_pack(args)
    given = {"num_depths": args.depths, "sliding_window": args.window}
    opts = {k: v for k, v in given.items() if v is not None}
    view = peagle_mask(pack["document_ids"], pack["loss_mask"], args.anchors, args.flex_block, seed=args.seed, **opts)
    demo(view, args, "peagle")


if __name__ == "__main__":
    main()
