"""Proposers that draft with a trained EAGLE-3 or DFlash model (stage 04), as speculators trains it.

speculators' draft models have only a training forward (a whole packed sequence, no KV cache, the
TTT steps teacher-forced), and no public drafting call. Drafting one step at a time therefore runs
their parts (`embed_tokens`, `fc` and its optional norms, `layers`, `rotary_emb`, `norm`, `lm_head`,
`config.norm_output`) itself: this module is the one place that reads those internals, in the order
their `forward` uses them. Each layer gets the mask speculators trained it with (`draft_masks`).
"""

from __future__ import annotations

import torch

from draftlab import DraftlabError
from draftlab.acceptance import draft_masks
from draftlab.acceptance.proposers import Proposal, Proposer, crop


class ModelProposer(Proposer):
    """What both model drafts share: the checks, the aux layers they read, the draft-to-target vocabulary."""

    kind = "model"

    def __init__(self, model, target_vocab: int):
        draft_masks.check_drafting(model, self.kind)
        self.model, self.target_vocab = model, target_vocab
        self.name, self.layer_ids = self.kind, list(model.target_layer_ids)
        self.device = model.fc.weight.device
        n = model.lm_head.weight.shape[0]  # draft vocabulary; without d2t it is the target's
        self.d2t = (
            model.d2t.to(self.device) if model.d2t is not None else torch.zeros(n, dtype=torch.long, device=self.device)
        )

    def _to_target(self, q: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary probabilities [..., Vd] placed at their target ids (`i + d2t[i]`); zero elsewhere."""
        full = q.new_zeros(*q.shape[:-1], self.target_vocab)
        full[..., torch.arange(q.shape[-1], device=q.device) + self.d2t] = q
        return full


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

    @torch.no_grad()
    def propose(self, ids, k, temperature, generator):
        n_new = len(self.pending)
        if self.n_real + n_new != len(ids) - 1:
            raise DraftlabError(
                f"EAGLE-3 proposer out of step: {self.n_real}+{n_new} draft "
                f"rows for {len(ids)} tokens; call reset(prompt) first."
            )
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


class DFlashProposer(ModelProposer):
    """DFlash block drafting, as speculators trains it: one block [anchor, mask, ..., mask] at positions
    anchor..anchor+B-1, where the anchor is the last committed token; its queries attend the fc-projected
    verifier aux states of the positions before the anchor (those in the window, in a sliding layer) and
    the block itself (causally in a sliding layer unless `sliding_window_non_causal`).
    Slot i predicts the token at anchor+i, so slots 1..k are the draft, all from one draft pass.
    No draft KV cache: the committed context is kept projected and re-attended each step (nothing
    speculative is stored, so nothing to roll back); at most B-1 tokens per step."""

    kind = "dflash"

    def reset(self, prompt_ids):
        hidden = self.model.config.transformer_layer_config.hidden_size
        self.ctx = torch.empty(0, hidden, device=self.device, dtype=self.model.fc.weight.dtype)

    def update(self, aux, n_kept):
        self.ctx = torch.cat(
            [self.ctx, self.model.hidden_norm(self.model.fc(aux[:n_kept].to(self.device, self.ctx.dtype)))]
        )

    def block_logits(self, anchor: int) -> torch.Tensor:
        """[B, draft vocab] logits of the block anchored at the last committed token `anchor`."""
        m, n, size = self.model, len(self.ctx), self.model.block_size
        block = torch.tensor([[anchor] + [m.mask_token_id] * (size - 1)], device=self.device)
        h = m.embed_tokens(block)
        pos = torch.arange(n + size, device=self.device)[None]  # context 0..n-1, block n..n+B-1
        emb = m.rotary_emb(h, pos)
        for layer, mask in zip(m.layers, draft_masks.dflash(m, n, h.dtype), strict=True):
            h = layer(
                target_hidden=self.ctx[None],
                hidden_states=h,
                attention_mask=mask,
                position_ids=pos,
                position_embeddings=emb,
            )
        return m.lm_head(m.norm(h))[0]

    @torch.no_grad()
    def propose(self, ids, k, temperature, generator):
        if len(self.ctx) != len(ids) - 1:
            raise DraftlabError(
                f"DFlash proposer out of step: {len(self.ctx)} context "
                f"states for {len(ids)} tokens; call reset(prompt) first."
            )
        logits = self.block_logits(ids[-1])[1 : 1 + min(k, self.model.block_size - 1)].float()
        if temperature == 0:
            idx = logits.argmax(-1)
            return Proposal((idx + self.d2t[idx]).tolist())
        q = torch.softmax(logits / temperature, -1)  # block slots are drawn independently
        idx = torch.multinomial(q, 1, generator=generator)[:, 0]
        return Proposal((idx + self.d2t[idx]).tolist(), self._to_target(q))
