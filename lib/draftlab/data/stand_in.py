"""Which shape a verifier is expanded to: a real model's published shape, met by padding (`data.expand`).

Speculative decoding pays where a verifier's decode step is bound by reading its weights, so that verifying k+1
tokens costs about what one token costs: an 8B model on a GPU, not the 135M embedded one, whose step there is the
engine's fixed cost. No larger real weights can be had on these machines, so draftlab measures speed-up on a
stand-in: the verifier itself, widened to a reference model's hidden size, heads, MLP width and layer count by a
rule that keeps its function exact (`data.expand`). `plan` chooses the shape, `count_parameters` counts it as
transformers builds it, `reference_config` writes the reference's own config (served with random weights beside
the stand-in, for the cost check) and `check_room` refuses a disk or device too small before anything is written.
A stand-in is named for what it is ("SmolLM2-135M-Instruct expanded to Llama-3.1-8B's shape"), never as the
reference model.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.writes import room_for

# Families whose decoder layer is q/k/v/o + gate/up/down with an x*w RMSNorm over the hidden size, nothing else.
FAMILIES = ("llama", "mistral", "qwen2")
REFUSED = {
    "gemma": "its RMSNorm computes x*(1+w) and its embeddings are scaled by sqrt(hidden size)",
    "qwen3": "its per-head q/k norms share rms_norm_eps with the hidden-size norms, which the expansion rescales",
    "phi3": "its fused qkv_proj / gate_up_proj interleave the blocks the padding must keep apart",
}


@dataclass(frozen=True)
class Reference:
    """A real model's published shape (its config.json): what a stand-in's kernels are sized after."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool

    def layer_params(self) -> int:
        return layer_params(
            self.hidden_size, self.intermediate_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim
        )


REFERENCES = {
    "8b": Reference("Llama-3.1-8B", 4096, 14336, 32, 32, 8, 128, 128256, False),
    "1b": Reference("Llama-3.2-1B", 2048, 8192, 16, 32, 8, 64, 128256, True),
}


def layer_params(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Weights of one decoder layer's projections (what a decode step reads), norms left out."""
    return hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * inter


@dataclass(frozen=True)
class Plan:
    """The expanded shape, and what it stands in for."""

    source: str
    like: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    parameters: int  # of the expanded model, as transformers counts them for its config
    reference_parameters: int

    @property
    def name(self) -> str:
        return f"{self.source} expanded to {self.like}'s shape ({self.parameters / 1e9:.2f}B parameters)"


def text_config(cfg: dict, where) -> dict:
    model_type = cfg.get("model_type", "?")
    if model_type in FAMILIES:
        return cfg
    why = next((w for fam, w in REFUSED.items() if model_type.startswith(fam)), None)
    raise DraftlabError(
        f"{where}: model_type {model_type!r} cannot be expanded"
        + (f": {why}." if why else ", only the families whose layers the padding rule is proven on can.")
        + f" Expansion takes {', '.join(FAMILIES)} verifiers (a text model's own directory, not a wrapper)."
    )


def plan(verifier_dir, like: str) -> Plan:
    """The stand-in's shape for `verifier_dir` after the reference `like` ('8b', '1b'): the reference's hidden size
    (rounded down to whole KV groups of this verifier's heads) and MLP width, its layer count or the verifier's if
    larger; with more layers than the reference, hidden size and MLP (at the reference's ratio) are chosen so the
    layers' weights match the reference's in total. Refused where the stand-in would be narrower than the verifier."""
    if like not in REFERENCES:
        raise DraftlabError(f"like={like!r}: choose one of {sorted(REFERENCES)} (the reference model's size).")
    path = Path(verifier_dir)
    cfg = text_config(json.loads((path / "config.json").read_text()), path)
    ref = REFERENCES[like]
    heads, kv, hidden = (
        cfg["num_attention_heads"],
        cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        cfg["hidden_size"],
    )
    hd = cfg.get("head_dim") or hidden // heads
    if heads % kv or heads * hd != hidden:
        raise DraftlabError(
            f"{path}: {heads} heads of {hd} over {kv} KV heads, hidden {hidden}: not a shape the "
            "padding rule keeps (heads x head_dim must be the hidden size, heads a multiple of KV heads)."
        )
    step, layers = hd * (heads // kv), max(cfg["num_hidden_layers"], ref.num_hidden_layers)
    if layers == ref.num_hidden_layers:
        new_hidden, inter = ref.hidden_size // step * step, ref.intermediate_size
    else:  # more layers than the reference: the same weight budget spread over them
        budget = ref.layer_params() * ref.num_hidden_layers / layers
        ratio = ref.intermediate_size / ref.hidden_size

        def cost(h):
            return abs(layer_params(h, round(h * ratio / 64) * 64, h // hd, h // step, hd) - budget)

        new_hidden = min(range(step, 4 * ref.hidden_size, step), key=cost)
        inter = round(new_hidden * ratio / 64) * 64
    if new_hidden < hidden or inter < cfg["intermediate_size"]:
        raise DraftlabError(
            f"the {like} stand-in ({new_hidden} hidden, {inter} MLP units) is smaller than the verifier at {path} "
            f"({hidden}, {cfg['intermediate_size']}): a stand-in must be at least as wide. Choose a larger one "
            f"(one of {sorted(REFERENCES)}), or serve this verifier as it is."
        )
    shape = dict(
        hidden_size=new_hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=new_hidden // hd,
        num_key_value_heads=new_hidden // step,
        head_dim=hd,
    )
    return Plan(
        source=path.name,
        like=ref.name,
        **shape,
        parameters=count_parameters({**cfg, **shape}),
        reference_parameters=count_parameters(reference_config(like)),
    )


def count_parameters(cfg: dict) -> int:
    """Parameters of a model of this config, as transformers builds it (on the meta device: nothing allocated)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    c = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version")})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(c)
    return sum(p.numel() for p in model.parameters())


def reference_config(like: str) -> dict:
    """The reference model's config.json from its published numbers, to serve it with random weights (vLLM's dummy
    load format) beside the stand-in: the same engine and kernels, for the cost check. Its RoPE is plain (the real
    model's scaling changes no kernel's cost)."""
    r = REFERENCES[like]
    fields = {k: v for k, v in asdict(r).items() if k != "name"}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **fields,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
        "_name_or_path": f"{r.name} (random weights)",
    }


def check_room(out: Path, nbytes: int, device: str) -> None:
    """Refuse before anything is written: a disk or a device that cannot hold the expansion."""
    room_for(
        out,
        int(nbytes * 1.05),
        "the expansion's weights",
        "free space there, choose another out folder, or a smaller stand-in ('1b').",
    )
    if str(device).startswith("cuda") and torch.cuda.is_available():
        total = torch.cuda.mem_get_info()[1]
        if total < nbytes * 1.2:
            raise DraftlabError(
                f"the expansion's weights ({nbytes / 2**30:.1f} GiB) and a KV cache need more than "
                f"this GPU's {total / 2**30:.1f} GiB: choose a smaller stand-in ('1b')."
            )
    elif not str(device).startswith("cuda"):
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if ram < nbytes * 1.5:
            raise DraftlabError(
                f"serving the expansion ({nbytes / 2**30:.1f} GiB) on this CPU needs more than its "
                f"{ram / 2**30:.1f} GiB of memory: choose a smaller stand-in or a GPU."
            )
