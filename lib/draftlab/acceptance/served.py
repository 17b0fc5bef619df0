"""Served acceptance: the same prompts and k through `vllm serve`, measured and reported for notebook 05.

`measure` serves the verifier alone, then with each draft, on the same prompts at the same k, and
keeps each workload's outputs, wall time and counter deltas (`counters.py`); `report` turns that
into notebook 05's tables and checks (`compare.py`), `for_metrics` into metrics.json's figures.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from draftlab import DraftlabError
from draftlab.acceptance import workload
from draftlab.acceptance.compare import checks, greedy_rows, speed_rows, tau_rows, warn_on_gaps
from draftlab.acceptance.together import Launched, launch, wait_all
from draftlab.data.prompts import messages
from draftlab.serving.counters import loop_unconditional, served_metrics
from draftlab.serving.pair_check import aux_layer_ids
from draftlab.serving.server import Server, ServerDied


class ServedDiedWarning(UserWarning):
    """A draft's server died while it answered: its row of the served tables holds the message."""


def measure(
    verifier,
    drafts: dict[str, Path],
    prompts: list[dict],
    k: int,
    max_tokens: int,
    log_dir: Path,
    concurrency=(0,),
    launched: Launched | None = None,
    pool: list[dict] | None = None,
    ngram: int | None = None,
) -> dict:
    """The verifier served alone, then with each draft, on the same prompts at the same k, at each number of
    requests in flight in `concurrency` (0: every prompt at once); the first level is the one whose outputs
    and counters the checks use. `launched` are servers `launch` started earlier (else they start here). A level
    of c > 1 requests in flight serves `prompts` followed by `pool`'s others, 3c in all where there are that many
    (a workload of only a few waves measures its tail), the same prompts with and without each draft. `ngram`
    serves vLLM's own prompt lookup too (`together.launch`), as "ngram" after the drafts.

    The servers start together and serve one after the other: on a CPU a start is three processes importing
    vLLM in turn on one core each, and an idle server takes no CPU, so starting them at once costs about the
    time of the slowest start instead of their sum (BENCHMARKS.md, "Served acceptance"). Every server is
    stopped on every path. Returns {"available": False, "reason": ...} where vLLM cannot run; a draft vLLM
    cannot serve gets {"error": <vLLM's reason>} and the others go on. A server that dies while it answers is named
    with its log (`ServerDied`) and a `ServedDiedWarning` at once: the verifier alone's is the served section's reason
    (no baseline, nothing to set a draft against; the rest of stage 05 goes on), a draft's its error, whole."""
    launched = launched or launch(verifier, drafts, prompts + list(pool or []), k, max_tokens, log_dir, ngram)
    if launched.reason:
        return {"available": False, "reason": launched.reason}
    servers, runs = launched.servers, dict(launched.errors)
    kinds = [*drafts, *(["ngram"] if "ngram" in servers else [])]
    levels = list(concurrency) or [0]
    try:
        started = wait_all(servers)
        s = servers["verifier alone"]
        try:  # e.g. a model family this vLLM build cannot serve: the rest of stage 05 goes on
            if started["verifier alone"] is not None:
                raise started["verifier alone"]
            runs["verifier alone"] = serve_levels(s, prompts, pool, max_tokens, levels)
            runs["verifier alone"]["vllm_prompt_ids"] = [s.tokenize(messages(p)) for p in prompts]
        except ServerDied as e:  # it died while answering (killed, out of memory, a kernel vLLM lacks): said as such
            warnings.warn(str(e), ServedDiedWarning, stacklevel=2)
            return {"available": False, "reason": str(e)}
        except DraftlabError as e:
            return {"available": False, "reason": f"vLLM could not serve the verifier: {str(e).splitlines()[0]}"}
        s.stop()
        for kind in kinds:
            if kind in runs:
                continue
            s = servers[kind]
            try:
                if started[kind] is not None:
                    raise started[kind]
                run = serve_levels(s, prompts, pool, max_tokens, levels)
                # draft_model: False for vLLM's n-gram, which drafts only where its context has a match
                run.update(served_metrics(run["counts"]), command=s.command, draft_model=s.draft_cfg is not None)
                if run["draft_model"]:
                    run.update(
                        aux_layers_logged=s.logged_aux_layers(),
                        aux_layers_checkpoint=aux_layer_ids(s.draft_cfg),
                        draft_vocab_size=s.draft_cfg.get("draft_vocab_size"),
                    )
            except ServerDied as e:  # the others go on; the whole message kept, and said now
                warnings.warn(str(e), ServedDiedWarning, stacklevel=2)
                run = {"error": str(e)}
            except DraftlabError as e:
                run = {"error": str(e).splitlines()[0]}
            runs[kind] = run
            s.stop()
    finally:
        launched.stop()
    return {
        "available": True,
        "k": k,
        "dtype": str(verifier.dtype).removeprefix("torch."),
        "max_tokens": max_tokens,
        "started_together": len(servers),
        "gpu": launched.gpu,
        "per_request_report": launched.per_request,
        "runs": {kind: runs[kind] for kind in ["verifier alone", *kinds]},
    }


WARMUP_CHAT = [{"role": "user", "content": "Count from one to twenty."}]  # no prompt set's: no prefix cached for them
WARMUP_TOKENS = 16  # enough verify steps for every drafting kernel to run once


def serve_levels(server: Server, prompts: list[dict], pool, max_tokens: int, levels: list[int]) -> dict:
    """The workload at each level; the first level's outputs, counters and per-request figures on top. One request
    goes first, untimed and before the counters are read: vLLM JIT-compiles some Triton kernels (the drafting and
    rejection ones) at the first request that runs them, seconds a served speed must not count (on the H200 four
    such compiles fell inside P-EAGLE's timed workload: BENCHMARKS.md, "Every family vLLM serves")."""
    server.chat(WARMUP_CHAT, min(max_tokens, WARMUP_TOKENS))
    ids = {p["id"] for p in prompts}
    more = [p for p in pool or [] if p["id"] not in ids]
    done = [
        workload.run(server, prompts if c <= 1 else (prompts + more)[: max(len(prompts), 3 * c)], max_tokens, c)
        for c in levels
    ]
    return {**done[0], "startup_s": server.startup_s, "levels": [workload.summary(w) for w in done]}


def report(verifier, prompts: list[dict], max_new_tokens: int, served: dict, loop_runs: dict, depth_edges=None) -> dict:
    """Every served table of notebook 05 and metrics.json, or {} where vLLM did not run. Where vLLM's
    per-request figures exist (`workload.step_table`), its tau carries an interval over prompts, is set
    against the loop's on the same prompts (`intervals.paired`), and, where each step is known, drawn
    against context depth on `depth_edges`. vLLM counts a step only where tokens were proposed, so every
    figure set against vLLM's takes the loop's steps on that rule (`proposed`): the n-gram proposes nothing
    where its context has no match, and the loop drafts nothing on a request's last token, where vLLM drafts
    k past the end."""
    if not served.get("available"):
        return {}
    ok = [kind for kind, run in served["runs"].items() if kind != "verifier alone" and "error" not in run]
    from draftlab.acceptance.intervals import estimate, step_table

    k = served["k"]
    loop_tables = {kind: proposed(step_table(loop_runs[kind])) for kind in ok}
    loop_estimates = {kind: estimate(t, k) for kind, t in loop_tables.items()}
    pr = per_request(served, loop_tables, ok, k, depth_edges)
    taus = with_intervals(tau_rows(served, loop_estimates), pr, loop_estimates)
    return {
        **pr,
        "tau": taus,
        "speed": speed_rows(served),
        "greedy": greedy_rows(verifier, max_new_tokens, served),
        "checks": {kind: checks(verifier, prompts, served, kind) for kind in ok},
        "positions": {
            kind: {
                "draftlab loop": loop_unconditional([s for g in loop_runs[kind] for s in g.steps if s.drafted], k),
                "vLLM": served["runs"][kind]["per_position_unconditional"][:k],
            }
            for kind in ok
        },
        "flagged": warn_on_gaps(verifier, prompts, served, taus),
    }


def proposed(table) -> list:
    """A step table's steps with a proposal, as vLLM counts them (its counters and per-request figures)."""
    return [[s for s in steps if s.drafted] for steps in table]


def with_intervals(rows: list[dict], pr: dict, loop_estimates: dict) -> list[dict]:
    """The tau rows with each engine's pooled interval and per-request mean beside the point figures."""
    from draftlab.acceptance.intervals import PER_REQUEST, POOLED
    from draftlab.acceptance.reported import ci

    for row in rows:
        kind = row["proposer"]
        if "vLLM tau" not in row:
            continue
        loop = loop_estimates[kind]["tau"]
        row["draftlab tau (95%)"] = ci(loop[POOLED])
        served = pr["intervals"].get(kind)
        row["vLLM tau (95%)"] = ci(served["tau"][POOLED]) if served else "no per-request figures"
        row["vLLM tau, per-request mean"] = ci(served["tau"][PER_REQUEST]) if served else "-"
    return rows


def per_request(served: dict, loop_tables: dict, ok: list[str], k: int, depth_edges=None) -> dict:
    """vLLM's figures with intervals, the loop against vLLM paired, and vLLM by depth, from per-request figures."""
    from draftlab.acceptance.depth import by_depth
    from draftlab.acceptance.depth import depth_edges as edges_of
    from draftlab.acceptance.intervals import estimate, paired

    found = {kind: workload.step_table(served["runs"][kind]) for kind in ok}
    tables = {kind: t for kind, (t, _) in found.items() if t}
    # by depth only where a model drafts at every step (vLLM's n-gram counts only the steps with a proposal)
    known = {kind: t for kind, (t, deep) in found.items() if t and deep and served["runs"][kind]["draft_model"]}
    first = served["runs"]["verifier alone"]["concurrency"]
    source = {kind: served["runs"][kind]["per_request_source"] for kind in tables}
    why = (
        None
        if len(tables) == len(ok)
        else f"no per-request figures at {first} requests in flight: this vLLM build "
        f"({'has' if served.get('per_request_report') else 'lacks'} --per-request-spec-decode-metrics) "
        "gives them in each response, else they come from its counters with one request in flight "
        "(serve_concurrency starting with 1)"
    )
    if known and depth_edges is None:
        depth_edges = edges_of([steps for t in known.values() for steps in t])
    return {
        "intervals": {kind: estimate(t, k) for kind, t in tables.items()},
        "per_request_source": source,
        "no_intervals_because": why,
        "loop_vs_vllm": [
            paired(loop_tables[kind], t, f"{kind} (draftlab loop)", f"{kind} (vLLM)") for kind, t in tables.items()
        ],
        "depth": {f"{kind} (vLLM)": by_depth(t, depth_edges) for kind, t in known.items()},
        "depth_note": None
        if known
        else "vLLM by depth needs each request's ordered steps, which only the responses of a build with "
        "--per-request-spec-decode-metrics carry",
    }


def for_metrics(served: dict, rep: dict) -> dict:
    """The served figures for metrics.json (no per-token outputs)."""
    if not served.get("available"):
        return {"available": False, "reason": served.get("reason")}
    runs = {
        kind: {key: val for key, val in run.items() if key not in ("outputs", "vllm_prompt_ids")}
        for kind, run in served["runs"].items()
    }
    return {
        "available": True,
        "k": served["k"],
        "dtype": served["dtype"],
        "max_tokens": served["max_tokens"],
        "runs": runs,
        "gpu": served.get("gpu"),
        **{
            key: rep[key]
            for key in (
                *("tau", "speed", "greedy", "checks", "flagged", "intervals", "per_request_source"),
                *("no_intervals_because", "loop_vs_vllm", "depth", "depth_note"),
            )
        },
    }
