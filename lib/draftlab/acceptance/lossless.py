"""Lossless: greedy speculative output is the verifier's own greedy output.

Greedy decoding is defined token by token: each emitted token is the verifier's argmax given the prompt and
every token before it, until end-of-sequence or the token budget. `greedy_check` tests exactly that in one
full forward of the verifier over prompt + output, with no KV cache: the parallel form of the definition,
independent of the cache crops and rollbacks the speculative loop makes (what the check is for), and one
pass per prompt instead of a second sequential decode of every prompt. A token that is not the argmax counts
as a near-tie when its logit is within a few machine epsilons of the maximum, relative: in bfloat16 the
(k+1)-token verify pass and the full forward round differently (in float32 it is about 5e-7 of the largest logit).
`greedy_agreement` compares two outputs at their first divergence, for vLLM's with and without a draft.
"""

from __future__ import annotations

import torch

SLACK = 4.0  # machine epsilons of the verifier's dtype, relative to the largest logit


@torch.no_grad()
def greedy_check(verifier, prompt_ids: list[int], tokens: list[int], max_new_tokens: int, slack: float = SLACK) -> dict:
    """Whether `tokens` is the verifier's greedy continuation of `prompt_ids`: every token the argmax (or a
    near-tie) of one full forward over prompt + tokens, and the output complete (the budget reached, or ended
    at end-of-sequence and not before)."""
    eos = verifier.tokenizer.eos_token_id
    n = len(prompt_ids)
    ids = torch.tensor([list(prompt_ids) + list(tokens)], device=verifier.device)
    logits = verifier.model(ids).logits[0, n - 1 : n - 1 + len(tokens)].float()
    want = torch.tensor(tokens, device=logits.device)
    top = logits.max(-1).values
    gaps = top - logits.gather(1, want[:, None])[:, 0]
    tol = slack * torch.finfo(verifier.dtype).eps * top.abs()
    off = (logits.argmax(-1) != want).nonzero()
    early_eos = eos is not None and eos in tokens[:-1]
    complete = len(tokens) == max_new_tokens or (bool(tokens) and tokens[-1] == eos)
    return {
        "tokens": len(tokens),
        "first divergence": int(off[0]) if len(off) else None,
        "divergences": len(off),
        "logit gap": float(gaps.max()) if len(tokens) else 0.0,
        "lossless": bool((gaps <= tol).all()) and complete and not early_eos,
    }


def lossless_rows(verifier, prompts: list[dict], greedy_runs: dict, max_new_tokens: int) -> list[dict]:
    """Per proposer, over all prompts: every token the verifier's argmax (identical), or a near-tie (bf16)."""
    rows = []
    for name, gens in greedy_runs.items():
        found = [greedy_check(verifier, p["ids"], g.tokens, max_new_tokens) for p, g in zip(prompts, gens, strict=True)]
        same = sum(c["divergences"] == 0 and c["lossless"] for c in found)
        rows.append(
            {
                "proposer": name,
                "prompts": len(prompts),
                "identical": same,
                "near-tie (bf16)": sum(c["lossless"] for c in found) - same,
                "lossless": sum(c["lossless"] for c in found),
                "largest logit gap": max((c["logit gap"] for c in found), default=0.0),
            }
        )
    return rows


@torch.no_grad()
def greedy_agreement(verifier, prompt_ids: list[int], got: list[int], ref: list[int], slack: float = SLACK) -> dict:
    """Greedy speculative tokens `got` against the verifier's own greedy `ref`. In float32 they must be
    identical. In bf16 the (k+1)-token verify pass and one-token decoding round differently, so a
    divergence counts as lossless only at a near-tie: the chosen token's logit, in one full forward
    over prompt + ref, within `slack` machine epsilons of the verifier's dtype (relative) of the maximum."""
    eos = verifier.tokenizer.eos_token_id
    n = next((i for i, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), None)
    if n is None:
        complete = len(got) == len(ref) or bool(got) and got[-1] == eos
        return {
            "identical tokens": min(len(got), len(ref)),
            "first divergence": None,
            "logit gap": 0.0,
            "tolerance": 0.0,
            "lossless": complete,
        }
    logits = verifier.model(torch.tensor([prompt_ids + ref[:n]], device=verifier.device)).logits[0, -1].float()
    gap = (logits.max() - logits[got[n]]).item()
    tol = slack * torch.finfo(verifier.dtype).eps * logits.max().abs().item()
    return {"identical tokens": n, "first divergence": n, "logit gap": gap, "tolerance": tol, "lossless": gap <= tol}
