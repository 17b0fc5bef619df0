"""Served speed-up with an interval: the same prompts through vLLM with and without a draft.

With one request in flight every response carries its own seconds, and the prompts are the same on both sides, so
the speed-up (tokens per second with the draft over tokens per second without) gets a paired bootstrap over prompts.
With several in flight the requests overlap and only the workload's wall time means anything: there the workload
is repeated, and the interval is the spread of the ratios of its repeats.
"""

from __future__ import annotations

import numpy as np

from draftlab.acceptance.bootstrap import percentile_interval, resample_weights


def paired_over_prompts(plain: list[dict], spec: list[dict], n_boot: int = 2000, seed: int = 0) -> dict:
    """`plain`, `spec`: the responses of one workload (`workload.run(...)["outputs"]`, one in flight) on the same
    prompts in the same order, each with its token ids and seconds. The pooled ratio and its 95% interval."""
    if len(plain) != len(spec) or not plain:
        raise ValueError(f"paired speed-up needs the same prompts on both sides ({len(plain)} and {len(spec)})")
    tok = np.array([[len(o["token_ids"]) for o in side] for side in (plain, spec)], dtype=float)
    sec = np.array([[o["seconds"] for o in side] for side in (plain, spec)], dtype=float)
    w = resample_weights(len(plain), n_boot, np.random.default_rng(seed))  # [n_boot, n] prompt multiplicities

    def ratio(weights):
        rates = (weights @ tok.T) / (weights @ sec.T)  # [.., 2] tokens/s without and with the draft
        return rates[..., 1] / rates[..., 0]

    lo, hi = percentile_interval(ratio(w))
    return {
        "value": float(ratio(np.ones(len(plain)))),
        "low": lo,
        "high": hi,
        "n_prompts": len(plain),
        "rule": "paired bootstrap over prompts",
    }


def over_repeats(plain_tps: list[float], spec_tps: list[float]) -> dict:
    """The median ratio of repeated workloads (each repeat of one side against each of the other) and its range."""
    ratios = sorted(s / p for p in plain_tps for s in spec_tps)
    return {
        "value": float(np.median(ratios)),
        "low": ratios[0],
        "high": ratios[-1],
        "repeats": len(spec_tps),
        "rule": "median and range over repeats",
    }
