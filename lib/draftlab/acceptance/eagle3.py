"""EAGLE-3 at stage 05: chain drafting with the draft's own KV cache, one token per step, as it trained."""

from __future__ import annotations

import torch

from draftlab import DraftlabError
from draftlab.acceptance import draft_masks
from draftlab.acceptance.model_proposers import ModelProposer
from draftlab.acceptance.proposers import Proposal, crop


class Eagle3Proposer(ModelProposer):
    """EAGLE-3 chain drafting with its own KV cache, aligned as speculators trains it (`shift_batch`):
    draft row t pairs token x[t+1] with the verifier's aux states of position t (fc over the
    concatenated aux slots) at position id t+1. Chain positions after the first are fed the draft's
    own decoder output (pre-norm, or post-norm when the config says `norm_output`), as in the TTT steps."""

    kind = "eagle3"

    def reset(self, prompt_ids):
        from transformers import DynamicCache

        self.cache = DynamicCache()  # every position kept: the sliding window is the mask's, as in training
        self.n_real = 0  # draft rows in the cache fed with verifier states
        self.pending = torch.empty(0, self.model.fc.in_features, device=self.device, dtype=self.model.fc.weight.dtype)

    def _rows(self, tokens: torch.Tensor, hidden: torch.Tensor, start: int, step: int) -> torch.Tensor:
        """Run len(tokens) rows at positions start+1... through the decoder layers, appending to the cache;
        step 0 for rows fed with verifier states, i for the chain's TTT step i (`draft_masks.eagle3`)."""
        m = self.model
        n = len(tokens)
        h = torch.cat([m.embed_tokens(tokens[None]), hidden[None]], dim=-1)
        past = self.cache.get_seq_length()
        pos = torch.arange(start + 1, start + 1 + n, device=self.device)[None]
        masks = draft_masks.eagle3(m, self.n_real, n, step, h.dtype)
        emb = m.rotary_emb(h, pos)
        for layer, mask in zip(m.layers, masks, strict=True):
            h = layer(
                h,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=self.cache,
                cache_position=torch.arange(past, past + n, device=self.device),
                position_embeddings=emb,
            )
        return h[0]

    def _head(self, h: torch.Tensor):
        m = self.model
        if m.config.norm_output:
            h = m.norm(h)
            return m.lm_head(h), h
        return m.lm_head(m.norm(h)), h

    def _prep(self, aux):
        """speculators' optional input norms before fc (off by default), as in its forward."""
        m = self.model
        if m.input_norm is not None:
            aux = m.input_norm(aux)
        if m.fc_norm is not None:
            aux = torch.cat([nm(c) for nm, c in zip(m.fc_norm, aux.chunk(len(m.fc_norm), -1), strict=True)], -1)
        return m.fc(aux)

    def check_step(self, ids) -> None:
        """Refuse a call out of step with the rows fed (or queued) with verifier states: one per token but the last."""
        if self.n_real + len(self.pending) != len(ids) - 1:
            raise DraftlabError(
                f"{self.kind} proposer out of step: {self.n_real}+{len(self.pending)} draft rows for {len(ids)} "
                "tokens; call reset(prompt) first."
            )

    @torch.no_grad()
    def propose(self, ids, k, temperature, generator):
        self.check_step(ids)
        toks = torch.tensor(ids[self.n_real + 1 :], device=self.device)
        h = self._rows(toks, self._prep(self.pending), self.n_real, 0)[-1:]
        self.n_real, self.pending = len(ids) - 1, self.pending[:0]
        out, qs = [], []
        for i in range(k):
            logits, h = self._head(h)
            q = torch.softmax(logits[-1].float() / max(temperature, 1e-6), -1) if temperature > 0 else None
            idx = int(torch.multinomial(q, 1, generator=generator)) if q is not None else int(logits[-1].argmax())
            tok = idx + int(self.d2t[idx])
            out.append(tok)
            if q is not None:
                qs.append(self._to_target(q))
            if i + 1 < k:
                h = self._rows(torch.tensor([tok], device=self.device), h, len(ids) - 1 + i, i + 1)
        return Proposal(out, torch.stack(qs) if qs else None)

    def update(self, aux, n_kept):
        """Drop the speculative rows (crop to the rows fed with verifier states); queue the kept aux states."""
        crop(self.cache, self.n_real)
        self.pending = torch.cat([self.pending, aux[:n_kept].to(self.device, self.pending.dtype)])


PROPOSER = Eagle3Proposer
