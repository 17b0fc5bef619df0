"""Stage 04: training loop, exact resume, reloadable checkpoints, bad inputs, the multi-GPU command."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from draftlab import DraftlabError
from draftlab.drafts.draft import build_draft
from draftlab.layout import RunLayout
from draftlab.training.checkpoint import check_reload
from draftlab.training.train import Settings, final_checkpoint, read_metrics, summary, train

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("one_thread")]
IDS = [2, 4, 5]


@pytest.fixture(scope="module")
def home(tmp_path_factory, tiny):
    """DRAFTLAB_HOME with data/runs/tiny/{train,eval} made the way notebook 01 makes them."""
    from draftlab.data import dataset, extract, vocab

    from conftest import random_rows

    root = tmp_path_factory.mktemp("home")
    run = RunLayout("tiny", "test", root).data
    for split, lengths, seed in (("train", [40, 25, 33, 18, 50, 29, 44, 21, 36, 27], 0), ("eval", [30, 22, 41], 1)):
        ds = dataset.save_split(random_rows(tiny.vocab_size, lengths, seed), tiny.tokenizer, run / split, max_length=64)
        extract.extract(tiny, ds, run / split, IDS, progress=False)
        if split == "train":
            vocab.build_mapping(vocab.token_frequencies(ds, run / split), 64, tiny.vocab_size, run / split)
    return root


@pytest.fixture
def data(home, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_HOME", str(home))
    return RunLayout("tiny", "test", home).data


@pytest.fixture
def layout(data):
    """A run on the tiny dataset: its drafts under data/runs/tiny/drafts/test/<kind>."""
    from draftlab.layout import RunLayout

    return RunLayout("tiny", "test")


def make(tiny, data, kind="eagle3", seed=0, **kw):
    torch.manual_seed(seed)
    extra = dict(num_layers=1, block_size=4) if kind == "dflash" else {}
    return build_draft(kind, tiny, data / "train", **{**extra, **kw})


S = dict(
    train_steps=20, learning_rate=3e-3, warmup_steps=3, pack_len=96, eval_every=10, checkpoint_every=10, n_anchors=8
)


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_twenty_steps_equal_ten_plus_resume_plus_ten(tiny, data, tmp_path, kind):
    straight = train(make(tiny, data, kind), data, Settings(**S), tmp_path / "a", progress=False)
    train(make(tiny, data, kind), data, Settings(**S), tmp_path / "b", stop_after=10, progress=False)
    assert not (tmp_path / "b" / "final").exists()
    resumed = train(make(tiny, data, kind, seed=123), data, Settings(**S), tmp_path / "b", resume=True, progress=False)
    a, b = read_metrics(straight), read_metrics(resumed)
    assert [(r["step"], r["split"]) for r in a] == [(r["step"], r["split"]) for r in b]
    assert len([r for r in a if r["split"] == "train"]) == 20 and [r["step"] for r in a if r["split"] == "eval"] == [
        10,
        20,
    ]
    torch.testing.assert_close([r["loss"] for r in a], [r["loss"] for r in b], rtol=1e-5, atol=1e-6)
    assert [r["lr"] for r in a] == [r["lr"] for r in b]
    assert a[0]["loss"] > a[-2]["loss"], "training should lower the loss"


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_packs_read_ahead_by_worker_processes_train_exactly_the_same(tiny, data, tmp_path, kind):
    runs = [
        train(
            make(tiny, data, kind),
            data,
            Settings(**{**S, "train_steps": 8, "loader_workers": w}),
            tmp_path / str(w),
            progress=False,
        )
        for w in (0, 2, 8)  # 8: each reads 2 ahead (`loaders.prefetch`), 2: 8 each
    ]
    a, *others = (read_metrics(r) for r in runs)
    for b in others:
        assert [r["split"] for r in a] == [r["split"] for r in b] == ["train"] * 8 + ["eval"]
        assert [r["loss"] for r in a] == [r["loss"] for r in b] and [r.get("epoch") for r in a] == [
            r.get("epoch") for r in b
        ]


def test_each_pack_is_freed_within_its_own_step_not_while_the_next_is_awaited(tiny, data, tmp_path, monkeypatch):
    """A loader process's pack lives in shared memory and freeing it is slow (26 ms a gpu-sized pack on this CPU, in
    the step's wait before, 3.9 ms of wait after: BENCHMARKS.md). So no pack is still held when the next is asked
    for: the loop lets it go while the device runs the backward."""
    import weakref

    from draftlab.training import data as train_data

    held, stream = [], train_data.Packs.stream

    def watched(self, start, end, workers=0):
        for batch, position in stream(self, start, end, workers):
            assert all(ref() is None for ref in held), "the last pack is still held while the next is read"
            held.append(weakref.ref(batch["input_ids"]))
            yield batch, position

    monkeypatch.setattr(train_data.Packs, "stream", watched)
    train(make(tiny, data), data, Settings(**{**S, "train_steps": 4}), tmp_path / "run", progress=False)
    assert len(held) == 4


def test_run_folder_layout_metrics_and_reload_through_speculators(tiny, data, layout):
    d = make(tiny, data)
    run = train(d, layout, Settings(**{**S, "train_steps": 6, "eval_every": 3, "checkpoint_every": 2}), progress=False)
    assert run == layout.draft("eagle3") and final_checkpoint(layout, "eagle3") == run / "final"
    assert run.parent == layout.drafts and layout.drafts.name == "test"  # keyed by run: runs never share one
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-6"]  # the newest only (keep_checkpoints)
    assert {p.name for p in (run / "checkpoints" / "step-6").iterdir()} >= {
        "config.json",
        "model.safetensors",
        "trainer_state.pt",
    }
    assert {"config.json", "model.safetensors"} <= {p.name for p in (run / "final").iterdir()}
    assert not (run / "final" / "trainer_state.pt").exists()
    assert json.loads((run / "final" / "config.json").read_text())["speculators_model_type"] == "eagle3"
    rec = read_metrics(run)
    train_rec = [r for r in rec if r["split"] == "train"]
    assert {"step", "split", "loss", "lr", "tokens_per_s", "full_acc_0", "full_acc_2", "cond_acc_1"} <= set(
        train_rec[0]
    )
    assert train_rec[0]["lr"] == 0.0 and max(r["lr"] for r in train_rec) == pytest.approx(3e-3)  # warm-up then cosine
    assert [r["step"] for r in rec if r["split"] == "eval"] == [3, 6]
    assert all(
        r["seconds"] > 0 and 0 < round(r["tokens_per_s"] * r["seconds"]) <= 96 for r in train_rec
    )  # tokens of one pack
    assert summary("eagle3", rec)["first step (s)"] == train_rec[0]["seconds"]
    r = check_reload(d, final_checkpoint(layout, "eagle3"), data, Settings(**S))
    assert r["identical tensors"] and r["identical outputs"] and r["loss"] == r["reloaded loss"]


def test_summary_gives_the_whole_runs_pace_beside_the_median_step():
    """Online, packs stall now and then: 9 steps of 0.03 s and one of 1.2 s waiting for its pack. The median says
    0.03 s a step; the run took 0.15 s a step, and its tokens/s say so."""
    from draftlab.training.train import summary

    steps = [0.5] + [0.03] * 8 + [1.2, 0.03]  # the first compiles: left out of both paces
    rec = [
        {"split": "train", "step": i, "seconds": t, "tokens_per_s": 300 / t, "data_s": t - 0.02}
        for i, t in enumerate(steps, 1)
    ] + [{"split": "eval", "step": len(steps), "loss": 1.0, "full_acc_0": 0.5}]
    s = summary("eagle3", rec)
    assert s["train tokens/s (median)"] == pytest.approx(10_000)
    assert s["train tokens/s (whole run)"] == pytest.approx(3000 / 1.47)
    assert s["step seconds (median / mean)"] == pytest.approx((0.03, 0.147))
    assert s["share of the run waiting for packs"] == pytest.approx((1.47 - 0.2) / 1.47)


def test_data_of_another_verifier_is_refused(tiny, data, tmp_path):
    from draftlab.data.verifier import load_verifier

    from conftest import make_model

    make_model(tiny.vocab_size, layers=6).save_pretrained(tmp_path / "other")
    tiny.tokenizer.save_pretrained(tmp_path / "other")
    other = load_verifier(tmp_path / "other", device="cpu", dtype="float32")
    d = build_draft("eagle3", other, None, layer_ids=IDS)
    with pytest.raises(DraftlabError, match="verifier_fingerprint"):
        train(d, data, Settings(**S), tmp_path / "run", progress=False)


def test_empty_dataset_is_refused(tiny, data, tmp_path):
    from datasets import load_from_disk

    for split in ("train", "eval"):
        load_from_disk(str(data / split)).select([]).save_to_disk(str(tmp_path / split))
        shutil.copy(data / split / "manifest.json", tmp_path / split)
    with pytest.raises(DraftlabError, match="no rows"):
        train(make(tiny, data), tmp_path, Settings(**S), tmp_path / "run", progress=False)


def test_pack_shorter_than_every_sample_is_refused(tiny, data, tmp_path):
    with pytest.raises(DraftlabError, match="shorter than every sample"):
        train(make(tiny, data), data, Settings(**{**S, "pack_len": 8}), tmp_path / "run", progress=False)


@pytest.mark.parametrize("workers", [0, 2])
def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tiny, data, tmp_path, workers, monkeypatch):
    import multiprocessing

    from draftlab.training import train as train_module

    d = make(tiny, data)
    forward, calls = train_module.forward, []

    def poisoned(draft, batch, **kw):
        calls.append(1)
        tokens, loss, m = forward(draft, batch, **kw)
        return tokens, loss * (float("inf") if len(calls) == 7 else 1.0), m

    monkeypatch.setattr(train_module, "forward", poisoned)  # the training loop's forward
    try:
        train(
            d,
            data,
            Settings(**{**S, "checkpoint_every": 5, "eval_every": 100, "loader_workers": workers}),
            tmp_path / "run",
            progress=False,
        )
    except DraftlabError as err:
        stopped = err  # its traceback (and train's frame) kept alive, as a notebook keeps the last one
    assert re.search(r"at step 7: .*step-5", str(stopped))
    assert multiprocessing.active_children() == []  # the stop also ended the loader's worker processes
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step-5"]
    assert not (tmp_path / "run" / "final").exists()
    from safetensors.torch import load_file

    assert all(
        torch.isfinite(t).all()
        for t in load_file(tmp_path / "run" / "checkpoints" / "step-5" / "model.safetensors").values()
        if t.is_floating_point()
    )


@pytest.mark.parametrize(
    ("change", "field"), [(dict(num_layers=2), "num_layers"), (dict(settings=dict(ttt_steps=2)), "ttt_steps")]
)
def test_resume_with_changed_parameters_is_refused_naming_the_field(tiny, data, tmp_path, change, field):
    train(make(tiny, data), data, Settings(**S), tmp_path / "run", stop_after=2, progress=False)
    settings = Settings(**{**S, **change.pop("settings", {})})
    with pytest.raises(DraftlabError, match=f"{field}="):
        train(make(tiny, data, **change), data, settings, tmp_path / "run", resume=True, progress=False)


def test_offline_alpha_drafts_k_positions_and_leaves_the_draft_as_it_was(tiny, data, tmp_path):
    from draftlab.acceptance.evaluate import offline_alpha

    d = make(tiny, data)
    built = dict(d.train_kwargs)
    train(d, data, Settings(**{**S, "train_steps": 10, "ttt_steps": 2}), tmp_path / "run", progress=False)
    assert d.train_kwargs == built, "training passes its TTT steps to each forward; the draft keeps its own"
    choices = dict(d.choices)
    three, five = offline_alpha(d, data / "eval", k=3), offline_alpha(d, data / "eval", k=5)
    assert len(three) == 3 and len(five) == 5 and all(0.0 <= a <= 1.0 for a in five)
    assert five[:3] == pytest.approx(three), "a position's teacher-forced acceptance cannot depend on later positions"
    assert d.train_kwargs == built and len(offline_alpha(d, data / "eval")) == built["ttt_steps"]
    assert d.choices == choices, "a forward records nothing on the draft"


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_evaluation_on_the_training_graph_gives_the_eval_mode_metrics(tiny, data, kind):
    """On CUDA evaluation reuses the compiled training graph (grad on, training mode): same metrics."""
    from draftlab.drafts.device import dropout_free
    from draftlab.drafts.forward import evaluate
    from draftlab.training.data import Packs, open_split

    d = make(tiny, data, kind)
    assert dropout_free(d.model)
    options = {"max_anchors": 8} if kind == "dflash" else {"ttt_steps": 2}
    packs = Packs(d, open_split(d, data / "eval", 96), 96, 0)
    plain, reused = evaluate(d, packs, reuse_graph=False, **options), evaluate(d, packs, reuse_graph=True, **options)
    assert d.model.training and all(p.grad is None for p in d.model.parameters())
    for r in (plain, reused):
        r.pop("tokens_per_s"), r.pop("seconds")
    assert plain.keys() == reused.keys() and len(plain) > 2
    torch.testing.assert_close(reused, plain)


def test_reload_check_on_the_training_graph_as_on_cuda(tiny, data, layout, monkeypatch):
    from draftlab.drafts import device

    d = make(tiny, data)
    run = train(d, layout, Settings(**{**S, "train_steps": 2}), progress=False)
    monkeypatch.setattr(device, "forward_is_compiled", lambda: True)  # what CUDA would say
    seen = []
    d.model.register_forward_pre_hook(lambda m, _args: seen.append((m.training, torch.is_grad_enabled())))
    d.model.eval()
    r = check_reload(d, run / "final", data, Settings(**S))
    assert r["identical tensors"] and r["identical outputs"] and seen == [(True, True)] and not d.model.training


def test_a_draft_with_dropout_is_evaluated_in_eval_mode_without_grad(tiny, data):
    from draftlab.drafts.device import dropout_free
    from draftlab.drafts.forward import evaluate
    from draftlab.training.data import Packs, open_split

    d = make(tiny, data)
    seen = []
    d.model.register_forward_pre_hook(lambda m, _args: seen.append((m.training, torch.is_grad_enabled())))
    packs = Packs(d, open_split(d, data / "eval", 96), 96, 0)
    evaluate(d, packs, limit=1, reuse_graph=True)
    d.model.extra = torch.nn.Dropout(0.1)
    assert not dropout_free(d.model)
    evaluate(d, packs, limit=1, reuse_graph=True)
    assert seen == [(True, True), (False, False)] and d.model.training


def test_drafts_trained_side_by_side_in_processes_equal_in_process_runs(tiny, data, layout):
    from draftlab.training.jobs import train_drafts

    def built():
        return {"eagle3": make(tiny, data), "dflash": make(tiny, data, "dflash", seed=1)}

    s = Settings(**{**S, "train_steps": 6, "eval_every": 3, "checkpoint_every": 3})
    here, there = built(), built()
    untrained = {k: {n: t.clone() for n, t in d.model.state_dict().items()} for k, d in there.items()}
    in_process = train_drafts(here, layout, s, side=False, progress=False)
    assert all(in_process.drafts[k] is here[k] for k in here), "in this process the drafts train in place"
    want = {k: [(r["split"], r["loss"]) for r in read_metrics(run)] for k, run in in_process.runs.items()}
    side = train_drafts(there, layout, s, side=True, progress=False)
    assert {k: [(r["split"], r["loss"]) for r in read_metrics(run)] for k, run in side.runs.items()} == want
    assert side.reloads == in_process.reloads
    assert all(r["identical tensors"] and r["identical outputs"] for r in side.reloads.values())
    assert set(side.seconds) == {"eagle3", "dflash"} and all(x > 0 for x in side.seconds.values())
    for k in here:  # the trained drafts come back; the ones handed in are left as they were
        b, t = side.drafts[k].model.state_dict(), there[k].model.state_dict()
        assert all(torch.equal(x, b[n]) for n, x in here[k].model.state_dict().items()), k
        assert all(torch.equal(x, t[n]) for n, x in untrained[k].items()), f"{k}: the caller's draft was written to"
        got = side.drafts[k]
        assert got.choices["training"][0] == "2 processes side by side" and "data loading" in got.report()
        assert "training" not in there[k].choices
    final = final_checkpoint(layout, "eagle3")
    assert check_reload(side.drafts["eagle3"], final, data, Settings(**S))["identical outputs"]
    assert sorted(p.name for p in (side.runs["dflash"] / "job").iterdir()) == ["log.txt", "result.json"]


def test_a_run_failing_in_its_process_is_raised_with_its_reason_and_log(tiny, data, layout):
    from draftlab.training.jobs import train_drafts

    drafts = {"eagle3": make(tiny, data), "dflash": make(tiny, data, "dflash")}
    with pytest.raises(DraftlabError, match=r"eagle3: .*shorter than every sample.*log: .*eagle3/job/log.txt"):
        train_drafts(drafts, layout, Settings(**{**S, "pack_len": 8}), side=True, progress=False)


def test_side_by_side_only_on_a_gpu_with_cpus_for_both():
    from draftlab.training.jobs import side_by_side

    assert side_by_side("cuda", 2, cpus=16)[0] and not side_by_side("cuda", 2, cpus=4)[0]
    assert not side_by_side("cpu", 2, cpus=64)[0] and not side_by_side("cuda", 1, cpus=16)[0]
    on, why = side_by_side("cuda", 2, cpus=16, online=True)  # one extraction server: sharing it is slower
    assert not on and "online" in why
    assert side_by_side("cpu", 2, requested=True) == (True, "as asked (side_by_side)")


def test_drafts_not_keyed_by_their_kind_are_refused(tiny, data, layout):
    from draftlab.training.jobs import train_drafts

    with pytest.raises(DraftlabError, match="keyed by kind.*'second': 'eagle3'"):
        train_drafts({"eagle3": make(tiny, data), "second": make(tiny, data)}, layout, Settings(**S), progress=False)
    with pytest.raises(DraftlabError, match="takes the run's RunLayout .*not PosixPath"):
        train_drafts({"eagle3": make(tiny, data)}, data, Settings(**S), progress=False)


def test_a_dataset_folder_names_no_run_so_train_asks_for_a_layout_or_a_folder(tiny, data, layout):
    from draftlab.training.launch import torchrun_command

    with pytest.raises(DraftlabError, match=r"train\(\): .* is a dataset folder, which names no run; pass a RunLayout"):
        train(make(tiny, data), data, Settings(**S), progress=False)
    with pytest.raises(DraftlabError, match=r"torchrun_command: .* names no run"):
        torchrun_command(make(tiny, data), data, Settings(**S), nproc=1)
    cmd = torchrun_command(make(tiny, data), layout, Settings(**S), nproc=1)  # the layout names the save path
    assert cmd[cmd.index("--save-path") + 1] == str(layout.speculators_save("eagle3").resolve())


def test_an_interrupt_stops_the_training_processes(tiny, data, layout, monkeypatch):
    import subprocess

    from draftlab.training import jobs as train_jobs

    started = []

    class Recorded(subprocess.Popen):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            started.append(self)

    def interrupt(_):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_jobs.subprocess, "Popen", Recorded)
    monkeypatch.setattr(train_jobs.time, "sleep", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train_jobs.train_drafts(
            {"eagle3": make(tiny, data), "dflash": make(tiny, data, "dflash")},
            layout,
            Settings(**S),
            side=True,
            progress=False,
        )
    assert len(started) == 2 and all(p.returncode is not None for p in started)
    assert not (layout.job("eagle3") / "result.json").exists()


def test_a_dict_where_settings_belong_is_named(tiny, tmp_path):
    from draftlab.drafts.draft import build_eagle3

    with pytest.raises(
        DraftlabError,
        match=r"train\(\) takes a draftlab.train.Settings, not a dict: pass Settings\(\*\*\{'train_steps': 1\}\)",
    ):
        train(build_eagle3(tiny, None), tmp_path, {"train_steps": 1})


def test_a_fresh_run_that_fails_keeps_the_earlier_trained_draft(tiny, data, tmp_path, monkeypatch):
    from draftlab.training import train as train_module

    first = train(
        make(tiny, data),
        data,
        Settings(**{**S, "train_steps": 2, "checkpoint_every": 2, "eval_every": 2}),
        tmp_path / "run",
        progress=False,
    )
    weights = (first / "final" / "model.safetensors").read_bytes()
    d = make(tiny, data, seed=1)
    real, calls = train_module.forward, []

    def nan_at_step_3(draft, batch, **kw):
        calls.append(1)
        t, loss, m = real(draft, batch, **kw)
        return t, loss * float("nan") if len(calls) == 3 else loss, m

    with monkeypatch.context() as patched:
        patched.setattr(train_module, "forward", nan_at_step_3)  # the training loop's forward
        with pytest.raises(DraftlabError, match=r"loss is nan at step 3: .*the earlier run is kept in .*\.previous"):
            train(
                d,
                data,
                Settings(**{**S, "train_steps": 6, "checkpoint_every": 5, "eval_every": 5}),
                first,
                progress=False,
            )
    prev = first / ".previous"
    assert (prev / "final" / "model.safetensors").read_bytes() == weights and (prev / "checkpoints" / "step-2").is_dir()
    again = train(
        make(tiny, data, seed=2),
        data,
        Settings(**{**S, "train_steps": 2, "checkpoint_every": 2, "eval_every": 2}),
        first,
        progress=False,
    )
    assert not prev.exists() and (again / "final" / "model.safetensors").exists(), (
        "set aside only until the new run checkpoints"
    )


@pytest.mark.parametrize("damage", ["cut", "altered"])
def test_a_damaged_hidden_state_file_is_named_before_training(tiny, data, tmp_path, damage):
    from draftlab.training.data import open_split

    split = tmp_path / "train"
    shutil.copytree(data / "train", split)
    d = make(tiny, data)
    open_split(d, split, 96)  # sound: every file hashed once and remembered
    assert len(json.loads((split / ".verified.json").read_text())) == 10
    f = split / "hidden_states" / "hs_3.safetensors"
    blob = bytearray(f.read_bytes())
    if damage == "cut":
        f.write_bytes(bytes(blob[: len(blob) // 2]))
        why = "it holds .* bytes, the manifest says"
    else:
        blob[-8:] = bytes(8)  # same size, other bytes
        f.write_bytes(bytes(blob))
        why = "its bytes differ from the manifest's sha256"
    with pytest.raises(DraftlabError, match=f"1 hidden-state file.*hs_3.safetensors: {why}.*Re-run notebook 01"):
        open_split(d, split, 96)


@pytest.mark.parametrize("field", ["train_steps", "eval_every", "checkpoint_every"])
def test_settings_refuse_a_zero_interval_by_name(field):
    from draftlab import DraftlabError
    from draftlab.training.train import Settings

    with pytest.raises(DraftlabError, match=f"{field}=0: must be at least 1"):
        Settings(**{field: 0})


# 03 drafts: the draft's own forward, recipe and masks) and the vLLM engine (online): a stage uses only stages before
# it and the core (issue 32), never 05's acceptance.
CORE = (
    "__init__",
    "config",
    "devices",
    "families",
    "figures",
    "files",
    "layout",
    "profile",
    "progress",
    "run",
    "writes",
)
EARLIER = ("data", "masks", "drafts", "serving")
HOME = ("draftlab/training/", *(f"draftlab/{m}.py" for m in CORE), *(f"draftlab/{m}/" for m in EARLIER))


def test_importing_the_training_entry_point_pulls_in_only_training_earlier_stages_and_core():
    import subprocess
    import sys

    code = "import sys, draftlab.training.train; print(' '.join(m for m in sys.modules if m.startswith('draftlab')))"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    core = {"draftlab", *(f"draftlab.{m}" for m in CORE if m != "__init__")}
    away = [
        m
        for m in found
        if m not in core and not m.startswith(("draftlab.training", *(f"draftlab.{e}" for e in EARLIER)))
    ]
    assert "draftlab.training.train" in found and away == []


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_the_draft_handed_to_train_stays_in_training_and_earlier_stages_call_by_call(tiny, data, tmp_path, kind):
    """Every draftlab function `train` runs, traced: all in training/, the stages before it or the core; nothing of
    stage 05 (acceptance), which a training run must never need."""
    import sys
    from pathlib import Path

    d, root = make(tiny, data, kind), str(Path(__import__("draftlab").__file__).parent.parent) + "/"
    calls = set()

    def record(frame, event, _arg):
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(root):
            calls.add((path.removeprefix(root), frame.f_code.co_qualname))

    sys.setprofile(record)
    try:
        train(d, data, Settings(**{**S, "train_steps": 2, "eval_every": 1}), tmp_path / "run", progress=False)
    finally:
        sys.setprofile(None)
    away = {(p, f) for p, f in calls if not p.startswith(HOME)}
    assert any(p == "draftlab/drafts/forward.py" for p, _ in calls) and not away, sorted(away)


def test_online_rows_of_a_pack_are_asked_at_once_and_come_back_in_order():
    """Online, each row is a request that waits on vLLM: `read_rows` keeps up to `requests` of a pack's rows in
    flight (the first alone, as it sets up speculators' client) and returns them in the pack's order; offline
    datasets, and requests=1, read one row after another."""
    import threading
    import time

    from draftlab.training.data import read_rows

    class Rows:
        def __init__(self, on_missing):
            self.on_missing, self.now, self.most, self.lock = on_missing, 0, 0, threading.Lock()

        def __getitem__(self, i):
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
            time.sleep(0.05 * (i % 3))  # later rows may finish first
            with self.lock:
                self.now -= 1
            return {"row": i}

    idx = [7, 3, 5, 1, 8, 2, 4]
    online = Rows("generate")
    assert read_rows(online, idx, requests=4) == [{"row": i} for i in idx]
    assert online.most == 4
    for ds, requests in ((Rows("generate"), 1), (Rows("raise"), 16)):
        assert read_rows(ds, idx, requests) == [{"row": i} for i in idx] and ds.most == 1


def test_a_run_with_noise_on_its_input_states_trains_otherwise_and_resumes_exactly(tiny, data, tmp_path):
    """Issue 51's noise lever (`state_noise`, training.noise; its draw: tests/test_noise.py): a run with noise trains
    otherwise than one without and resumes to the same losses as a straight run; a checkpoint made before the setting
    existed resumes as one made without noise; a negative level, and the torchrun command with noise, are refused."""
    from draftlab.training import checkpoint as ckpt
    from draftlab.training.launch import torchrun_command

    noisy = {**S, "state_noise": 0.2}
    plain = read_metrics(train(make(tiny, data), data, Settings(**S), tmp_path / "plain", progress=False))
    straight = read_metrics(train(make(tiny, data), data, Settings(**noisy), tmp_path / "a", progress=False))
    train(make(tiny, data), data, Settings(**noisy), tmp_path / "b", stop_after=10, progress=False)
    resumed = read_metrics(
        train(make(tiny, data), data, Settings(**noisy), tmp_path / "b", resume=True, progress=False)
    )
    torch.testing.assert_close([r["loss"] for r in straight], [r["loss"] for r in resumed], rtol=1e-5, atol=1e-6)
    assert [r["loss"] for r in straight][1:] != [r["loss"] for r in plain][1:]
    assert ckpt.differences({"lr": 1}, {"state_noise": 0.0, "lr": 1}) == []
    assert ckpt.differences({"lr": 1}, {"state_noise": 0.2, "lr": 1}) == ["state_noise"]
    with pytest.raises(DraftlabError, match=r"state_noise=-0.1: must be a number of at least 0"):
        Settings(**{**S, "state_noise": -0.1})
    with pytest.raises(DraftlabError, match=r"speculators train \(0.9.0\) has no noise transform"):
        torchrun_command(make(tiny, data), data, Settings(**noisy), nproc=1, save_path=tmp_path / "spec")
