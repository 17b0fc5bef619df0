"""Served acceptance: the same prompts and k through `vllm serve`, read from vLLM's own counters.

vLLM counts, per engine, drafts (verifier passes that checked a draft), draft tokens, accepted
tokens, and accepted tokens per draft position; the counters are cumulative, so a workload's
figures are the difference of `/metrics` read before and after it (parsed with prometheus_client).
In vLLM's convention the mean acceptance length is `1 + accepted / drafts` (the bonus token
included): draftlab's tau on the same definition. vLLM's per-position figure is unconditional
(drafts whose position i was accepted / drafts); draftlab's alpha_n is conditional (given
positions 1..n-1 accepted). Both are given on both definitions here.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from draftlab import DraftlabError
from draftlab.serving.server import Server, aux_layer_ids, unavailable

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GAP_WARN = 0.10  # relative tau difference past which the served and the loop figures need explaining


class ServedGapWarning(UserWarning):
    """vLLM's tau and draftlab's differ by more than GAP_WARN for one checkpoint."""


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
    vLLM in turn on one core each (about 45 s here), and an idle server takes no CPU, so starting them
    at once costs about the time of the slowest start instead of their sum (BENCHMARKS.md). Every
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
        for s in servers.values():
            s.stop()
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
    behind). Any other exception, an interrupt included, propagates to the caller, who stops every server."""
    for s in servers.values():
        s.launch()

    def ready(s: Server):
        try:
            s.wait_ready()
        except DraftlabError as e:
            return e
        return None

    with ThreadPoolExecutor(max_workers=max(len(servers), 1)) as pool:
        futures = {name: pool.submit(ready, s) for name, s in servers.items()}
        return {name: f.result() for name, f in futures.items()}


def model_len(prompts, max_tokens, k) -> int:
    """--max-model-len for a workload, in blocks of 256: a small KV cache starts faster."""
    longest = max(len(p["ids"]) for p in prompts)
    return 256 * -(-(longest + max_tokens + k + 16) // 256)  # room for the prompt, the answer and one draft


def first_difference(a: list[int], b: list[int]) -> int | None:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return n if n is not None or len(a) == len(b) else min(len(a), len(b))


def tau_rows(served: dict, loop_summary: dict) -> list[dict]:
    """draftlab's loop against vLLM, per draft, on vLLM's definitions (the bonus token counted in tau)."""
    rows = []
    for kind, run in served["runs"].items():
        if kind == "verifier alone":
            continue
        if "error" in run:
            rows.append({"proposer": kind, "vLLM": f"not served: {run['error']}"})
            continue
        loop = loop_summary[kind]["all"]
        rows.append(
            {
                "proposer": kind,
                "draftlab tau": loop["tau"],
                "vLLM tau": run["tau"],
                "relative difference": run["tau"] / loop["tau"] - 1,
                "draftlab acceptance rate": loop["acceptance_rate"],
                "vLLM acceptance rate": run["acceptance_rate"],
                "draftlab steps": loop["steps"],
                "vLLM drafts": int(run["drafts"]),
            }
        )
    return rows


def speed_rows(served: dict) -> list[dict]:
    """Wall-clock tokens/s of the same workload, the verifier alone and with each draft: the speed-up a user gets."""
    alone = served["runs"]["verifier alone"]
    rows = [
        {
            "server": "verifier alone",
            "tokens": alone["tokens"],
            "seconds": alone["wall_s"],
            "tokens/s": alone["tokens_per_s"],
            "speed-up": 1.0,
            "start-up s": alone["startup_s"],
        }
    ]
    for kind, run in served["runs"].items():
        if kind != "verifier alone" and "error" not in run:
            rows.append(
                {
                    "server": f"with {kind}",
                    "tokens": run["tokens"],
                    "seconds": run["wall_s"],
                    "tokens/s": run["tokens_per_s"],
                    "speed-up": run["tokens_per_s"] / alone["tokens_per_s"],
                    "start-up s": run["startup_s"],
                }
            )
    return rows


def greedy_rows(verifier, prompts: list[dict], refs: list[list[int]], served: dict, loop_runs: dict) -> list[dict]:
    """Greedy outputs over all prompts: identical token for token, or (bf16 only) a near-tie at the first
    divergence (`accept_eval.greedy_agreement`), or different."""
    from draftlab.acceptance.evaluate import greedy_agreement

    exact = verifier.dtype.itemsize >= 4
    alone = [o["token_ids"] for o in served["runs"]["verifier alone"]["outputs"]]
    pairs = {"vLLM alone vs transformers greedy": (alone, refs)}
    for kind, run in served["runs"].items():
        if kind != "verifier alone" and "error" not in run:
            pairs[f"vLLM + {kind} vs vLLM alone"] = ([o["token_ids"] for o in run["outputs"]], alone)
    for name, gens in loop_runs.items():
        pairs[f"draftlab loop ({name}) vs transformers greedy"] = ([g.tokens for g in gens], refs)
    rows = []
    for name, (got, want) in pairs.items():
        same = sum(g == w for g, w in zip(got, want, strict=True))
        ties = (
            0
            if exact
            else sum(
                g != w and greedy_agreement(verifier, p["ids"], g, w)["lossless"]
                for p, g, w in zip(prompts, got, want, strict=True)
            )
        )
        rows.append(
            {
                "comparison": name,
                "prompts": len(want),
                "identical": same,
                "near-tie (bf16)": ties,
                "different": len(want) - same - ties,
            }
        )
    return rows


def checks(verifier, prompts: list[dict], served: dict, kind: str) -> dict:
    """What can make vLLM's acceptance differ from draftlab's, for one served draft, each run and shown."""
    run = served["runs"][kind]
    vllm_ids = served["runs"]["verifier alone"]["vllm_prompt_ids"]
    diffs = [(p["id"], first_difference(p["ids"], v)) for p, v in zip(prompts, vllm_ids, strict=True)]
    differing = [(pid, n) for pid, n in diffs if n is not None]
    return {
        "chat template (HF apply_chat_template vs vLLM /tokenize)": "same tokens on every prompt"
        if not differing
        else f"{len(differing)}/{len(prompts)} prompts differ, first at token {differing[0][1]} of {differing[0][0]}",
        "aux layers (vLLM log / checkpoint)": f"{run['aux_layers_logged']} / {run['aux_layers_checkpoint']}",
        "draft vocabulary size": run["draft_vocab_size"],
        "dtype (vLLM / draftlab)": f"{served['dtype']} / {str(verifier.dtype).removeprefix('torch.')}",
    }


def warn_on_gaps(verifier, prompts, served: dict, rows: list[dict]) -> list[str]:
    """A ServedGapWarning, with the checks, for each draft whose two taus differ by more than GAP_WARN."""
    import warnings

    flagged = []
    for r in rows:
        if "vLLM tau" in r and abs(r["relative difference"]) > GAP_WARN:
            found = checks(verifier, prompts, served, r["proposer"])
            warnings.warn(
                ServedGapWarning(
                    f"{r['proposer']}: vLLM tau {r['vLLM tau']:.3f} vs draftlab {r['draftlab tau']:.3f} "
                    f"({r['relative difference']:+.0%}); checks: {found}"
                ),
                stacklevel=2,
            )
            flagged.append(r["proposer"])
    return flagged


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
