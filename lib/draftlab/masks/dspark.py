"""DSpark's masks: DFlash's attention, and which token each block slot is taught, from speculators' own code.

DSpark does not change DFlash's attention (speculators' `DSparkDraftModel` keeps `select_anchors` and
`create_anchor_block_mask_mod`), so its first view is `masks.dflash.dflash_mask`, checked as DFlash's.
What DSpark changes is the teaching inside a block: with `sample_from_anchor` (its default) the anchor's own slot
drafts too, and its Markov head reads, for each slot, the token before the one the slot drafts. A slip there (the
slot shifted by one, the head reading the token it should predict) trains without any error, so the second view
draws it: row = block slot, column = the pack position of the token that slot is taught to draft, marked only
where the slot is scored. It is read from speculators' DSpark forward itself (`teaching`), run over
position-coded inputs with stand-ins for its learned parts, and checked against the rule written here from the
paper's description: the block sits on positions p..p+B-1 after an anchor p; slot k is scored where position p+k
is supervised; it drafts p+k+1 (p+k without `sample_from_anchor`, slot 0 then the anchor itself, unscored); the
Markov head reads the token just before that one; the block's inputs are the anchor then mask tokens only.

    python -m draftlab.masks.dspark --anchors 8 --block-size 8     # draws it: outputs/masks/dspark_slots.png
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask

from draftlab.masks.common import MaskView, anchor_extra, anchor_regions, demo, demo_pack, demo_parser, doc_bounds
from draftlab.masks.dflash import dflash_mask, generate_dflash_anchors

PACK_WHOLE_FLEX_BLOCKS = False  # DFlash's anchor blocks: the BlockMask is built once, for the pack as it is
MASK_ID = -1  # the stand-in mask token: no real token id, so a leaked true token shows


def default_sample_from_anchor() -> bool:
    """speculators' DSpark default (its config's field): the anchor's slot drafts."""
    from speculators.models.dspark.config import DSparkSpeculatorConfig

    return bool(DSparkSpeculatorConfig.model_fields["sample_from_anchor"].default)


def teaching(loss_mask, n_anchors: int, block_size: int, sample_from_anchor: bool = True, seed: int = 0) -> dict:
    """Per block slot (n_anchors * block_size): the block's input ids, the position whose token the Markov head
    reads, the position of the token the slot is taught to draft, whether it is scored, as speculators' DSpark
    forward makes them (its own anchor draw, seeded as `generate_dflash_anchors` seeds it).

    The forward runs on position-coded inputs (input id i and verifier state i at position i) with identities for
    its learned parts and no layers; its loss (`compute_metrics`) is replaced by a recorder of the targets and
    aligned loss mask it is handed. The verifier state at i teaches token i+1."""
    import speculators.models.dspark.core as core
    from speculators.models.dflash.core import DFlashDraftModel

    n = loss_mask.numel()
    pos = torch.arange(n)
    got, same = {}, lambda x: x

    def embed(ids):
        got["inputs"] = ids[0].clone()
        return ids[..., None].float()

    def record(logits, targets, confidence_logits, aligned_loss_mask, *args, **kwargs):
        got["taught"], got["scored"] = targets[0, :, 0].round().long() + 1, aligned_loss_mask[0].bool()
        return torch.zeros(()), {}

    def prev_embeddings(ids):
        got["prev"] = ids.reshape(-1).clone()
        return ids[..., None].float()

    markov = SimpleNamespace(prev_embeddings=prev_embeddings, block_bias=lambda **kw: torch.zeros(()))
    fake = SimpleNamespace(
        block_size=block_size,
        config=SimpleNamespace(sample_from_anchor=sample_from_anchor, confidence_head_with_markov=False),
        uses_full_attn=False,  # no attention masks (the first view draws them), no layers to use them
        uses_sliding_window_attn=False,
        layers=[],
        mask_token_id=MASK_ID,
        embed_tokens=embed,
        fc=same,
        hidden_norm=same,
        norm=same,
        lm_head=same,
        verifier_norm=same,
        verifier_lm_head=same,
        rotary_emb=lambda h, p: None,
        markov_head=markov,
        confidence_head=None,
    )
    fake._build_attention_mask = partial(DFlashDraftModel._build_attention_mask, fake)
    fake._backbone_forward = partial(DFlashDraftModel._backbone_forward, fake)
    forward = core.DSparkDraftModel.forward
    forward = getattr(forward, "_torchdynamo_orig_callable", forward)  # compiled on CUDA: its Python body
    real, core.compute_metrics = core.compute_metrics, record
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            coded = pos[None, :, None].float()
            forward(fake, coded, pos[None], loss_mask.reshape(1, -1).cpu(), coded, None, max_anchors=n_anchors)
    finally:
        core.compute_metrics = real
    return got


def intended(anchors, valid, loss_mask, block_size: int, sample_from_anchor: bool) -> dict:
    """The rule, written from the paper's description: per slot, the taught position, the position the Markov
    head reads, whether the slot is scored."""
    k = torch.arange(block_size)
    sits = anchors[:, None] + k  # the pack position each slot sits on
    taught = sits + 1 if sample_from_anchor else sits
    scored = valid[:, None] & loss_mask.reshape(-1)[sits].bool() & (k >= (0 if sample_from_anchor else 1))
    return {"taught": taught.reshape(-1), "prev": (taught - 1).reshape(-1), "scored": scored.reshape(-1)}


def teaching_mask(
    document_ids, loss_mask, n_anchors: int, block_size: int, sample_from_anchor: bool = True, flex_block=128, seed=0
) -> MaskView:
    """Rows: block slots; columns: pack positions; marked: the token a scored slot is taught to draft."""
    doc, lm = document_ids.reshape(-1).cpu(), loss_mask.reshape(-1).cpu()
    n, q_len = doc.numel(), n_anchors * block_size
    got = teaching(lm, n_anchors, block_size, sample_from_anchor, seed)
    anchors, valid = generate_dflash_anchors(lm, n_anchors, block_size, seed)  # the attention view's draw
    taught, scored = got["taught"], got["scored"]

    def mod(_b, _h, q, kv):
        return scored[q] & (taught[q] == kv)

    dense = create_mask(mod, None, None, q_len, n, device="cpu")[0, 0]
    want = intended(anchors, valid, lm, block_size, sample_from_anchor)

    def intent(dense):
        rows = torch.zeros(q_len, n, dtype=torch.bool)
        rows[want["scored"], want["taught"][want["scored"]]] = True
        s = want["scored"]
        first, rest = got["inputs"][::block_size], got["inputs"].view(n_anchors, block_size)[:, 1:]
        return [
            ("the forward drew the attention view's anchors", torch.equal(first, anchors), f"{n_anchors} anchors"),
            ("each scored slot is taught the token the rule names, no other slot", torch.equal(dense, rows), ""),
            (
                "the Markov head reads the token just before the one each scored slot drafts (no leak)",
                torch.equal(got["prev"][s], want["prev"][s]),
                f"{int(s.sum())} scored slots",
            ),
            ("block inputs: the anchor, then mask tokens only", bool((rest == MASK_ID).all()), ""),
        ]

    convention = "slot k drafts p+k+1" if sample_from_anchor else "slot k drafts p+k, slot 0 unscored"
    return MaskView(
        f"DSpark slots, {n_anchors} anchors x block {block_size} ({convention})",
        mod,
        dense,
        create_block_mask(mod, None, None, q_len, n, device="cpu", BLOCK_SIZE=flex_block),
        f"q_len = n_anchors * block_size = {n_anchors} * {block_size} = {q_len} block slots; kv_len = L = {n} pack "
        f"positions. Each scored slot marks the token it is taught to draft (sample_from_anchor="
        f"{sample_from_anchor}: {convention}); {int(scored.sum())} of {q_len} slots are scored.",
        anchor_regions(anchors, block_size),
        [("packed sequence", 0, n)],
        doc_bounds(doc),
        anchor_extra(anchors, valid, block_size, doc, flex_block, real_rows=scored, intent=intent),
    )


def views(pack: dict, cfg, device="cpu") -> list[tuple[str, MaskView]]:
    """Notebook 02's figures for DSpark: DFlash's anchor-block attention (DSpark's own), and the slots' teaching
    under speculators' default `sample_from_anchor`, anchors drawn with the profile's seed in both."""
    doc, loss = pack["document_ids"][0], pack["loss_mask"]
    att = dflash_mask(doc, loss, cfg.n_anchors, cfg.dflash_block_size, cfg.flex_block, seed=cfg.seed, device=device)
    att.name = att.name.replace("DFlash", "DSpark (DFlash's attention)")
    sfa = default_sample_from_anchor()
    slots = teaching_mask(doc, loss, cfg.n_anchors, cfg.dflash_block_size, sfa, cfg.flex_block, cfg.seed)
    return [("dspark", att), ("dspark_slots", slots)]


def main(argv=None) -> None:
    """Draws which token each DSpark block slot is taught over a small synthetic pack."""
    p = demo_parser("Draw which token each DSpark block slot is taught (rows: slots, columns: pack positions).")
    p.add_argument("--anchors", type=int, default=8, help="anchor blocks per pack")
    p.add_argument("--block-size", type=int, default=8, help="slots per anchor block")
    p.add_argument("--no-sample-from-anchor", action="store_true", help="slot 0 is the anchor itself (DFlash's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the anchor draw")
    args = p.parse_args(argv)
    pack = demo_pack(args)
    view = teaching_mask(
        pack["document_ids"],
        pack["loss_mask"],
        args.anchors,
        args.block_size,
        not args.no_sample_from_anchor,
        args.flex_block,
        args.seed,
    )
    demo(view, args, "dspark_slots")


if __name__ == "__main__":
    main()
