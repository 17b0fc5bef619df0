"""One workload through one server: the prompts at a given number of requests in flight, timed, with vLLM's
counters for the whole and, where they can be had, per request.

Per-request figures are what an interval over prompts needs (`acceptance.intervals`). They come from the
response itself where the build reports them (`--per-request-spec-decode-metrics detailed`: each verify
step's accepted and drafted counts, in order), else, with one request in flight, from vLLM's `/metrics`
counters read before and after each request (the counters are cumulative and nothing else runs, so the
difference is that request's). With several in flight and no per-request report there are none: said so.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from draftlab.data.prompts import messages
from draftlab.serving.counters import delta, spec_counters

SETTLE_S = 0.02  # before each counter read with one request in flight


def run(server, prompts: list[dict], max_tokens: int, concurrency: int) -> dict:
    """Every prompt (prompt-set rows, each sent as its chat: `prompts.messages`) through `server` (greedy),
    `concurrency` requests in flight (0: all at once)."""
    c = len(prompts) if concurrency == 0 else concurrency
    drafting = server.spec is not None  # a draft, or vLLM's n-gram
    before = spec_counters(server.metrics_text())
    by_counters = [] if drafting and c == 1 else None  # one in flight: each request's counter difference
    t0 = time.perf_counter()
    if c == 1:
        outs, mark = [], before
        for p in prompts:
            outs.append(server.chat(messages(p), max_tokens))
            if by_counters is not None:
                time.sleep(SETTLE_S)  # the engine records a step's counts as it hands the output on
                now = spec_counters(server.metrics_text())
                by_counters.append(delta(mark, now))
                mark = now
        wall = sum(o["seconds"] for o in outs)  # the requests' own time: the counter reads between them left out
    else:
        with ThreadPoolExecutor(max_workers=c) as pool:
            outs = list(pool.map(lambda p: server.chat(messages(p), max_tokens), prompts))
        wall = time.perf_counter() - t0
    counts = delta(before, spec_counters(server.metrics_text()))
    tokens = sum(len(o["token_ids"]) for o in outs)
    reported = [o.get("spec") for o in outs]
    if drafting and all(r and r.get("per_step_accepted") is not None for r in reported):
        per_request, source = [from_report(r, k=len(counts["per_pos"])) for r in reported], "response"
    elif by_counters is not None:
        per_request, source = by_counters, "counters, one request in flight"
    else:
        per_request, source = None, None
    return {
        "concurrency": c,
        "prompts": len(prompts),
        "outputs": outs,
        "prompt_lens": [len(o["prompt_token_ids"]) for o in outs],  # vLLM's own tokenisation: where each step starts
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "counts": counts,
        "per_request": per_request,
        "per_request_source": source,
        "per_request_counters": by_counters,  # one in flight: also from the counters (checked against the reports)
        "per_request_unattributed": None  # counts no request's difference holds (0: every count is some request's)
        if by_counters is None
        else counts["drafts"] - sum(r["drafts"] for r in by_counters),
    }


def from_report(spec: dict, k: int) -> dict:
    """A response's `metrics.speculative_decoding` (detailed) on the counters' names, with its ordered steps."""
    acc, drafted = list(spec["per_step_accepted"]), list(spec["per_step_drafted"])
    width = max(k, spec.get("num_spec_tokens") or 0)
    return {
        "drafts": float(len(acc)),
        "draft_tokens": float(sum(drafted)),
        "accepted": float(sum(acc)),
        "per_pos": [float(sum(a >= i for a in acc)) for i in range(1, width + 1)],
        "per_step_accepted": acc,
        "per_step_drafted": drafted,
    }


def step_table(level: dict):
    """(the step table of one served workload's per-request figures, whether its step starts are known), or
    (None, False) where it has none. From the responses' own reports every step is known, in order; from the
    counters (one request in flight) each request's steps are rebuilt from its per-position counts, which fixes
    how many steps accepted exactly j tokens but not their order, so their starts are unknown (-1) and no depth
    is drawn from them."""
    from draftlab.acceptance.intervals import StepRecord, step_table_from_arrays

    per = level.get("per_request")
    if not per:
        return None, False
    if level["per_request_source"] == "response":
        acc, drafted = [p["per_step_accepted"] for p in per], [p["per_step_drafted"] for p in per]
        return step_table_from_arrays(level["prompt_lens"], acc, drafted), True
    table = []
    for p in per:
        n, at_least = int(round(p["drafts"])), [int(round(x)) for x in p["per_pos"]]
        each = int(round(p["draft_tokens"] / n)) if n else 0
        bounds = [n, *at_least, 0]  # steps accepting at least j tokens, j = 0 .. k+1
        exactly = [bounds[j] - bounds[j + 1] for j in range(len(bounds) - 1)]
        table.append([StepRecord(-1, each, j) for j, count in enumerate(exactly) for _ in range(count)])
    return table, False


def summary(level: dict) -> dict:
    """A workload's figures for the levels table of metrics.json: no per-token outputs, and no per-request lists
    (the first level's are kept whole beside it)."""
    dropped = ("outputs", "per_request", "per_request_counters", "prompt_lens")
    return {key: val for key, val in level.items() if key not in dropped}
