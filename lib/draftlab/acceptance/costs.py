"""Where a speculative step's time goes, and the speed-up each chain length k buys.

A served step at chain length k is one verifier forward over k+1 tokens, k draft steps and the engine's own work;
a token served without a draft is one verifier forward over 1 token and the engine's work. So

    speed-up(k) = tau(k) * (V(1) + E) / (V(k+1) + E + k * D)

with tau(k) the tokens per step (draftlab's loop), V(m) the verifier's forward over m tokens, D one draft step's forward
and E the engine's own time per step (attention, norms, sampling: a served plain token less V(1)). A GPU engine runs its
host work (scheduling, the speculative step's bookkeeping) beside the GPU's, so a step takes the longer of the two:
where the host work per speculative step, c0 + k * c1, outlasts the GPU's (a small verifier), it bounds the step
(`Costs.host_s`, measured where vLLM serves several k). On top of either, each token a step accepts beyond the first
costs the engine work it does not overlap with the device's (`Costs.per_token_s`, measured where one k was served at two
taus: on one H100 host about the same on a 135M and on an 8B-shaped verifier, so not the GPU's; how much it is depends
on the host, BENCHMARKS, issue 48), which is why a better draft's step is longer. A speculative step also costs the
device a fixed time its GEMMs do not show (the draft's pass over the accepted tokens, the rejection sampler, the
proposals' hand-over: `Costs.spec_s`, measured where a draft whose proposals are never accepted was served, tau 1).
A verifier whose step reads its weights from memory (an 8B model on a GPU) has V(k+1) close to V(1), and the speed-up
approaches tau; where the engine or the drafting dominates (a 135M verifier on a GPU), no tau pays it back. `predict`
gives every k, `best_k` the best one, `bound` what limits it. V and D are measured as the engine runs them: on a GPU
vLLM replays CUDA graphs, so they are the weight GEMMs of every layer in one CUDA graph (`time_gemms`); on a CPU vLLM
runs eager torch (`time_forward`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class Costs:
    """Seconds per verifier forward over m tokens, per draft step, the engine's own per step, and (where measured) the
    engine's host work per speculative step, c0 + k * c1, which a GPU engine runs beside the GPU's work."""

    verify_s: dict[int, float]
    draft_s: float
    engine_s: float = 0.0
    host_s: tuple[float, float] | None = None
    per_token_s: float = 0.0  # each accepted token past a step's first, not overlapped (`step_s`)
    spec_s: float = 0.0  # a speculative step's fixed device cost beyond V(k+1) + E + k D (served at tau 1)
    chain: bool = True  # k draft steps a verifier step (EAGLE-3); False: one pass drafts the block (DFlash, P-EAGLE)
    how: dict = field(default_factory=dict)  # how each was measured

    def plain_s(self) -> float:
        return self.verify_s[1] + self.engine_s

    def gpu_step_s(self, k: int) -> float:
        return self.verify_s[k + 1] + self.engine_s + (k if self.chain else 1) * self.draft_s + self.spec_s

    def host_step_s(self, k: int) -> float:
        return self.host_s[0] + k * self.host_s[1] if self.host_s else 0.0

    def base_step_s(self, k: int) -> float:
        """Its device work, or the engine's host work where that takes longer (vLLM overlaps the two)."""
        return max(self.gpu_step_s(k), self.host_step_s(k))

    def step_s(self, k: int, tau: float = 1.0) -> float:
        """The step: its base, and the work on the tau - 1 tokens it accepts past the first, not overlapped."""
        return self.base_step_s(k) + self.per_token_s * max(tau - 1, 0.0)


def predict(tau_k: dict[int, float], costs: Costs) -> list[dict]:
    """One row per k: tau, the predicted step and plain token times and speed-up, and the term that bounds it."""
    rows = []
    for k, tau in sorted(tau_k.items()):
        if k + 1 not in costs.verify_s:
            continue
        step = costs.step_s(k, tau)
        rows.append(
            {
                "k": k,
                "tau": tau,
                "step ms": step * 1e3,
                "plain ms/token": costs.plain_s() * 1e3,
                "predicted speed-up": tau * costs.plain_s() / step,
                "break-even tau": break_even(costs, k),
                "bound by": bound(costs, k, tau),
            }
        )
    return rows


def break_even(costs: Costs, k: int) -> float:
    """The tau at which a step at k costs tau plain tokens: tau * plain = base + p * (tau - 1); none (inf) where
    each accepted token costs the engine a plain token's time or more."""
    base, plain = costs.base_step_s(k), costs.plain_s()
    return (base - costs.per_token_s) / (plain - costs.per_token_s) if plain > costs.per_token_s else float("inf")


def best_k(rows: list[dict]) -> int | None:
    return max(rows, key=lambda r: r["predicted speed-up"])["k"] if rows else None


def bound(costs: Costs, k: int, tau: float = 1.0) -> str:
    """Which cost a step adds to a plain token's most: verifying k more tokens, drafting k, the engine's fixed share,
    its work on the accepted tokens, or, where it outlasts the device's work, the engine's host work per step."""
    accepted = costs.per_token_s * max(tau - 1, 0.0)
    if costs.host_step_s(k) > costs.gpu_step_s(k):
        host = costs.host_step_s(k) - costs.plain_s()
        return "the engine's host work per step" if host >= accepted else "the engine's work per accepted token"
    terms = {
        "verifying k+1 tokens": costs.verify_s[k + 1] - costs.verify_s[1],
        "drafting": (k if costs.chain else 1) * costs.draft_s,
        "the engine's fixed cost": costs.engine_s,
        "the speculative step's fixed cost": costs.spec_s,
        "the engine's work per accepted token": accepted,
    }
    return max(terms, key=terms.get)


def linear_shapes(cfg: dict, draft: bool = False) -> list[tuple[int, int]]:
    """(in, out) of each weight GEMM a decode step runs through a Llama-shaped model (`cfg`: a config.json, or an
    EAGLE-3 draft's transformer_layer_config with `draft=True`: its layer reads [embeddings, hidden], and its fc
    the aux states). The lm_head is the draft's vocabulary for a draft."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, (cfg.get("num_key_value_heads") or cfg["num_attention_heads"]) * hd
    width = 2 * h if draft else h
    layer = [(width, q), (width, kv), (width, kv), (q, h), (h, inter), (h, inter), (inter, h)]
    head = [(h, cfg.get("draft_vocab_size") or cfg["vocab_size"])]
    return ([(3 * h, h)] if draft else []) + layer * cfg["num_hidden_layers"] + head


def time_gemms(shapes: list[tuple[int, int]], ms, device="cuda", dtype=torch.bfloat16, repeats: int = 50) -> dict:
    """{m: seconds} for one pass over every weight GEMM in `shapes` at m tokens: on CUDA captured in one CUDA graph
    (as vLLM replays a decode step), the median of `repeats` replays; on a CPU eager, the median of a few passes."""
    weights = [torch.empty(o, i, device=device, dtype=dtype).normal_(0, 0.02) for i, o in shapes]
    out = {}
    for m in ms:
        xs = {i: torch.randn(m, i, device=device, dtype=dtype) for i in {i for i, _ in shapes}}

        def run(xs=xs):
            for w in weights:
                torch.matmul(xs[w.shape[1]], w.t())

        out[m] = _median_time(run, device, repeats)
    return out


def _median_time(fn, device, repeats: int) -> float:
    if str(device).startswith("cuda"):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()  # warm-up outside the graph (cuBLAS picks its kernels)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        times = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return float(torch.tensor(times).median())
    fn()
    times = []
    for _ in range(max(3, repeats // 10)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(torch.tensor(times).median())


@torch.no_grad()
def time_forward(model, ms, context: int = 128, repeats: int = 5) -> dict:
    """{m: seconds} of a causal LM's eager forward over m new tokens after a cached context of `context` tokens (the
    cache cropped back after each), the median of `repeats`: what a CPU engine running eager torch pays per step."""
    from transformers import DynamicCache

    dev = next(model.parameters()).device
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(0)).to(dev)
    cache = DynamicCache()
    model(ids, past_key_values=cache, use_cache=True)
    out = {}
    for m in ms:
        new = torch.randint(0, vocab, (1, m), generator=torch.Generator().manual_seed(m)).to(dev)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(new, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            cache.crop(context)
        out[m] = float(torch.tensor(times).median())
    return out
