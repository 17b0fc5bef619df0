"""XPress at stage 05: DFlash's block, then the causal refiner resolved by Jacobi passes, as it trained.

speculators' `XPressDraftModel.forward` scores, for the block anchored at a: the backbone's logits `base`
(DFlash's block), one teacher-forced refiner pass (slot k's previous token is the data token a+k-1, slot 0's the
token before the anchor in its document, or the anchor itself at a document start), and `consistency_passes`
free-running rounds: round 0 feeds the refiner the backbone's argmax, each later round the previous round's
argmax, slot 0 pinned to the anchor. Drafting runs that same recurrence, `num_jacobi_passes` times (the value
the config stores for an engine): pass j's logits are training's round j's wherever both run, and when the
drafted prefix is right, a slot's logits are the teacher-forced ones training scored.

The mixer is causal and everything else in the head works per slot, so slot k settles after k passes:
with fewer passes than block_size-1 the last slots may differ from slot-by-slot greedy; that stays lossless
(the verifier decides every token) and is what the engine drafts. Sampling (temperature > 0) cannot use the
Jacobi fixpoint's q, so it draws slot by slot instead (one refiner pass per slot, slot k conditioned on the
tokens drawn before it, exactly the teacher-forced distribution training scores): each q is the distribution
its token came from, which speculative sampling needs to stay exact.
"""

from __future__ import annotations

import torch

from draftlab import DraftlabError
from draftlab.acceptance.dflash import DFlashProposer
from draftlab.acceptance.proposers import Proposal


class XPressProposer(DFlashProposer):
    """DFlash's block drafting (context, masks, slots after the anchor), plus XPress's refiner over the block.
    `passes`: Jacobi passes per block (None: the config's `num_jacobi_passes`)."""

    kind = "xpress"

    def __init__(self, model, target_vocab: int, passes: int | None = None):
        super().__init__(model, target_vocab)  # sample_from_anchor=True and non-dense attention are refused there
        tril = model.refiner_head.causal_tril
        if not torch.equal(tril, torch.tril(torch.ones_like(tril))):
            raise DraftlabError(
                "xpress draft whose refiner_head.causal_tril is not the causal mask (tril of ones): speculators' "
                "from_pretrained leaves that non-persistent buffer uninitialised. Load the checkpoint with "
                "`proposers.load_draft`, which restores it (training.checkpoint.load_model)."
            )
        self.passes = int(model.config.num_jacobi_passes if passes is None else passes)
        if self.passes < 0:
            raise DraftlabError(f"xpress passes={self.passes}: Jacobi passes are a count, 0 or more.")

    def _target(self, idx: torch.Tensor) -> torch.Tensor:
        return idx + self.d2t[idx]

    def _prev(self, before: int, anchor: int, slots: torch.Tensor) -> torch.Tensor:
        """[1, B] previous tokens: `before` for slot 0, then the anchor and slots 1..B-2's tokens."""
        return torch.cat([slots.new_tensor([before, anchor]), slots[1:-1]])[None]

    def refine(self, hidden, anchor: int, before: int, prev=None, passes: int | None = None):
        """(base logits [B, Vd], [refined logits [B, Vd] per pass]). `prev` [B] given: one teacher-forced pass
        with those previous tokens; else the Jacobi recurrence from the base argmax, `passes` times."""
        rh = self.model.refiner_head
        base = self.model.lm_head(hidden)
        cache = rh.hidden_cache(hidden[None].to(rh.down_h.weight.dtype))
        if prev is not None:
            return base, [base + rh.block_bias(prev[None], hcache=cache)[0]]
        pred, outs = self._target(base.argmax(-1)), []
        for _ in range(self.passes if passes is None else passes):
            outs.append(base + rh.block_bias(self._prev(before, anchor, pred), hcache=cache)[0])
            pred = self._target(outs[-1].argmax(-1))
        return base, outs

    def sequential(self, hidden, anchor: int, before: int, n: int, temperature: float, generator):
        """Slots 1..n drawn one at a time, each from its refined logits given the tokens drawn before it:
        (target ids, q [n, Vd])."""
        rh = self.model.refiner_head
        base = self.model.lm_head(hidden)
        cache = rh.hidden_cache(hidden[None].to(rh.down_h.weight.dtype))
        slots = torch.full((self.model.block_size,), anchor, dtype=torch.long, device=self.device)
        qs = []
        for k in range(1, n + 1):  # slot k reads prev[0..k] only: the slots after it are placeholders
            logits = (base[k] + rh.block_bias(self._prev(before, anchor, slots), hcache=cache)[0, k]).float()
            qs.append(torch.softmax(logits / temperature, -1))
            slots[k] = self._target(torch.multinomial(qs[-1], 1, generator=generator))[0]
        return slots[1 : n + 1].tolist(), torch.stack(qs)

    @torch.no_grad()
    def propose(self, ids, k, temperature, generator):
        self.check_step(ids)
        n = min(k, self.model.block_size - 1)
        if n < 1:
            return Proposal([])
        anchor, before = ids[-1], ids[-2] if len(ids) > 1 else ids[-1]  # training's rule at a document start
        hidden = self.block_hidden(anchor)
        if temperature == 0:
            base, outs = self.refine(hidden, anchor, before)
            return Proposal(self._target((outs[-1] if outs else base)[1 : 1 + n].argmax(-1)).tolist())
        tokens, q = self.sequential(hidden, anchor, before, n, temperature, generator)
        return Proposal(tokens, self._to_target(q))


PROPOSER = XPressProposer
