"""Acceptance figures with intervals over prompts, a named pooling rule, and paired comparisons.

Everything here reads a *step table*: per prompt, its verifier passes in order, each a `StepRecord`
(where in the context it began, how many draft tokens it checked, how many it accepted). draftlab's
loop and vLLM's per-request figures both become one, so both engines are measured by the same code.

Two pooling rules answer different questions and part ways when prompts generate different numbers
of steps, so every output names the one it used: *pooled* (vLLM's counters: one sum over every step
of every prompt, a long generation weighing more; the headline) and *per-request mean* (SpecForge's:
each prompt's own figure, then their mean, every prompt weighing the same). Intervals resample
prompts, not steps: the steps of one prompt share its text, so they are not independent draws.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from draftlab import DraftlabError
from draftlab.acceptance.bootstrap import percentile_interval, plain, position, prompt_sums, resample_weights, statistic

POOLED, PER_REQUEST = "pooled", "per_request_mean"
RULES = {
    POOLED: "vLLM's convention: sums over every step of every prompt (tau = 1 + accepted / steps)",
    PER_REQUEST: "SpecForge's convention: each prompt's own figure, then the mean over prompts with a step",
}
SAME = "not distinguishable at this sample size"


class StepRecord(NamedTuple):
    start: int  # context length (prompt + tokens emitted so far) where this verifier pass begins
    drafted: int  # draft tokens checked
    accepted: int  # the accepted prefix, 0..drafted


def step_table(generations) -> list[list[StepRecord]]:
    """The step table of the loop's `speculative.Generation`s, one row of steps per prompt."""
    return step_table_from_arrays(
        [len(g.prompt_ids) for g in generations],
        [[s.accepted for s in g.steps] for g in generations],
        [[s.drafted for s in g.steps] for g in generations],
    )


def step_table_from_arrays(prompt_lens, accepted_lists, drafted_lists) -> list[list[StepRecord]]:
    """The step table of per-request, per-step accepted / drafted counts (vLLM's detailed figures).
    The prefill emits one token and each step `accepted + 1`, which fixes where each step starts."""
    if not len(prompt_lens) == len(accepted_lists) == len(drafted_lists):
        raise DraftlabError(
            f"step table: {len(prompt_lens)} prompt lengths, {len(accepted_lists)} accepted lists and "
            f"{len(drafted_lists)} drafted lists; pass one of each per request, in the same order."
        )
    table = []
    for i, (n, accepted, drafted) in enumerate(zip(prompt_lens, accepted_lists, drafted_lists, strict=True)):
        if len(accepted) != len(drafted):
            raise DraftlabError(
                f"step table: request {i} has {len(accepted)} accepted counts but {len(drafted)} drafted "
                "counts; both must list every verifier pass of the request, in order."
            )
        start, rows = int(n) + 1, []
        for a, d in zip(accepted, drafted, strict=True):
            if not 0 <= int(a) <= int(d):
                raise DraftlabError(
                    f"step table: request {i} step {len(rows)} accepted {a} of {d} drafted tokens; "
                    "accepted must lie in 0..drafted (are the two lists swapped?)."
                )
            rows.append(StepRecord(start, int(d), int(a)))
            start += int(a) + 1
        table.append(rows)
    return table


def _pooled(sums: np.ndarray, boot: np.ndarray, stat: str, level: float) -> dict:
    lo, hi = percentile_interval(statistic(boot, stat), level)
    return {"value": plain(statistic(sums.sum(0), stat)), "lo": lo, "hi": hi}


def _per_request(sums: np.ndarray, weights: np.ndarray, stat: str, level: float) -> dict:
    """Mean over prompts where `stat` is defined. Centred on the median prompt so that identical prompts
    give exactly their own value, with no rounding, in every resample."""
    x = statistic(sums, stat)
    ok = np.isfinite(x)
    if not ok.any():
        return {"value": None, "lo": None, "hi": None, "n_prompts": 0}
    c = float(np.median(x[ok]))
    dev = np.where(ok, x - c, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = c + (weights @ dev) / (weights @ ok.astype(float))
    lo, hi = percentile_interval(boot, level)
    return {"value": c + float(dev[ok].mean()), "lo": lo, "hi": hi, "n_prompts": int(ok.sum())}


def _checked(table, k: int) -> np.ndarray:
    sums = prompt_sums(table, k)
    if not len(table) or sums[:, 0].sum() == 0:
        raise DraftlabError(
            f"the step table holds no decode steps ({len(table)} prompts): raise max_new_tokens above 1, "
            "or check that the proposer drafted for these prompts."
        )
    return sums


def estimate(table, k: int | None = None, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """tau, acceptance rate and unconditional per-position acceptance p_1..p_k (steps with at least i
    accepted / steps, vLLM's definition; k defaults to the most drafted in a step), each on both pooling
    rules with a bootstrap interval over prompts."""
    k = max((s.drafted for steps in table for s in steps), default=0) if k is None else k
    sums = _checked(table, k)
    weights = resample_weights(len(table), n_boot, np.random.default_rng(seed))
    boot = weights @ sums
    out = {
        "rules": dict(RULES),
        "level": level,
        "n_boot": n_boot,
        "seed": seed,
        "k": k,
        "n_prompts": len(table),
        "n_prompts_without_steps": int((sums[:, 0] == 0).sum()),
        "n_steps": int(sums[:, 0].sum()),
        "n_drafted": int(sums[:, 2].sum()),
        "n_accepted": int(sums[:, 1].sum()),
    }
    for stat in ["tau", "acceptance_rate", *(f"p_{i}" for i in range(1, k + 1))]:
        out[stat] = {
            POOLED: _pooled(sums, boot, stat, level),
            PER_REQUEST: _per_request(sums, weights, stat, level),
        }
    return out


def paired(
    table_a,
    table_b,
    name_a: str,
    name_b: str,
    stat: str = "tau",
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """The pooled `stat` of a minus b on the same prompts, its interval from resampling the same prompts for
    both (a prompt's difficulty then cancels), and a verdict. `unpaired` is the interval had the two been
    resampled independently, to show what pairing gains."""
    if len(table_a) != len(table_b):
        raise DraftlabError(
            f"a paired comparison needs the same prompts in the same order, but {name_a} has {len(table_a)} "
            f"prompts and {name_b} {len(table_b)}; decode both over one prompt list (evaluate.run_all does)."
        )
    k = position(stat)
    sa, sb = _checked(table_a, k), _checked(table_b, k)
    rng = np.random.default_rng(seed)
    weights = resample_weights(len(table_a), n_boot, rng)
    lo, hi = percentile_interval(statistic(weights @ sa, stat) - statistic(weights @ sb, stat), level)
    other = resample_weights(len(table_b), n_boot, rng)
    un_lo, un_hi = percentile_interval(statistic(weights @ sa, stat) - statistic(other @ sb, stat), level)
    va, vb = plain(statistic(sa.sum(0), stat)), plain(statistic(sb.sum(0), stat))
    if lo is None or va is None or vb is None:
        raise DraftlabError(f"{stat} is undefined on {name_a} or {name_b} (no drafted tokens?); compare 'tau'.")
    verdict = SAME if lo <= 0 <= hi else f"{name_a} higher" if lo > 0 else f"{name_b} higher"
    return {
        "stat": stat,
        "rule": POOLED,
        "a": name_a,
        "b": name_b,
        "value_a": va,
        "value_b": vb,
        "difference": va - vb,
        "lo": lo,
        "hi": hi,
        "verdict": verdict,
        "unpaired": {"lo": un_lo, "hi": un_hi},
        "n_prompts": len(table_a),
        "level": level,
        "n_boot": n_boot,
        "seed": seed,
    }


def sample_size(
    table, half_width: float = 0.05, stat: str = "tau", n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> dict:
    """About how many prompts, each generating as much as these did, the pooled `stat`'s interval needs to
    reach +-half_width: the bootstrap half-width shrinks as 1 / sqrt(prompts)."""
    if not half_width > 0:
        raise DraftlabError(f"half_width={half_width} must be > 0.")
    sums = _checked(table, position(stat))
    weights = resample_weights(len(table), n_boot, np.random.default_rng(seed))
    lo, hi = percentile_interval(statistic(weights @ sums, stat), level)
    if lo is None:
        raise DraftlabError(f"{stat} is undefined on this step table (no drafted tokens?); use 'tau'.")
    now, n = (hi - lo) / 2, len(table)
    need = max(2, math.ceil(n * (now / half_width) ** 2))  # an interval over prompts needs two of them
    return {
        "stat": stat,
        "rule": POOLED,
        "level": level,
        "n_prompts": n,
        "steps_per_prompt": float(sums[:, 0].mean()),
        "half_width": now,
        "target_half_width": half_width,
        "n_prompts_needed": need,
        "summary": f"{stat} reached +-{now:.3f} with {n} prompts; +-{half_width:g} needs about {need}",
    }
