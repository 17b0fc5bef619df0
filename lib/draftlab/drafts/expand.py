"""A trained draft widened by the verifier's expansion rule (`data.expand`), for an expanded verifier.

A draft trained for the original verifier proposes the same tokens for its expansion once it is widened the same
way: its inputs from the verifier (the aux hidden states, the token embeddings) gain padded coordinates that are
exactly zero, so the columns that read them are padded (with values that only ever meet zeros), and its own width
is padded to the expanded verifier's where vLLM and speculators need them equal (the hidden size: a real EAGLE-3
draft for an 8B verifier is that wide), with extra heads and MLP units whose output projections are zero and
RMSNorms rescaled as the verifier's. So its proposals are unchanged and each of its steps costs what a real draft's
for a verifier of that shape costs. EAGLE-3's layer is a Llama layer whose only epsilon is the hidden-size norms', so
it is exact; DFlash's Qwen3 layers also normalise each head's q and k over head_dim with the same config epsilon,
which the rule rescales by H / H': those two norms then differ from the original's by about (eps - eps') / (2 mean
q^2), far below bf16's resolution where q is not near zero (its proposals are checked equal in fp32 in the tests).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.data.expand import MARKER, grow, scaled_norm
from draftlab.data.stand_in import Plan

WIDENED = ("eagle3", "dflash")


def blocks(t: torch.Tensor, rows: int, old: int, new: int, fill: str, gen, dtype) -> torch.Tensor:
    """A weight whose input is n blocks of the hidden size (EAGLE-3's fc reads three aux states, its first layer
    [embeddings, hidden]): each block of `old` columns placed at the start of a block of `new`, the rest filled."""
    n = t.shape[1] // old
    out = grow(torch.empty(0, 0), (rows, n * new), fill, gen, dtype)
    for b in range(n):
        out[: t.shape[0], b * new : b * new + old] = t[:, b * old : (b + 1) * old].to(dtype)
    return out


def widen(name: str, t: torch.Tensor, h: int, p: Plan, gen, dtype) -> torch.Tensor:
    """One EAGLE-3 tensor (speculators' names) widened from hidden `h` to the plan's."""
    hn, q, kv, inter = (
        p.hidden_size,
        p.num_attention_heads * p.head_dim,
        p.num_key_value_heads * p.head_dim,
        p.intermediate_size,
    )
    scale = math.sqrt(h / hn)
    if name in ("d2t", "t2d") or name.endswith(("q_norm.weight", "k_norm.weight")):  # vocabularies; per-head norms
        return t
    if name.endswith("norm.weight"):  # input_norm spans the three aux states: a block each
        n = t.numel() // h
        return torch.cat([scaled_norm(t[b * h : (b + 1) * h], hn, scale, dtype) for b in range(n)])
    rules = {  # suffix: (rows, fill, input blocks of the hidden size or None for a plain grow)
        "embed_tokens.weight": ((t.shape[0], hn), "zero"),
        "lm_head.weight": ((t.shape[0], hn), "zero"),  # the verifier's rows, padded as the verifier's
        "fc.weight": ((hn, None), "zero"),
        "q_proj.weight": ((q, None), "random"),
        "k_proj.weight": ((kv, None), "random"),
        "v_proj.weight": ((kv, None), "random"),
        "o_proj.weight": ((hn, q), "zero"),
        "gate_proj.weight": ((inter, hn), "random"),
        "up_proj.weight": ((inter, hn), "random"),
        "down_proj.weight": ((hn, inter), "zero"),
    }
    for suffix, (shape, fill) in rules.items():
        if name.endswith(suffix):
            if shape[1] is None:  # fc, q/k/v: their input is several hidden-size blocks
                return blocks(t, shape[0], h, hn, fill, gen, dtype)
            return grow(t, shape, fill, gen, dtype)
    raise DraftlabError(f"the draft expansion has no rule for the EAGLE-3 tensor {name!r} {tuple(t.shape)}.")


def expand_draft(draft_dir, expanded_verifier, out=None, seed: int = 0) -> Path:
    """The EAGLE-3 checkpoint at `draft_dir` (speculators' `save_pretrained` folder, e.g. a run's final/) widened
    for `expanded_verifier` (`data.expand.expand`'s folder) into `out` (default: beside it, `<name>-as-<like>`), in the
    expanded verifier's dtype, its config naming the expanded verifier and the original aux layer ids."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, ver = Path(draft_dir), Path(expanded_verifier)
    if not (ver / MARKER).exists():
        raise DraftlabError(
            f"{ver} is not an expanded verifier (no {MARKER}): make it with draftlab.data.expand first."
        )
    info = json.loads((ver / MARKER).read_text())
    p, dtype = Plan(**info["plan"]), getattr(torch, info["dtype"])
    cfg = json.loads((src / "config.json").read_text())
    if cfg.get("speculators_model_type") not in WIDENED:
        raise DraftlabError(
            f"{src} is a {cfg.get('speculators_model_type')!r} draft: the expansion widens {', '.join(WIDENED)} drafts "
            "(the others' layers hold parts the padding rule is not proven on). Serve them on the original verifier."
        )
    tl = cfg["transformer_layer_config"]
    h = tl["hidden_size"]
    if (cfg.get("eagle_aux_hidden_state_layer_ids") or cfg.get("aux_hidden_state_layer_ids")) is None:
        raise DraftlabError(
            f"{src}/config.json names no aux layer ids: the expansion keeps them, so they must be explicit."
        )
    out = Path(out or ver.parent / f"{src.parent.name}-{src.name}-as-{ver.name}")
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            tensors.update({name: widen(name, st.get_tensor(name), h, p, gen, dtype) for name in st.keys()})
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shape = {
        k: getattr(p, k)
        for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    }
    cfg["transformer_layer_config"] = {**tl, **shape, "rms_norm_eps": tl["rms_norm_eps"] * h / p.hidden_size}
    cfg["speculators_config"]["verifier"]["name_or_path"] = str(ver.resolve())
    cfg["dtype"] = info["dtype"]
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    (tmp / MARKER).write_text(
        json.dumps({"name": f"{src} widened for {info['name']}", "source": str(src), "verifier": info}, indent=1)
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def never_accepted(draft: Path, out: Path) -> Path:
    """The same draft with every proposal moved to the next token id (its d2t map shifted by one): the very work of a
    step at tau 1, so a step served with it, less the model's V(k+1) + E + k D, is a speculative step's fixed device
    cost on that verifier (benchmarks/bench_speedup.py's `spec_fixed`), with no trained draft's acceptance in it."""
    from safetensors.torch import load_file, save_file

    draft, out = Path(draft), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in draft.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    for f in draft.glob("*.safetensors"):
        t = load_file(f)
        if "d2t" in t:
            i = torch.arange(t["d2t"].numel())
            t["d2t"] = (i + t["d2t"] + 1) % t["t2d"].numel() - i
        save_file(t, out / f.name, metadata={"format": "pt"})
    return out
