"""Stage 04 through speculators' own trainer: the torchrun command draftlab writes parses and builds in speculators'
CLI, runs exactly its steps, and its save layout (epochs, checkpoint_best) is read back as draftlab's final/."""

from __future__ import annotations

import shutil

import pytest
import test_train
import torch
from test_train import IDS, S, make

from draftlab import DraftlabError
from draftlab.layout import RunLayout
from draftlab.training.train import Settings, train

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("one_thread")]
home, data = test_train.home, test_train.data  # fixtures: the tiny stage-01 dataset notebook 01 makes


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_torchrun_command_parses_with_speculators_own_cli(tiny, data, tmp_path, kind):
    from pathlib import Path

    from speculators.train.config import TrainConfig
    from speculators.train.config.resolution import build_parser

    from draftlab.training.launch import torchrun_command

    s = Settings(**S)
    cmd = torchrun_command(make(tiny, data, kind), data, s, nproc=4, save_path=tmp_path / "save")
    i = cmd.index("speculators.train") + 1
    assert cmd[:i][-4:] == ["--standalone", "--nproc-per-node=4", "-m", "speculators.train"]
    assert cmd[0] == "torchrun" or cmd[1:3] == ["-m", "torch.distributed.run"]  # this Python's launcher either way
    cfg = TrainConfig.resolve(cmd[i:])
    assert cfg.speculator_type == kind and cfg.optimizer.optimizer == "adamw" and cfg.optimizer.lr == s.learning_rate
    assert (
        cfg.scheduler.scheduler_type == "cosine"
        and cfg.trainer.max_steps == s.train_steps
        and cfg.draft.target_layer_ids == IDS
    )
    assert (
        (cfg.loss.ttt_steps == s.ttt_steps)
        if kind == "eagle3"
        else (cfg.dflash.block_size == 4 and cfg.data.max_anchors == 8)
    )
    flat = cfg.flatten()
    assert flat["num_workers"] == 4 and flat["prefetch_factor"] == 4 and flat["on_missing"] == "raise"
    assert not flat["save_best"]
    for key in ("verifier_name_or_path", "data_path", "save_path", "d2t_path"):  # absolute, and there on this machine
        assert Path(flat[key]).is_absolute() and (key == "save_path" or Path(flat[key]).exists()), key
    assert (Path(flat["verifier_name_or_path"]) / "config.json").exists()
    assert (Path(flat["data_path"]) / "hidden_states").is_dir()
    with pytest.raises(SystemExit):
        build_parser().parse_args([*cmd[i:], "--ttt-stepz", "3"])


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_the_generated_command_builds_its_draft_in_speculators_cli_and_draftlab_loads_it(tiny, data, tmp_path, kind):
    """speculators' own `main` up to its first step (`--dry-run`: verifier, vocab files, layer ids and draft
    from the command's flags, saved by speculators), then loaded the way notebook 05 loads a draft."""
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    from draftlab.acceptance.proposers import load_draft
    from draftlab.training.launch import torchrun_command

    cmd = torchrun_command(make(tiny, data, kind), data, Settings(**S), nproc=1, save_path=tmp_path / "save")
    main(TrainConfig.resolve([*cmd[cmd.index("speculators.train") + 1 :], "--dry-run"]))
    d = load_draft(tmp_path / "save", tiny)
    assert d.kind == kind and list(d.model.target_layer_ids) == IDS and d.model.config.draft_vocab_size == 64
    assert (tmp_path / "save" / "train_command.txt").exists()


def run_as_speculators(flat: dict, data, tmp_path) -> tuple[int, list]:
    """speculators' epoch loop for these flags (trainer.run_training / train_epoch, its own sampler and save
    decisions, `Trainer.maybe_save_checkpoint` itself): optimizer steps run and the epoch folders saved."""
    from types import SimpleNamespace

    from speculators.train.data import ArrowDataset
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from speculators.train.trainer import MIN_STEP_PCT, Trainer, TrainerConfig

    T = flat["total_seq_len"]
    ds = ArrowDataset(T, flat["data_path"], on_missing="raise", train_ratio=flat["train_data_ratio"])
    sampler = MultipackDistributedBatchSamplerV2(T, ds.approx_lengths, num_replicas=1, rank=0, seed=flat["seed"])
    config = TrainerConfig(
        lr=1.0,
        num_epochs=flat["epochs"],
        save_path=str(tmp_path),
        checkpoint_freq=flat["checkpoint_freq"],
        save_best=flat["save_best"],
        max_steps=flat["max_steps"],
    )
    saved = []
    fake = SimpleNamespace(
        config=config,
        is_distributed=False,
        model=None,
        optimizers=[],
        schedulers=[],
        _save_training_state=lambda e, s: None,
        checkpointer=SimpleNamespace(path=tmp_path, save_checkpoint=lambda m, o, e: saved.append(e)),
    )
    step, freq = 0, config.checkpoint_freq
    for epoch in range(config.num_epochs):
        sampler.set_epoch(epoch)
        n = len(sampler)
        interval = max(1, round(n * freq)) if freq < 1 else None
        for local in range(1, n + 1):
            step += 1
            if step >= config.max_steps:
                break
            if interval and local % interval == 0 and n - local >= interval * MIN_STEP_PCT:
                Trainer.maybe_save_checkpoint(fake, epoch, local_step=local)
        Trainer.maybe_save_checkpoint(fake, epoch)
    return step, sorted(set(saved))


def test_speculators_runs_exactly_the_steps_and_saves_a_few_times_the_last_included(tiny, data, tmp_path):
    """Seen on the H200: 60 steps on a split of two packs an epoch made 30 epochs and 30 saved folders."""
    from speculators.train.config import TrainConfig

    from draftlab.training.flags import MAX_SAVES
    from draftlab.training.launch import torchrun_command

    s = Settings(**{**S, "train_steps": 60, "checkpoint_every": 2})
    cmd = torchrun_command(make(tiny, data), data, s, nproc=1, save_path=tmp_path / "save")
    flat = TrainConfig.resolve(cmd[cmd.index("speculators.train") + 1 :]).flatten()
    steps, saved = run_as_speculators(flat, data, tmp_path)
    assert steps == 60, "one epoch too many trains a step past --max-steps; one too few stops short"
    assert flat["epochs"] >= 10 and saved[-1] == flat["epochs"] - 1, (flat["epochs"], saved)
    assert 2 <= len(saved) <= MAX_SAVES + 1, saved


def test_checkpoint_interval_within_long_epochs_and_across_short_ones():
    from draftlab.training.flags import checkpoint_freq

    assert checkpoint_freq([1000, 1000], 1500, 500) == 0.5  # a save each 500 steps inside an epoch, and at each end
    assert checkpoint_freq([498, 497, 499], 1500, 500) == 1.0  # epochs about as long as the interval: one save each
    assert checkpoint_freq([2] * 30, 60, 2) == 10.0  # 30 tiny epochs: epochs 0, 9, 19, 29, not 30 folders
    assert checkpoint_freq([3] * 7, 20, 5) == 7.0  # 7 epochs, a prime: the first and the last
    assert checkpoint_freq([100], 80, 500) == 1.0


def test_a_save_path_holding_another_run_is_refused_unless_resuming(tiny, data, tmp_path):
    from draftlab.training.flags import check_verifier
    from draftlab.training.launch import torchrun_command

    (tmp_path / "save" / "3").mkdir(parents=True)
    d, s = make(tiny, data), Settings(**S)
    with pytest.raises(DraftlabError, match=r"already holds speculators epochs \[3\].*resume=True"):
        torchrun_command(d, data, s, nproc=1, save_path=tmp_path / "save")
    assert "--save-path" in torchrun_command(d, data, s, nproc=1, save_path=tmp_path / "save", resume=True)
    with pytest.raises(DraftlabError, match="not a local directory here: speculators would ask the Hugging Face Hub"):
        check_verifier("HuggingFaceTB/SmolLM2-135M-Instruct")


@pytest.fixture
def speculators_save(tiny, data, tmp_path):
    """A speculators --save-path as its trainer leaves it: epochs 0-2 written by its own checkpointer (bf16
    weights, optimizer and scheduler state), epoch<N>_end links, checkpoint_best -> 1, run files at the top."""
    from speculators.train.checkpointer import SingleGPUCheckpointer

    d = make(tiny, data)
    opt = torch.optim.AdamW([p for p in d.model.parameters() if p.requires_grad])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    root = RunLayout("tiny", "test", tmp_path).speculators_save("eagle3")
    saver, weights = SingleGPUCheckpointer(root), {}
    for epoch in range(3):
        with torch.no_grad():
            d.model.fc.weight.add_(0.5)  # each epoch's weights differ
        saver.save_checkpoint(d.model, opt, epoch)
        saver.save_scheduler_state_dict(sched, epoch)
        (root / f"epoch{epoch}_end").symlink_to(str(epoch))
        weights[epoch] = d.model.fc.weight.detach().to(torch.bfloat16).float().clone()
    saver.save_val_metrics(1, {"loss_epoch": 1.0})
    saver.update_best_symlink(1)
    (root / "train_command.txt").write_text("torchrun ...\n")
    return root, weights


def test_find_checkpoint_in_speculators_save_layout(speculators_save):
    from draftlab.training.launch import find_checkpoint, trained_draft

    root, _ = speculators_save
    files = {"optimizer_state_dict.pt", "scheduler_state_dict.pt", "config.json", "model.safetensors"}
    assert files <= {p.name for p in (root / "2").iterdir()}
    assert find_checkpoint(root) == root / "1" and find_checkpoint(root, prefer="last") == root / "2"
    assert find_checkpoint(root / "2") == root / "2" and trained_draft(root.parent) == root / "1"
    (root / "checkpoint_best").unlink()
    blob = (root / "2" / "model.safetensors").read_bytes()
    (root / "2" / "model.safetensors").write_bytes(blob[: len(blob) // 2])  # a save cut short
    assert find_checkpoint(root) == root / "1"
    for e in range(3):
        shutil.rmtree(root / str(e))
    with pytest.raises(DraftlabError, match=r"no draft checkpoint at .*speculators.*epoch0_end.*torchrun"):
        find_checkpoint(root)
    assert trained_draft(root.parent) is None


@pytest.mark.parametrize("fault", ["cut", "missing"])
def test_a_checkpoint_best_at_a_cut_or_missing_epoch_is_named_not_replaced(tiny, speculators_save, fault):
    """speculators chose epoch 1 by its held-out loss: another epoch is not quietly loaded in its place."""
    from draftlab.acceptance.proposers import load_draft
    from draftlab.training.launch import find_checkpoint, trained_draft

    root, _ = speculators_save
    if fault == "cut":
        blob = (root / "1" / "model.safetensors").read_bytes()
        (root / "1" / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    else:
        shutil.rmtree(root / "1")
    says = "cut short" if fault == "cut" else "is missing"
    best = rf"{root / 'checkpoint_best'} points at {root / '1'}, which cannot be loaded \(.*{says}.*\): speculators'"
    for call in (lambda: find_checkpoint(root), lambda: trained_draft(root.parent), lambda: load_draft(root, tiny)):
        with pytest.raises(DraftlabError, match=best + rf".*prefer='last' for the newest whole epoch \({root / '2'}\)"):
            call()
    assert find_checkpoint(root, prefer="last") == root / "2"


def test_load_draft_takes_a_speculators_save_path_as_draftlabs_final(tiny, speculators_save):
    from draftlab.acceptance.proposers import load_draft, make_proposer

    root, weights = speculators_save
    d = load_draft(root, tiny)  # checkpoint_best: epoch 1, saved in bf16, checked against the fp32 verifier
    assert d.choices["checkpoint"][0] == str(root / "1") and torch.equal(d.model.fc.weight, weights[1])
    assert torch.equal(load_draft(root / "2", tiny).model.fc.weight, weights[2])
    p = make_proposer(d, tiny.vocab_size)
    p.reset([5, 6, 7])
    aux = torch.zeros(2, d.model.fc.in_features)
    p.update(aux, 2)
    assert len(p.propose([5, 6, 7], 3, 0.0, None).tokens) == 3


def test_compare_reads_both_trainers_checkpoints_on_the_same_packs(tiny, data, speculators_save, tmp_path):
    from draftlab.training.checkpoint import compare

    root, _ = speculators_save
    d = make(tiny, data)
    run = train(d, data, Settings(**{**S, "train_steps": 2}), tmp_path / "run", progress=False)
    got = compare({"draftlab": run / "final", "speculators": root}, d, data / "eval", Settings(**S))
    assert got["draftlab"]["checkpoint"] == str(run / "final") and got["speculators"]["checkpoint"] == str(root / "2")
    assert all(0.0 <= r["eval first-position accuracy"] <= 1.0 and r["eval loss"] > 0 for r in got.values())
    assert got["draftlab"]["eval loss"] != got["speculators"]["eval loss"]  # different weights, different numbers


# The core (top-level modules, as tests/test_project.py's) and the stages before training (01 data, 02 masks,
