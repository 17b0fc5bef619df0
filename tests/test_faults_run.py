"""Issue 30, `draftlab run` and stage 01's dataset: a setting that cannot take effect is refused, a dataset
other runs' drafts were trained on is never rewritten, and aux layer ids are whole numbers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from draftlab import DraftlabError

from conftest import link_embedded, notebook

ROOT = Path(__file__).resolve().parents[1]

# A notebook that leaves a mark when it runs: a refused run must leave none.
MARKING = notebook("open('ran', 'w').write('yes')")


@pytest.fixture
def home(tmp_path, monkeypatch, embedded_dir):
    """A checkout with the real profiles, the converted embedded verifier and stand-in notebooks 01-05 (each writes
    notebooks/ran)."""
    link_embedded(tmp_path, embedded_dir)
    shutil.copytree(ROOT / "notebooks" / "params", tmp_path / "notebooks" / "params")
    for nb in ("01_a", "02_b", "03_c", "04_d", "05_e"):
        (tmp_path / "notebooks" / f"{nb}.ipynb").write_text(json.dumps(MARKING))
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    return tmp_path


def test_a_set_key_no_stage_of_the_run_reads_is_refused_before_any_notebook(home, capsys):
    from draftlab.run import main

    for key, value in (("draft_vocab_size", "64"), ("max_length", "128")):
        assert main(["run", "--profile", "ci", "--only", "04", "--set", f"{key}={value}"]) == 1
        err = capsys.readouterr().err
        assert f"--set {key}={value}: only stage 01 reads {key}, and this run runs stage 04" in err, err
        assert "--only 01,04" in err
    from draftlab.profile import refuse_unread

    with pytest.raises(DraftlabError, match=r"only stage 02/04 reads pack_len.*runs stage 05.*--only 04,05"):
        refuse_unread({"pack_len": 256}, ["05"])
    assert not (home / "notebooks" / "ran").exists() and not (home / "outputs").exists()
    refuse_unread({"draft_vocab_size": 64, "pack_len": 256, "seed": 1}, ["01", "04"])  # each read by a stage run


def test_a_stage_refuses_an_override_its_upstream_ran_with_another_value(home):
    from draftlab.config import start_stage

    _, first = start_stage("01", "ci", "a")
    first.finish("01")
    cfg, layout = start_stage("04", "ci", "a", {"draft_vocab_size": 64})  # 04 itself has no draft_vocab_size
    with pytest.raises(
        DraftlabError,
        match=r"draft_vocab_size=64 is set for run 'a', but stage 04 does not read draft_vocab_size: it takes "
        r"stage 01's draft_vocab_size=2048 .*config.json\)\. Re-run stage 01 with it too \(draftlab run --only 01,04",
    ):
        layout.upstream("01", cfg)
    cfg, layout = start_stage("04", "ci", "a", {"draft_vocab_size": 2048, "seed": 7})  # what 01 used; one 04 reads
    assert layout.upstream("01", cfg)["draft_vocab_size"] == 2048


def _dataset_with_drafts_of(run_name: str):
    """Stage 01 finished on the ci dataset, and `run_name` trained a draft on it."""
    from draftlab.config import start_stage

    _, layout = start_stage("01", "ci", run_name)
    layout.finish("01")
    layout.final("eagle3").mkdir(parents=True)
    (layout.final("eagle3") / "model.safetensors").write_text("weights")
    return layout


def test_stage_01_refuses_to_change_a_dataset_another_runs_drafts_were_trained_on(home):
    from draftlab.config import start_stage

    r0 = _dataset_with_drafts_of("r0")
    before = r0.resolved_config("01").read_text()
    for key, value in (("n_chat", 4), ("max_length", 128)):
        with pytest.raises(
            DraftlabError,
            match=rf"stage 01 would change dataset 'smollm2-ci' \(.*{key}=\d+ -> {value}\), but the drafts of "
            r"run\(s\) \['r0'\] were trained on it \(.*drafts/r0\)\. Make a new dataset with --set dataset_name=",
        ):
            start_stage("01", "ci", "r1", {key: value})
    assert r0.resolved_config("01").read_text() == before  # nothing of the dataset touched
    assert (r0.final("eagle3") / "model.safetensors").read_text() == "weights"
    start_stage("01", "ci", "r1", {"extract_batch_size": 3})  # same data, other pace: resumes
    start_stage("01", "ci", "r1", {"n_chat": 4, "dataset_name": "smollm2-ci-4"})  # a new dataset: its own


def test_draftlab_run_refuses_rewriting_another_runs_dataset_before_any_notebook(home, capsys):
    from draftlab.run import main

    _dataset_with_drafts_of("r0")
    assert main(["run", "--profile", "ci", "--only", "01", "--run-name", "r1", "--set", "n_chat=4"]) == 1
    err = capsys.readouterr().err
    assert "stage 01 would change dataset 'smollm2-ci'" in err and "n_chat=8 -> 4" in err and "['r0']" in err, err
    assert not (home / "notebooks" / "ran").exists() and not (home / "outputs" / "r1").exists()


@pytest.mark.parametrize("ids", [[2.7, 5, 6], [2.0, 5, 6], [True, 5], ["2", 5], "2,5", 2])
def test_aux_layer_ids_must_be_whole_numbers(ids):
    from draftlab.data.extract import validate_layer_ids

    with pytest.raises(DraftlabError, match=r"layer_ids=.*: aux layer ids are a list of whole numbers \(ints\)"):
        validate_layer_ids(ids, 8)
    assert validate_layer_ids([np.int64(5), 2], 8) == [2, 5]  # ints of any kind


def test_stage_01_sees_a_key_an_older_dataset_lacks_as_the_value_it_implied(home):
    """A dataset made before `sharegpt_turns` existed was made with first turns only: switching it to `all`
    is a change (refused while drafts use it), keeping `first` resumes."""
    import json

    from draftlab.config import start_stage

    r0 = _dataset_with_drafts_of("r0")
    path = r0.resolved_config("01")
    record = json.loads(path.read_text())
    del record["config"]["sharegpt_turns"]
    path.write_text(json.dumps(record))
    with pytest.raises(DraftlabError, match=r"sharegpt_turns='first' -> 'all'"):
        start_stage("01", "ci", "r1", {"sharegpt_turns": "all"})
    cfg, layout = start_stage("04", "ci", "r0", {"sharegpt_turns": "all"})  # 04 does not read it: 01's value holds
    with pytest.raises(DraftlabError, match=r"sharegpt_turns='all' is set for run 'r0', but stage 04 does not read "):
        layout.upstream("01", cfg)
    assert layout.upstream("01", start_stage("04", "ci", "r0")[0])["sharegpt_turns"] == "first"
    start_stage("01", "ci", "r1", {"sharegpt_turns": "first"})  # the value it was made with: resumes


def test_a_relative_draftlab_vllm_reaches_the_notebooks_as_the_path_it_named_where_draftlab_run_was_called(
    tmp_path, monkeypatch
):
    """papermill runs each notebook from notebooks/: `DRAFTLAB_VLLM=.venv-vllm/bin/vllm draftlab run ...` from the
    checkout named nothing there (a dry run of gpu_pipeline.sh's sweep met it, 2026-12-07)."""
    from draftlab.run import kernel_env

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DRAFTLAB_VLLM", ".venv-vllm/bin/vllm")
    assert kernel_env()["DRAFTLAB_VLLM"] == str(tmp_path / ".venv-vllm" / "bin" / "vllm")
    monkeypatch.setenv("DRAFTLAB_VLLM", "/opt/vllm/bin/vllm")
    assert "DRAFTLAB_VLLM" not in kernel_env()  # an absolute one is inherited as it is
    monkeypatch.delenv("DRAFTLAB_VLLM")
    assert "DRAFTLAB_VLLM" not in kernel_env() and kernel_env()["DRAFTLAB_HEADLESS"] == "1"
