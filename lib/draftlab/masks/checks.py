"""Each mask checked against references written independently of speculators.

The token mask must equal the mask function called point by point, the BlockMask's skipped /
partial / full tiles must follow from the token mask, and both must be what EAGLE-3 and DFlash
intend, written here from the papers' description rather than from speculators' code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn.attention.flex_attention import BlockMask

if TYPE_CHECKING:
    from draftlab.masks.common import MaskView


def pointwise(mask_mod, q_len: int, kv_len: int, points=None) -> torch.Tensor:
    """The mask function called one (q, kv) at a time: the reference the dense mask must equal."""
    z = torch.zeros((), dtype=torch.long)
    pairs = points if points is not None else [(q, k) for q in range(q_len) for k in range(kv_len)]
    return torch.tensor([bool(mask_mod(z, z, torch.tensor(q), torch.tensor(k))) for q, k in pairs])


def block_states(block: BlockMask) -> torch.Tensor:
    """[q_blocks, kv_blocks]: 0 skipped, 1 partial (mask_mod evaluated), 2 full (no mask needed)."""
    states = block.to_dense()[0, 0].to(torch.int8)
    if block.full_kv_num_blocks is not None:
        full = BlockMask.from_kv_blocks(block.full_kv_num_blocks, block.full_kv_indices).to_dense()[0, 0]
        states[full[:, : states.shape[1]].bool()] = 2
    return states.cpu()  # compared with the CPU-side dense mask; a CUDA BlockMask would not compare


def expected_block_states(dense: torch.Tensor, flex_block: int) -> torch.Tensor:
    """The same classification derived from the token-level mask (trailing partial blocks padded False)."""
    q, k = dense.shape
    qb, kb = -(-q // flex_block), -(-k // flex_block)
    padded = torch.zeros(qb * flex_block, kb * flex_block, dtype=torch.bool)
    padded[:q, :k] = dense
    tiles = padded.reshape(qb, flex_block, kb, flex_block).permute(0, 2, 1, 3).reshape(qb, kb, -1)
    out = tiles.any(-1).to(torch.int8)
    out[tiles.all(-1)] = 2
    return out


def _eagle3_expected(doc: torch.Tensor, ttt_step: int) -> torch.Tensor:
    """What EAGLE-3 intends, written independently of speculators: same document, not in the future;
    padding sees only itself; in every later TTT block each query sees only its own position."""
    n = doc.numel()
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    base = ((doc[q] == doc[k]) & (doc[q] != -1) & (k <= q)) | (q == k)
    return torch.cat([base] + [torch.eye(n, dtype=torch.bool)] * ttt_step, dim=1)


def _dflash_expected(doc: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """What DFlash intends: block j sees its document's base tokens strictly before anchor j, and the
    whole of its own block (bidirectional), nothing of other blocks."""
    n, q_len = doc.numel(), anchors.numel() * block_size
    a = torch.repeat_interleave(anchors, block_size)[:, None]
    kv = torch.arange(n)[None, :]
    base = (doc[kv] == doc[a]) & (doc[a] != -1) & (kv < a)
    blk = torch.arange(q_len) // block_size
    return torch.cat([base, blk[:, None] == blk[None, :]], dim=1)


def run_checks(view: MaskView, flex_block: int, n_points: int | None = 2000, seed: int = 0) -> list[dict]:
    """Every check as {check, passed, detail}; the notebook shows them and the tests assert them."""
    out = []
    dense = view.dense.cpu()  # built on the mask's device (CUDA on a GPU); every reference here is on the CPU

    def add(name, ok, detail=""):
        out.append({"check": name, "passed": bool(ok), "detail": detail})

    if n_points is None or n_points >= view.q_len * view.kv_len:
        pts = [(q, k) for q in range(view.q_len) for k in range(view.kv_len)]
    else:
        g = torch.Generator().manual_seed(seed)
        pts = list(
            zip(
                torch.randint(view.q_len, (n_points,), generator=g).tolist(),
                torch.randint(view.kv_len, (n_points,), generator=g).tolist(),
                strict=True,
            )
        )
    ref = pointwise(view.mask_mod, view.q_len, view.kv_len, pts)
    got = torch.tensor([bool(dense[q, k]) for q, k in pts])
    add("dense mask == mask function evaluated point by point", torch.equal(ref, got), f"{len(pts)} points")
    add(
        "BlockMask full/partial/skipped blocks agree with the token mask",
        torch.equal(block_states(view.block), expected_block_states(dense, flex_block)),
        f"block {flex_block}",
    )
    rows = view.extra.get("real_rows")  # a family whose padding rows see nothing (masked out of the loss) says which
    add(
        "no query row is empty (softmax stays finite)" if rows is None else "no real query row is empty",
        bool(dense.any(1).all() if rows is None else dense[rows.cpu()].any(1).all()),
    )
    if "intent" in view.extra:  # a family's own intended mask and named checks (masks/<family>.py), from its paper
        for name, ok, detail in view.extra["intent"](dense):
            add(name, ok, detail)
    elif "anchors" in view.extra:
        doc, anchors, bs = view.extra["document_ids"].cpu(), view.extra["anchors"].cpu(), view.extra["block_size"]
        want = _dflash_expected(doc, anchors, bs)
        n = doc.numel()
        add("no query sees another anchor's block", not (dense[:, n:] & ~want[:, n:]).any())
        add(
            "no query sees a base token at or after its anchor, or in another document",
            not (dense[:, :n] & ~want[:, :n]).any(),
        )
        add("each query sees its whole own block", bool(dense[:, n:][want[:, n:]].all()))
        add("token mask == DFlash intent exactly", torch.equal(dense, want))
    else:
        n = view.q_len
        doc = view.extra.get("document_ids")
        steps = view.kv_len // n - 1
        want = _eagle3_expected(doc.cpu(), steps) if doc is not None else None
        base = dense[:, :n]
        q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
        add("no query sees a future position", not (base & (k > q)).any())
        if want is not None:
            add("no query sees another document", not (base & ~want[:, :n]).any())
            for s in range(1, steps + 1):
                blk = dense[:, s * n : (s + 1) * n]
                add(
                    f"TTT step {s}: each query sees exactly its own position",
                    torch.equal(blk, torch.eye(n, dtype=torch.bool)),
                )
            add("token mask == EAGLE-3 intent exactly", torch.equal(dense, want))
    return out
