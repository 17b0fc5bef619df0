"""vLLM's speculative-decoding counters, read from `/metrics`, on draftlab's names.

vLLM counts, per engine, drafts (verifier passes that checked a draft), draft tokens, accepted
tokens, and accepted tokens per draft position; the counters are cumulative, so a workload's
figures are the difference of `/metrics` read before and after it (parsed with prometheus_client).
In vLLM's convention the mean acceptance length is `1 + accepted / drafts` (the bonus token
included): draftlab's tau on the same definition. vLLM's per-position figure is unconditional
(drafts whose position i was accepted / drafts); draftlab's alpha_n is conditional (given
positions 1..n-1 accepted). Both are given on both definitions here.
"""

from __future__ import annotations

from draftlab import DraftlabError

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counters(text: str) -> dict:
    """vLLM's speculative-decoding counters from a /metrics page, summed over engines."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {key: 0.0 for key in COUNTERS}
    per_pos: dict[int, float] = {}
    names = {name: key for key, name in COUNTERS.items()}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.endswith("_total"):
                continue
            base = s.name.removesuffix("_total")
            if base in names:
                out[names[base]] += s.value
            elif base == PER_POS:
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
    out["per_pos"] = [per_pos[i] for i in sorted(per_pos)]
    return out


def delta(before: dict, after: dict) -> dict:
    out = {k: after[k] - before[k] for k in COUNTERS}
    width = max(len(after["per_pos"]), len(before["per_pos"]))
    pad = lambda xs: xs + [0.0] * (width - len(xs))  # noqa: E731
    out["per_pos"] = [a - b for a, b in zip(pad(after["per_pos"]), pad(before["per_pos"]), strict=True)]
    return out


def conditional(unconditional: list[float]) -> list[float | None]:
    """P(position i accepted | 1..i-1 accepted) from P(1..i accepted): a ratio of neighbours."""
    prev, out = 1.0, []
    for u in unconditional:
        out.append(u / prev if prev > 0 else None)
        prev = u
    return out


def served_metrics(counts: dict) -> dict:
    """vLLM's figures on draftlab's names: tau, acceptance rate, per position both ways."""
    n = counts["drafts"]
    if n <= 0:
        raise DraftlabError(
            "vLLM counted no drafts for this workload: raise max_new_tokens above 1, or check that the "
            "server was started with the draft (its log names the speculative config)."
        )
    uncond = [c / n for c in counts["per_pos"]]
    return {
        "tau": 1 + counts["accepted"] / n,
        "acceptance_rate": counts["accepted"] / max(counts["draft_tokens"], 1.0),
        "per_position_unconditional": uncond,
        "alpha_n": conditional(uncond),
        "drafts": n,
        "draft_tokens": counts["draft_tokens"],
        "accepted": counts["accepted"],
    }


def loop_unconditional(steps, k: int) -> list[float]:
    """draftlab's steps on vLLM's per-position definition: steps with at least i accepted / steps."""
    return [sum(s.accepted >= i for s in steps) / len(steps) for i in range(1, k + 1)]
