"""Acceptance against context depth: where in the context a verifier pass begins, bucketed.

A draft trained on packs of a fixed length has seen few positions beyond it, so its acceptance may
fall once a generation runs deeper; a single tau over whole generations hides that. Each bucket is
measured on the pooled rule, with a bootstrap over the prompts that reach it: a prompt that has no
step in a bucket is absent from that bucket rather than counted as a zero.
"""

from __future__ import annotations

import math

import numpy as np

from draftlab import DraftlabError
from draftlab.acceptance.bootstrap import percentile_interval, plain, prompt_sums, resample_weights, statistic
from draftlab.acceptance.intervals import POOLED


def depth_edges(table) -> list[float]:
    """Powers of two from just below the shallowest step start to just above the deepest: on a log2 axis
    every bucket is as wide as the next."""
    starts = [s.start for steps in table for s in steps]
    if not starts:
        raise DraftlabError("the step table holds no decode steps: raise max_new_tokens above 1.")
    lo = math.floor(math.log2(max(min(starts), 1)))
    hi = math.ceil(math.log2(max(starts) + 1))
    return [float(2**e) for e in range(lo, max(hi, lo + 1) + 1)]


def by_depth(table, edges, n_boot: int = 2000, seed: int = 0, level: float = 0.95, min_prompts: int = 2) -> dict:
    """Per bucket [edges[b], edges[b+1]) of step start: steps, prompts, pooled tau and p_1 (steps accepting
    the first draft / steps), each with an interval over the bucket's prompts; a bucket reached by fewer than
    `min_prompts` prompts gets none (lo and hi None). An infinite edge is written as None."""
    edges = [float(e) for e in edges]
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise DraftlabError(f"depth edges {edges} must be at least two, strictly increasing (e.g. [0, 128, inf]).")
    n_buckets = len(edges) - 1
    in_bucket = [[[] for _ in table] for _ in range(n_buckets)]  # per bucket, per prompt, its steps there
    outside = 0
    for p, steps in enumerate(table):
        for s in steps:
            b = int(np.searchsorted(edges, s.start, side="right")) - 1
            if not 0 <= b < n_buckets:
                outside += 1
                continue
            in_bucket[b][p].append(s)
    rng = np.random.default_rng(seed)
    buckets = []
    for b in range(n_buckets):
        sums = prompt_sums(in_bucket[b], 1)  # steps, accepted, drafted, steps accepting the first draft
        here = sums[sums[:, 0] > 0]
        lo_edge, hi_edge = edges[b], edges[b + 1]
        row = {
            "lo": plain(lo_edge),
            "hi": plain(hi_edge),
            "x": _where(lo_edge, hi_edge, [s.start for steps in in_bucket[b] for s in steps]),
            "n_steps": int(here[:, 0].sum()),
            "n_prompts": len(here),
        }
        boot = resample_weights(len(here), n_boot, rng) @ here if len(here) >= min_prompts else None
        for stat in ("tau", "p_1"):
            lo, hi = percentile_interval(statistic(boot, stat), level) if boot is not None else (None, None)
            row[stat] = {"value": plain(statistic(here.sum(0), stat)) if len(here) else None, "lo": lo, "hi": hi}
        buckets.append(row)
    return {
        "rule": POOLED,
        "level": level,
        "n_boot": n_boot,
        "seed": seed,
        "min_prompts": min_prompts,
        "edges": [plain(e) for e in edges],
        "n_steps_outside": outside,
        "buckets": buckets,
    }


def _where(lo: float, hi: float, starts: list[int]) -> float | None:
    """Where a plot puts a bucket: its midpoint, or for an open-ended bucket the median start of its steps."""
    if math.isfinite(lo) and math.isfinite(hi):
        return (lo + hi) / 2
    return float(np.median(starts)) if starts else None
