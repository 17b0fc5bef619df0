import hashlib
import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from draftlab import DraftlabError
from draftlab.data import manifest
from draftlab.data.dataset import save_split
from draftlab.data.extract import default_layer_ids, extract, load_sample, validate_layer_ids
from draftlab.data.hooks import hidden_states

from conftest import random_rows

IDS = [0, 2, 4, 5]  # includes id 0 (the embedding output)


def test_each_slot_is_the_reference_hidden_state(tiny):
    ids = torch.randint(4, tiny.vocab_size, (1, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = tiny.model(ids, output_hidden_states=True).hidden_states  # ref[i] enters layer i; ref[L] is normed
    (got,) = hidden_states(tiny, [ids[0].tolist()], IDS)
    assert got.shape == (23, len(IDS) + 1, tiny.hidden_size)
    for k, i in enumerate(IDS):
        torch.testing.assert_close(got[:, k], ref[i][0])
    last = got[:, -1]
    with torch.no_grad():
        torch.testing.assert_close(tiny.norm(last), ref[tiny.num_layers][0])
    assert not torch.allclose(last, ref[tiny.num_layers][0]), "the final slot must be pre-norm"


def test_batched_extraction_equals_one_at_a_time(tiny):
    rows = random_rows(tiny.vocab_size, [5, 31, 17, 2, 24], seed=2)["input_ids"]
    batched = hidden_states(tiny, rows, IDS)
    for row, b in zip(rows, batched, strict=True):
        (single,) = hidden_states(tiny, [row], IDS)
        assert b.shape == single.shape == (len(row), len(IDS) + 1, tiny.hidden_size)
        torch.testing.assert_close(b, single, atol=1e-5, rtol=1e-4)


def _dataset(tiny, tmp_path, lengths, seed=0):
    return save_split(random_rows(tiny.vocab_size, lengths, seed), tiny.tokenizer, tmp_path, max_length=64)


def test_speculators_arrowdataset_and_collate_read_what_we_wrote(tiny, tmp_path):
    from speculators.train.data import ArrowDataset, CollateFn

    ds = _dataset(tiny, tmp_path, [12, 20, 7, 16])
    stats = extract(tiny, ds, tmp_path, [2, 4, 5], batch_size=3, progress=False)
    assert (stats.written, stats.reused) == (4, 0)
    ads = ArrowDataset(max_len=64, datapath=tmp_path, on_missing="raise", hidden_states_dtype=torch.float32)
    assert len(ads) == 4
    item = ads[1]
    raw = load_sample(tmp_path, 1)["hidden_states"]
    assert item["hidden_states"].shape == (20, 3 * tiny.hidden_size)
    torch.testing.assert_close(item["hidden_states"], raw[:, :3].flatten(1))
    torch.testing.assert_close(item["verifier_last_hidden_states"], raw[:, 3])
    batch = CollateFn(64, tiny.hidden_size, num_target_layers=3, dtype=torch.float32)([ads[i] for i in range(4)])
    assert batch["hidden_states"].shape == (1, 64, 3 * tiny.hidden_size)
    assert batch["verifier_last_hidden_states"].shape == (1, 64, tiny.hidden_size)
    assert batch["input_ids"].shape == batch["loss_mask"].shape == (1, 64)
    assert batch["document_ids"][0, :55].tolist() == [0] * 12 + [1] * 20 + [2] * 7 + [3] * 16
    (tmp_path / "hidden_states" / "hs_2.safetensors").unlink()
    with pytest.raises(RuntimeError):
        ArrowDataset(max_len=64, datapath=tmp_path, on_missing="raise")[2]


def _assert_complete(folder, ds):
    files = sorted(p.name for p in (folder / "hidden_states").iterdir())
    assert files == sorted(f"hs_{i}.safetensors" for i in range(len(ds))), "missing, extra or temp files"
    m = manifest.read(folder)
    assert m["complete"] and len(m["files"]) == len(ds)
    rows = ds.with_format(None)["input_ids"]
    for i in range(len(ds)):
        blob = (folder / "hidden_states" / f"hs_{i}.safetensors").read_bytes()
        assert hashlib.sha256(blob).hexdigest() == m["files"][str(i)]["sha256"]
        assert load_sample(folder, i)["token_ids"].tolist() == rows[i]


KILL_SCRIPT = textwrap.dedent("""
    import sys
    from datasets import load_from_disk
    from draftlab.data.verifier import load_verifier
    from draftlab.data.extract import extract
    v = load_verifier(sys.argv[1], device="cpu", dtype="float32")
    ds = load_from_disk(sys.argv[2]); ds.set_format("torch")
    extract(v, ds, sys.argv[2], [2, 4, 5], batch_size=1, progress=False)
""")


def test_killed_extraction_resumes_to_a_complete_sound_set(tiny, tiny_dir, tmp_path):
    ds = _dataset(tiny, tmp_path, [48] * 400, seed=3)
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(tiny_dir), str(tmp_path)])
    hs = tmp_path / "hidden_states"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(hs.glob("hs_*.safetensors"))) < 20:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(hs.glob("hs_*.safetensors"))
    assert 20 <= len(done) < 400, "the run must be killed mid-way for this test to mean anything"
    # An interruption can also leave a temp file and, on other filesystems, a truncated file.
    (hs / "hs_399.safetensors.tmp").write_bytes(b"partial")
    victim = done[0]
    victim.write_bytes(victim.read_bytes()[:100])
    stats = extract(tiny, ds, tmp_path, [2, 4, 5], batch_size=8, progress=False)
    assert stats.redone >= 1 and stats.reused >= len(done) - 1
    assert stats.written + stats.reused == 400
    _assert_complete(tmp_path, ds)
    again = extract(tiny, ds, tmp_path, [2, 4, 5], progress=False)
    assert (again.written, again.reused, again.redone) == (0, 400, 0)


def test_changed_rows_are_re_extracted_and_extras_removed(tiny, tmp_path):
    ds = _dataset(tiny, tmp_path, [10, 11, 12, 13], seed=4)
    extract(tiny, ds, tmp_path, [2, 4, 5], progress=False)
    ds2 = _dataset(tiny, tmp_path, [10, 11, 9], seed=5)  # other tokens, one row fewer
    stats = extract(tiny, ds2, tmp_path, [2, 4, 5], progress=False)
    assert stats.written == 3 and stats.reused == 0
    _assert_complete(tmp_path, ds2)


def test_folder_from_another_layer_set_or_verifier_is_refused(tiny, tmp_path):
    ds = _dataset(tiny, tmp_path, [10, 12], seed=6)
    extract(tiny, ds, tmp_path, [2, 4, 5], progress=False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "hidden_states").iterdir()}
    with pytest.raises(DraftlabError, match="'layer_ids'"):
        extract(tiny, ds, tmp_path, [1, 3, 5], progress=False)
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["verifier_fingerprint"] = "0000other0000000"
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DraftlabError, match="'verifier_fingerprint'"):
        extract(tiny, ds, tmp_path, [2, 4, 5], progress=False)
    assert before == {p.name: p.read_bytes() for p in (tmp_path / "hidden_states").iterdir()}, "nothing lost"


def test_layer_ids_out_of_range_or_repeated_name_the_range():
    with pytest.raises(DraftlabError, match=r"\[0, 7\]"):
        validate_layer_ids([2, 8], 8)
    with pytest.raises(DraftlabError, match="distinct"):
        validate_layer_ids([2, 2], 8)
    with pytest.raises(DraftlabError, match="pass layer_ids explicitly"):
        default_layer_ids(4)  # [2, 2, 1]: too shallow for the EAGLE-3 default
    assert default_layer_ids(30) == [2, 15, 27]
    assert default_layer_ids(30, "dflash") == [1, 8, 14, 21, 28]


def test_a_layer_output_that_is_no_hidden_state_is_refused_naming_it(tiny):
    """A family whose decoder layer returns something else than the residual stream (here a dict) is refused, never read."""  # noqa: E501
    handle = tiny.layers[-1].register_forward_hook(lambda _m, _i, out: {"hidden": out})
    try:
        with pytest.raises(
            DraftlabError, match=r"the output of decoder layer 7 is a dict, not a \[batch, tokens, 32\] hidden state"
        ):
            hidden_states(tiny, [[5, 6, 7]], [2, 4])
    finally:
        handle.remove()


def test_atomic_writes_from_many_writers_at_once_never_collide(tmp_path):
    """Two training processes verify one split together: each rewrites `.verified.json` (a fixed
    temporary name made one's rename find the other's file gone, CI stop 25)."""
    from concurrent.futures import ThreadPoolExecutor

    from draftlab.data.manifest import write_atomic

    target = tmp_path / ".verified.json"
    payloads = [json.dumps({"writer": i, "pad": "x" * 20000}) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: [write_atomic(target, p) for _ in range(40)], payloads))
    assert target.read_text() in payloads  # whole, one writer's text
    assert sorted(p.name for p in tmp_path.iterdir()) == [".verified.json"]  # no temporary left behind


def test_states_that_cannot_fit_the_disk_are_refused_before_the_first_forward(tiny, tmp_path, monkeypatch):
    """A disk that fills hours into an extraction stops it where it stands: what the rows still to extract need
    (tokens x slots x hidden x bytes) is checked against the free space first, and the fix named."""
    import shutil
    from collections import namedtuple

    ds = _dataset(tiny, tmp_path, [12, 20, 7, 16, 9, 11])
    tokens = sum(len(r) for r in ds.with_format(None)["input_ids"])
    per_token = 4 * tiny.hidden_size * tiny.dtype.itemsize + 8  # three layers and the last state, and the token id
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 0, tokens * per_token + (255 << 20)))
    wanted = rf"the 6 rows still to extract \({tokens:,} tokens\) need about .* GiB on disk"
    with pytest.raises(DraftlabError, match=wanted) as e:
        extract(tiny, ds, tmp_path, [2, 4, 5], progress=False)
    assert "hidden_states: online" in str(e.value) and not list((tmp_path / "hidden_states").glob("hs_*"))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 0, tokens * per_token + (257 << 20)))
    assert extract(tiny, ds, tmp_path, [2, 4, 5], progress=False).written == 6  # room enough: written
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 0, 0))
    assert extract(tiny, ds, tmp_path, [2, 4, 5], progress=False).reused == 6  # a full disk, nothing left to write
