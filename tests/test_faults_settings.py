"""Every setting checked before the first notebook (issue 50): `draftlab run --check` prints the plan and runs nothing,
and a value a stage would refuse minutes into a run is refused at once, naming the key and the values it takes; a
profile or `--set` that is not YAML is named with its line and column; stage 01 refuses a draft vocabulary larger
than its verifier's before any answer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from draftlab import DraftlabError
from draftlab.run import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path, monkeypatch, embedded_dir):
    """A DRAFTLAB_HOME with the shipped profiles, the converted embedded verifier and one notebook per stage that
    fails if it is ever run."""
    import json

    from conftest import link_embedded, notebook

    link_embedded(tmp_path, embedded_dir)
    shutil.copytree(ROOT / "notebooks" / "params", tmp_path / "notebooks" / "params")
    for name in ("01_a", "02_b", "03_c", "04_d", "05_e"):
        nb = notebook("raise SystemExit('a notebook ran')")
        (tmp_path / "notebooks" / f"{name}.ipynb").write_text(json.dumps(nb))
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    return tmp_path


def _check(capsys, *args) -> tuple[int, str, str]:
    rc = main(["run", "--profile", "ci", "--check", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_check_prints_the_plan_and_runs_nothing(home, tiny_dir, capsys):
    rc, out, err = _check(capsys, "--run-name", "mine", "--set", f"verifier={tiny_dir}", "--set", "draft_vocab_size=64")
    assert rc == 0, err
    assert "profile ci, run 'mine', dataset 'smollm2-ci': D = data/runs/smollm2-ci, O = outputs/mine" in out
    assert f"verifier {tiny_dir}: {tiny_dir} (8 layers, " in out
    lines = {line[:2]: line for line in out.splitlines() if line[:2] in ("01", "02", "03", "04", "05")}
    assert sorted(lines) == ["01", "02", "03", "04", "05"]
    assert "writes D/prompts.jsonl, D/responses.jsonl, D/train, D/eval, D/config.json, O/01" in lines["01"]
    assert "writes D/drafts/mine/{eagle3,peagle,dflash,dflash2,dspark,xpress}, O/04" in lines["04"]
    assert "reads D/prompts.jsonl (bench), D/drafts/mine/{eagle3," in lines["05"] and "served by vLLM" in lines["05"]
    assert "nothing was run" in out
    assert not (home / "outputs").exists() and not (home / "data" / "runs").exists(), "nothing written"


@pytest.mark.parametrize(
    "setting, says",
    [
        (
            "draft_kinds=[]",
            r"draft_kinds=\[\] is refused: draft_kinds takes a list naming each family once.*it is empty",
        ),
        ("draft_kinds=[eagle3, dflash, eagle3]", r"takes a list naming each family once.*\(it names 'eagle3' twice\)"),
        ("draft_kinds=[mtp]", r"at least one of \['eagle3'.*it names no family draftlab trains"),
        (
            "dflash_block_size=1",
            r"dflash_block_size=1 is refused: dflash_block_size takes a whole number of at least 2",
        ),
        ("n_anchors=0", r"n_anchors=0 is refused: n_anchors takes a whole number of at least 1 \(DFlash blocks"),
        ("ttt_steps=0", r"ttt_steps=0 is refused: ttt_steps takes a whole number of at least 1"),
        ("spec_k=-1", r"spec_k=-1 is refused: spec_k takes a whole number of at least 1"),
        ("serve_concurrency=[]", r"serve_concurrency=\[\] is refused: .*at least one number of requests in flight"),
        ("serve_concurrency=[1, -4]", r"serve_concurrency=\[1, -4\] is refused: .* or 0 for every prompt at once"),
        ("draft_vocab_size=0", r"draft_vocab_size=0 is refused: draft_vocab_size takes a whole number of at least 1"),
        ("engine=vlm", r"engine='vlm' is refused: engine takes one of \['auto', 'hf', 'vllm'\]"),
        ("train_steps=0", r"train_steps=0: must be at least 1"),
        ("compare_runs=[a/b/c]", r"compare_runs=\['a/b/c'\] is refused: .*`dataset/run`, each once \('a/b/c' is no"),
        ("compare_runs=[a, a]", r"compare_runs=\['a', 'a'\] is refused: .*\(a run is named twice\)"),
    ],
)
def test_a_setting_a_stage_would_refuse_is_refused_up_front_naming_the_key_and_its_values(home, capsys, setting, says):
    import re

    rc, out, err = _check(capsys, "--set", setting)
    assert rc == 1 and re.search(says, err), err
    assert "Traceback" not in err and not (home / "outputs").exists()


def test_the_same_values_are_refused_in_a_profile_file_and_in_a_notebooks_stage_config(home):
    from draftlab.config import load_profile, load_stage

    params = home / "notebooks" / "params"
    (params / "twice.yaml").write_text(
        (params / "ci.yaml").read_text().replace("dflash_block_size: 8", "dflash_block_size: 0")
    )
    with pytest.raises(DraftlabError, match=r"twice.yaml: dflash_block_size=0 is refused"):
        load_profile("twice")
    with pytest.raises(DraftlabError, match=r"overrides: serve_concurrency=\[\] is refused"):
        load_stage("05", "ci", {"serve_concurrency": []})


def test_a_profile_or_set_that_is_not_yaml_names_its_line_and_column_without_a_traceback(home, capsys):
    params = home / "notebooks" / "params"
    lines = (params / "ci.yaml").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("n_chat:"))
    lines[at] = "n_chat: [8"
    (params / "broken.yaml").write_text("\n".join(lines) + "\n")
    assert main(["run", "--profile", "broken", "--check"]) == 1
    err = capsys.readouterr().err
    assert f"broken.yaml, line {at + 2}, column 7: not valid YAML: expected ',' or ']', but got ':'" in err, err
    assert f"(while parsing a flow sequence, from line {at + 1}, column 9)" in err and "Traceback" not in err
    rc, _, err = _check(capsys, "--set", "layer_ids=[2, 4")
    assert rc == 1 and "--set 'layer_ids=[2, 4', line 1, column 6: not valid YAML" in err, err


def test_a_learning_rate_written_1e_3_is_the_number_meant(home, capsys):
    from draftlab.config import load_profile
    from draftlab.run import parse_overrides

    params = home / "notebooks" / "params"
    (params / "lr.yaml").write_text(
        (params / "ci.yaml").read_text().replace("learning_rate: 0.002", "learning_rate: 1e-3")
    )
    assert load_profile("lr")["learning_rate"] == 1e-3
    assert parse_overrides(["learning_rate=2E-4", "learning_rate=5e3"]) == {"learning_rate": 5000.0}
    assert parse_overrides(["dataset_name=1e3-run"])["dataset_name"] == "1e3-run", "a name stays a string"
    assert _check(capsys, "--only", "04", "--set", "learning_rate=1e-3")[0] == 0


def test_a_draft_vocabulary_past_the_verifiers_is_refused_when_stage_01_starts(home, tiny_dir, capsys):
    from draftlab.config import start_stage
    from draftlab.layout import RunLayout

    rc, _, err = _check(capsys, "--set", f"verifier={tiny_dir}", "--set", "draft_vocab_size=100000")
    assert rc == 1 and f"draft_vocab_size=100000 is refused: the verifier {tiny_dir} has 300 tokens" in err, err
    assert "draft_vocab_size takes 1 to 300" in err
    over = {"verifier": str(tiny_dir), "draft_vocab_size": 301}
    with pytest.raises(DraftlabError, match="draft_vocab_size=301 is refused: .* has 300 tokens"):
        start_stage("01", "ci", "ci", over)  # notebook 01's second cell: before any prompt is answered
    assert not RunLayout("smollm2-ci", "ci").resolved_config("01").exists()
    with pytest.raises(DraftlabError, match=r"aux layer ids \[2, 9\] are invalid for a verifier with 8 layers"):
        start_stage("01", "ci", "ci", {**over, "draft_vocab_size": 64, "layer_ids": [2, 9]})


def test_a_run_without_check_refuses_the_same_before_any_notebook(home, capsys):
    assert main(["run", "--profile", "ci", "--set", "draft_kinds=[dflash, dflash]"]) == 1
    assert "it names 'dflash' twice" in capsys.readouterr().err
    assert not (home / "outputs").exists(), "no notebook started"


def test_check_names_the_users_prompt_files_and_refuses_a_missing_one(home, tiny_dir, tmp_path, capsys):
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"messages": [{"role": "user", "content": "Hello?"}]}\n')
    ok = _check(capsys, "--set", f"verifier={tiny_dir}", "--set", "draft_vocab_size=64", "--set", f"prompts=[{mine}]")
    assert ok[0] == 0, ok[2]
    assert f"HumanEval 8, mine (every from {mine}) prompts" in ok[1], ok[1]
    rc, _, err = _check(capsys, "--set", f"prompts=[{tmp_path / 'gone.jsonl'}]")
    assert rc == 1 and "prompts: '" in err and "gone.jsonl' does not exist" in err and "fix the path" in err, err
    assert "Traceback" not in err and not (home / "outputs").exists()


def test_compare_runs_reads_the_arms_beside_this_run_and_refuses_one_not_trained(home, tiny_dir, capsys):
    """Issue 51: the arms of a sweep named in `compare_runs` are read beside this run (the plan names their folders);
    an arm with no run of a kind is refused by --check, before 04 trains for minutes, naming the command that makes
    it."""
    import json

    from draftlab.layout import RunLayout
    from draftlab.training import arms

    rec = [{"split": s, "step": 2, "seconds": 1.5, "full_acc_0": 0.5, "full_acc_1": 0.25} for s in ("train", "eval")]
    for run in ("mine", "ttt5"):
        (RunLayout("smollm2-ci", run, home).draft("eagle3")).mkdir(parents=True)
        (RunLayout("smollm2-ci", run, home).draft("eagle3") / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rec)
        )
    base = ["--run-name", "mine", "--set", f"verifier={tiny_dir}", "--set", "draft_vocab_size=64"]
    rc, out, err = _check(capsys, *base, "--set", "draft_kinds=[eagle3]", "--set", "compare_runs=[ttt5]")
    assert rc == 0, err
    assert "reads D/train, D/eval (01's states), D/drafts/ttt5" in out
    rc, out, err = _check(capsys, *base, "--set", "draft_kinds=[eagle3]", "--set", "compare_runs=[ttt5, other/noise]")
    assert rc == 1 and "compare_runs: arm 'other/noise' has no eagle3 run at " in err, err
    assert "data/runs/other/drafts/noise/eagle3. Train it first (draftlab run --only 04 --run-name noise" in err
    read = arms.read_arms(RunLayout("smollm2-ci", "mine", home), ["ttt5"], ["eagle3"])
    assert list(read) == ["mine", "ttt5"] and read["ttt5"]["eagle3"] == rec
    assert arms.arm_table(read)[1] == {
        "arm": "ttt5",
        "kind": "eagle3",
        "steps": 2,
        "training seconds": 1.5,
        "first-position accuracy": 0.5,
        "position 1": 0.5,
        "position 2": 0.25,
    }
    (RunLayout("smollm2-ci", "ttt5", home).draft("eagle3") / "metrics.jsonl").write_text(json.dumps(rec[0]) + "\n")
    with pytest.raises(DraftlabError, match=r"arm 'ttt5' has no held-out evaluation of eagle3 in .*ttt5/eagle3"):
        arms.read_arms(RunLayout("smollm2-ci", "mine", home), ["ttt5"], ["eagle3"])
