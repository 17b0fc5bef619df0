"""A verifier expanded to a stand-in's shape (`data.stand_in.plan`), computing exactly the original's function.

The padding rule, tensor by tensor:

- the hidden size is padded with coordinates that stay exactly zero: every tensor that writes the residual stream
  (the embeddings, each `o_proj` and `down_proj`) writes nothing there, and every RMSNorm's weight is scaled by
  sqrt(H / H') and its epsilon by H / H', so the mean of x^2 over H' coordinates normalises as the original's did
  over H (`scaled_norm`; the config's `rms_norm_eps` is the only epsilon of these families);
- extra attention heads, whole KV groups (the query-to-KV ratio kept), and extra MLP units, whose output
  projections are zero: they cost what they would and write nothing;
- layers appended at the end whose output projections are zero: the identity.

Every real coordinate of every hidden state, and every logit, is the original's, so a draft's aux layer ids are
unchanged. Blocks that only ever meet zeros (the padded input columns, the extra heads' and units' input rows) hold
small random values, as a trained model's would. `drafts.expand` widens a trained draft by the same rule. The
folder is written under a temporary name, its `expansion.json` (what it is, from what) last, then renamed: a folder
without it is never taken for an expansion.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.config import data_dir
from draftlab.data.stand_in import Plan, check_room, plan
from draftlab.data.verifier_dir import fingerprint, resolve_verifier

MARKER = "expansion.json"
SHARD_BYTES = 2**31
INDEX = "model.safetensors.index.json"


def grow(t: torch.Tensor, shape: tuple[int, ...], fill: str, gen: torch.Generator, dtype) -> torch.Tensor:
    """`t` in the leading corner of a tensor of `shape`; the rest zero ('zero': it would write into the padded
    coordinates, or carry the extra heads' and units' output) or small random values ('random': it only meets 0)."""
    out = (
        torch.zeros(shape, dtype=dtype)
        if fill == "zero"
        else torch.empty(shape).normal_(0, 0.02, generator=gen).to(dtype)
    )
    out[tuple(slice(0, n) for n in t.shape)] = t.to(dtype)
    return out


def scaled_norm(w: torch.Tensor, size: int, scale: float, dtype) -> torch.Tensor:
    """An RMSNorm weight for the padded width: the real part times `scale`; the padded part meets only zeros."""
    out = torch.full((size,), scale, dtype=torch.float32)
    out[: w.numel()] = w.float() * scale
    return out.to(dtype)


def new_shape(name: str, t: torch.Tensor, p: Plan) -> tuple[tuple[int, ...], str]:
    """The expanded shape of the verifier tensor `name` and how its new entries are filled."""
    h, q, kv, inter = (
        p.hidden_size,
        p.num_attention_heads * p.head_dim,
        p.num_key_value_heads * p.head_dim,
        p.intermediate_size,
    )
    projections = {  # name: (rows, columns, fill of the new entries); a bias is filled as its weight
        "q_proj": (q, h, "random"),
        "k_proj": (kv, h, "random"),
        "v_proj": (kv, h, "random"),
        "o_proj": (h, q, "zero"),
        "gate_proj": (inter, h, "random"),
        "up_proj": (inter, h, "random"),
        "down_proj": (h, inter, "zero"),
    }
    rules = {  # suffix: (shape, fill)
        "embed_tokens.weight": ((t.shape[0], h), "zero"),
        "lm_head.weight": ((t.shape[0], h), "zero"),  # zero: a draft's frozen rows of it must equal it
        **{f"{n}.weight": ((rows, cols), fill) for n, (rows, cols, fill) in projections.items()},
        **{f"{n}.bias": ((rows,), fill) for n, (rows, _, fill) in projections.items()},
    }
    if name.endswith("norm.weight"):
        return (h,), "norm"
    for suffix, rule in rules.items():
        if name.endswith(suffix):
            return rule
    raise DraftlabError(f"the expansion has no padding rule for the verifier tensor {name!r} {tuple(t.shape)}.")


def expanded_tensors(src: Path, p: Plan, dtype, gen: torch.Generator, layers: int, scale: float):
    """(name, tensor) of the expansion, layer by layer (one source tensor in memory at a time): the verifier's
    tensors padded, then the appended identity layers (their originals empty, so zero writers and random readers)."""
    from safetensors import safe_open

    template = []
    for f in sorted(src.glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            for name in st.keys():
                t = st.get_tensor(name)
                shape, fill = new_shape(name, t, p)
                if ".layers.0." in name:
                    template.append(name)
                yield (
                    name,
                    scaled_norm(t, shape[0], scale, dtype) if fill == "norm" else grow(t, shape, fill, gen, dtype),
                )
    for i in range(layers, p.num_hidden_layers):
        for name in template:
            shape, fill = new_shape(name, torch.empty(0), p)
            new = name.replace(".layers.0.", f".layers.{i}.")
            empty = torch.empty((0,) * len(shape))
            yield (
                new,
                scaled_norm(empty, shape[0], scale, dtype) if fill == "norm" else grow(empty, shape, fill, gen, dtype),
            )


def expand(
    verifier="smollm2", like: str = "8b", out=None, dtype=torch.bfloat16, device: str = "cuda", seed: int = 0
) -> Path:
    """The verifier at `verifier` (the embedded 'smollm2' or a local HF directory) expanded after the reference
    `like` ('8b', '1b') into `out` (default data/verifiers/expanded/<name>-as-<like>-<dtype>), a local HF directory
    like any other; an expansion already there for the same source, shape and dtype is reused. `device` is where it
    will be served: a GPU or memory too small for it, or a full disk, is refused before anything is written."""
    src = resolve_verifier(verifier)
    p, tag = plan(src, like), str(dtype).removeprefix("torch.")
    out = Path(out or data_dir() / "verifiers" / "expanded" / f"{src.name}-as-{like}-{tag}")
    want = describe(p, src, tag, seed)
    if reusable(out, want):
        return out
    check_room(out, p.parameters * torch.tensor([], dtype=dtype).element_size(), device)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    scale = math.sqrt(cfg["hidden_size"] / p.hidden_size)
    write_shards(
        tmp, expanded_tensors(src, p, dtype, torch.Generator().manual_seed(seed), cfg["num_hidden_layers"], scale), p
    )
    for f in src.iterdir():  # the tokenizer, chat template and generation config, as they are
        if f.is_file() and f.suffix not in (".safetensors", ".bin") and f.name not in ("config.json", INDEX):
            shutil.copy2(f, tmp / f.name)
    shape = {k: v for k, v in asdict(p).items() if k in cfg or k == "head_dim"}
    eps = cfg.get("rms_norm_eps", 1e-6) * cfg["hidden_size"] / p.hidden_size
    new_cfg = {**cfg, **shape, "rms_norm_eps": eps, "dtype": tag, "_name_or_path": p.name}
    (tmp / "config.json").write_text(json.dumps(new_cfg, indent=2))
    (tmp / MARKER).write_text(json.dumps(want, indent=1))  # last: what makes the folder an expansion
    os.replace(tmp, out)
    return out


def describe(p: Plan, src: Path, tag: str, seed: int) -> dict:
    """What `expansion.json` says: the name, the plan, where from, and what the stand-in matches and does not."""
    return {
        "name": p.name,
        "plan": asdict(p),
        "dtype": tag,
        "source": str(src),
        "source_fingerprint": fingerprint(src),
        "seed": seed,
        "matches": f"{p.like}'s decode kernels: hidden {p.hidden_size}, {p.num_attention_heads} heads of "
        f"{p.head_dim} over {p.num_key_value_heads} KV heads, MLP {p.intermediate_size}, {p.num_hidden_layers} layers",
        "not": f"a real model of that size: its function and vocabulary are {p.source}'s",
    }


def reusable(out: Path, want: dict) -> bool:
    """True where `out` is this very expansion; refused where it holds another one or a partial folder."""
    if (out / MARKER).exists():
        have, keys = json.loads((out / MARKER).read_text()), ("plan", "dtype", "source_fingerprint")
        if all(have.get(k) == want[k] for k in keys):
            return True
        raise DraftlabError(
            f"{out} holds another expansion ({have.get('name')}, {have.get('dtype')}): pass another out folder, "
            "or delete it."
        )
    if out.exists():
        raise DraftlabError(
            f"{out} exists but has no {MARKER}: it is not a whole expansion (an interrupted one, or something "
            "else). Delete it, or pass another out folder."
        )
    return False


def write_shards(folder: Path, tensors, p: Plan) -> None:
    """Safetensors shards of about SHARD_BYTES and their index, a progress bar by layer."""
    from safetensors.torch import save_file

    from draftlab.progress import progress_bar

    shard, where, n = {}, {}, 0

    def flush():
        nonlocal shard, n
        name = f"model-{n:05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        where.update({k: (name, t.numel() * t.element_size()) for k, t in shard.items()})
        shard, n = {}, n + 1

    with progress_bar(total=p.num_hidden_layers, desc=f"expanding to {p.like}'s shape", unit="layer") as bar:
        for name, t in tensors:
            shard[name] = t
            bar.update(int(name.endswith("down_proj.weight")))
            if sum(x.numel() * x.element_size() for x in shard.values()) >= SHARD_BYTES:
                flush()
    if shard:
        flush()
    index = {
        "metadata": {"total_size": sum(v[1] for v in where.values())},
        "weight_map": {k: v[0] for k, v in where.items()},
    }
    (folder / INDEX).write_text(json.dumps(index))
