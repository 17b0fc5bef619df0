"""Drafting attention masks, made by speculators' own training mask functions, one per draft layer.

speculators trains each draft layer under a mask of its kind: `sliding_attention` layers (the layer
indices in `model.sliding_window_indices`; speculators' default makes every draft layer one, window
`model.sliding_window`, 2048) see only the window's last context positions, the others everything
before them; DFlash blocks attend causally in sliding layers unless `sliding_window_non_causal`.
A draft run with other masks than it trained with drafts other tokens, silently. So drafting asks the
same mask functions (`create_combined_mask_mod`, `create_anchor_block_mask_mod`) about its own query
rows and keys, laid out as speculators lays them out in training, and turns the answer into the
additive float mask its sdpa / eager layers take (speculators' `create_float_mask` conversion).
"""

from __future__ import annotations

import torch

from draftlab import DraftlabError


def check_drafting(model, kind: str) -> None:
    """Refuse, before any torch call, a draft whose training masks or settings drafting cannot reproduce."""
    impl = model.config.transformer_layer_config._attn_implementation
    if impl not in ("sdpa", "eager"):
        raise DraftlabError(
            f"{kind} draft with attention {impl!r}: drafting with a KV cache passes dense masks, which only "
            "sdpa and eager take. Load the checkpoint with `proposers.load_draft` (it picks sdpa, or eager on mps)."
        )


def _float(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, Q, KV]: 0 where attended, -inf elsewhere, as speculators' `create_float_mask` makes it."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))[
        None, None
    ]


def _ask(mask_mod, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """The mask mod over every (query, key) pair in one broadcast call (flex's `create_mask` vmaps it, ~50 ms)."""
    return mask_mod(torch.zeros((), dtype=torch.long, device=q.device), None, q[:, None], kv[None, :])


def _per_layer(model, make) -> list[torch.Tensor]:
    """make(window or None) for the kinds of layer the model has, handed out per layer as speculators does."""
    windows = {i: model.sliding_window if i in model.sliding_window_indices else None for i in range(len(model.layers))}
    made = {w: make(w) for w in set(windows.values())}
    return [made[windows[i]] for i in range(len(model.layers))]


def eagle3(model, n_ctx: int, n_new: int, step: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Per layer, the mask for n_new new EAGLE-3 draft rows over the draft's KV cache.

    step 0: rows n_ctx..n_ctx+n_new-1 fed with verifier states, after n_ctx such rows (training's first
    pass: causal within the window). step i > 0: one row, TTT step i of the last verifier-fed row
    q = n_ctx-1, over the cache [n_ctx verifier-fed rows, chain rows 1..i]; in training that row's keys
    are the first pass's (windowed) and its own earlier TTT steps, which lie at kv index j*T + q."""
    from speculators.models.eagle3.attention import create_combined_mask_mod

    dev = next(model.parameters()).device
    if step == 0:
        total = n_ctx + n_new
        q, kv = torch.arange(n_ctx, total, device=dev), torch.arange(total, device=dev)
    else:
        total = n_ctx
        q = torch.tensor([total - 1], device=dev)
        kv = torch.cat([torch.arange(total, device=dev), torch.arange(1, step + 1, device=dev) * total + total - 1])
    docs = torch.zeros(total, dtype=torch.long, device=dev)  # one document: the conversation drafted
    return _per_layer(model, lambda w: _float(_ask(create_combined_mask_mod(docs, total, w), q, kv), dtype))


def dflash(model, n_ctx: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Per layer, the [1, 1, B, n_ctx+B] mask of one DFlash block anchored at position n_ctx over the
    n_ctx context states before it, as training masks the block of an anchor at that position. The anchor's
    own state is not in the context (the verifier has not run on it yet), so the base sequence is n_ctx
    long and the document ids one longer, for the anchor's own lookup."""
    from speculators.models.dflash.attention import create_anchor_block_mask_mod

    dev, size = next(model.parameters()).device, model.block_size
    docs = torch.zeros(n_ctx + 1, dtype=torch.long, device=dev)
    q, kv = torch.arange(size, device=dev), torch.arange(n_ctx + size, device=dev)

    def make(window):
        mod, _, _ = create_anchor_block_mask_mod(
            docs, n_ctx, torch.tensor([n_ctx], device=dev), size, window, model.sliding_window_non_causal
        )
        return _float(_ask(mod, q, kv), dtype)

    return _per_layer(model, make)
