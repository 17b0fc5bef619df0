"""The cost model of a speculative step and the served speed-up's intervals (issue 48), on hand-made numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftlab.acceptance import costs, speedup

ROOT = Path(__file__).resolve().parents[1]


def test_the_model_is_the_formula_and_picks_the_k_where_drafting_stops_paying():
    v = {m: 0.010 + 0.001 * (m - 1) for m in range(1, 9)}  # a verifier whose forward grows 10% a token
    c = costs.Costs(v, draft_s=0.002, engine_s=0.005)
    tau = {1: 1.7, 2: 2.2, 3: 2.5, 4: 2.6, 5: 2.65}
    rows = costs.predict(tau, c)
    for r in rows:
        k = r["k"]
        step = v[k + 1] + 0.005 + k * 0.002
        assert r["predicted speed-up"] == pytest.approx(tau[k] * 0.015 / step)
        assert r["break-even tau"] == pytest.approx(step / 0.015)
    assert costs.best_k(rows) == 2  # 2.2 * 15 / 21 = 1.571 beats k 3 (2.5 * 15 / 24 = 1.5625) and k 1 (1.417)
    assert costs.bound(c, 5) == "drafting" and costs.bound(costs.Costs(v, 0.0001, 0.02), 1) == "the engine's fixed cost"
    memory_bound = costs.Costs({m: 0.004 for m in range(1, 9)}, draft_s=0.0002, engine_s=0.0003)
    assert costs.predict({5: 2.6}, memory_bound)[0]["predicted speed-up"] == pytest.approx(2.6 * 4.3 / 5.3)


def test_gemm_timing_counts_more_work_as_more_time():
    shapes = costs.linear_shapes({"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "vocab_size": 5000})  # fmt: skip
    assert len(shapes) == 2 * 7 + 1 and shapes[-1] == (256, 5000)
    t = costs.time_gemms(shapes, [1, 2048], device="cpu", dtype=__import__("torch").float32, repeats=30)
    assert 0 < t[1] < t[2048]  # 2048 times the arithmetic: memory-bound at 1, not at 2048


def test_speedup_over_prompts_is_paired_and_its_interval_holds_it():
    plain = [{"token_ids": [0] * n, "seconds": n / 10} for n in (40, 60, 80, 100)]  # 10 tokens/s
    twice = [{"token_ids": [0] * n, "seconds": n / 20} for n in (40, 60, 80, 100)]
    r = speedup.paired_over_prompts(plain, twice)
    assert r["value"] == pytest.approx(2.0) and r["low"] == pytest.approx(2.0) and r["high"] == pytest.approx(2.0)
    mixed = [{"token_ids": [0] * n, "seconds": n / s} for n, s in ((40, 15), (60, 25), (80, 18), (100, 22))]
    r = speedup.paired_over_prompts(plain, mixed)
    assert r["low"] < r["value"] < r["high"] and r["value"] == pytest.approx(
        (280 / sum(o["seconds"] for o in mixed)) / 10
    )
    with pytest.raises(ValueError, match="same prompts"):
        speedup.paired_over_prompts(plain, mixed[:2])
    rep = speedup.over_repeats([100.0, 110.0], [150.0, 160.0])
    assert rep["low"] == pytest.approx(150 / 110) and rep["high"] == pytest.approx(1.6) and rep["repeats"] == 2


def test_a_step_is_the_longer_of_the_devices_work_and_the_engines_host_work():
    v = {m: 0.0008 for m in range(1, 9)}  # a small verifier: its forward is short beside the engine's host work
    small = costs.Costs(v, draft_s=0.00004, engine_s=0.0015, host_s=(0.0048, 0.0002))
    assert small.step_s(1) == pytest.approx(0.005) and small.step_s(5) == pytest.approx(0.0058)
    assert costs.bound(small, 3) == "the engine's host work per step"
    row = costs.predict({1: 1.2}, small)[0]
    assert row["predicted speed-up"] == pytest.approx(1.2 * 0.0023 / 0.005) and row["break-even tau"] > 2
    big = costs.Costs({m: 0.006 for m in range(1, 9)}, draft_s=0.0003, engine_s=0.0004, host_s=(0.0048, 0.0002))
    assert big.step_s(5) == pytest.approx(0.006 + 0.0004 + 5 * 0.0003)  # the device's work outlasts the host's
    assert costs.bound(big, 5) == "drafting"


def test_each_accepted_token_lengthens_the_step_and_moves_the_break_even():
    """H100, vLLM 0.25 (BENCHMARKS, issue 48): a draft accepted 2.5 tokens a step made the 8B stand-in's k-5 step
    2 ms longer than one accepted 1.2, and SmolLM2's too: work per accepted token the engine does not overlap."""
    v = {m: 0.006 for m in range(1, 9)}
    c = costs.Costs(v, draft_s=0.0003, engine_s=0.0004, host_s=(0.0048, 0.0002), per_token_s=0.0015)
    assert c.step_s(5, 1.0) == pytest.approx(0.0079) and c.step_s(5, 3.0) == pytest.approx(0.0079 + 0.003)
    row = costs.predict({5: 3.0}, c)[0]
    assert row["predicted speed-up"] == pytest.approx(3.0 * 0.0064 / 0.0109)
    # at the break-even tau the step costs exactly tau plain tokens
    tau = row["break-even tau"]
    assert c.step_s(5, tau) == pytest.approx(tau * c.plain_s()) and tau > 0.0079 / 0.0064
    assert costs.bound(c, 5, 4.0) == "the engine's work per accepted token" and costs.bound(c, 5, 1.2) == "drafting"
    assert costs.break_even(costs.Costs(v, 0.0003, 0.0004, per_token_s=0.007), 5) == float("inf")


def test_a_block_drafter_pays_one_pass_a_step_whatever_k():
    v = {m: 0.004 for m in range(1, 9)}
    block = costs.Costs(v, draft_s=0.001, engine_s=0.0005, chain=False)
    assert block.step_s(1) == block.step_s(7) == pytest.approx(0.0055)
    assert costs.Costs(v, draft_s=0.001, engine_s=0.0005).step_s(7) == pytest.approx(0.0115)


def test_a_family_the_served_section_could_not_serve_is_reported_not_served_again(monkeypatch):
    """notebook 05 (CI, 2026-12-05): a DFlash-2 draft vLLM refuses became a server start, and the refusal the notebook's
    failure. Now its served-section error is its row, and no server is started for it at that k."""
    from draftlab.acceptance import served, speedup  # noqa: F401  (served binds Server as it is imported: not patched)
    from draftlab.serving import server

    def no_server(*a, **kw):
        raise AssertionError("a server was started")

    monkeypatch.setattr(server, "Server", no_server)
    outputs = [{"tokens": 10, "seconds": 1.0}]
    served_run = {
        "available": True,
        "k": 5,
        "runs": {
            "verifier alone": {"concurrency": 1, "outputs": outputs},
            "dflash2": {"error": "a 'dflash2' checkpoint, which vLLM does not serve"},
        },
    }
    model = {"rows": {"dflash2": [{"k": 5, "predicted speed-up": 0.9}]}, "best_k": {"dflash2": 5}}
    got = speedup.measured_for_model(None, {"dflash2": "/nowhere"}, model, [], 8, "/tmp", served_run)
    assert got == {"dflash2": [{"k": 5, "error": "a 'dflash2' checkpoint, which vLLM does not serve"}]}
    assert speedup.against_model(got, model)[0]["note"].startswith("a 'dflash2' checkpoint")


def test_the_engine_line_is_fitted_over_every_run_given():
    """`speedup.host_line`: c0 + k c1 + c2 (tau - 1) recovered from SmolLM2's served steps, pooled over two
    runs (a weak and a strong draft), and c2 left at 0 where every step accepted about the same."""

    def run(taus: dict[int, float]) -> dict:
        step = {k: 0.005 + 0.0002 * k + 0.0016 * (t - 1) for k, t in taus.items()}
        level = lambda k: {"levels": {"1": {"tokens_per_s": [taus[k] / step[k]], "metrics": {"tau": taus[k]}}}}  # noqa: E731
        return {"servers": {f"original eagle3 k{k}": level(k) for k in taus} | {"original alone": {}}}

    weak, strong = run({1: 1.19, 3: 1.21, 5: 1.22}), run({5: 2.6})
    (c0, c1), c2 = speedup.host_line([weak, strong], "original", "eagle3")
    assert (c0, c1, c2) == pytest.approx((0.005, 0.0002, 0.0016), rel=1e-6)
    (c0, c1), c2 = speedup.host_line([weak], "original", "eagle3")
    assert c2 == 0.0 and c1 == pytest.approx(0.0002, rel=0.2)
    (c0, c1), c2 = speedup.host_line([run({1: 1.6, 3: 2.3, 4: 2.5})], "original", "eagle3")  # tau rising with k alone
    assert c2 == 0.0


def test_a_speculative_steps_fixed_device_cost_is_read_from_a_random_draft_served_at_tau_1():
    """`speedup.spec_fixed`: the step of a random draft at k 5 (tau 1) on a stand-in, less its model
    V(6) + E + 5 D, is the fixed device cost of a speculative step (`Costs.spec_s`), added to every k's device step
    and named by `bound` where it is the largest term; 0 where no run served such a draft."""
    v, d, plain, fixed = {m: 0.006 for m in range(1, 9)}, 0.0003, 0.0064, 0.001
    random_step = v[6] + (plain - v[1]) + 5 * d + fixed
    level = lambda sec: {"levels": {"1": {"tokens_per_s": [1 / sec], "metrics": {"tau": 1.0}}}}  # noqa: E731
    run = {
        "costs": {"8b": {"verify_s": {str(m): t for m, t in v.items()}, "draft_s": {"eagle3": d}}},
        "servers": {"8b alone": level(plain), "8b (random weights) random eagle3 k5": level(random_step)},
    }
    assert speedup.spec_fixed([run], "8b") == pytest.approx(fixed)
    assert speedup.spec_fixed([{"costs": run["costs"], "servers": {"8b alone": level(plain)}}], "8b") == 0.0
    c = costs.Costs(v, d, plain - v[1], spec_s=fixed)
    assert c.gpu_step_s(1) == pytest.approx(v[2] + 0.0004 + d + fixed)
    assert costs.bound(c, 1) == "the speculative step's fixed cost" and costs.bound(c, 5) == "drafting"


def test_a_draft_never_accepted_does_the_same_work_and_proposes_the_next_token_id(tmp_path):
    """`drafts.expand.never_accepted`: the draft's d2t moved by one token id (mod the verifier's vocabulary), every
    other tensor and file the same, so a step served with it is the trained draft's work at tau 1; `spec_fixed`
    reads that server before the reference check's random-weight one."""
    import torch
    from safetensors.torch import load_file, save_file

    from draftlab.drafts.expand import never_accepted

    src = tmp_path / "draft"
    src.mkdir()
    targets = torch.tensor([0, 5, 9, 11])  # draft id i proposes target id targets[i]; the verifier has 12 tokens
    tensors = {
        "d2t": targets - torch.arange(4),
        "t2d": torch.zeros(12, dtype=torch.bool),
        "fc.weight": torch.randn(3, 2),
    }
    save_file(tensors, src / "model.safetensors")
    (src / "config.json").write_text('{"speculators_model_type": "eagle3"}')
    out = load_file(never_accepted(src, tmp_path / "never") / "model.safetensors")
    assert (out["d2t"] + torch.arange(4)).tolist() == [1, 6, 10, 0]
    assert torch.equal(out["fc.weight"], tensors["fc.weight"]) and torch.equal(out["t2d"], tensors["t2d"])
    assert (tmp_path / "never" / "config.json").read_text() == (src / "config.json").read_text()
    v, d, plain = {m: 0.006 for m in range(1, 9)}, 0.0003, 0.0064
    level = lambda sec: {"levels": {"1": {"tokens_per_s": [1 / sec], "metrics": {"tau": 1.0}}}}  # noqa: E731
    base = v[6] + (plain - v[1]) + 5 * d
    run = {
        "costs": {"8b": {"verify_s": {str(m): t for m, t in v.items()}, "draft_s": {"eagle3": d}}},
        "servers": {
            "8b alone": level(plain),
            "8b (random weights) random eagle3 k5": level(base + 0.001),
            "8b eagle3 k5 never accepted": level(base + 0.0005),
        },
    }
    assert speedup.spec_fixed([run], "8b") == pytest.approx(0.0005)


def test_a_sweep_arm_whose_draft_is_not_at_hand_is_put_through_a_hosts_cost_model_by_its_position_shares():
    """`bench_speedup predict-arm`: tau at each k from an arm's bench shares (passes accepting at least i tokens),
    through the cost model of a recorded `speedup` run. On the host that served the one-lease recipe's draft at k 3
    and 4 (2026-12-05; a step's fixed cost from the first lease's random draft), the base arm of that recipe predicts
    5% under the measured speed-ups; the 6000-step arm, whose shares are higher at every position, predicts more at
    every k."""
    assert speedup.taus_from_shares([0.6, 0.4, 0.2]) == pytest.approx({1: 1.6, 2: 2.0, 3: 2.2})
    res = ROOT / "benchmarks" / "results"
    run = json.loads((res / "h100-2026-12-05-ksweep" / "speedup-8b.json").read_text())
    fixed = [json.loads((res / "h100-2026-12-05" / "speedup-8b.json").read_text())]  # its random draft at tau 1

    def predicted(arm: str) -> dict:
        shares = json.loads((res / arm).read_text())["bench tau"]["p"]
        return {
            (r["verifier"], r["k"]): r
            for r in speedup.predict_taus(run, speedup.taus_from_shares(shares), spec_from=fixed)
        }

    base, steps6k = (
        predicted("h100-2026-12-07-sweep2/arm-base.json"),
        predicted("h100-2026-12-07-sweep3/arm-steps6k.json"),
    )
    assert base[("8b", 5)]["tau"] == pytest.approx(2.559, abs=1e-3) and base[("8b", 4)]["measured"] == pytest.approx(
        1.854, abs=1e-3
    )
    for k in (3, 4):
        assert base[("8b", k)]["predicted speed-up"] / base[("8b", k)]["measured"] - 1 == pytest.approx(-0.05, abs=0.01)
    assert all(steps6k[key]["predicted speed-up"] > base[key]["predicted speed-up"] for key in base)


def test_a_speculative_steps_host_cost_is_read_from_the_ngram_served_beside_and_predicts_eagle3_on_that_host():
    """The H100 of 2026-12-07 (BENCHMARKS.md, "The `gpu` profile from a clean checkout"), SmolLM2 at k 5, one request
    in flight: the verifier alone 2,876 tokens in 8.315 s; the n-gram 2,876 in 9.586 s, 1,002 drafting steps, 1,059
    accepted; EAGLE-3 1.128x at the loop's tau 2.862. The parts alone (V, E, 5 D: a 3.086 ms step) predicted 2.68x;
    with the n-gram's step, 1.12x. V(6) is not recorded: it cancels, as the step is the n-gram's plus EAGLE-3's
    drafting."""
    from draftlab.acceptance import cost_model

    alone = {"concurrency": 1, "tokens": 2876, "wall_s": 8.315}
    ngram = {"concurrency": 1, "tokens": 2876, "wall_s": 9.586, "counts": {"drafts": 1002, "accepted": 1059}}
    served_run = {"k": 5, "runs": {"verifier alone": alone, "ngram": ngram}}
    step = cost_model.ngram_step_s(served_run)
    assert step == pytest.approx((9.586 - (2876 - 1002 - 1059) * 8.315 / 2876) / 1002)  # 7.215 ms
    for v6 in (0.70e-3, 0.78e-3, 0.90e-3):
        verify = {1: 0.76e-3, 6: v6}
        e = 8.315 / 2876 - verify[1]
        draft = (3.086e-3 - v6 - e) / 5  # the recorded 3.086 ms step of V(6) + E + 5 D
        before = costs.predict({5: 2.862}, costs.Costs(verify, draft, e))[0]["predicted speed-up"]
        fixed = cost_model.spec_s(served_run, verify, e)
        after = costs.predict({5: 2.862}, costs.Costs(verify, draft, e, spec_s=fixed))[0]["predicted speed-up"]
        assert before == pytest.approx(2.68, abs=0.01) and after == pytest.approx(1.128, rel=0.03)
    assert cost_model.spec_s({"k": 5, "runs": {"verifier alone": alone}}, verify, e) is None  # no n-gram: left out
    assert (
        cost_model.ngram_step_s({"k": 5, "runs": {"verifier alone": {**alone, "concurrency": 8}, "ngram": ngram}})
        is None
    )


def test_the_ngram_term_is_read_on_a_gpu_only(monkeypatch):
    """On a CPU V(m) is transformers' eager forward, host work included: the n-gram's step is not set against it."""
    from types import SimpleNamespace

    from draftlab.acceptance import cost_model

    verify = {m: 0.76e-3 + 0.004e-3 * m for m in range(1, 8)}
    parts = {"verify_s": verify, "draft_s": {"ngram": 1e-5, "eagle3": 3e-5}, "how": {"V": "stand-in"}}
    monkeypatch.setattr(cost_model, "measure", lambda *a, **kw: parts)
    alone = {"concurrency": 1, "tokens": 2876, "wall_s": 8.315, "tokens_per_s": 2876 / 8.315}
    ngram = {"concurrency": 1, "tokens": 2876, "wall_s": 9.586, "counts": {"drafts": 1002, "accepted": 1059}}
    served_run = {"k": 5, "runs": {"verifier alone": {**alone, "levels": [alone]}, "ngram": ngram}}
    got = {}
    for device in ("cpu", "cuda"):
        v = SimpleNamespace(device=SimpleNamespace(type=device))
        got[device] = cost_model.for_run(v, {"ngram": None}, {}, {}, {"ngram": {5: 1.5}}, served_run, [1], 8)
    assert got["cpu"]["spec_s"] is None and "V(m) on a CPU holds the host's work" in got["cpu"]["why"]
    assert got["cuda"]["spec_s"] == pytest.approx(
        cost_model.ngram_step_s(served_run) - verify[6] - got["cuda"]["engine_s"]
    )
    assert got["cuda"]["rows"]["ngram"][0]["step ms"] > 2 * got["cpu"]["rows"]["ngram"][0]["step ms"]
