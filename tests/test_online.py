"""Online hidden states (issue 31): the draft trained on states vLLM makes as packs are read gives the same losses,
step for step, as the same draft trained on stage 01's files; nothing is left on disk by the online run."""

from __future__ import annotations

import json

import pytest

from draftlab import DraftlabError
from draftlab.serving.command import unavailable
from draftlab.serving.process import group_members
from draftlab.training.settings import Settings

from conftest import random_rows

LAYER_IDS = [1, 4, 6]  # of the serve verifier's 8 layers
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("one_thread")]


def make_splits(v, root, mode: str = "offline"):
    """Stage-01 splits of `v` under `root`, states extracted by draftlab's hooks for the rows 01 keeps in `mode`."""
    from draftlab.data import dataset, extract, vocab

    for split, lengths, seed in (("train", [40, 25, 33, 18, 50, 29, 44, 21], 0), ("eval", [30, 22, 41], 1)):
        ds = dataset.save_split(random_rows(v.vocab_size, lengths, seed), v.tokenizer, root / split, max_length=64)
        keep = extract.rows_to_store(mode, split)
        extract.extract(v, ds, root / split, LAYER_IDS, progress=False, max_samples=keep)
        if split == "train":
            vocab.build_mapping(vocab.token_frequencies(ds, root / split), 32, v.vocab_size, root / split)
    return root


@pytest.fixture(scope="module")
def split_data(tmp_path_factory, serve_verifier):
    """Stage-01 splits of the serve verifier (vLLM's CPU attention takes it), every row's states on disk."""
    return make_splits(serve_verifier, tmp_path_factory.mktemp("online"))


def _losses(run_dir) -> list[tuple[str, int, float]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["split"], r["step"], r["loss"]) for r in lines]


def test_online_training_gives_the_offline_losses_step_for_step(serve_verifier, split_data, tmp_path):
    import torch

    from draftlab.drafts.draft import build_draft
    from draftlab.training.train import train

    if unavailable() is not None:
        pytest.skip(f"no working vLLM environment: {unavailable()}")
    runs = {}
    for mode in ("offline", "online"):
        torch.manual_seed(0)
        d = build_draft("eagle3", serve_verifier, split_data / "train", layer_ids=LAYER_IDS, attention="sdpa")
        s = Settings(train_steps=4, pack_len=128, eval_every=2, checkpoint_every=4, warmup_steps=1, hidden_states=mode)
        runs[mode] = train(d, split_data, s, run_dir=tmp_path / mode, progress=False)
        assert d.choices["hidden states"][0] == mode
    # online, the held-out split (kept whole by stage 01) is read from disk: the same packs at every evaluation
    assert "eval: stage 01's files" in d.choices["hidden states"][1]
    off, on = _losses(runs["offline"]), _losses(runs["online"])
    assert [r[:2] for r in off] == [r[:2] for r in on] and len(off) == 6, "4 train steps and 2 evaluations each"
    # vLLM's fp32 states equal the hooks' within 1e-5 (test_extract_vllm); the losses follow them
    assert [r[2] for r in on] == pytest.approx([r[2] for r in off], rel=1e-4)
    log = runs["online"] / "vllm-online.log"
    assert log.exists() and "extract_hidden_states" in log.read_text()


def test_online_stops_its_server_and_keeps_nothing(serve_verifier, split_data):
    from draftlab.training.online import state_server

    if unavailable() is not None:
        pytest.skip(f"no working vLLM environment: {unavailable()}")
    from draftlab.data.packing import rows

    with state_server(serve_verifier, LAYER_IDS, 80) as online:
        folder = online.no_cache.parent
        ds = rows(split_data / "train", 128, serve_verifier.dtype, online)
        item = ds[0]
        assert item["hidden_states"].shape[-1] == 3 * serve_verifier.hidden_size
        assert list((folder / "generated").rglob("*.safetensors")) == [], "each file is deleted once loaded"
        pid = online.server.proc.pid
    assert group_members(pid) == [] and not folder.exists()


def test_an_unknown_source_is_refused_by_name():
    from draftlab.data.extract import check_source

    with pytest.raises(DraftlabError, match=r"hidden_states='disk': use one of \('offline', 'online'\)"):
        Settings(hidden_states="disk")
    with pytest.raises(DraftlabError, match=r"hidden_states='disk': use 'offline' .* or 'online'"):
        check_source("disk")


def test_the_torchrun_command_asks_vllm_for_every_row_when_online(serve_verifier, split_data, tmp_path):
    from speculators.train.config import TrainConfig

    from draftlab.drafts.draft import build_draft
    from draftlab.training.launch import torchrun_command

    d = build_draft("eagle3", serve_verifier, split_data / "train", layer_ids=LAYER_IDS, attention="sdpa")
    s = Settings(train_steps=4, pack_len=128, hidden_states="online")
    cmd = torchrun_command(d, split_data, s, nproc=2, save_path=tmp_path / "save")
    assert cmd[cmd.index("--vllm-endpoint") + 1] == "http://localhost:8000/v1"  # speculators' launch_vllm.py
    cmd = torchrun_command(d, split_data, s, nproc=2, save_path=tmp_path / "save", vllm_endpoint="http://h:8000/v1")
    flat = TrainConfig.resolve(cmd[cmd.index("speculators.train") + 1 :]).flatten()
    assert flat["on_missing"] == "generate" and flat["vllm_endpoint"] == "http://h:8000/v1"
    cache = tmp_path / "save-no-cache"
    assert flat["hidden_states_path"] == str(cache) and cache.is_dir() and not any(cache.iterdir())


def test_a_split_01_extracted_online_trains_online_and_is_refused_offline(serve_verifier, tmp_path, monkeypatch):
    """Stage 01 with hidden_states: online keeps the first train rows' states only (for notebooks 02-04): training
    offline on it is refused by name before any step (speculators would meet a missing file mid-epoch)."""
    from draftlab.data import extract
    from draftlab.drafts.draft import build_draft
    from draftlab.training.launch import torchrun_command
    from draftlab.training.train import train

    monkeypatch.setattr(extract, "PREVIEW_ROWS", 3)
    v, root = serve_verifier, make_splits(serve_verifier, tmp_path / "data", "online")
    assert len(list((root / "train" / "hidden_states").glob("*.safetensors"))) == 3
    assert len(list((root / "eval" / "hidden_states").glob("*.safetensors"))) == 3, "eval is kept whole"
    d = build_draft("eagle3", v, root / "train", layer_ids=LAYER_IDS, attention="sdpa")
    offline = Settings(train_steps=2, pack_len=128, warmup_steps=1)
    for refused in (
        lambda: train(d, root, offline, run_dir=tmp_path / "off", progress=False),
        lambda: torchrun_command(d, root, offline, nproc=1, save_path=tmp_path / "save"),
    ):
        with pytest.raises(DraftlabError, match=r"first 3 of 8 rows only .* train with hidden_states: online"):
            refused()
    if unavailable() is not None:
        pytest.skip(f"no working vLLM environment: {unavailable()}")
    run = train(d, root, Settings(train_steps=2, pack_len=128, warmup_steps=1, hidden_states="online"), tmp_path / "on")
    assert (run / "final" / "model.safetensors").exists()
    assert len(list((root / "train" / "hidden_states").glob("*.safetensors"))) == 3, "nothing written to the data"
