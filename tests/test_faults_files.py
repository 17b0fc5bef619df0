"""Files draftlab wrote, cut or corrupted, then read back: each fault is a DraftlabError naming the file, what is
wrong with it and what to do (never a raw json / numpy / safetensors error, never a draft taken for absent), and a
cache draftlab can rebuild is rebuilt with a warning."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from draftlab import DraftlabError
from draftlab.data import manifest
from draftlab.layout import RunLayout, write_json

from conftest import random_rows


def _cut(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.fixture(scope="module")
def eagle_dir(tiny, tmp_path_factory):
    from draftlab.drafts.draft import build_eagle3

    path = tmp_path_factory.mktemp("eagle3") / "final"
    build_eagle3(tiny, None, num_layers=1).model.save_pretrained(path)
    return path


@pytest.mark.parametrize("name, says", [("config.json", "not valid JSON"), ("model.safetensors", "cut short")])
def test_a_cut_final_checkpoint_is_named_not_skipped_as_absent(tiny, eagle_dir, tmp_path, name, says):
    from draftlab.acceptance.proposers import load_draft, load_run_drafts

    layout = RunLayout("tiny", "run", root=tmp_path)
    shutil.copytree(eagle_dir, layout.final("eagle3"))
    _cut(layout.final("eagle3") / name)
    with pytest.raises(DraftlabError, match=f"checkpoint .*final is broken: .*{name}: it .*{says}.*Re-run notebook 04"):
        load_run_drafts(layout, tiny)
    with pytest.raises(DraftlabError, match=f"{name}: it .*{says}"):  # a draft passed by name (extra) alike
        load_draft(layout.final("eagle3"), tiny)
    shutil.rmtree(layout.final("eagle3"))  # absent: still skipped with the note
    assert "dflash: no checkpoint under" in load_run_drafts(layout, tiny, ("dflash",)).notes[0]


def _prompt_set(tmp_path):
    from draftlab.data.prompts import Prompt, write_prompt_set

    ps = [Prompt(f"p{i}", "chat", f"question {i} é", "bench") for i in range(3)]
    return write_prompt_set(ps, tmp_path / "prompts.jsonl")


def test_a_cut_or_edited_prompt_set_is_named_with_its_line(tiny, tmp_path):
    from draftlab.acceptance.evaluate import load_spec_prompts

    path = _prompt_set(tmp_path)
    assert len(load_spec_prompts(path, tiny.tokenizer)) == 3
    lines = path.read_bytes().splitlines(keepends=True)
    faults = {
        "is not valid JSON": lines[0] + lines[1][:20] + b"\n" + lines[2],  # cut mid-line
        "has no 'split'": lines[0] + json.dumps({"id": "p1", "source": "chat", "text": "q"}).encode() + b"\n",
        "is not UTF-8": lines[0] + lines[1].replace(b"question", b"quest\xffion"),
    }
    for says, data in faults.items():
        path.write_bytes(data)
        with pytest.raises(DraftlabError, match=f"prompts.jsonl, line 2, cannot be read: it {says}.*notebook 01"):
            load_spec_prompts(path, tiny.tokenizer)
    for empty in (b"", b"\n\n"):
        path.write_bytes(empty)
        with pytest.raises(DraftlabError, match=r"prompts.jsonl is empty: it holds no prompts at all .*notebook 01"):
            load_spec_prompts(path, tiny.tokenizer)


def test_responses_a_line_without_settings_is_named_a_cut_last_line_is_redone(tmp_path):
    from draftlab.data.generate import read_done

    path, settings = tmp_path / "responses.jsonl", {"verifier": "abc", "engine": "hf"}
    good = json.dumps({"id": "a", "response": "réponse", "settings": settings}) + "\n"
    other = good.replace('"a"', '"c"').encode().replace(b"ponse", b"p\xffnse")  # bytes that are not UTF-8
    path.write_bytes(good.encode() + other + good.replace('"a"', '"b"').encode()[:-9])  # the last line cut short
    assert read_done(path, settings, "float32") == {"a": "réponse"}  # b and c are answered again
    path.write_text(good + json.dumps({"id": "b", "response": "x"}) + "\n")
    with pytest.raises(DraftlabError, match="responses.jsonl, line 2, cannot be read: it has no 'settings'.*Delete"):
        read_done(path, settings, "float32")


def test_a_cut_resolved_config_is_named_with_the_notebook_to_rerun(tmp_path):
    layout = RunLayout("tiny", "run", root=tmp_path)
    write_json(layout.resolved_config("01"), {"stage": "01", "finished": "now", "config": {"verifier": "v"}})
    _cut(layout.resolved_config("01"))
    with pytest.raises(DraftlabError, match="tiny/config.json cannot be read: it is not valid JSON.*notebook 01"):
        layout.upstream("01", None)
    write_json(layout.resolved_config("04"), {"stage": "04", "finished": None})
    _cut(layout.resolved_config("04"))
    with pytest.raises(DraftlabError, match="04/config.json cannot be read.*Re-run notebook 04"):
        layout.upstream("04", None, required=False)  # cut is not "not finished": it is named
    with pytest.raises(DraftlabError, match="04/config.json cannot be read.*Re-run notebook 04"):
        layout.finish("04")


def _split(tiny, folder, lengths=(9, 12, 7)):
    from draftlab.data.dataset import save_split
    from draftlab.data.extract import extract

    ds = save_split(random_rows(tiny.vocab_size, list(lengths), 3), tiny.tokenizer, folder, max_length=32)
    return ds, extract(tiny, ds, folder, [2, 4, 5], progress=False)


def test_a_cut_manifest_is_named_where_it_is_read_and_redone_by_notebook_01(tiny, tmp_path):
    from draftlab.data.extract import extract
    from draftlab.drafts.inputs import read_data

    ds, first = _split(tiny, tmp_path)
    assert first.written == 3
    _cut(tmp_path / "manifest.json")
    fix = "manifest.json cannot be read: it is not valid JSON.*Re-run notebook 01"
    for read in (manifest.read, manifest.verify_files, lambda f: read_data(f, tiny, None)):  # notebooks 03, 04
        with pytest.raises(DraftlabError, match=fix):
            read(tmp_path)
    hs = tmp_path / "hidden_states"
    _cut(hs / "hs_1.safetensors")  # a file the cut manifest can no longer vouch for
    with pytest.warns(UserWarning, match="manifest.json cannot be read .* checked against its row"):
        again = extract(tiny, ds, tmp_path, [2, 4, 5], progress=False)
    assert (again.reused, again.redone, again.written) == (2, 1, 1)
    man = manifest.read(tmp_path)
    assert man["complete"] and sorted(man["files"]) == ["0", "1", "2"]
    manifest.verify_files(tmp_path)  # every file matches the manifest written again


def test_cut_caches_are_rebuilt_with_a_warning(tiny, tiny_dir, tmp_path):
    import hashlib

    from draftlab.data.verifier_dir import file_digest

    weights, cache = tiny_dir / "model.safetensors", tmp_path / "weight-digests.json"
    cache.write_text('{"x": "y", "z"')
    with pytest.warns(UserWarning, match="weight-digests.json cannot be read .*rebuilt"):
        assert file_digest(weights, cache) == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert len(json.loads(cache.read_text())) == 1  # written whole again

    _split(tiny, tmp_path / "train")
    manifest.verify_files(tmp_path / "train")
    _cut(tmp_path / "train" / manifest.VERIFIED)
    with pytest.warns(UserWarning, match=r"\.verified\.json cannot be read"):
        manifest.verify_files(tmp_path / "train")
    assert len(json.loads((tmp_path / "train" / manifest.VERIFIED).read_text())) == 3


def test_a_cut_vocabulary_mapping_is_named(tiny, tmp_path):
    from draftlab.drafts.inputs import read_data

    manifest.write(tmp_path, {"verifier_fingerprint": tiny.fingerprint, "hidden_size": tiny.hidden_size,
                              "layer_ids": [2, 4, 5], "dtype": "float32"})  # fmt: skip
    t2d = np.zeros(tiny.vocab_size, dtype=bool)
    t2d[:8] = True
    np.save(tmp_path / "d2t-8.npy", np.zeros(8, dtype=np.int64))
    np.save(tmp_path / "t2d-8.npy", t2d)
    assert read_data(tmp_path, tiny, 8)[2].shape == (8,)
    _cut(tmp_path / "d2t-8.npy", 0.9)
    with pytest.raises(DraftlabError, match="d2t-8.npy cannot be read: it is not a whole .npy array.*notebook 01"):
        read_data(tmp_path, tiny, 8)


def test_a_verifier_with_weights_cut_to_half_is_named_before_loading(tiny_dir, tmp_path):
    from draftlab.data.verifier import load_verifier

    cut = shutil.copytree(tiny_dir, tmp_path / "verifier")
    _cut(cut / "model.safetensors")
    with pytest.raises(DraftlabError, match=r"\['model.safetensors'\] are empty or cut short; copy them .*cut short"):
        load_verifier(cut, device="cpu", dtype="float32")


def test_a_cut_embedded_conversion_is_converted_again(tiny_dir, tmp_path, monkeypatch):
    from draftlab.data import embedded

    dest = shutil.copytree(tiny_dir, tmp_path / "SmolLM2")
    assert embedded.convert_embedded(dest) == dest  # whole: taken as it is
    _cut(dest / "model.safetensors")

    def converting():
        raise RuntimeError("converting")

    monkeypatch.setattr(embedded, "embedded_gguf", converting)  # the conversion's first step: it starts again
    with pytest.warns(UserWarning, match="model.safetensors cannot be read .*cut short.*converting again"):
        with pytest.raises(RuntimeError, match="converting"):
            embedded.convert_embedded(dest)
    assert not dest.exists()


def test_a_metrics_line_cut_by_an_interruption_is_left_out(tmp_path):
    from draftlab.training.train import read_metrics

    rec = json.dumps({"step": 1, "split": "train", "loss": 1.0}) + "\n"
    (tmp_path / "metrics.jsonl").write_text(rec + rec[:12])
    assert read_metrics(tmp_path) == [json.loads(rec)]
