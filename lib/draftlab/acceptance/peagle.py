"""P-EAGLE at stage 05: all k draft tokens from one forward of the draft, laid out as it trained.

Training (speculators' `models/peagle`) runs COD rows: row (a, 0) is EAGLE-3's first pass at position a (token
x[a+1] with the verifier's aux states of a, as `shift_batch` aligns them), and row (a, d) of the chain anchored at a
stands at position a+d with the mask token's embedding and fc(`mask_hidden`); its target is the verifier's next
token at a+d, i.e. draft token d+1 after a context whose last verifier-processed position is a. Drafting is therefore
one pass: the committed context's depth-0 rows (kept in the draft's KV cache, as EAGLE-3's step 0) and k-1 mask rows
of the chain anchored at the last of them, each layer under the mask speculators' `create_peagle_mask_mod` gives
those rows (its window, per layer kind). No drafted token is fed back, so the drafting logits are the training
forward's at the same (anchor, depth): lossless by construction, checked in tests/test_family_peagle.py.
"""

from __future__ import annotations

import torch

from draftlab import DraftlabError
from draftlab.acceptance.draft_masks import _ask, _float, _per_layer
from draftlab.acceptance.eagle3 import Eagle3Proposer
from draftlab.acceptance.proposers import Proposal, crop


def peagle_masks(model, n_ctx: int, n_new: int, depths: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Per layer, [1, 1, n_new + depths, n_ctx + n_new + depths]: queries are the n_new new depth-0 rows (positions
    n_ctx..) and `depths` mask rows of the chain anchored at the last depth-0 row; keys are every depth-0 row, then
    those mask rows. Asked of speculators' `create_peagle_mask_mod` with the rows described as training's COD sample
    describes them (anchor, depth), one document: the conversation drafted."""
    from speculators.models.peagle.attention import create_peagle_mask_mod

    dev = next(model.parameters()).device
    n0 = n_ctx + n_new
    anchor = torch.cat([torch.arange(n0, device=dev), torch.full((depths,), n0 - 1, device=dev)])
    depth = torch.cat([torch.zeros(n0, dtype=torch.long, device=dev), torch.arange(1, depths + 1, device=dev)])
    docs = torch.zeros(n0, dtype=torch.long, device=dev)
    q, kv = torch.arange(n_ctx, n0 + depths, device=dev), torch.arange(n0 + depths, device=dev)
    return _per_layer(model, lambda w: _float(_ask(create_peagle_mask_mod(anchor, depth, docs, w), q, kv), dtype))


class PEagleProposer(Eagle3Proposer):
    """Parallel drafting: one draft pass per proposal for up to `num_depths` tokens; a KV cache of the depth-0 rows
    only (the mask rows are cropped after each pass). Sampling draws each slot from its own distribution, which
    does not depend on the tokens drafted before it (none is fed back), so `q` per slot is what each was drawn from."""

    kind = "peagle"

    def __init__(self, model, target_vocab: int):
        if getattr(model, "mask_token_id", None) is None:
            raise DraftlabError(
                "peagle draft without mask_token_id: the chain rows it drafts with embed that token. Load a checkpoint "
                "whose config.json names it (draftlab's build_draft and speculators' CLI always write one)."
            )
        super().__init__(model, target_vocab)
        self.n_depths = int(model.config.speculators_config.proposal_methods[0].speculative_tokens)

    def slot_logits(self, tokens: torch.Tensor, aux: torch.Tensor, k: int) -> torch.Tensor:
        """[k, draft vocab]: the new depth-0 rows (tokens[i] with aux[i]) appended to the cache, the last one the
        anchor, and k-1 mask rows after it in the same pass; slot d drafts token d+1. The mask rows are cropped."""
        m, n_ctx, depths = self.model, self.n_real, k - 1
        n = len(tokens)
        ids = torch.cat([tokens, torch.full((depths,), m.mask_token_id, device=self.device, dtype=tokens.dtype)])
        mh = m.mask_hidden.reshape(1, -1).to(aux.dtype).expand(depths, -1)
        h = torch.cat([m.embed_tokens(ids)[None].to(aux.dtype), self._prep(torch.cat([aux, mh]))[None]], -1)
        a = n_ctx + n - 1  # the anchor: training's row (a, d) stands at position a + d
        pos = torch.cat([torch.arange(n_ctx, a + 1), torch.arange(a + 1, a + 1 + depths)]).to(self.device)[None]
        emb = m.rotary_emb(h, pos)
        past = self.cache.get_seq_length()
        for layer, mask in zip(m.layers, peagle_masks(m, n_ctx, n, depths, h.dtype), strict=True):
            h = layer(
                h,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=self.cache,
                cache_position=torch.arange(past, past + n + depths, device=self.device),
                position_embeddings=emb,
            )
        crop(self.cache, n_ctx + n)  # the depth-0 rows stay, the mask rows go
        self.n_real = n_ctx + n
        return m.lm_head(m.norm(h[0, n - 1 :]))  # as its forward: lm_head(norm(h)), whatever norm_output says

    @torch.no_grad()
    def propose(self, ids, k, temperature, generator):
        self.check_step(ids)
        k = min(k, self.n_depths)  # depths beyond num_depths were never trained
        if k < 1:
            return Proposal([])
        toks = torch.tensor(ids[self.n_real + 1 :], device=self.device)
        logits = self.slot_logits(toks, self.pending, k).float()
        self.pending = self.pending[:0]
        return self.independent(logits, temperature, generator)


PROPOSER = PEagleProposer
