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
        samples.append({
            "input_ids": torch.zeros(n, dtype=torch.long), "loss_mask": torch.tensor([0] * k + [1] * (n - k)),
            "hidden_states": torch.zeros(n, 1), "verifier_last_hidden_states": torch.zeros(n, 1),
            "lengths": torch.tensor([n]), "position_ids": torch.arange(n),
        })
    return CollateFn(total_len, hidden_size=1, num_target_layers=1, dtype=torch.float32)(samples)


def real_pack(datapath, total_len: int, start: int = 0) -> dict:
    """A packed batch of the stage-01 dataset, exactly as training packs it."""
    from pathlib import Path

    from speculators.train.data import ArrowDataset, CollateFn

    if not (Path(datapath) / "dataset_info.json").exists():
        raise DraftlabError(f"No stage-01 dataset at {datapath}: run notebook 01 (or `draftlab run --only 01`) first.")
    ds = ArrowDataset(max_len=total_len, datapath=datapath, on_missing="raise", hidden_states_dtype=torch.float32)
    items, used = [], 0
    for i in range(start, len(ds)):
        if used >= total_len:
            break
        items.append(ds[i])
        used += items[-1]["input_ids"].shape[0]
    hidden = items[0]["verifier_last_hidden_states"].shape[-1]
    n_aux = items[0]["hidden_states"].shape[-1] // hidden
    return CollateFn(total_len, hidden, n_aux, torch.float32)(items)


def _doc_bounds(document_ids: torch.Tensor) -> list[int]:
    d = document_ids.tolist()
    return [i for i in range(1, len(d)) if d[i] != d[i - 1]]


def eagle3_block_mask(document_ids: torch.Tensor, ttt_step: int = 0, flex_block: int = 128, device="cpu",
                      builder=create_block_mask):
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


def dflash_block_mask(document_ids: torch.Tensor, loss_mask: torch.Tensor, n_anchors: int, block_size: int,
                      flex_block: int = 128, seed: int = 0, device="cpu", builder=create_block_mask):
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
    return MaskView(f"EAGLE-3, TTT step {ttt_step}", mod, dense, block, arith, [("queries", 0, n)], kv_regions,
                    _doc_bounds(doc), {"document_ids": doc, "flex_block": flex_block})


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


def dflash_mask(document_ids: torch.Tensor, loss_mask: torch.Tensor, n_anchors: int, block_size: int,
                flex_block: int = 128, seed: int = 0, device="cpu") -> MaskView:
    """The DFlash anchor-block mask, anchors drawn by speculators' `select_anchors` (seeded)."""
    doc = document_ids.reshape(-1).to(device)
    n = doc.numel()
    mod, block, anchors, valid = dflash_block_mask(doc, loss_mask, n_anchors, block_size, flex_block, seed, device)
    q_len, kv_len = n_anchors * block_size, n + n_anchors * block_size
    dense = create_mask(mod, None, None, q_len, kv_len, device=device)[0, 0]
    q_regions = [(f"anchor {j} @ {int(a)}", j * block_size, (j + 1) * block_size) for j, a in enumerate(anchors.tolist())]
    arith = (
        f"q_len = n_anchors * block_size = {n_anchors} * {block_size} = {q_len} synthetic queries. "
        f"kv_len = L + q_len = {n} + {q_len} = {kv_len}: the packed base sequence, then the anchor blocks. "
        f"{int(valid.sum())} of {n_anchors} anchors are valid (supervised positions at least block_size from the end)."
    )
    return MaskView(f"DFlash, {n_anchors} anchors x block {block_size}", mod, dense, block, arith, q_regions,
                    [("packed base sequence", 0, n), ("anchor blocks", n, kv_len)], _doc_bounds(doc),
                    {"anchors": anchors, "anchor_valid": valid, "block_size": block_size, "document_ids": doc,
                     "flex_block": flex_block})


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
        pts = list(zip(torch.randint(view.q_len, (n_points,), generator=g).tolist(),
                       torch.randint(view.kv_len, (n_points,), generator=g).tolist(), strict=True))
    ref = pointwise(view.mask_mod, view.q_len, view.kv_len, pts)
    got = torch.tensor([bool(dense[q, k]) for q, k in pts])
    add("dense mask == mask function evaluated point by point", torch.equal(ref, got), f"{len(pts)} points")
    add("BlockMask full/partial/skipped blocks agree with the token mask",
        torch.equal(block_states(view.block), expected_block_states(dense, flex_block)), f"block {flex_block}")
    add("no query row is empty (softmax stays finite)", bool(dense.any(1).all()))
    if "anchors" in view.extra:
        doc, anchors, bs = view.extra["document_ids"].cpu(), view.extra["anchors"].cpu(), view.extra["block_size"]
        want = _dflash_expected(doc, anchors, bs)
        n = doc.numel()
        add("no query sees another anchor's block", not (dense[:, n:] & ~want[:, n:]).any())
        add("no query sees a base token at or after its anchor, or in another document", not (dense[:, :n] & ~want[:, :n]).any())
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
                add(f"TTT step {s}: each query sees exactly its own position", torch.equal(blk, torch.eye(n, dtype=torch.bool)))
            add("token mask == EAGLE-3 intent exactly", torch.equal(dense, want))
    return out
