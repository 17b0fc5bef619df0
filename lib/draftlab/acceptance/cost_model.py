"""Notebook 05's cost model for its own run: the parts of a step measured on this machine, vLLM's own share, the
loop's tau at every k, and the speed-up each k is predicted to give (the formula: `acceptance.costs`).

V(m) and D are measured as this machine's engine runs them: on a GPU the weight GEMMs in one CUDA graph (EAGLE-3's
draft step too), on a CPU the eager forward and one eager draft step timed inside the loop (`draft_step_s`). E comes
from the served verifier alone, one request in flight (`engine_s`). tau(k) is the loop's: EAGLE-3's at every k of
K_RANGE from one replayed pass (`replay.tau_by_k`), the others' at the k the loop decoded.

On a GPU those parts leave out the engine's host work on a speculative step (scheduling, the proposals' hand-over,
the rejection sampler), which on a 135M verifier is most of the step: without it the model overstated the served
speed-up more than twofold on an H100 (BENCHMARKS.md, 2026-12-07). So where vLLM served the n-gram at the headline
k with one request in flight, its speculative step is read from that run (`ngram_step_s`), and what the parts leave
out of it becomes the step's fixed cost for every proposer (`Costs.spec_s`): the n-gram drafts on the host, so its
step is the verifier's and the engine's alone. It is read at the n-gram's tau and at one k, so a better draft's
longer step per accepted token and the host work's growth with k are not in it, and the n-gram's own row, which it
is read from, is no check of the model. On a CPU V(m) is transformers' eager forward, which holds its own host
work, and the term is not read.
"""

from __future__ import annotations

import time

import torch

from draftlab.acceptance.costs import Costs, best_k, linear_shapes, predict, time_forward, time_gemms


def draft_step_s(verifier, proposer, prompt_ids: list[int], steps: int = 24) -> float:
    """Median seconds of one `propose` at k 1 (one draft forward over the tokens the last step kept, and its head) over
    a short greedy decode of `prompt_ids`; the first call, which also reads the prompt, left out."""
    from draftlab.acceptance.speculative import speculative_generate

    times = []
    inner = proposer.propose

    def timed(*a, **kw):
        t0 = time.perf_counter()
        out = inner(*a, **kw)
        times.append(time.perf_counter() - t0)
        return out

    proposer.propose = timed
    try:
        speculative_generate(verifier, proposer, prompt_ids, 1, steps, eos_id=None)
    finally:
        del proposer.propose  # the class's own method again
    return float(torch.tensor(times[1:] or times).median())


def measure(verifier, proposers: dict, prompt_ids: list[int], k_max: int, drafts: dict | None = None) -> dict:
    """V(m) for m = 1 .. k_max + 1 and each proposer's D, as this machine's engine runs them (the module's docstring):
    {"verify_s", "draft_s": {name: s}, "how"}. The engine's own share comes from a served run (`engine_s`)."""
    ms = range(1, k_max + 2)
    if verifier.device.type == "cuda":
        cfg = verifier.model.config.get_text_config().to_dict()
        verify, how = (
            time_gemms(linear_shapes(cfg), ms, verifier.device, verifier.dtype),
            "weight GEMMs in one CUDA graph",
        )
    else:
        verify, how = time_forward(verifier.model, ms, context=len(prompt_ids)), "eager forward with a KV cache"
    steps = {name: draft_step_s(verifier, p, prompt_ids) for name, p in proposers.items()}
    if verifier.device.type == "cuda":  # EAGLE-3's step as vLLM replays it; the others as timed in the loop
        for name, d in (drafts or {}).items():
            if name == "eagle3":
                tl = {
                    **d.model.config.transformer_layer_config.to_dict(),
                    "draft_vocab_size": d.model.config.draft_vocab_size,
                }
                steps[name] = time_gemms(linear_shapes(tl, draft=True), [1], verifier.device, verifier.dtype)[1]
    return {
        "verify_s": verify,
        "draft_s": steps,
        "how": {"V": how, "D": "one eager propose at k 1, timed in the loop"},
    }


def engine_s(served_run: dict, verify_1: float) -> float | None:
    """E: a served token of the verifier alone with one request in flight, less V(1); None where vLLM served no
    workload one request at a time."""
    levels = (served_run.get("runs") or {}).get("verifier alone", {}).get("levels") or []
    one = [lv for lv in levels if lv["concurrency"] == 1]
    return 1 / one[0]["tokens_per_s"] - verify_1 if one else None


def ngram_step_s(served_run: dict) -> float | None:
    """Seconds of one speculative step of vLLM's n-gram at the served k, one request in flight: its wall less its plain
    steps (tokens neither drafted-and-accepted nor a drafting step's own, each at the verifier alone's time a token),
    over its drafting steps. None where either was not served one request at a time or the n-gram never drafted."""
    runs = served_run.get("runs") or {}
    alone, ngram = runs.get("verifier alone") or {}, runs.get("ngram") or {}
    if alone.get("concurrency") != 1 or ngram.get("concurrency") != 1 or not ngram.get("counts", {}).get("drafts"):
        return None
    drafts, accepted = ngram["counts"]["drafts"], ngram["counts"]["accepted"]
    plain_steps = max(ngram["tokens"] - drafts - accepted, 0)
    return (ngram["wall_s"] - plain_steps * alone["wall_s"] / alone["tokens"]) / drafts


def spec_s(served_run: dict, verify_s: dict, engine: float | None) -> float | None:
    """The speculative step's cost that V(k+1) + E leave out, read from the n-gram (the module's docstring)."""
    step, k = ngram_step_s(served_run), served_run.get("k")
    return None if step is None or engine is None or k + 1 not in verify_s else step - verify_s[k + 1] - engine


K_RANGE = tuple(range(1, 8))  # the chain lengths the model predicts for


def for_run(
    verifier,
    proposers: dict,
    drafts: dict,
    greedy: dict,
    tau_k: dict,
    served_run: dict,
    prompt_ids,
    max_new_tokens: int,
) -> dict:
    """Notebook 05's cost model: each proposer's predicted speed-up at every k it has a tau for (EAGLE-3 at every k of
    K_RANGE from one replayed pass, `replay.tau_by_k`; the others at the k the loop decoded), its best k and what
    bounds it. E is 0 where vLLM served nothing one request at a time (said in `why`)."""
    from draftlab.acceptance.replay import tau_by_k

    taus = {n: dict(t) for n, t in tau_k.items()}
    for kind, d in drafts.items():
        if kind == "eagle3" and kind in greedy:
            taus[kind] = tau_by_k(d, greedy[kind], K_RANGE, max_new_tokens)
    parts = measure(verifier, proposers, prompt_ids, max(max(t) for t in taus.values()), drafts)
    e = engine_s(served_run, parts["verify_s"][1])
    # on a CPU the eager forwards V(m) already hold transformers' host work, not vLLM's: the term would be set against
    # them and carry their noise (BENCHMARKS.md), so it is read on a GPU only
    cpu = verifier.device.type != "cuda"
    fixed = None if cpu else spec_s(served_run, parts["verify_s"], e)
    rows = {
        n: predict(t, Costs(parts["verify_s"], parts["draft_s"][n], e or 0.0, spec_s=fixed or 0.0, chain=n == "eagle3"))
        for n, t in taus.items()
    }
    why = "vLLM served no workload one request at a time: the engine's own time is taken as 0"
    if e is not None:
        why = (
            f"V(1) {parts['verify_s'][1] * 1e3:.2f} ms ({parts['how']['V']}); the engine's own {e * 1e3:.2f} ms a step"
        )
        left_out = "V(m) on a CPU holds the host's work" if cpu else "no n-gram served at k one request at a time"
        why += (
            f"; a speculative step's {fixed * 1e3:.2f} ms beyond V(k+1) + E, read from the n-gram served at k "
            f"{served_run['k']} (its row is no check of the model)"
            if fixed is not None
            else f"; a speculative step's own cost left out ({left_out})"
        )
    best, table = {n: best_k(r) for n, r in rows.items()}, [{"proposer": n, **r} for n, rs in rows.items() for r in rs]
    return {
        **parts,
        "engine_s": e,
        "spec_s": fixed,
        "tau": taus,
        "rows": rows,
        "best_k": best,
        "why": why,
        "table": table,
    }
