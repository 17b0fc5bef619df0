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
