"""Stage 01's prompt set with `n_bench` (bench prompts apart from the prompts learnt from), and its
notebook's phases each in a cell of its own (so per-cell times name the phase that took them)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from draftlab import DraftlabError
from draftlab.data.prompts import bench_quota, load_prompts, split_of

ROOT = Path(__file__).resolve().parents[1]
# notebooks/params/default.yaml: n_chat, n_code, eval_fraction, n_sharegpt, bench_fraction, max_prompt_chars
DEFAULT = (40, 40, 0.15, 160, 0.15, 1000)


def _learn(prompts):
    return [p for p in prompts if p.split != "bench"]


def _bench(prompts):
    return [p for p in prompts if p.split == "bench"]


def test_n_bench_draws_from_the_whole_sources_and_leaves_train_and_eval_as_they_were():
    before = load_prompts(*DEFAULT)
    more = load_prompts(*DEFAULT, n_bench=120)
    assert _learn(more) == _learn(before), "the prompts learnt from (and their order) do not depend on n_bench"
    assert len(_bench(before)) == 38 and len(_bench(more)) == 120
    assert Counter(p.source for p in _bench(more)) == {"sharegpt": 80, "chat": 20, "code": 20}  # as 160 : 40 : 40
    assert all(p.split == split_of(p.text, 0.15, p.group, 0.15) for p in more), "no prompt changed split"
    assert {p.id for p in _bench(before)} < {p.id for p in _bench(more)}, "the bench prompts of before are kept"
    fewer = load_prompts(*DEFAULT, n_bench=60)
    assert _learn(fewer) == _learn(before) and {p.id for p in _bench(fewer)} < {p.id for p in _bench(more)}
    assert _bench(load_prompts(*DEFAULT, n_bench=0)) == []
    ci = load_prompts(8, 8, 0.25, 24, 0.15, 600, n_bench=12)  # notebooks/params/ci.yaml
    assert Counter(p.source for p in _bench(ci)) == {"sharegpt": 7, "chat": 3, "code": 2}
    assert _learn(ci) == _learn(load_prompts(8, 8, 0.25, 24, 0.15, 600))


def test_bench_quota_follows_the_sources_taken_and_gives_what_one_lacks_to_the_others():
    wanted, have = {"sharegpt": 160, "chat": 40, "code": 40}, {"sharegpt": 1308, "chat": 140, "code": 20}
    assert bench_quota(120, wanted, have) == {"sharegpt": 80, "chat": 20, "code": 20}
    assert bench_quota(300, wanted, have) == {"sharegpt": 224, "chat": 56, "code": 20}  # code holds 20 bench tasks
    assert bench_quota(1468, wanted, have) == have
    assert bench_quota(7, {"a": 1, "b": 1, "c": 1}, {"a": 9, "b": 9, "c": 9}) == {"a": 3, "b": 2, "c": 2}
    assert bench_quota(5, {"a": 0, "b": 1}, {"a": 9, "b": 9}) == {"a": 0, "b": 5}
    held = r"hold only 1468 prompts \(sharegpt 1308, chat 140, code 20\)"
    with pytest.raises(DraftlabError, match=r"n_bench=1469 .* " + held):
        bench_quota(1469, wanted, have)


def test_n_bench_is_refused_where_it_cannot_hold():
    with pytest.raises(DraftlabError, match="n_bench=-1 must be 0 or more"):
        load_prompts(*DEFAULT, n_bench=-1)
    with pytest.raises(DraftlabError, match="n_bench=5 needs bench_fraction above 0"):
        load_prompts(40, 40, 0.15, 160, 0.0, 1000, n_bench=5)
    with pytest.raises(DraftlabError, match="hold only"):
        load_prompts(*DEFAULT, n_bench=5000)


def test_notebook_01_runs_each_costly_phase_in_a_cell_of_its_own():
    """`benchmarks/cell_times.py` names a cell by its first line: reading the prompts and writing the answers
    in one cell once had the generation's time read as the prompts' (the issue-29 report of 90 s reading ShareGPT)."""
    nb = json.loads((ROOT / "notebooks" / "01_extract_hidden_states.ipynb").read_text())
    phases = ("load_verifier(", "load_prompts(", "generate_responses(", "extract(")
    for cell in (c for c in nb["cells"] if c["cell_type"] == "code"):
        code = "".join(cell["source"])
        found = [ph for ph in phases if ph in code]
        assert len(found) <= 1, f"one cell runs {found}: give each its own cell"


def test_longer_bench_prompts_leave_train_and_eval_as_they_were():
    """bench_max_prompt_chars lets ShareGPT bench prompts run deeper than any training row (notebook 05's depth
    plot); the prompts learnt from, their order, and every prompt's split stay as without it."""
    short = load_prompts(*DEFAULT, n_bench=120)
    long = load_prompts(*DEFAULT, n_bench=120, bench_max_prompt_chars=8000)
    assert _learn(long) == _learn(short)
    assert all(len(p.text) <= 1000 for p in _learn(long) if p.source == "sharegpt") and len(_bench(long)) == 120
    share = [p for p in _bench(long) if p.source == "sharegpt"]
    assert max(len(p.text) for p in share) > 1000 >= max(len(p.text) for p in _bench(short) if p.source == "sharegpt")
    assert all(p.split == split_of(p.text, 0.15, p.group, 0.15) for p in long), "no prompt changed split"
    with pytest.raises(DraftlabError, match="bench_max_prompt_chars=8000 needs n_bench"):
        load_prompts(*DEFAULT, bench_max_prompt_chars=8000)
