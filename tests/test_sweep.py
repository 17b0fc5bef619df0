"""Issue 51's sweep (benchmarks/sweep_levers.py): an arm that changes stage 01 gets a dataset of its own, one that
changes training shares the base dataset, and the levers table marks the arm chosen on eval, beside its bench tau
and its paired difference from the base."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _sweep():
    spec = importlib.util.spec_from_file_location("sweep_levers", ROOT / "benchmarks" / "sweep_levers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(arm: str, settings: dict, tau: float) -> dict:
    """An arm's row as the sweep measures it, eval and bench tau alike (0.1 either side)."""
    t = {"value": tau, "lo": tau - 0.1, "hi": tau + 0.1}
    return {"arm": arm, "settings": settings, "steps": 9, "training seconds": 4.0, "eval tau": t, "bench tau": t}


def test_arms_of_stage_01_get_their_own_dataset_and_the_table_marks_the_eval_choice():
    sweep = _sweep()
    assert sweep.arm_run("default", "ttt3", {"ttt_steps": 3}, "smollm2-default").dataset_name == "smollm2-default"
    assert sweep.arm_run("default", "ttt3", {"ttt_steps": 3}, "smollm2-default").run_name == "default-ttt3"
    assert (
        sweep.arm_run("default", "vocab", {"draft_vocab_size": 8192}, "smollm2-default").dataset_name
        == "smollm2-default-vocab"
    )
    assert (
        sweep.arm_run("default", "text", {"extra_samples": 1}, "smollm2-default").dataset_name == "smollm2-default-text"
    )
    # the base drawn again: `seed` draws 01's answers too (a dataset of its own), `train_seed` 04 alone on the same data
    assert sweep.arm_run("default", "seed1", {"seed": 1}, "smollm2-default").dataset_name == "smollm2-default-seed1"
    assert sweep.arm_run("default", "draw1", {"train_seed": 1}, "smollm2-default").dataset_name == "smollm2-default"

    def tau(v):
        return {"value": v, "lo": v - 0.1, "hi": v + 0.1}

    rows = [
        {
            "arm": a,
            "settings": s,
            "steps": 9,
            "training seconds": 4.0,
            "position 1": 0.5,
            "eval tau": tau(e),
            "bench tau": tau(b),
        }
        for a, s, e, b in (("base", {}, 1.2, 1.3), ("noise", {"state_noise": 0.1}, 1.4, 1.25))
    ]
    text = sweep.table({"chosen on eval": "noise", "arms": rows})
    assert (
        '| noise (chosen on eval) | {"state_noise": 0.1} | 9 | 4 | - | - | - | 0.500 | 1.400 [1.300, 1.500] '
        "| 1.250 [1.150, 1.350] | - |" in text
    )
    assert "| base | - | 9 |" in text


def test_each_arm_is_compared_with_the_base_on_the_same_prompts_and_the_table_marks_a_difference_told_apart():
    sweep = _sweep()

    def arm(name, steps):
        tau = {"value": 0.0, "lo": 0.0, "hi": 0.0, "steps": steps}
        return {"arm": name, "settings": {}, "steps": 9, "training seconds": 4.0, "eval tau": tau, "bench tau": tau}

    # per prompt, its verifier passes [start, drafted, accepted]: the base pools tau 1 + 2/3, the arm 1 + 5/2
    base = arm("base", [[[0, 5, 1], [2, 5, 1]], [[0, 5, 0]]])
    rows = [base, arm("ttt5", [[[0, 5, 3]], [[0, 5, 2]]]), arm("same", base["bench tau"]["steps"])]
    vs = sweep.against_base(rows, "bench")
    assert [(c["a"], c["b"]) for c in vs] == [("ttt5", "base"), ("same", "base")]
    assert vs[0]["difference"] == pytest.approx(3.5 - 5 / 3) and vs[0]["lo"] > 0  # every resample of 2 prompts
    assert vs[1]["difference"] == 0 and vs[1]["lo"] == vs[1]["hi"] == 0
    data = {"draft vocabulary": 4096, "eval coverage": 0.8648, "train tokens": 14534}
    rows = [{**r, "data": data, "01 seconds": 293.1 if r["arm"] == "ttt5" else None} for r in rows]
    text = sweep.table({"chosen on eval": "base", "arms": rows, "against the base": {"bench": vs}})
    assert "| ttt5 | - | 9 | 4 | 293 | 4096 (86.5%) | 14,534 |" in text and "| +1.833 [+1.833, +2.000]* |" in text
    lines = text.splitlines()
    assert lines[2].startswith("| base (chosen on eval) |") and lines[2].endswith("| - |")  # no difference of its own
    assert lines[4].endswith("| +0.000 [+0.000, +0.000] |")  # not told apart: no mark


def test_an_arm_of_its_own_dataset_is_charged_its_notebook_01_and_one_on_the_shared_dataset_is_not(tmp_path):
    from draftlab.layout import RunLayout

    sweep = _sweep()
    own, shared = RunLayout("d-text2x", "p-text2x", tmp_path), RunLayout("d", "p-ttt3", tmp_path)
    assert sweep.own_01_seconds(own, "d") is None  # no summary: nothing claimed
    for layout in (own, shared):
        layout.outputs.mkdir(parents=True)
        runs = [{"notebook": "01_extract.ipynb", "seconds": 293.1}, {"notebook": "04_train.ipynb", "seconds": 9}]
        (layout.outputs / "summary.json").write_text(json.dumps(runs))
    assert sweep.own_01_seconds(own, "d") == 293.1 and sweep.own_01_seconds(shared, "d") is None


def test_an_arm_of_its_own_dataset_resumes_the_base_answers_unless_it_changes_what_they_are(tmp_path, monkeypatch):
    from draftlab.layout import RunLayout

    sweep = _sweep()
    base = RunLayout("d", "p", tmp_path)
    base.data.mkdir(parents=True)
    for name in ("responses.jsonl", "responses-sampled-0.jsonl"):
        (base.data / name).write_text(f'{{"id": "a", "response": "{name}", "settings": {{}}}}\n')
    started = []
    monkeypatch.setattr(sweep, "draftlab_run", lambda *a, **k: started.append(a) or "running")
    vocab = RunLayout("d-vocab", "p-vocab", tmp_path)
    assert sweep.train_arm("p", "eagle3", vocab, {"draft_vocab_size": 8192}, "d") == "running"
    assert started[-1][1] == "01,04"  # its own 01 runs, and resumes the copies
    assert sorted(f.name for f in vocab.data.iterdir()) == ["responses-sampled-0.jsonl", "responses.jsonl"]
    assert (vocab.data / "responses.jsonl").read_text() == (base.data / "responses.jsonl").read_text()
    # a file the arm already has stays; an arm that changes the answers' settings writes all of its own
    (vocab.data / "responses.jsonl").write_text("")
    assert sweep.reuse_answers(base, vocab, {"draft_vocab_size": 8192}) == []
    assert (vocab.data / "responses.jsonl").read_text() == ""
    for sets in ({"seed": 1}, {"max_new_tokens": 64}, {"sample_temperature": 1.0}):
        assert sweep.reuse_answers(base, RunLayout("d-x", "p-x", tmp_path), sets) == []
    assert not RunLayout("d-x", "p-x", tmp_path).data.exists()
    assert sweep.reuse_answers(base, RunLayout("d", "p-ttt5", tmp_path), {"ttt_steps": 5}) == []  # the base's own data


def test_an_arm_of_its_own_dataset_frees_its_train_states_once_its_draft_is_written_and_the_base_keeps_its(tmp_path):
    from draftlab.layout import RunLayout

    sweep = _sweep()
    own, shared = RunLayout("d-text2x", "p-text2x", tmp_path), RunLayout("d", "p-ttt3", tmp_path)
    for layout in (own, shared):
        states = layout.split("train") / "hidden_states"
        states.mkdir(parents=True)
        (states / "hs_0.safetensors").write_bytes(b"x" * 1000)
        (layout.split("train") / "token_freq.pt").write_bytes(b"f")
    assert sweep.free_train_states(own, "d", "eagle3") == 0  # not trained yet: its 04 still reads them
    assert (own.split("train") / "hidden_states" / "hs_0.safetensors").is_file()
    for layout in (own, shared):
        layout.final("eagle3").mkdir(parents=True)
        (layout.final("eagle3") / "config.json").write_text("{}")
    assert sweep.free_train_states(own, "d", "eagle3") == 1000
    assert not (own.split("train") / "hidden_states").exists() and (own.split("train") / "token_freq.pt").is_file()
    assert sweep.free_train_states(shared, "d", "eagle3") == 0  # the shared dataset: every arm trains on it
    assert (shared.split("train") / "hidden_states" / "hs_0.safetensors").is_file()


def test_arms_an_earlier_sweep_measured_are_read_back_not_trained_and_one_measured_here_is_kept(tmp_path):
    sweep = _sweep()
    earlier, here = tmp_path / "lease1", tmp_path / "sweep"
    earlier.mkdir(), here.mkdir()
    measured = {**_row("base", {}, 2.5), "bench tau": {"value": 2.5, "steps": [[[0, 5, 3]]]}}
    (earlier / "arm-base.json").write_text(json.dumps(measured))
    (earlier / "arm-ttt5.json").write_text(json.dumps(_row("ttt5", {}, 2.4)))  # no step tables: measured again
    (here / "arm-noise.json").write_text(json.dumps({**measured, "arm": "noise (this lease)"}))
    (earlier / "arm-noise.json").write_text(json.dumps({**measured, "arm": "noise (earlier)"}))
    lease2 = tmp_path / "lease2"  # a second earlier sweep: its steps6k read back, its base not (lease1's comes first)
    lease2.mkdir()
    (lease2 / "arm-steps6k.json").write_text(json.dumps({**measured, "arm": "steps6k"}))
    (lease2 / "arm-base.json").write_text(json.dumps({**measured, "arm": "base (lease2)"}))
    got = sweep.read_back([str(earlier), str(lease2)], here, ["base", "ttt5", "noise", "steps6k"])
    assert got == ["base", "steps6k"] and sweep.measured(here / "arm-steps6k.json")["arm"] == "steps6k"
    assert sweep.measured(here / "arm-base.json") == measured and not (here / "arm-ttt5.json").exists()
    assert json.loads((here / "arm-noise.json").read_text())["arm"] == "noise (this lease)"
    assert sweep.measured(earlier / "arm-ttt5.json") == {} and sweep.measured(here / "arm-steps9k.json") == {}
    assert sweep.read_back(None, here, ["ttt5"]) == [] and sweep.read_back([str(earlier)], here, ["base"]) == []
    # an arm measured under another recipe (its file says so, or its folder's levers.json) is not read back
    other = {**measured, "recipe": ["extra_samples=2", "train_steps=6000"]}
    (lease2 / "arm-t2s6k.json").write_text(json.dumps(other))
    (lease2 / "arm-steps9k.json").write_text(json.dumps(measured))
    (lease2 / "levers.json").write_text(json.dumps({"args": {"base": ["train_steps=1500", "extra_samples=1"]}}))
    recipe = ["extra_samples=1", "train_steps=1500"]  # the same, in another order
    assert sweep.read_back([str(lease2)], here, ["t2s6k", "steps9k"], recipe) == ["steps9k"]
    (tmp_path / "new").mkdir()
    assert sweep.read_back([str(lease2)], tmp_path / "new", ["t2s6k"], ["extra_samples=2", "train_steps=6000"]) == [
        "t2s6k"
    ]
    assert sweep.read_back([str(lease2)], tmp_path / "new", ["steps9k"], ["extra_samples=2"]) == []
    # the first folder holding the arm under this sweep's recipe gives it, past one that measured it under another
    assert sweep.read_back([str(lease2), str(earlier)], tmp_path / "new", ["steps9k"], ["extra_samples=2"]) == []
    (earlier / "arm-steps9k.json").write_text(json.dumps({**measured, "arm": "steps9k (lease1)", "recipe": []}))
    assert sweep.read_back([str(lease2), str(earlier)], tmp_path / "new", ["steps9k"], []) == ["steps9k"]
    assert json.loads((tmp_path / "new" / "arm-steps9k.json").read_text())["arm"] == "steps9k (lease1)"


def test_arms_of_leases_with_different_recipes_are_tabled_by_what_each_ran_with_and_the_steps_curve_keeps_like(
    tmp_path,
):
    """The GPU sweeps of 2026-12-07: the base and steps3k (sweep2, no recipe kept), steps6k and steps9k (sweep3's
    recipe: one sampled answer, 1500 steps) and t2s6k (sweep4's: two sampled answers, 6000 steps, no settings of its
    own). Summarised together, t2s6k is shown with the two settings it ran with and is not a point of the steps curve
    (it was, as a 6000-step arm of the base recipe, before the recipes were read)."""
    res = ROOT / "benchmarks" / "results"
    files = [res / "h100-2026-12-07-sweep2" / f"arm-{a}.json" for a in ("base", "steps3k")]
    files += [res / "h100-2026-12-07-sweep3" / f"arm-{a}.json" for a in ("steps6k", "steps9k")]
    files += [res / "h200-2026-12-07-sweep4" / "arm-t2s6k.json"]
    result = _sweep().resummarise(tmp_path / "levers.json", [str(f) for f in files])
    settings = {r["arm"]: r["settings"] for r in result["arms"]}
    assert settings == {
        "base": {},
        "steps3k": {"train_steps": 3000},
        "steps6k": {"train_steps": 6000},
        "steps9k": {"train_steps": 9000},
        "t2s6k": {"extra_samples": 2, "train_steps": 6000},
    }
    bench = next(c for c in result["steps curve"] if c["split"] == "bench")
    assert [s for s, _ in bench["points"]] == [1500, 3000, 6000, 9000]
    assert [round(t, 4) for s, t in bench["points"] if s == 6000] == [2.8508]  # steps6k's, not t2s6k's 2.8649
    assert '| t2s6k | {"extra_samples": 2, "train_steps": 6000} |' in _sweep().table(result)


def test_an_arm_whose_states_would_not_fit_on_the_disk_is_not_started_and_said(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from draftlab.layout import RunLayout

    sweep = _sweep()
    base, text4x = RunLayout("d", "p", tmp_path), RunLayout("d-text4x", "p-text4x", tmp_path)
    for split, size in (("train", 3000), ("eval", 1000)):
        (base.split(split) / "hidden_states").mkdir(parents=True)
        (base.split(split) / "hidden_states" / "hs_0.safetensors").write_bytes(b"x" * size)
    base.resolved_config("01").write_text(
        json.dumps({"stage": "01", "config": {"extra_samples": 1}})
    )  # as 01 writes it
    free = {"bytes": 8000}
    monkeypatch.setattr(sweep.shutil, "disk_usage", lambda path: SimpleNamespace(free=free["bytes"]))
    assert sweep.states_room(text4x, base, {"extra_samples": 3}) is None  # train 3000 x 4/2 + eval 1000 = 7000
    free["bytes"] = 7500  # under 7000 with a tenth to spare
    why = sweep.states_room(text4x, base, {"extra_samples": 3})
    assert why.startswith("d-text4x: not started: its 01 would write about 7e-06 GB") and "7.5e-06 GB are free" in why
    assert "(the base's train 3e-06 GB x 2 and eval 1e-06 GB)" in why  # the sampled answers are train's only
    # online, 01 keeps a few train rows' states: the eval split's is what it writes
    assert sweep.states_room(text4x, base, {"extra_samples": 3, "hidden_states": "online"}) is None
    free["bytes"] = 1000
    assert "about 1e-06 GB" in sweep.states_room(text4x, base, {"extra_samples": 3, "hidden_states": "online"})
    free["bytes"] = 7500
    assert sweep.states_room(RunLayout("d", "p-ttt5", tmp_path), base, {"ttt_steps": 5}) is None  # shared dataset
    (text4x.split("train") / "hidden_states").mkdir(parents=True)
    assert sweep.states_room(text4x, base, {"extra_samples": 3}) is None  # its 01 wrote states: it resumes them

    # the sweep skips it, trains and measures the others, and keeps the reason in levers.json
    trained, out = [], tmp_path / "sweep" / "levers.json"
    monkeypatch.setattr(sweep, "states_room", lambda layout, b, sets: "no room" if "extra_samples" in sets else None)
    monkeypatch.setattr(sweep, "train_arm", lambda profile, kind, layout, sets, b, base_sets: trained.append(layout))
    monkeypatch.setattr(sweep, "measure_arm", lambda args, v, prompts, name, sets, layout, b: {"arm": name})

    def summarise(rows, o, args, beside):  # writes what main hands it, as the real one does
        o.parent.mkdir(parents=True, exist_ok=True)
        o.write_text(json.dumps(result := {"arms": [r["arm"] for r in rows], **beside}))
        return result

    monkeypatch.setattr(sweep, "summarise", summarise)
    monkeypatch.setattr(sweep.config, "load_profile", lambda profile: {"dataset_name": "d", "verifier": "v"})
    monkeypatch.setattr(sweep, "draftlab_run", lambda *a: None)
    monkeypatch.setattr(sweep, "load_verifier", lambda *a, **k: SimpleNamespace(tokenizer=None))
    monkeypatch.setattr(sweep, "load_spec_prompts", lambda *a: [])
    cover = [{"draft vocabulary": 16, "train coverage": 1.0, "eval coverage": 0.9}]
    monkeypatch.setattr(sweep.arms, "vocab_coverage", lambda layout, sizes: cover if sizes == [] else None)
    argv = ["sweep_levers.py", "--arm", "base:", "--arm", "big:extra_samples=3", "--arm", "ttt5:ttt_steps=5"]
    monkeypatch.setattr(sys, "argv", [*argv, "--profile", "p", "--out", str(out)])
    sweep.main()
    assert [layout.run_name for layout in trained] == ["p-base", "p-ttt5"]
    want = {"arms": ["base", "ttt5"], "vocabulary coverage": cover, "not run": {"big": "no room"}}
    assert json.loads(out.read_text()) == want


@pytest.mark.parametrize("overlap", [False, True])
def test_arms_train_in_order_and_with_overlap_the_next_trains_while_this_one_is_measured(overlap):
    events = []

    class Run:  # a finished `draftlab run`
        returncode = 0

        def __init__(self, name):
            self.name = name

        def wait(self):
            events.append(f"trained {self.name}")
            return 0

        def poll(self):
            return 0

    def train(name):
        events.append(f"start {name}")
        return Run(name)

    rows = _sweep().run_arms(["base", "a", "b"], train, lambda n: events.append(f"measure {n}") or {"arm": n}, overlap)
    assert [r["arm"] for r in rows] == ["base", "a", "b"]
    for n in ("base", "a", "b"):  # an arm is measured only once its training ended
        assert events.index(f"trained {n}") < events.index(f"measure {n}")
    # with overlap, a's training starts before base is measured; without, after
    assert (events.index("start a") < events.index("measure base")) is overlap


def test_a_failed_training_stops_the_sweep_and_names_the_command():
    class Failed:
        returncode, args = 1, ["draftlab", "run", "--run-name", "default-a"]

        def wait(self):
            return 1

        def poll(self):
            return 1

    with pytest.raises(subprocess.CalledProcessError, match="default-a"):
        _sweep().run_arms(["a"], lambda n: Failed(), lambda n: {"arm": n}, overlap=True)


def test_a_cut_sweeps_arm_files_give_the_table_and_figures_the_whole_sweep_gave(tmp_path):
    """`summarise` rebuilds the result from the arms a sweep had measured (the CPU pilot's, its own-01 seconds kept in
    the arm's file as the sweep now does): the rows equal those of the whole sweep's table. What the sweep had written
    in levers.json beside the arms (its arguments, the vocabulary coverage) stays; a served figure for an arm not
    among those summarised goes (2026-12-07: the rewrite dropped a GPU sweep's coverage line and arguments)."""
    pilot = ROOT / "benchmarks" / "results" / "levers-cpu-2026-12-06"
    text2x = json.loads((pilot / "arm-text2x.json").read_text())
    (tmp_path / "arm-text2x.json").write_text(json.dumps({**text2x, "01 seconds": 293.1}))
    coverage = [{"draft vocabulary": 32768, "train coverage": 1.0, "eval coverage": 0.9948}]
    earlier = {"args": {"profile": "gpu", "k": 5}, "vocabulary coverage": coverage, "served": {"arm": "ttt3"}}
    (tmp_path / "levers.json").write_text(json.dumps(earlier))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sweep_levers.py"), "summarise", str(tmp_path / "levers.json")]
    got = subprocess.run(
        [*cmd, str(pilot / "arm-base.json"), str(tmp_path / "arm-text2x.json")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    whole = _sweep().table(json.loads((pilot / "levers.json").read_text())).splitlines()
    drop = [i for i, c in enumerate(whole[0].split(" | ")) if c in ("acc 2", "acc 3")]  # ttt3's, not among these

    def cells(line):
        return [c for i, c in enumerate(line.split(" | ")) if i not in drop]

    rows = {line.split(" | ")[0]: line for line in got.splitlines()}
    assert rows["| text2x (chosen on eval)"].split(" | ") == cells(whole[-1])  # 271 s, own 01 293 s, +0.050*
    assert rows["| base"].split(" | ") == cells(whole[2])
    assert (tmp_path / "levers.png").stat().st_size > 0 and (tmp_path / "levers_cost.png").stat().st_size > 0
    result = json.loads((tmp_path / "levers.json").read_text())
    assert result["args"] == earlier["args"] and result["vocabulary coverage"] == coverage
    assert "served" not in result and [Path(f).name for f in result["summarised from"]] == [
        "arm-base.json",
        "arm-text2x.json",
    ]
    assert [r["arm"] for r in result["arms"]] == ["base", "text2x"]


def test_arms_that_only_draw_the_base_again_are_the_yardstick_the_table_states():
    sweep = _sweep()

    def arm(name, settings, d, half=0.03):
        return _row(name, settings, 1.0), {"a": name, "b": "base", "difference": d, "lo": d - half, "hi": d + half}

    rows, vs = zip(
        *[
            arm("base", {}, 0),
            arm("text4x", {"extra_samples": 3}, 0.069),
            arm("text2x", {"extra_samples": 1}, 0.026),
            arm("noise3", {"state_noise": 0.3}, -0.07, half=0.08),  # beyond every draw, 0 inside its interval
            arm("seed1", {"seed": 1}, 0.058),
            arm("draw1", {"train_seed": 1}, -0.01),
        ],
        strict=True,
    )
    text = sweep.table({"chosen on eval": "text4x", "arms": list(rows), "against the base": {"bench": list(vs[1:])}})
    assert "The base drawn again (seed1, draw1) moved bench tau by +0.058, -0.010" in text
    assert "only beyond 0.058; beyond it: text4x*, noise3 (* its paired interval leaves out 0 too" in text
    no_draws = sweep.table(
        {"chosen on eval": "text4x", "arms": list(rows[:3]), "against the base": {"bench": list(vs[1:3])}}
    )
    assert "drawn again" not in no_draws


def test_the_arm_chosen_on_eval_is_served_by_vllm_and_the_table_gives_vllms_tau_beside_the_loops(tmp_path, monkeypatch):
    from argparse import Namespace

    from draftlab.layout import RunLayout

    sweep = _sweep()
    layout = RunLayout("d-vocab", "p-vocab", tmp_path)
    calls = []

    def run_05(profile, stages, run_name, sets):  # what notebook 05 writes, as metrics.json holds it
        calls.append((stages, run_name, sets))
        layout.stage("05").mkdir(parents=True)
        tau = {"value": 2.4, "lo": 2.2, "hi": 2.6}
        pairs = [{"a": "eagle3 (draftlab loop)", "b": "eagle3 (vLLM)", "difference": 0.01, "lo": -0.02, "hi": 0.03}]
        pairs[0] |= {"value_a": 2.41, "value_b": 2.4}
        served = {"available": True, "intervals": {"eagle3": {"tau": {"pooled": tau}, "n_prompts": 32}}}
        (layout.stage("05") / "metrics.json").write_text(json.dumps({"served": {**served, "loop_vs_vllm": pairs}}))

    monkeypatch.setattr(sweep, "draftlab_run", run_05)
    args = Namespace(prompts=32, k=5, max_new_tokens=96, base=["extra_samples=1"], kind="eagle3")
    args.profile = "p"
    got = sweep.serve_chosen(args, "vocab", {"draft_vocab_size": 32768}, layout, "d")
    stages, run_name, sets = calls[0]
    assert (stages, run_name) == ("05", "p-vocab")
    for want in ("dataset_name=d-vocab", "draft_kinds=[eagle3]", "spec_prompts=32", "serve_concurrency=[1]"):
        assert want in sets
    assert got["vLLM bench tau"] == {"value": 2.4, "lo": 2.2, "hi": 2.6} and got["loop - vLLM"]["difference"] == 0.01

    rows = [_row("base", {}, 2.5), _row("vocab", {"x": 1}, 2.5)]
    text = sweep.table({"chosen on eval": "vocab", "arms": rows, "served": got})
    lines = {line.split(" | ")[0]: line for line in text.splitlines()}
    assert lines["| vocab (chosen on eval)"].endswith("| 2.400 [2.200, 2.600] |")
    assert lines["| base"].endswith("| - | - |")  # no paired difference, no vLLM figure
    assert "vocab served by vLLM (32 bench prompts, one in flight): loop minus vLLM +0.010 [-0.020, +0.030]" in text
    assert "paired; 05's loop 2.410." in text
    # a draft trained again for serving (its arm read back from an earlier lease) is said to be
    again = sweep.table({"chosen on eval": "vocab", "arms": rows, "served": {**got, "draft": "trained again"}})
    assert "paired; 05's loop 2.410 (trained again)." in again

    # vLLM not serving it is said, not taken for a figure
    layout.stage("05").joinpath("metrics.json").write_text(json.dumps({"served": {"available": False, "reason": "x"}}))
    monkeypatch.setattr(sweep, "draftlab_run", lambda *a: None)
    with pytest.raises(SystemExit, match="vLLM did not serve vocab's eagle3: x"):
        sweep.serve_chosen(args, "vocab", {}, layout, "d")


def test_vocab_coverage_gives_each_sizes_train_and_held_out_share_and_writes_nothing_in_the_dataset(tmp_path):
    import numpy as np
    import torch

    from draftlab import DraftlabError
    from draftlab.layout import RunLayout
    from draftlab.training import arms

    layout = RunLayout("d", "_", tmp_path)
    with pytest.raises(DraftlabError, match=r"train/token_freq.pt is missing: run stage 01 on d first"):
        arms.vocab_coverage(layout)
    for split, freq in (("train", {0: 5, 1: 3, 2: 2}), ("eval", {0: 4, 1: 1, 3: 5})):
        layout.split(split).mkdir(parents=True)
        torch.save(freq, layout.split(split) / "token_freq.pt")
    layout.resolved_config("01").write_text(json.dumps({"config": {"draft_vocab_size": 2}}))
    np.save(layout.vocab(2)[1], np.zeros(8, dtype=bool))  # 01's t2d: one entry per verifier token (8)
    before = sorted(layout.data.rglob("*"))
    rows = arms.vocab_coverage(layout, [1])  # its own 2, twice it 4, the whole 8, and 1
    # train: the top 1 / 2 tokens hold 5 / 8 of 10; eval: token 3 was never in train, so only a vocabulary larger than
    # the train's 3 tokens has it (speculators fills one with unseen tokens, in id order)
    got = [(r["draft vocabulary"], r["train coverage"], r["eval coverage"]) for r in rows]
    assert got == [(1, 0.5, 0.4), (2, 0.8, 0.5), (4, 1.0, 1.0), (8, 1.0, 1.0)]
    assert sorted(layout.data.rglob("*")) == before
    assert (
        arms.coverage_line(rows[:1])
        == "supervised tokens the draft vocabulary can emit, train / eval: 1: 0.5000 / 0.4000"
    )


def test_the_steps_curve_finds_where_a_saturating_lever_levels_off_and_the_steps_a_target_needs():
    """Arms of the base recipe at four step counts, tau drawn from 3.2 - 0.5 / (steps/1000): the fit gives the ceiling
    3.2 back and 3.0 at 2,500 steps; a ceiling under the target says steps alone do not reach it; arms that change
    anything beside `train_steps` are left out, and under three step counts there is no curve. The table prints it."""
    from draftlab.training import arms

    sweep = _sweep()

    def arm(name, steps, settings=None):
        tau = {"value": 3.2 - 0.5 / (steps / 1000), "lo": 0.0, "hi": 9.0}
        return {"arm": name, "steps": steps, "settings": settings or {"train_steps": steps}, "bench tau": tau}

    rows = [arm("base", 1500, {}), arm("s3", 3000), arm("s6", 6000), arm("s12", 12000)]
    rows += [{**arm("text", 6000, {"extra_samples": 2, "train_steps": 6000}), "bench tau": {"value": 1.0}}]
    curve = arms.steps_curve(rows, "bench", 3.0)
    assert abs(curve["ceiling"] - 3.2) < 0.005 and abs(curve["a"] - 1.0) < 0.02 and curve["rms"] < 1e-3
    assert abs(curve["steps for target"] - 2500) < 60 and [s for s, _ in curve["points"]] == [1500, 3000, 6000, 12000]
    assert arms.steps_curve(rows, "bench", 3.3)["steps for target"] is None
    assert "3.3 not reached by steps" in arms.curve_line(arms.steps_curve(rows, "bench", 3.3))
    assert arms.steps_curve(rows[:2] + rows[-1:], "bench", 3.0) is None
    falling = [{**r, "bench tau": {"value": 2.0 - r["steps"] / 10000}} for r in rows[:4]]
    assert arms.steps_curve(falling, "bench", 3.0)["ceiling"] is None
    assert "does not rise with steps" in arms.curve_line(arms.steps_curve(falling, "bench", 3.0))
    result = {"arms": [_row("base", {}, 2.867)], "chosen on eval": "base", "steps curve": [curve]}
    assert "levels off at 3.200" in sweep.table(result) and "3.0 at about 2," in sweep.table(result)
