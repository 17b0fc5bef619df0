"""Served speed-up with an interval: the same prompts through vLLM with and without a draft.

With one request in flight every response carries its own seconds, and the prompts are the same on both sides, so
the speed-up (tokens per second with the draft over tokens per second without) gets a paired bootstrap over prompts.
With several in flight the requests overlap and only the workload's wall time means anything: there the workload
is repeated, and the interval is the spread of the ratios of its repeats.
"""

from __future__ import annotations

import re

import numpy as np

from draftlab.acceptance import costs
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


def served_at_k(
    verifier, kind: str, draft_dir, k: int, prompts: list[dict], max_tokens: int, log_dir, served_run: dict
) -> dict:
    """vLLM's speed-up for a draft at chain length k, one request in flight, paired over the prompts against the
    verifier alone of `served_run` (notebook 05's served section, whose first level must be one in flight): that
    run's own draft server where it served this k, else one more server at k, stopped on every path."""
    from draftlab.acceptance.served import serve_levels
    from draftlab.acceptance.together import model_len
    from draftlab.serving.gpu_memory import cuda_share, weights_bytes
    from draftlab.serving.server import Server

    runs = served_run.get("runs") or {}
    alone = runs.get("verifier alone") or {}
    if alone.get("concurrency") != 1:
        return {
            "k": k,
            "error": "the served section measured no workload one request in flight (serve_concurrency[0] must be 1)",
        }
    if k == served_run["k"]:  # the served section's own run; one it could not serve is not tried again
        run = runs.get(kind) or {}
        if "outputs" not in run:
            return {"k": k, "error": str(run.get("error") or "not served by vLLM in the served section")}
    else:
        gpu = (
            cuda_share(verifier.device, 1, weights_bytes(verifier.path, draft_dir))
            if verifier.device.type == "cuda"
            else None
        )
        dtype = str(verifier.dtype).removeprefix("torch.")
        log = f"{log_dir}/vllm-{kind}-k{k}.log"
        with Server(
            verifier.path, draft_dir, k, dtype, str(verifier.device), model_len(prompts, max_tokens, k), log, gpu=gpu
        ) as s:
            run = serve_levels(s, prompts, None, max_tokens, [1])
    ci = paired_over_prompts(alone["outputs"], run["outputs"])
    n = run["counts"]["drafts"]
    return {
        "k": k,
        "speed-up": ci["value"],
        "low": ci["low"],
        "high": ci["high"],
        "vLLM tau": 1 + run["counts"]["accepted"] / n if n else None,
    }


def measured_for_model(
    verifier, draft_dirs: dict, model: dict, prompts, max_tokens: int, log_dir, served_run: dict
) -> dict:
    """vLLM's speed-ups the cost model is checked against: every proposer served at the headline k, and EAGLE-3 at the
    best k the model picks too (one more server where that is another k). {name: [served_at_k rows]}."""
    if not served_run.get("available"):
        return {}
    k = served_run["k"]
    out = {
        n: [served_at_k(verifier, n, draft_dirs.get(n), k, prompts, max_tokens, log_dir, served_run)]
        for n in model["rows"]
        if n in served_run["runs"]
    }
    best = model["best_k"].get("eagle3")
    if best is not None and best != k and "eagle3" in draft_dirs:
        out["eagle3"].append(
            served_at_k(verifier, "eagle3", draft_dirs["eagle3"], best, prompts, max_tokens, log_dir, served_run)
        )
    return out


def against_model(measured: dict, model: dict) -> list[dict]:
    """Each measured speed-up beside the cost model's prediction at the same k: the check the model must pass."""
    rows = []
    for name, got in measured.items():
        predicted = {r["k"]: r["predicted speed-up"] for r in model["rows"].get(name, [])}
        for m in got:
            p = predicted.get(m["k"])
            if "error" in m or p is None:
                rows.append({"proposer": name, "k": m["k"], "note": m.get("error", "no prediction at this k")})
                continue
            ci = f"{m['speed-up']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"
            rows.append(
                {
                    "proposer": name,
                    "k": m["k"],
                    "vLLM tau": m["vLLM tau"],
                    "measured (95%)": ci,
                    "predicted": p,
                    "predicted / measured - 1": p / m["speed-up"] - 1,
                }
            )
    return rows


# A `speedup` run's record (benchmarks/bench_speedup.py's result JSON) read into the cost model of each verifier it
# served: the engine's host line, a speculative step's fixed cost, and predictions for a draft's tau by k.


def one_in_flight(result: dict, name: str) -> tuple[float, float | None]:
    """(seconds a token, vLLM's tau) of a server's one-in-flight workload."""
    lv = result["servers"][name]["levels"]["1"]
    return 1 / (sum(lv["tokens_per_s"]) / len(lv["tokens_per_s"])), (lv["metrics"] or {}).get("tau")


def host_line(results: list[dict], variant: str, kind: str) -> tuple[tuple[float, float], float]:
    """The engine's work per speculative step, c0 + k * c1 (host work, overlapped with the device's) plus c2 per
    token accepted past the first (not overlapped), fitted by least squares to a verifier's measured steps (tau over
    tokens/s, one in flight) at every k it was served at, over every result given: on a GPU a small verifier's step
    is the engine's. c2 is fitted only where one k was served at taus 0.5 or more apart (two drafts, or two runs of
    the same machine): along one draft's k sweep tau rises with k, and c1 and c2 cannot be told apart; else 0."""
    pts = []
    for result in results:
        for name in result["servers"]:
            m = re.fullmatch(rf"{re.escape(variant)} {kind} k(\d+)", name)
            if m and "error" not in result["servers"][name]:
                sec, tau = one_in_flight(result, name)
                pts.append((int(m.group(1)), tau, tau * sec))
    k, tau, step = np.array(pts, dtype=float).T
    several, apart = len(set(k)) > 1, any(np.ptp(tau[k == x]) >= 0.5 for x in set(k))
    cols = [np.ones_like(k)] + ([k] if several else []) + ([tau - 1] if apart else [])
    coef = np.linalg.lstsq(np.stack(cols, 1), step, rcond=None)[0]
    return (float(coef[0]), float(coef[1]) if several else 0.0), float(coef[-1]) if apart else 0.0


def verifier_costs(result: dict, var: str, kind: str, engine: tuple, spec: float = 0.0) -> tuple[costs.Costs, float]:
    """A verifier's cost model as the run measured it (its GEMMs, the draft's, its plain token) with the engine line
    `engine` ((c0, c1), c2: `host_line`) and a speculative step's fixed cost `spec` (`spec_fixed`), and its plain
    token's seconds."""
    c, plain = result["costs"][var], one_in_flight(result, f"{var} alone")[0]
    ver = {int(x): t for x, t in c["verify_s"].items()}
    return costs.Costs(ver, c["draft_s"][kind], plain - ver[1], *engine, spec_s=spec), plain


def spec_fixed(results: list[dict], like: str) -> float:
    """A speculative step's fixed device cost on a stand-in's shape, beyond V(6) + E + 5 D: a step served at k 5 with
    a draft whose proposals are not accepted, less that run's own model of it; no trained draft's acceptance enters
    it. The stand-in's own draft never accepted (`never_accepted`, the same work) where a result served it, else the
    reference check's random-weight draft on the random-weight stand-in (`--reference`: its step at tau 1 measured
    0.6 ms above the trained draft's at tau 1.2, so it overstates the cost); 0 where no result given served either."""
    for name in (f"{like} eagle3 k5 never accepted", f"{like} (random weights) random eagle3 k5"):
        for r in results:
            drafted = "eagle3" in r["costs"].get(like, {}).get("draft_s", {})
            if name in r["servers"] and "error" not in r["servers"][name] and drafted:
                sec, tau = one_in_flight(r, name)
                model = verifier_costs(r, like, "eagle3", ((0.0, 0.0), 0.0))[0]
                return max((tau or 1.0) * sec - model.gpu_step_s(5), 0.0)
    return 0.0


def taus_from_shares(shares: list[float]) -> dict[int, float]:
    """tau at each k up to the measured one, from a chain's share of passes accepting at least i tokens (an arm's
    `bench tau` `p`): tau(k) = 1 + the first k shares. An approximation: a draft's i-th guess does not depend on the
    k drafted, but at a smaller k the passes start at other places of the text."""
    return {k: 1 + sum(shares[:k]) for k in range(1, len(shares) + 1)}


def predict_taus(
    result: dict, taus: dict[int, float], pool: list[dict] = (), kind: str = "eagle3", spec_from: list[dict] = ()
) -> list[dict]:
    """`taus` (k: tau) put through the cost model of each verifier the run measured (its GEMMs, its plain token, the
    engine line fitted on the original's runs, a speculative step's fixed cost from `spec_from` or the run), beside
    each measured k: the speed-up of a draft not served on that host yet (`predict-k` replays one at hand;
    `predict-arm` takes a sweep arm's shares, its draft left on a lease's machine)."""
    engine = host_line([result, *pool], "original", kind)
    rows = []
    for var, c in result["costs"].items():
        if f"{var} alone" not in result["servers"] or kind not in c.get("draft_s", {}):
            continue
        model, plain = verifier_costs(
            result, var, kind, engine, spec_fixed([result, *pool, *spec_from], var) if var != "original" else 0
        )
        for r in costs.predict({k: t for k, t in taus.items() if k + 1 in model.verify_s}, model):
            name = f"{var} {kind} k{r['k']}"
            sec, tau = (None, None)
            if name in result["servers"] and "error" not in result["servers"][name]:
                sec, tau = one_in_flight(result, name)
            rows.append({"verifier": var, **r, "measured": plain / sec if sec else None, "vLLM tau": tau})
    return rows
