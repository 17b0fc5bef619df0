"""Served acceptance: the same prompts and k through `vllm serve`, measured and reported for notebook 05.

`measure` serves the verifier alone, then with each draft, on the same prompts at the same k, and
keeps each workload's outputs, wall time and counter deltas (`counters.py`); `report` turns that
into notebook 05's tables and checks (`compare.py`), `for_metrics` into metrics.json's figures.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from draftlab import DraftlabError
from draftlab.serving.command import unavailable
from draftlab.serving.compare import checks, greedy_rows, speed_rows, tau_rows, warn_on_gaps
from draftlab.serving.counters import delta, loop_unconditional, served_metrics, spec_counters
from draftlab.serving.pair_check import aux_layer_ids
from draftlab.serving.process import stop_groups
from draftlab.serving.server import Server


def workload(server: Server, prompts: list[dict], max_tokens: int) -> dict:
    """Every prompt sent at once (a server's normal load), greedy; outputs, wall time and counter deltas."""
    before = spec_counters(server.metrics_text())
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        outs = list(pool.map(lambda p: server.chat(p["text"], max_tokens), prompts))
    wall = time.perf_counter() - t0
    counts = delta(before, spec_counters(server.metrics_text()))
    tokens = sum(len(o["token_ids"]) for o in outs)
    return {
        "outputs": outs,
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "counts": counts,
        "startup_s": server.startup_s,
    }


def measure(verifier, drafts: dict[str, Path], prompts: list[dict], k: int, max_tokens: int, log_dir: Path) -> dict:
    """The verifier served alone, then with each draft, on the same prompts at the same k.

    The servers start together and serve one after the other: a start is three processes importing
    vLLM in turn on one core each, and an idle server takes no CPU, so starting them at once costs
    about the time of the slowest start instead of their sum (BENCHMARKS.md, "Served acceptance"). Every
    server is stopped on every path. Returns {"available": False, "reason": ...} where vLLM cannot run;
    a draft vLLM cannot serve gets {"error": <vLLM's reason>} and the others go on."""
    reason = unavailable()
    if reason:
        return {"available": False, "reason": reason}
    dtype = str(verifier.dtype).removeprefix("torch.")
    common = {"dtype": dtype, "device": str(verifier.device), "max_model_len": model_len(prompts, max_tokens, k)}
    servers, runs = {}, {}
    try:
        servers["verifier alone"] = Server(verifier.path, None, log_path=Path(log_dir) / "vllm-verifier.log", **common)
        for kind, path in drafts.items():
            try:
                servers[kind] = Server(verifier.path, path, k, log_path=Path(log_dir) / f"vllm-{kind}.log", **common)
            except DraftlabError as e:  # a checkpoint the pair check refuses: no server for it
                runs[kind] = {"error": str(e).splitlines()[0]}
        started = start_together(servers)
        s = servers["verifier alone"]
        try:  # e.g. a model family this vLLM build cannot serve: the rest of stage 05 goes on
            if started["verifier alone"] is not None:
                raise started["verifier alone"]
            runs["verifier alone"] = workload(s, prompts, max_tokens)
            runs["verifier alone"]["vllm_prompt_ids"] = [s.tokenize(p["text"]) for p in prompts]
        except DraftlabError as e:
            return {"available": False, "reason": f"vLLM could not serve the verifier: {str(e).splitlines()[0]}"}
        s.stop()
        for kind in drafts:
            if kind in runs:
                continue
            s = servers[kind]
            try:
                if started[kind] is not None:
                    raise started[kind]
                run = workload(s, prompts, max_tokens)
                run.update(
                    served_metrics(run["counts"]),
                    aux_layers_logged=s.logged_aux_layers(),
                    aux_layers_checkpoint=aux_layer_ids(s.draft_cfg),
                    draft_vocab_size=s.draft_cfg.get("draft_vocab_size"),
                    command=s.command,
                )
            except DraftlabError as e:
                run = {"error": str(e).splitlines()[0]}
            runs[kind] = run
            s.stop()
    finally:
        stop_all(servers)
    return {
        "available": True,
        "k": k,
        "dtype": dtype,
        "max_tokens": max_tokens,
        "started_together": len(servers),
        "runs": {kind: runs[kind] for kind in ["verifier alone", *drafts]},
    }


def start_together(servers: dict[str, Server]) -> dict[str, DraftlabError | None]:
    """Launch every server from this thread (their parent-death signal follows the launching thread), then wait
    for all at once; per name None, or the DraftlabError its start raised (a failed start leaves no process
    behind). Any other exception, in this thread (an interrupt) or in a wait, stops every server at once (the
    other waits then end as their processes go) and propagates."""
    pool = ThreadPoolExecutor(max_workers=max(len(servers), 1))

    def ready(s: Server):
        try:
            s.wait_ready()
        except DraftlabError as e:
            return e
        return None

    try:
        for s in servers.values():
            s.launch()
        futures = {name: pool.submit(ready, s) for name, s in servers.items()}
        done, _ = wait(futures.values(), return_when=FIRST_EXCEPTION)
        for f in done:
            if f.exception() is not None:
                raise f.exception()
        return {name: f.result() for name, f in futures.items()}
    except BaseException:
        stop_all(servers)
        raise
    finally:
        pool.shutdown(wait=True)


def stop_all(servers: dict[str, Server]) -> None:
    """Every launched server stopped, side by side (`process.stop_groups`)."""
    stop_groups([s.proc for s in servers.values() if s.proc is not None])


def model_len(prompts, max_tokens, k) -> int:
    """--max-model-len for a workload, in blocks of 256: a small KV cache starts faster."""
    longest = max(len(p["ids"]) for p in prompts)
    return 256 * -(-(longest + max_tokens + k + 16) // 256)  # room for the prompt, the answer and one draft


def report(
    verifier, prompts: list[dict], refs: list[list[int]], served: dict, loop_summary: dict, loop_runs: dict
) -> dict:
    """Every served table of notebook 05 and metrics.json, or {} where vLLM did not run."""
    if not served.get("available"):
        return {}
    ok = [kind for kind, run in served["runs"].items() if kind != "verifier alone" and "error" not in run]
    taus = tau_rows(served, loop_summary)
    k = served["k"]
    return {
        "tau": taus,
        "speed": speed_rows(served),
        "greedy": greedy_rows(verifier, prompts, refs, served, loop_runs),
        "checks": {kind: checks(verifier, prompts, served, kind) for kind in ok},
        "positions": {
            kind: {
                "draftlab loop": loop_unconditional([s for g in loop_runs[kind] for s in g.steps], k),
                "vLLM": served["runs"][kind]["per_position_unconditional"][:k],
            }
            for kind in ok
        },
        "flagged": warn_on_gaps(verifier, prompts, served, taus),
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
        **{key: rep[key] for key in ("tau", "speed", "greedy", "checks", "flagged")},
    }
