"""Tiny random verifiers (plain and nested) with a real tokenizer and chat template, built offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "hello how are you today",
    "what is the capital of france",
    "def add(a, b): return a + b",
    "the quick brown fox jumps over the lazy dog",
    "print('hello world')",
    "i am fine thank you",
    "for i in range(10): print(i)",
    "speculative decoding drafts tokens that a verifier accepts",
] * 20


def make_tokenizer(chat_template: str | None = CHATML):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
    tk.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>", bos_token="<|im_start|>"
    )
    tok.chat_template = chat_template
    return tok


def make_model(vocab_size: int, layers: int = 8, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on a shared 2-core machine: two intra-op threads spin against each other (~10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def embedded_dir(tmp_path_factory):
    """The embedded SmolLM2 de-quantised once per session (the checkout's own copy where `make run` made one), for
    the DRAFTLAB_HOMEs that `link_embedded` gives it: each converting its own wrote 517 MB, 3.6 GB a pytest run."""
    from draftlab.data.embedded import EMBEDDED_NAME, convert_embedded, converted

    ours = Path(__file__).resolve().parents[1] / "data" / "verifiers" / EMBEDDED_NAME
    return converted(ours) or convert_embedded(tmp_path_factory.mktemp("embedded") / EMBEDDED_NAME)


def link_embedded(home: Path, embedded: Path) -> None:
    """`home/data/verifiers/<name>` a link to the session's converted verifier, as if `home` had converted it."""
    (home / "data" / "verifiers").mkdir(parents=True, exist_ok=True)
    (home / "data" / "verifiers" / embedded.name).symlink_to(embedded, target_is_directory=True)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_verifier")
    tok = make_tokenizer()
    make_model(len(tok)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def nested_dir(tmp_path_factory, tiny_dir):
    """A Kimi-style wrapper: config under text_config, weights under `language_model.`, plus a vision part."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("nested_verifier")
    text_cfg = json.loads((tiny_dir / "config.json").read_text())
    cfg = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text_cfg,
        "vision_config": {"hidden_size": 8},
    }
    (path / "config.json").write_text(json.dumps(cfg))
    state = {f"language_model.{k}": v for k, v in load_file(tiny_dir / "model.safetensors").items()}
    state["vision_tower.proj.weight"] = torch.zeros(8, 8)
    save_file(state, path / "model.safetensors")
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(path)
    return path


@pytest.fixture
def sharegpt_file(tmp_path, monkeypatch):
    """Where `sources.sharegpt_texts` reads ShareGPT from: write the file's bytes here."""
    from draftlab.data import sources

    (tmp_path / "data").mkdir()
    monkeypatch.setattr(sources, "_package_dir", lambda *a: tmp_path)
    sources.sharegpt_texts.cache_clear()
    yield tmp_path / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    sources.sharegpt_texts.cache_clear()


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    from draftlab.data.verifier import load_verifier

    return load_verifier(tiny_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def serve_dir(tmp_path_factory):
    """A verifier vLLM's CPU attention takes (head_dim 32; the shared tiny one has 8)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("serve_verifier")
    tok = make_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def serve_verifier(serve_dir):
    from draftlab.data.verifier import load_verifier

    return load_verifier(serve_dir, device="cpu", dtype="float32")


def random_rows(vocab: int, lengths, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    rows = {"input_ids": [], "loss_mask": []}
    for n in lengths:
        rows["input_ids"].append(torch.randint(4, vocab, (n,), generator=g).tolist())
        rows["loss_mask"].append([0] * (n // 3) + [1] * (n - n // 3))
    return rows


def notebook(*sources: str) -> dict:
    """A papermill notebook: the parameters cell of every draftlab notebook, then one code cell per source."""
    cells = ['profile = "ci"\nrun_name = "ci"\noverrides = {}', *sources]
    return {
        "cells": [
            {
                "id": f"c{i + 1}",
                "cell_type": "code",
                "metadata": {"tags": ["parameters"]} if i == 0 else {},
                "source": src,
                "outputs": [],
                "execution_count": None,
            }
            for i, src in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
