"""What every model proposer shares: drafting with a trained draft (stage 04) as speculators trains it.

speculators' draft models have only a training forward (a whole packed sequence, no KV cache, the
TTT steps teacher-forced), and no public drafting call. Drafting one step at a time therefore runs
their parts (`embed_tokens`, `fc` and its optional norms, `layers`, `rotary_emb`, `norm`, `lm_head`,
`config.norm_output`) itself: each family's module (`acceptance/<family>.py`) reads those internals, in the
order its `forward` uses them, and draws its `PROPOSER` from here. Each layer gets the mask speculators trained
it with (`draft_masks`).
"""

from __future__ import annotations

import torch

from draftlab.acceptance import draft_masks
from draftlab.acceptance.proposers import Proposal, Proposer


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

    def independent(self, logits: torch.Tensor, temperature: float, generator) -> Proposal:
        """A proposal from [n, draft vocab] logits whose slots do not depend on one another (DFlash's block, P-EAGLE's
        depths): argmax each, or draw each from softmax(logits / T) with that row as its q."""
        if temperature == 0:
            idx = logits.argmax(-1)
            return Proposal((idx + self.d2t[idx]).tolist())
        q = torch.softmax(logits / temperature, -1)
        idx = torch.multinomial(q, 1, generator=generator)[:, 0]
        return Proposal((idx + self.d2t[idx]).tolist(), self._to_target(q))
