"""DFlash-2 at stage 05: DFlash's block pass, then the candidate selector slot by slot, as it trained.

speculators has no drafting code for DFlash-2, only its training forward; this drafts what that forward scores.
Its layers take DFlash's call and masks (the local convolutions see one block at slot positions 0..B-1, as
every training block starts at a multiple of the block size), so the block pass is `DFlashProposer`'s. Training
then scores, for slot p >= 1, the unary head's top-k candidates by `candidate_selector.score_candidates(unary_p,
hidden_p, predecessor, candidates)` with the predecessor the token before slot p (`_predecessor_ids`: the anchor
for slot 1, teacher-forced after that). Drafting feeds the token it chose at slot p-1 in that place: on every
path the verifier accepts that is the same token, so each accepted slot is scored exactly as training scored it;
a slot after a rejection is never verified. `candidate_selector.select` (speculators' own: unary top-k, then
those scores) makes each choice.
"""

from __future__ import annotations

import torch

from draftlab import DraftlabError
from draftlab.acceptance.dflash import DFlashProposer
from draftlab.acceptance.proposers import Proposal


class DFlash2Proposer(DFlashProposer):
    """Greedy: slot p emits the highest-scoring candidate. Sampling: slot p draws from softmax(scores / T) over its
    k candidates given the tokens drawn before it (q: those probabilities, zero elsewhere), so the chain of q rows
    is the distribution the draft was drawn from, as speculative sampling needs. Full vocabulary (speculators
    refuses another for DFlash-2), so candidate ids are verifier ids."""

    kind = "dflash2"

    def __init__(self, model, target_vocab: int):
        if model.config.draft_vocab_size != target_vocab or getattr(model, "d2t", None) is not None:
            raise DraftlabError(
                f"dflash2 draft with a {model.config.draft_vocab_size}-token draft vocabulary for a {target_vocab}-"
                "token verifier: its selector drafts verifier ids. Pair it with the verifier it was built for."
            )
        super().__init__(model, target_vocab)  # refuses sample_from_anchor=True and non-sdpa/eager attention

    def chain(self, anchor: int, n: int, temperature: float = 0.0, generator=None, predecessors=None):
        """(tokens, candidate ids [n, k], scores [n, k]) of slots 1..n of the block anchored at `anchor`;
        `predecessors` (n ids) feeds given tokens instead of the chosen ones (teacher forcing, for checks)."""
        hidden = self.block_hidden(anchor)
        unary = self.model.lm_head(hidden)
        prev, toks, cands, scores = anchor, [], [], []
        for p in range(1, n + 1):
            if predecessors is not None:
                prev = predecessors[p - 1]
            ids, sc = self.model.candidate_selector.select(unary[p], hidden[p], torch.tensor(prev, device=self.device))
            if temperature == 0:
                j = int(sc.argmax())
            else:
                j = int(torch.multinomial(torch.softmax(sc.float() / temperature, -1), 1, generator=generator))
            prev = int(ids[j])
            toks.append(prev)
            cands.append(ids)
            scores.append(sc)
        return toks, torch.stack(cands), torch.stack(scores)

    @torch.no_grad()
    def propose(self, ids, k, temperature, generator):
        self.check_step(ids)
        n = min(k, self.model.block_size - 1)
        toks, cands, scores = self.chain(ids[-1], n, temperature, generator)
        if temperature == 0:
            return Proposal(toks)
        q = torch.zeros(n, self.target_vocab, device=self.device)
        return Proposal(toks, q.scatter_(1, cands, torch.softmax(scores.float() / temperature, -1)))


PROPOSER = DFlash2Proposer
