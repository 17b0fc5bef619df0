"""DFlash at stage 05: a block drafted in one pass after the last committed token, as it trained."""

from __future__ import annotations

import torch

from draftlab import DraftlabError
from draftlab.acceptance import draft_masks
from draftlab.acceptance.model_proposers import ModelProposer


class DFlashProposer(ModelProposer):
    """DFlash block drafting, as speculators trains it: one block [anchor, mask, ..., mask] at positions
    anchor..anchor+B-1, where the anchor is the last committed token; its queries attend the fc-projected
    verifier aux states of the positions before the anchor (those in the window, in a sliding layer) and
    the block itself (causally in a sliding layer unless `sliding_window_non_causal`).
    Slot i predicts the token at anchor+i, so slots 1..k are the draft, all from one draft pass.
    No draft KV cache: the committed context is kept projected and re-attended each step (nothing
    speculative is stored, so nothing to roll back); at most B-1 tokens per step."""

    kind = "dflash"
    drafts_anchor_slot = False  # slot 0 is the anchor itself: a draft trained to predict from it is refused

    def __init__(self, model, target_vocab: int):
        if model.config.sample_from_anchor and not self.drafts_anchor_slot:
            raise DraftlabError(
                f"{self.kind} draft trained with sample_from_anchor=True (its anchor slot predicts too): this proposer "
                "drafts slots 1.. after the anchor only. Train with sample_from_anchor=False (speculators' DFlash "
                "default)."
            )
        super().__init__(model, target_vocab)

    def check_step(self, ids) -> None:
        """Refuse a call out of step with the context states it holds (one per committed token but the last)."""
        if len(self.ctx) != len(ids) - 1:
            raise DraftlabError(
                f"{self.kind} proposer out of step: {len(self.ctx)} context states for {len(ids)} tokens; call "
                "reset(prompt) first."
            )

    def reset(self, prompt_ids):
        hidden = self.model.config.transformer_layer_config.hidden_size
        self.ctx = torch.empty(0, hidden, device=self.device, dtype=self.model.fc.weight.dtype)

    def update(self, aux, n_kept):
        self.ctx = torch.cat(
            [self.ctx, self.model.hidden_norm(self.model.fc(aux[:n_kept].to(self.device, self.ctx.dtype)))]
        )

    def block_logits(self, anchor: int) -> torch.Tensor:
        """[B, draft vocab] logits of the block anchored at the last committed token `anchor`."""
        return self.model.lm_head(self.block_hidden(anchor))

    def block_hidden(self, anchor: int) -> torch.Tensor:
        """[B, hidden]: the block's last-layer states after the final norm, what `lm_head` (and a family's extra
        heads over the block: DFlash-2's selector, XPress's refiner) read."""
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
        return m.norm(h)[0]

    @torch.no_grad()
    def propose(self, ids, k, temperature, generator):
        self.check_step(ids)
        logits = self.block_logits(ids[-1])[1 : 1 + min(k, self.model.block_size - 1)].float()
        return self.independent(logits, temperature, generator)  # block slots are drawn independently


PROPOSER = DFlashProposer
