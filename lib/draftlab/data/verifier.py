"""The verifier: the embedded SmolLM2, or any local HF causal-LM directory, nested or not.

Wrapper checkpoints (multimodal, Kimi-style) keep the text model's config under `text_config`
and its weights under a `language_model.` prefix; `load_verifier` unwraps both so the rest of
draftlab sees one plain causal LM and its parts (embeddings, decoder layers, final norm, lm_head).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from draftlab import DraftlabError
from draftlab.data import gqa
from draftlab.data.embedded import EMBEDDED
from draftlab.data.verifier_dir import fingerprint, resolve_verifier
from draftlab.devices import pick_device, pick_dtype

# Prefixes under which wrapper checkpoints store the text model, and what they become.
WRAPPER_PREFIXES = (("model.language_model.", "model."), ("language_model.", ""), ("text_model.", ""))


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


def check_token_ids(verifier: Verifier, rows: dict, where: str, fix: str) -> None:
    """Refuse a token id the verifier has no embedding row for, before a forward fails on it with torch's
    "index out of range in self", which names neither the record nor the cause. `rows`: a record's name ->
    its token ids; `where` says what the records are, `fix` what to do."""
    n = verifier.embed.weight.shape[0]
    for name, ids in rows.items():
        if len(ids) and not 0 <= min(ids) <= max(ids) < n:
            bad = next(int(t) for t in ids if not 0 <= t < n)
            raise DraftlabError(
                f"{where}: record {name} holds token id {bad}, but the verifier {verifier.path} embeds ids 0 to "
                f"{n - 1} only (its tokenizer has {len(verifier.tokenizer)} tokens); {fix}"
            )


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
