"""Speculative decoding for real: a chain draft against the verifier, both with KV caches.

One *step* is one verifier pass over [last committed token, d_1..d_k]: the drafts are checked
left to right, the longest acceptable prefix is kept, and one more token (the *bonus*: the
correction after a rejection, or a free token after full acceptance) comes from the same pass.
The verifier's cache is then cropped to the kept positions and the proposer rolls its own back.
Greedy verification keeps a draft iff it is the verifier's argmax, so the output is the
verifier's own greedy text; sampling verification (Leviathan et al. 2023) accepts d with
probability min(1, p(d)/q(d)) and otherwise resamples from norm(max(0, p - q)), so every emitted
token is distributed exactly as the verifier's softmax at that temperature.
"""

from __future__ import annotations

import numbers
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from draftlab import DraftlabError
from draftlab.acceptance.proposers import Proposal, Proposer, crop
from draftlab.data.hooks import capture
from draftlab.data.verifier import check_token_ids


@dataclass
class Step:
    drafted: int  # draft tokens checked in this verifier pass
    accepted: int  # of them, the accepted prefix
    bonus: int  # the token the verifier added (always one)
    rejected: int | None = None  # the first rejected draft token, if any


@dataclass
class Generation:
    prompt_ids: list[int]
    tokens: list[int]  # emitted, the prefill token first
    labels: list[str]  # per emitted token: prefill | accepted | bonus
    steps: list[Step] = field(default_factory=list)
    settings: dict = field(default_factory=dict)


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def verify_greedy(logits: torch.Tensor, drafted: list[int]) -> tuple[int, int]:
    """(accepted, bonus): the longest prefix equal to the verifier's argmax, then its next argmax.
    logits: [d+1, V] of the pass over [last token, d_1..d_d]; the prefix is where a running product of matches is 1."""
    best = logits.argmax(-1)
    same = best[: len(drafted)] == torch.tensor(drafted, dtype=best.dtype, device=best.device)
    a = int(same.cumprod(0).sum())
    return a, int(best[a])


def verify_sampled(p: torch.Tensor, proposal: Proposal, generator: torch.Generator) -> tuple[int, int]:
    """(accepted, bonus) by rejection sampling. p: [d+1, V] verifier probabilities; proposal.q: [d, V]
    draft probabilities, or None for a deterministic proposer (q is then a point mass on the draft).
    Token by token: one uniform per checked draft, then the resample, in that order, is what a seed reproduces."""
    for i, tok in enumerate(proposal.tokens):
        q = (
            proposal.q[i]
            if proposal.q is not None
            else torch.zeros_like(p[i]).index_fill_(0, torch.tensor([tok], device=p.device), 1.0)
        )
        u = torch.rand((), generator=generator, device=generator.device).item()
        if u * float(q[tok]) < float(p[i, tok]):  # u < p/q without dividing by zero
            continue
        residual = (p[i] - q.to(p.dtype)).clamp(min=0)
        residual = residual if residual.sum() > 0 else p[i]
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    d = len(proposal.tokens)
    return d, int(torch.multinomial(p[d], 1, generator=generator))


class Verifier1Pass:
    """The verifier with a DynamicCache: one forward over new tokens, with the proposer's aux states."""

    def __init__(self, verifier, layer_ids):
        from transformers import DynamicCache

        self.v, self.layer_ids, self.cache = verifier, layer_ids, DynamicCache()

    @torch.no_grad()
    def __call__(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = torch.tensor([ids], device=self.v.device)
        with capture(self.v, self.layer_ids) if self.layer_ids else nullcontext({}) as store:
            logits = self.v.model(input_ids=x, past_key_values=self.cache, use_cache=True).logits[0]
        aux = torch.cat([store[i][0] for i in self.layer_ids], -1) if self.layer_ids else None
        return logits, aux


@torch.no_grad()
def speculative_generate(
    verifier,
    proposer: Proposer,
    prompt_ids: list[int],
    k: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    eos_id: int | None = -1,
) -> Generation:
    """Generate up to max_new_tokens with `proposer` drafting k tokens per verifier pass; eos_id=-1 means
    the tokenizer's eos, None never stops early. Returns the tokens and one `Step` per decode pass."""
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (k, max_new_tokens)):
        raise DraftlabError(
            "speculative_generate needs whole numbers for k and "
            f"max_new_tokens (got k={k!r}, max_new_tokens={max_new_tokens!r})."
        )
    if k < 0 or max_new_tokens < 1 or not prompt_ids:
        raise DraftlabError(
            f"speculative_generate needs k >= 0, max_new_tokens >= 1 and a prompt (got k={k}, "
            f"max_new_tokens={max_new_tokens}, {len(prompt_ids)} prompt tokens)."
        )
    odd = [t for t in prompt_ids if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
    if odd:
        raise DraftlabError(f"speculative_generate: prompt_ids holds {odd[0]!r}, not a token id (a whole number).")
    check_token_ids(
        verifier,
        {"prompt_ids": [int(t) for t in prompt_ids]},
        "speculative_generate",
        "tokenize the prompt with this verifier's tokenizer (the one saved with the model).",
    )
    limit = getattr(verifier.config, "max_position_embeddings", None)
    if limit and len(prompt_ids) + max_new_tokens > limit:
        import warnings

        warnings.warn(
            f"a prompt of {len(prompt_ids)} tokens plus {max_new_tokens} new ones passes the verifier's position limit "
            f"({limit}): past it its outputs are not what it was "
            "trained to give. Shorten the prompt or max_new_tokens.",
            stacklevel=2,
        )
    if temperature < 0:
        raise DraftlabError(f"temperature={temperature} must be >= 0 (0 means greedy verification).")
    eos_id = verifier.tokenizer.eos_token_id if eos_id == -1 else eos_id
    gen = torch.Generator(device=verifier.device).manual_seed(seed)
    run = Verifier1Pass(verifier, proposer.layer_ids)
    proposer.reset(list(prompt_ids))
    logits, aux = run(list(prompt_ids))  # prefill: one pass, one token, no draft
    first = (
        int(logits[-1].argmax())
        if temperature == 0
        else int(torch.multinomial(probs(logits[-1], temperature), 1, generator=gen))
    )
    proposer.update(aux, len(prompt_ids))
    ids = [*prompt_ids, first]
    out = Generation(
        list(prompt_ids),
        [first],
        ["prefill"],
        settings={"proposer": proposer.name, "topology": "chain", "k": k, "temperature": temperature, "seed": seed},
    )
    while len(out.tokens) < max_new_tokens and out.tokens[-1] != eos_id:
        room = min(k, max_new_tokens - len(out.tokens) - 1)
        prop = proposer.propose(ids, room, temperature, gen) if room > 0 else Proposal([])
        prop = Proposal(prop.tokens[:room], None if prop.q is None else prop.q[:room])
        logits, aux = run([ids[-1], *prop.tokens])
        if temperature == 0:
            a, bonus = verify_greedy(logits, prop.tokens)
        else:
            a, bonus = verify_sampled(probs(logits, temperature), prop, gen)
        crop(run.cache, len(ids) + a)  # keep the committed tokens and the accepted drafts
        proposer.update(aux, a + 1)
        new = [*prop.tokens[:a], bonus]
        if eos_id is not None and eos_id in new:
            new = new[: new.index(eos_id) + 1]
        out.steps.append(Step(len(prop.tokens), a, bonus, prop.tokens[a] if a < len(prop.tokens) else None))
        out.labels += ["accepted"] * min(a, len(new)) + ["bonus"] * (len(new) > a)
        out.tokens += new
        ids += new
    return out


def metrics(steps: list[Step], k: int) -> dict:
    """tau, acceptance rate, alpha_n and the accepted-length histogram over decode steps (prefill excluded)."""
    if not steps:
        raise DraftlabError("no decode steps to measure: raise max_new_tokens above 1.")
    n = len(steps)
    drafted = sum(s.drafted for s in steps)
    accepted = sum(s.accepted for s in steps)
    alpha = []
    for pos in range(1, k + 1):
        reached = sum(1 for s in steps if s.drafted >= pos and s.accepted >= pos - 1)
        alpha.append(sum(1 for s in steps if s.accepted >= pos) / reached if reached else None)
    hist = [sum(1 for s in steps if s.accepted == a) for a in range(k + 1)]
    return {
        "tau": (accepted + n) / n,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "alpha_n": alpha,
        "accepted_hist": hist,
        "steps": n,
        "drafted": drafted,
        "accepted": accepted,
        "mean_drafted": drafted / n,
    }
