"""The bootstrap over prompts behind `intervals` and `depth`: per-prompt sums, resamples as weights.

A resample of prompts changes only how often each prompt counts, and every statistic here is a ratio
of column sums, so a whole set of resamples is one matrix product of draw counts with the per-prompt
sums rather than a Python loop over resamples.
"""

from __future__ import annotations

import math
import re

import numpy as np

from draftlab import DraftlabError


def resample_weights(n: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """[n_boot, n]: how many times each of n prompts is drawn in each resample (with replacement), so a
    resample's sums are one matrix product with the per-prompt sums instead of a Python loop."""
    idx = rng.integers(0, n, size=(n_boot, n)) + n * np.arange(n_boot)[:, None]
    return np.bincount(idx.ravel(), minlength=n_boot * n).reshape(n_boot, n).astype(float)


def percentile_interval(samples: np.ndarray, level: float = 0.95) -> tuple[float | None, float | None]:
    """The percentile bootstrap interval; resamples where the statistic is undefined are left out."""
    s = samples[np.isfinite(samples)]
    if not s.size:
        return None, None
    q = 50 * (1 - level)
    lo, hi = np.percentile(s, [q, 100 - q])
    return float(lo), float(hi)


def plain(x) -> float | None:
    """A float for JSON, None where undefined (JSON has no NaN)."""
    return float(x) if x is not None and math.isfinite(x) else None


def position(stat: str) -> int:
    """How many per-position columns `stat` needs; refuses an unknown name."""
    if stat in ("tau", "acceptance_rate"):
        return 0
    if m := re.fullmatch(r"p_([1-9][0-9]*)", stat):
        return int(m.group(1))
    raise DraftlabError(f"unknown statistic {stat!r}: use 'tau', 'acceptance_rate' or 'p_<i>' (e.g. 'p_1').")


def prompt_sums(table, k: int) -> np.ndarray:
    """[prompts, 3 + k]: steps, accepted, drafted, then the steps with at least i accepted, i = 1..k."""
    out = np.zeros((len(table), 3 + k))
    for p, steps in enumerate(table):
        if steps:
            acc = np.array([s.accepted for s in steps])
            out[p, :3] = len(steps), acc.sum(), sum(s.drafted for s in steps)
            out[p, 3:] = (acc[:, None] >= np.arange(1, k + 1)).sum(0)
    return out


def statistic(sums: np.ndarray, stat: str) -> np.ndarray:
    """`stat` of summed columns (any leading shape); NaN where its denominator is 0."""
    steps, accepted, drafted = sums[..., 0], sums[..., 1], sums[..., 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        if stat == "tau":
            return 1 + accepted / steps
        if stat == "acceptance_rate":
            return accepted / drafted
        return sums[..., 2 + position(stat)] / steps
