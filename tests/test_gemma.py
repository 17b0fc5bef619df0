"""The optional Gemma 3 270M verifier (`make gemma`, `verifier: gemma3-270m`): its GGUF path taken on a tiny random
Gemma-3 stand-in written the way llama.cpp writes Gemma (norm weights stored as 1 + w), and the real packages
checked for what they claim where they are installed."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from draftlab import DraftlabError
from draftlab.data import gemma

from families import FAMILIES

WORDS = ["hello", "how", "are", "you", "the", "capital", "of", "france", "def", "add", "return", "print", "fine"]
TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", *(f"<0x{b:02X}>" for b in range(256))]
TOKENS += [*("▁" + w for w in WORDS), *"abcdefghijklmnopqrstuvwxyz", "\n", "\n\n", "▁"]


class _Vocab:
    """What the family matrix's config reads of a tokenizer: this GGUF vocabulary's size and special ids."""

    eos_token_id, bos_token_id, pad_token_id = 1, 2, 0

    def __len__(self) -> int:
        return len(TOKENS)


def _tiny_gemma():
    """The family matrix's tiny random Gemma-3 (tests/families.py), as transformers reads a Gemma-3 GGUF back:
    query_pre_attn_scalar 256 (the real 270M's too), sliding and global layers as Gemma 3's pattern sets them."""
    from transformers import Gemma3ForCausalLM

    cfg = FAMILIES["gemma3"].config(_Vocab())
    cfg.query_pre_attn_scalar, cfg.rms_norm_eps = 256, 1e-6
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.5)  # x·(1+w) with w far from 0: a norm read as x·w would show
    return model


def _write_gguf(model, path) -> None:
    """The model as llama.cpp's converter writes a Gemma-3 GGUF: its tensor names, norm weights as 1 + w."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_name("tiny gemma3")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(c.sliding_window)
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0] * 261 + [-float(i) for i in range(len(TOKENS) - 261)])
    w.add_token_types([3, 3, 3, 2, 3] + [6] * 256 + [1] * (len(TOKENS) - 261))
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, c.num_hidden_layers)
    for name, p in model.state_dict().items():
        if name != "lm_head.weight":  # tied to the embeddings
            arr = p.numpy().astype(np.float32)
            w.add_tensor(names.get_name(name.removesuffix(".weight")) + ".weight", arr + 1 if "norm" in name else arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """The Gemma packages replaced by one whose `assemble` gives the tiny GGUF, as the real one gives its file."""
    model = _tiny_gemma()
    src = tmp_path / "tiny-gemma3.gguf"
    _write_gguf(model, src)
    pkg = types.ModuleType(gemma.PACKAGE)
    pkg.MODEL_NAME = "tiny-gemma3.gguf"
    pkg.assemble = lambda target: target.write_bytes(src.read_bytes()) and target
    monkeypatch.setitem(sys.modules, gemma.PACKAGE, pkg)
    monkeypatch.setattr(gemma, "installed", lambda: True)
    return model


def test_the_gemma_gguf_path_on_a_tiny_random_stand_in(stand_in, tmp_path, one_thread):
    from draftlab.data import extract, extract_check, hooks
    from draftlab.data.dataset import tokenize_conversation
    from draftlab.data.prompts import Prompt
    from draftlab.data.verifier import load_verifier

    dest = gemma.convert_gemma(tmp_path / "verifier")
    assert gemma.convert_gemma(tmp_path / "verifier") == dest  # converted once
    v = load_verifier(str(dest))
    assert type(v.norm).__name__ == "Gemma3RMSNorm" and v.vocab_size == len(TOKENS)
    x = torch.tensor([[2, *range(261, 275)]])
    torch.testing.assert_close(v.model(x).logits, stand_in(x).logits, msg="the GGUF's 1 + w norms read back as w")
    prompt = Prompt("p", "mine", "hello how are you", "train", system="be brief")
    ids, mask = tokenize_conversation(v.tokenizer, prompt, "fine")
    assert ids[0] == 2 and ids.count(2) == 1, "<bos> first, once"
    assert v.tokenizer.decode(ids[1:]) == "be brief\n\nhello how are you\n\nfine\n\n"
    assert v.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m]) == "fine\n\n", "the answer alone learnt"
    aux = extract.default_layer_ids(v.num_layers)
    chat = [2, *range(261, 290)]
    sample = {"token_ids": torch.tensor(chat), "hidden_states": hooks.hidden_states(v, [chat], aux)[0]}
    assert extract_check.against_verifier(v, sample, aux)["greedy tokens from the final slot equal the verifier's"] == 1
    sample["hidden_states"] = sample["hidden_states"][:, [1, 0, 2, 3]]  # two slots swapped: refused
    with pytest.raises(DraftlabError, match="differ from the verifier's own"):
        extract_check.against_verifier(v, sample, aux)


def test_the_gemma_verifier_without_its_packages_names_the_make_target(tmp_path, monkeypatch):
    monkeypatch.setattr(gemma, "installed", lambda: False)
    with pytest.raises(DraftlabError, match=r"'gemma3-270m' needs the Gemma 3 270M packages: run `make gemma`"):
        gemma.convert_gemma(tmp_path / "none")


@pytest.mark.skipif(not gemma.installed(), reason="the Gemma packages are not installed (make gemma)")
def test_the_installed_gemma_packages_hold_what_they_claim(tmp_path):
    """The vetting of issue 49, repeated wherever `make gemma` ran: the sha256 the package ships, the GGUF's
    architecture, shape, parameter count and tokenizer."""
    import gguf

    path = gemma.assemble_gguf(tmp_path)  # checks the sha256
    r = gguf.GGUFReader(str(path))
    field = lambda k: r.fields[k].contents()  # noqa: E731
    assert field("general.architecture") == "gemma3" and field("general.size_label") == "270M"
    assert [field(f"gemma3.{k}") for k in ("block_count", "embedding_length", "attention.head_count")] == [18, 640, 4]
    assert sum(int(np.prod(t.shape)) for t in r.tensors) == 268_098_176
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 262_144 and field("tokenizer.ggml.model") == "llama"
