"""Stage 04's faults (issue 30): an earlier run is never lost to a fresh one before it finishes, re-running
the same training resumes an interrupted run, a run folder trains one run at a time, and the torchrun
command refuses the arguments `train()` refuses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import test_train
from test_train import S, make

from draftlab import DraftlabError
from draftlab.layout import RunLayout
from draftlab.training import train as train_module
from draftlab.training.train import Settings, read_metrics, train

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("one_thread")]
home, data = test_train.home, test_train.data  # fixtures: the tiny stage-01 dataset notebook 01 makes
LIB = str(Path(train_module.__file__).resolve().parents[2])


def _failing_at(monkeypatch, step: int, error):
    """The training loop's forward, raising `error` (a NaN loss: None) at training step `step`."""
    real, calls = train_module.forward, []

    def forward(draft, batch, **kw):
        calls.append(1)
        if len(calls) == step and error is not None:
            raise error
        t, loss, m = real(draft, batch, **kw)
        return t, loss * float("nan") if len(calls) == step else loss, m

    monkeypatch.setattr(train_module, "forward", forward)


def _run(**kw) -> Settings:
    return Settings(**{**S, **kw})


def test_a_fresh_run_checkpointing_every_step_keeps_the_earlier_run_until_it_finishes(
    tiny, data, tmp_path, monkeypatch
):
    run = train(
        make(tiny, data), data, _run(train_steps=2, checkpoint_every=2, eval_every=2), tmp_path / "run", progress=False
    )
    before = {p: (run / p).read_bytes() for p in ("final/model.safetensors", "metrics.jsonl")}
    with monkeypatch.context() as patched:
        _failing_at(patched, 3, None)
        with pytest.raises(DraftlabError, match=r"loss is nan at step 3: .*step-2.*kept in .*\.previous"):
            train(make(tiny, data, seed=1), data, _run(train_steps=6, checkpoint_every=1), run, progress=False)
    prev = run / ".previous"  # the new run checkpointed steps 1 and 2: the earlier one is all still there
    assert {p: (prev / p).read_bytes() for p in before} == before
    assert (prev / "checkpoints" / "step-2" / "model.safetensors").exists()
    train(make(tiny, data, seed=1), data, _run(train_steps=6, checkpoint_every=1), run, progress=False)
    assert not prev.exists() and (run / "final" / "model.safetensors").exists(), "set aside until the new run ends"


def _interrupted(tiny, data, layout, monkeypatch, **kw):
    from draftlab.training.jobs import train_drafts

    with monkeypatch.context() as patched:
        _failing_at(patched, 8, KeyboardInterrupt())  # Ctrl-C at step 8, after the step-5 checkpoint
        with pytest.raises(KeyboardInterrupt):
            train_drafts({"eagle3": make(tiny, data)}, layout, _run(**kw), side=False, progress=False)
    return layout.draft("eagle3")


def test_rerunning_the_same_training_resumes_an_interrupted_run(tiny, data, tmp_path, monkeypatch, capsys):
    """As notebook 04 calls it (`train_drafts`, no resume argument): Ctrl-C, then the same command again."""
    from draftlab.training.jobs import train_drafts

    layout = RunLayout("tiny", tmp_path.name)
    kw = dict(train_steps=12, checkpoint_every=5, eval_every=5)
    run = _interrupted(tiny, data, layout, monkeypatch, **kw)
    first = read_metrics(run)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-5"] and not (run / "final").exists()
    again = train_drafts({"eagle3": make(tiny, data, seed=123)}, layout, _run(**kw), side=False, progress=False)
    resumed = read_metrics(again.runs["eagle3"])
    assert resumed[:6] == [r for r in first if r["step"] <= 5], "steps 1-5 kept as they were, not retrained"
    assert [r["step"] for r in resumed if r["split"] == "train"] == list(range(1, 13))
    straight = read_metrics(train(make(tiny, data), data, _run(**kw), tmp_path / "straight", progress=False))
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in straight], rel=1e-5, abs=1e-6)
    assert again.drafts["eagle3"].choices["run folder"][0] == "resumed after step 5"
    assert f"Resuming the run in {run} from step-5" in capsys.readouterr().err


def test_other_settings_over_an_interrupted_run_set_it_aside_loudly(tiny, data, tmp_path, monkeypatch, capsys):
    layout = RunLayout("tiny", tmp_path.name)
    run = _interrupted(tiny, data, layout, monkeypatch, train_steps=12, checkpoint_every=5, eval_every=5)
    first = (run / "metrics.jsonl").read_text()
    train(make(tiny, data), data, _run(learning_rate=1e-3), run, stop_after=2, progress=False)
    err = capsys.readouterr().err
    assert "interrupted at step-5" in err and "learning_rate=0.003 (now 0.001)" in err and ".previous" in err
    prev = run / ".previous"
    assert (prev / "checkpoints" / "step-5").is_dir() and (prev / "metrics.jsonl").read_text() == first
    # a third run set aside the second: both kept, the first where it was
    train(make(tiny, data), data, _run(learning_rate=2e-3), run, stop_after=2, progress=False)
    assert (prev / "metrics.jsonl").read_text() == first and (run / ".previous.2" / "checkpoints" / "step-2").is_dir()
    train(make(tiny, data), data, _run(learning_rate=2e-3, train_steps=3), run, progress=False)
    assert not list(run.glob(".previous*")), "the runs set aside go when the fresh one finishes"


def _hold(folder: Path) -> subprocess.Popen:
    """Another process holding the run folder's lock, as a second `draftlab run --only 04` would."""
    code = (
        "import sys; from draftlab.training.lock import run_lock\n"
        f"with run_lock({str(folder)!r}):\n    print('held', flush=True); sys.stdin.read()"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": LIB},
    )
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_run_folder_in_use_is_refused_at_once_and_freed_when_its_holder_dies(tiny, data, tmp_path):
    from draftlab.training.jobs import train_drafts

    layout = RunLayout("tiny", tmp_path.name)
    run = layout.draft("eagle3")
    holder = _hold(run)
    try:
        why = rf"{run} is in use: another training \(pid {holder.pid}\) .*Wait for it .*--run-name"
        with pytest.raises(DraftlabError, match=why):
            train(make(tiny, data), layout, _run(train_steps=2), progress=False)
        with pytest.raises(DraftlabError, match=why):
            train_drafts({"eagle3": make(tiny, data)}, layout, _run(train_steps=2), side=False, progress=False)
        assert not (run / "metrics.jsonl").exists() and not (run / "job").exists(), "refused before writing"
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # dies holding it
        holder.wait()
    assert (train(make(tiny, data), layout, _run(train_steps=2), progress=False) / "final").is_dir()


def test_a_lock_is_released_when_training_fails(tiny, data, tmp_path, monkeypatch):
    with monkeypatch.context() as patched:
        _failing_at(patched, 1, None)
        with pytest.raises(DraftlabError, match="loss is nan at step 1"):
            train(make(tiny, data), data, _run(train_steps=2), tmp_path / "run", progress=False)
    holder = _hold(tmp_path / "run")  # another process takes it at once
    holder.communicate("")
    assert holder.returncode == 0


def test_torchrun_command_refuses_what_train_refuses_and_a_file_as_save_path(tiny, data, tmp_path):
    from draftlab.training.launch import torchrun_command

    d, s = make(tiny, data), Settings(**S)
    with pytest.raises(DraftlabError, match=r"nproc=2.5: must be at least 1, a whole number \(GPU processes"):
        torchrun_command(d, data, s, nproc=2.5, save_path=tmp_path / "save")
    with pytest.raises(DraftlabError, match=r"nproc=0: must be at least 1"):
        torchrun_command(d, data, s, nproc=0, save_path=tmp_path / "save")
    with pytest.raises(
        DraftlabError, match=r"torchrun_command takes a draftlab.train.Settings, not a dict: pass Settings\(\*\*"
    ):
        torchrun_command(d, data, dict(S), nproc=1, save_path=tmp_path / "save")
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(DraftlabError, match=rf"save_path {tmp_path / 'file'} is a file: .*Pass a folder"):
        torchrun_command(d, data, s, nproc=1, save_path=tmp_path / "file")
    with pytest.raises(DraftlabError, match=r"train_steps=2.5: must be at least 1, a whole number"):
        Settings(**{**S, "train_steps": 2.5})


@pytest.mark.parametrize("obstacle", ["file", "link"])
def test_a_final_that_cannot_be_written_fails_naming_the_path_and_keeps_the_earlier_run(
    tiny, data, tmp_path, obstacle, capsys
):
    """Something at final/'s temporary name: transformers' save_pretrained only logs "should be a directory, not a
    file" and returns, which once renamed the obstacle into final/ and deleted the earlier run's .previous."""
    run = train(make(tiny, data), data, _run(train_steps=2, eval_every=2, checkpoint_every=2), tmp_path / "run")
    before = (run / "final" / "model.safetensors").read_bytes()
    tmp = run / ".final.tmp"
    if obstacle == "file":
        tmp.write_text("someone's notes")
    else:
        tmp.symlink_to(tmp_path / "elsewhere")
    fresh = _run(train_steps=3, eval_every=3, checkpoint_every=3, learning_rate=1e-3)
    with pytest.raises(DraftlabError, match=rf"could not write {run / 'final'} .*: {tmp} is a {obstacle}, .* Move "):
        train(make(tiny, data, seed=1), data, fresh, run, progress=False)
    prev = run / ".previous"
    assert (prev / "final" / "model.safetensors").read_bytes() == before, "the earlier run stays where it was"
    assert tmp.is_symlink() or tmp.read_text() == "someone's notes", "the obstacle is the user's: left as it was"
    assert not (run / "final").exists()
    tmp.unlink()
    capsys.readouterr()
    train(make(tiny, data, seed=1), data, fresh, run, progress=False)  # the same command again: resumes, finishes
    assert "Resuming the run" in capsys.readouterr().err
    assert (run / "final" / "model.safetensors").exists() and not prev.exists()


def test_a_final_that_does_not_load_is_removed_and_the_earlier_run_kept(tiny, data, tmp_path, monkeypatch):
    from draftlab.training import final

    run = train(make(tiny, data), data, _run(train_steps=2, eval_every=2, checkpoint_every=2), tmp_path / "run")
    real = final.write_final

    def cut(run_dir, draft):  # a final/ written whole, then cut (a disk that lies, a copy elsewhere)
        folder = real(run_dir, draft)
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
        return folder

    monkeypatch.setattr(final, "write_final", cut)
    fresh = _run(train_steps=3, eval_every=3, checkpoint_every=3, learning_rate=1e-3)
    with pytest.raises(DraftlabError, match=r"final was written but does not load .*cut short.*step-3.*\.previous"):
        train(make(tiny, data, seed=1), data, fresh, run, progress=False)
    assert (run / ".previous" / "final" / "model.safetensors").exists() and not (run / "final").exists()
    monkeypatch.setattr(final, "write_final", real)
    train(make(tiny, data, seed=1), data, fresh, run, progress=False)
    assert not (run / ".previous").exists()
