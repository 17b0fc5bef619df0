"""Step tables, the two pooling rules, bootstrap intervals over prompts, paired comparisons, depth buckets,
sample sizes and their plots, on hand-made step records whose figures are known exactly."""

import json
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from draftlab import DraftlabError  # noqa: E402
from draftlab.acceptance import plots  # noqa: E402
from draftlab.acceptance.depth import by_depth, depth_edges  # noqa: E402
from draftlab.acceptance.intervals import (  # noqa: E402
    PER_REQUEST,
    POOLED,
    SAME,
    StepRecord,
    estimate,
    paired,
    sample_size,
    step_table,
    step_table_from_arrays,
)
from draftlab.acceptance.speculative import Generation, Step  # noqa: E402

K = 4


def table_of(accepted: list[list[int]], prompt_len: int = 20, drafted: int = K):
    return step_table_from_arrays([prompt_len] * len(accepted), accepted, [[drafted] * len(a) for a in accepted])


def noisy(seed: int, n_prompts: int = 40, difficulty=None, shift: float = 0.0):
    """Prompts of 5..30 steps; each draft position accepted with the prompt's own probability (shifted by
    `shift`), so the steps of one prompt share its difficulty as real prompts do."""
    rng = np.random.default_rng(seed)
    q = difficulty if difficulty is not None else rng.uniform(0.2, 0.9, n_prompts)
    lengths = np.random.default_rng(123).integers(5, 31, len(q))
    accepted = [
        [int(np.argmin(np.append(rng.random(K) < qp + shift, False))) for _ in range(n)]
        for qp, n in zip(q, lengths, strict=True)
    ]
    return table_of(accepted)


def width(e: dict) -> float:
    return e["hi"] - e["lo"]


def test_pooled_and_per_request_mean_differ_where_prompts_differ_in_length():
    table = table_of([[4] * 10, [0], []])
    est = estimate(table, K)
    assert est["tau"][POOLED]["value"] == 1 + 40 / 11
    assert est["tau"][PER_REQUEST]["value"] == ((1 + 4) + (1 + 0)) / 2
    assert est["acceptance_rate"][POOLED]["value"] == 40 / 44
    assert est["acceptance_rate"][PER_REQUEST]["value"] == 0.5
    assert [est[f"p_{i}"][POOLED]["value"] for i in range(1, K + 1)] == [10 / 11] * K
    assert est["p_1"][PER_REQUEST]["value"] == 0.5
    assert est["n_prompts"] == 3 and est["n_prompts_without_steps"] == 1 and est["n_steps"] == 11
    assert est["tau"][PER_REQUEST]["n_prompts"] == 2
    assert set(est["rules"]) == {POOLED, PER_REQUEST}
    assert estimate(table)["k"] == K
    json.dumps(est, allow_nan=False)


def test_an_empty_table_is_refused_with_the_fix():
    with pytest.raises(DraftlabError, match="max_new_tokens"):
        estimate([[], []], K)
    with pytest.raises(DraftlabError, match="p_<i>"):
        paired(table_of([[1]]), table_of([[1]]), "a", "b", stat="tau2")


def test_the_bootstrap_contains_the_estimate_narrows_with_more_prompts_and_repeats_with_its_seed():
    table = noisy(0)
    est = estimate(table, K)
    for stat in ("tau", "acceptance_rate", *(f"p_{i}" for i in range(1, K + 1))):
        for rule in (POOLED, PER_REQUEST):
            e = est[stat][rule]
            assert e["lo"] <= e["value"] <= e["hi"] and e["lo"] < e["hi"], (stat, rule)
    four = estimate(table * 4, K)
    for rule in (POOLED, PER_REQUEST):  # sqrt(4) in theory: half as wide
        assert width(four["tau"][rule]) < 0.7 * width(est["tau"][rule])
    assert estimate(table, K, seed=3) == estimate(table, K, seed=3)
    assert estimate(table, K, seed=3)["tau"][POOLED] != est["tau"][POOLED]


def test_identical_prompts_give_a_degenerate_interval():
    est = estimate(table_of([[0, 3, 4, 1, 2]] * 20), K)
    for stat in ("tau", "acceptance_rate", "p_1", "p_4"):
        for rule in (POOLED, PER_REQUEST):
            e = est[stat][rule]
            assert e["lo"] == e["hi"] == e["value"], (stat, rule, e)


def test_two_thousand_resamples_of_two_hundred_prompts_are_quick():
    table = noisy(1, n_prompts=200)
    t0 = time.perf_counter()
    estimate(table, K)
    assert time.perf_counter() - t0 < 2.0  # a loop over resamples takes far longer; 2 s leaves room for a busy CPU


def test_paired_difference_is_exact_and_names_the_higher():
    a = noisy(2)
    first = [next(j for j, s in enumerate(p) if s.accepted < s.drafted) for p in a]  # room for one more
    b = [
        [s._replace(accepted=s.accepted + 1) if j == f else s for j, s in enumerate(p)]
        for p, f in zip(a, first, strict=True)
    ]
    n_steps = sum(len(p) for p in a)
    ab = paired(a, b, "a", "b")
    assert ab["difference"] == pytest.approx(-len(a) / n_steps, rel=1e-12)
    assert ab["hi"] < 0 and ab["verdict"] == "b higher"
    ba = paired(b, a, "b", "a")
    assert ba["lo"] > 0 and ba["verdict"] == "b higher"
    assert paired(a, b, "eagle3", "dflash")["verdict"] == "dflash higher"
    json.dumps(ab, allow_nan=False)


def test_paired_same_distribution_is_not_distinguishable_and_pairing_narrows_the_interval():
    q = np.random.default_rng(7).uniform(0.1, 0.95, 40)
    a, b = noisy(10, difficulty=q), noisy(11, difficulty=q)
    same = paired(a, b, "a", "b")
    assert same["verdict"] == SAME and same["lo"] <= 0 <= same["hi"]
    worse = paired(a, noisy(12, difficulty=q, shift=-0.05), "a", "b")
    assert width(worse) < 0.8 * width(worse["unpaired"])  # the prompts' difficulty cancels only when paired


def test_paired_refuses_tables_of_different_prompt_counts():
    with pytest.raises(DraftlabError, match="same prompts"):
        paired(noisy(0, 5), noisy(0, 6), "a", "b")


def test_step_table_of_generations_starts_each_step_after_the_tokens_before_it():
    steps = [Step(3, 2, 9, 5), Step(3, 0, 9, 5), Step(3, 3, 9)]
    tokens = [1] + [2, 2, 9] + [9] + [2, 2, 2, 9]  # prefill, then accepted + bonus per step
    gen = Generation(prompt_ids=list(range(7)), tokens=tokens, labels=[], steps=steps)
    empty = Generation(prompt_ids=[1, 2], tokens=[3], labels=["prefill"])
    table = step_table([gen, empty])
    assert table == [[StepRecord(8, 3, 2), StepRecord(11, 3, 0), StepRecord(12, 3, 3)], []]
    assert table[0][-1].start + table[0][-1].accepted + 1 == len(gen.prompt_ids) + len(tokens)
    assert step_table_from_arrays([7, 2], [[2, 0, 3], []], [[3, 3, 3], []]) == table
    with pytest.raises(DraftlabError, match="0..drafted"):
        step_table_from_arrays([7], [[4]], [[3]])
    with pytest.raises(DraftlabError, match="one of each"):
        step_table_from_arrays([7, 8], [[1]], [[3]])


def test_by_depth_buckets_steps_by_start_with_exact_pooled_figures():
    # prompt 0 starts at 10: steps at 10 (2), 13 (4), 18 (0), 19 (1); prompt 1 at 12: 12 (0), 13 (3), 17 (4), 22 (0)
    table = step_table_from_arrays([9, 11, 40], [[2, 4, 0, 1], [0, 3, 4, 0], [1]], [[4] * 4, [4] * 4, [4]])
    assert [s.start for s in table[0]] == [10, 13, 18, 19] and [s.start for s in table[1]] == [12, 13, 17, 22]
    out = by_depth(table, [0, 16, 32, float("inf")])
    low, mid, deep = out["buckets"]
    assert (low["n_steps"], low["n_prompts"], mid["n_steps"], mid["n_prompts"]) == (4, 2, 4, 2)
    assert low["tau"]["value"] == 1 + (2 + 4 + 0 + 3) / 4 and low["p_1"]["value"] == 3 / 4
    assert mid["tau"]["value"] == 1 + (0 + 1 + 4 + 0) / 4 and mid["p_1"]["value"] == 2 / 4
    assert low["tau"]["lo"] <= low["tau"]["value"] <= low["tau"]["hi"]
    assert deep == {
        "lo": 32.0,
        "hi": None,
        "x": 41.0,
        "n_steps": 1,
        "n_prompts": 1,
        "tau": {"value": 2.0, "lo": None, "hi": None},
        "p_1": {"value": 1.0, "lo": None, "hi": None},
    }
    assert low["x"] == 8.0 and out["edges"][-1] is None and out["n_steps_outside"] == 0
    assert by_depth(table, [16, 32])["n_steps_outside"] == 5
    json.dumps(out, allow_nan=False)
    assert depth_edges(table) == [8.0, 16.0, 32.0, 64.0]
    with pytest.raises(DraftlabError, match="increasing"):
        by_depth(table, [0, 0, 16])


def test_sample_size_scales_with_the_square_root_of_the_prompts():
    table = noisy(4)
    now, four = sample_size(table), sample_size(table * 4)
    assert abs(four["n_prompts_needed"] / now["n_prompts_needed"] - 1) < 0.3
    assert abs(four["half_width"] / now["half_width"] - 0.5) < 0.15
    assert now["summary"] == (
        f"tau reached +-{now['half_width']:.3f} with 40 prompts; +-0.05 needs about {now['n_prompts_needed']}"
    )
    assert sample_size(table, half_width=now["half_width"])["n_prompts_needed"] == 40


def _figures():
    a, b, c = noisy(0, 10), noisy(1, 10), noisy(2, 10)
    ests = {"eagle3": estimate(a, K, n_boot=200), "dflash": estimate(b, K, n_boot=200)}
    comps = [paired(a, b, "eagle3", "dflash", n_boot=200), paired(a, c, "eagle3", "ngram", n_boot=200)]
    depth = {name: by_depth(t, depth_edges(t), n_boot=200) for name, t in (("eagle3", a), ("vLLM eagle3", b))}
    return {
        "interval": lambda: plots.interval_plot(ests),
        "paired": lambda: plots.paired_plot(comps, "t"),
        "depth": lambda: plots.depth_plot(depth, pack_len=32, title="t"),
    }


@pytest.mark.parametrize("name", ["interval", "paired", "depth"])
def test_interval_plots_return_their_figure_and_write_nothing(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fig = _figures()[name]()
    assert isinstance(fig, Figure) and fig.axes
    assert list(tmp_path.iterdir()) == [], "a plot function wrote a file"
    if name == "depth":
        assert all("training pack length" in ax.get_legend_handles_labels()[1] for ax in fig.axes)
    plt.close(fig)
