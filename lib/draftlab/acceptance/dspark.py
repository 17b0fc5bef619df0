"""DSpark at stage 05: DFlash's block pass, then the Markov head slot by slot, each slot reading the token drafted
by the slot before, as it trained.

In training speculators feeds the Markov head the block's true tokens (teacher forcing): slot k's bias reads the
token just before the one slot k drafts. Drafting has no true tokens: the token before slot k's is the anchor or
the draft of an earlier slot, so the slots are resolved in order. The backbone does not depend on them (its block
inputs are the anchor and mask tokens only), so one DFlash pass serves the whole block; only the head runs per slot.
"""

from __future__ import annotations

import torch

from draftlab.acceptance.dflash import DFlashProposer
from draftlab.acceptance.proposers import Proposal


class DSparkProposer(DFlashProposer):
    """DSpark block drafting. With `sample_from_anchor` (speculators' DSpark default) slot k drafts the token at
    anchor+k+1 and its bias reads the token at anchor+k: up to B drafts per step. Without it slot k drafts
    anchor+k (slot 0 is the anchor, no draft) and reads anchor+k-1: up to B-1, as DFlash.

    Each slot's logits are the block's lm_head logits plus speculators' `MarkovHead.block_bias` over the slots up
    to it (the rnn head's recurrent state runs over them as in training; vanilla and gated read only the last).
    The previous token is a verifier-vocabulary id (`markov_w1` indexes the verifier's vocabulary, as training's
    input ids do): a draft-vocabulary draft i is the target id i + d2t[i]. Sampling draws slot by slot, so each
    slot's `q` is conditional on the drafts before it, which is what sequential verification needs. The
    confidence head is not used: the loop drafts a fixed k."""

    kind = "dspark"
    drafts_anchor_slot = True  # with sample_from_anchor (its default) the anchor's slot drafts too, by design

    def prev_slot(self, slot: int) -> int:
        """Index into [anchor, token at anchor+1, ...] of the token slot `slot`'s bias reads."""
        return slot if self.model.config.sample_from_anchor else max(slot - 1, 0)

    def draft_block(self, anchor: int, k: int, temperature: float = 0.0, generator=None, forced=None):
        """(drafted target ids, [n_slots, draft vocab] Markov-corrected logits of every slot run, their q).
        `forced`: the target ids at anchor+1, ... fed to the head instead of the drafts (teacher forcing, as
        training does; for parity checks). Stops after k drafts or at the block's end."""
        m = self.model
        hidden = self.block_hidden(anchor)  # DFlash's block pass, the states its lm_head reads
        base = m.lm_head(hidden)
        first = 0 if m.config.sample_from_anchor else 1
        seq = [anchor]  # target ids at anchor, anchor+1, ...
        out, logits, qs = [], [], []
        for slot in range(m.block_size):
            if len(out) == k:
                break
            slot_logits = base[slot]
            if m.markov_head is not None:
                prev = torch.tensor([[seq[self.prev_slot(s)] for s in range(slot + 1)]], device=self.device)
                bias = m.markov_head.block_bias(prev_token_ids=prev, hidden_states=hidden[None, : slot + 1])
                slot_logits = slot_logits + bias[0, -1]
            logits.append(slot_logits)
            if slot < first:
                continue
            if temperature > 0:
                q = torch.softmax(slot_logits.float() / temperature, -1)
                idx = int(torch.multinomial(q, 1, generator=generator))
                qs.append(self._to_target(q))
            else:
                idx = int(slot_logits.argmax())
            out.append(idx + int(self.d2t[idx]))
            seq.append(int(forced[len(seq) - 1]) if forced is not None else out[-1])
        return out, torch.stack(logits), qs

    @torch.no_grad()
    def propose(self, ids, k, temperature, generator):
        self.check_step(ids)
        tokens, _, qs = self.draft_block(ids[-1], k, temperature, generator)
        return Proposal(tokens, torch.stack(qs) if qs else None)


PROPOSER = DSparkProposer
