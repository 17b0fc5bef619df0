"""What `build_draft` hands speculators: its typed TrainConfig, the verifier folder it reads (the
verifier itself or a head-only view), stage 01's data (layer ids, vocab mapping), the config it
reads the layer shape from, and DFlash's mask token.

speculators reads verifier weights from `speculators_config.verifier.name_or_path` by key suffix
and its config by `AutoConfig`; a wrapper (config under `text_config`, weights under
`language_model.`) of a model_type transformers does not know fails there, and suffix matching can
pick a vision tower's tensor. For nested verifiers draftlab therefore writes a head-only *view*
(text config, tokenizer, embeddings, lm_head, final norm, taken from the loaded `Verifier`) and
points speculators at it; plain verifiers are used as they are.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.config import data_dir
from draftlab.data import manifest
from draftlab.data.verifier import Verifier
from draftlab.files import load_npy


def _train_config(kind: str, path: Path, **flat):
    """speculators' typed TrainConfig with its per-kind defaults; flat overrides go to their group."""
    from speculators.train.config.schema import TrainConfig

    groups: dict[str, dict] = {}
    for key, value in flat.items():
        group = next(
            (g for g, f in TrainConfig.model_fields.items() if key in getattr(f.annotation, "model_fields", {})), None
        )
        if group is None:
            raise DraftlabError(f"{key!r} is not a speculators training option; see speculators.train.config.schema.")
        groups.setdefault(group, {})[key] = value
    return TrainConfig(speculator_type=kind, verifier={"verifier_name_or_path": str(path)}, **groups)


def head_view(v: Verifier, root: Path | None = None) -> Path:
    """The directory speculators reads the verifier from: the verifier itself when plain, else a
    head-only unwrapped view of the loaded tensors (written once per verifier fingerprint)."""
    if not v.nested:
        return v.path
    from safetensors.torch import save_file

    view = Path(root or data_dir() / "verifiers" / "views") / f"{v.path.name}-{v.fingerprint}"
    if (view / "model.safetensors").exists():
        return view
    view.mkdir(parents=True, exist_ok=True)
    cfg = v.config.to_dict()
    cfg["architectures"] = [type(v.model).__name__]
    cfg["draftlab_unwrapped_from"] = str(v.path)
    parts = {
        "model.embed_tokens.weight": v.embed.weight,
        "lm_head.weight": v.lm_head.weight,
        "model.norm.weight": v.norm.weight,
    }
    save_file({k: t.detach().cpu().clone().contiguous() for k, t in parts.items()}, view / "model.safetensors.tmp")
    v.tokenizer.save_pretrained(view)
    (view / "config.json").write_text(json.dumps(cfg, indent=1))
    (view / "model.safetensors.tmp").replace(view / "model.safetensors")
    return view


def read_data(
    folder: Path | None, v: Verifier, draft_vocab_size: int | None
) -> tuple[list[int] | None, dict | None, torch.Tensor | None, torch.Tensor | None]:
    """(layer ids, manifest, d2t, t2d) of a stage-01 train folder; refuses data of another verifier."""
    if folder is None:
        return None, None, None, None
    folder = Path(folder)
    man = manifest.read(folder)
    if man is None:
        raise DraftlabError(
            f"{folder} has no manifest.json; pass the stage-01 train folder (data/runs/<dataset_name>/train)."
        )
    if man.get("verifier_fingerprint") != v.fingerprint or man.get("hidden_size") != v.hidden_size:
        raise DraftlabError(
            f"{folder} was extracted from verifier {man.get('verifier_path')!r} (fingerprint "
            f"{man.get('verifier_fingerprint')}), not {v.path} ({v.fingerprint}); "
            "pass that verifier or re-run stage 01."
        )
    sizes = sorted(int(p.stem.split("-")[1]) for p in folder.glob("d2t-*.npy"))
    n = draft_vocab_size or (sizes[-1] if len(sizes) == 1 else None)
    if draft_vocab_size == v.vocab_size and n not in sizes:  # the full vocabulary needs no mapping
        return man["layer_ids"], man, None, None
    if n is None or n not in sizes:
        if draft_vocab_size is None and not sizes:
            return man["layer_ids"], man, None, None
        raise DraftlabError(
            f"{folder}: no unique d2t-N.npy for draft_vocab_size={draft_vocab_size} "
            f"(found {sizes}); pass one of {sizes}."
        )
    fix = "Re-run notebook 01 for this dataset_name: it builds the vocabulary mapping again (and resumes the rest)."
    d2t, t2d = (torch.from_numpy(load_npy(folder / f"{m}-{n}.npy", fix)) for m in ("d2t", "t2d"))
    if not torch.equal(torch.arange(n) + d2t, t2d.nonzero().flatten()):
        raise DraftlabError(
            f"{folder}: d2t-{n}.npy and t2d-{n}.npy disagree; rebuild both with draftlab.vocab.build_mapping."
        )
    return man["layer_ids"], man, d2t, t2d


@contextmanager
def shape_source(path, v):
    """Where speculators reads the draft layer's shape from: the verifier's config, or a config-only copy of it
    with the head_dim the verifier computes (hidden // heads) when its config has none (Qwen2, Phi-3, Qwen3-MoE):
    speculators passes a missing head_dim on as None, which DFlash's Qwen3Config refuses."""
    if getattr(v.config, "head_dim", None) is not None:
        yield str(path)
        return
    cfg = json.loads((Path(path) / "config.json").read_text())
    with tempfile.TemporaryDirectory(prefix="draftlab-shape-") as tmp:
        (Path(tmp) / "config.json").write_text(
            json.dumps({**cfg, "head_dim": v.hidden_size // v.config.num_attention_heads})
        )
        yield tmp


def pick_mask_token(v, path, mask_token_id: int | None = None, used: set[int] | None = None) -> tuple[int, str]:
    """DFlash fills draft blocks with a mask token. speculators' resolver picks the tokenizer's
    mask token, else a free embedding row, else pad/eos/unk; a fallback that also occurs in the
    training inputs (SmolLM2's pad is <|im_end|>, which closes every turn) is swapped for a special
    token that never does, so a block of masks cannot look like real text."""
    if mask_token_id is not None:
        if not 0 <= int(mask_token_id) < v.vocab_size:
            raise DraftlabError(
                f"mask_token_id={mask_token_id} is outside the verifier's "
                f"vocabulary [0, {v.vocab_size}); pass a valid id or None."
            )
        return int(mask_token_id), "given"
    from speculators.train.utils import resolve_mask_token_id

    tok = v.tokenizer
    with warnings.catch_warnings():  # its fallback warning is replaced by the reason returned here
        warnings.simplefilter("ignore")
        tid = resolve_mask_token_id(str(path), v.vocab_size)
    if tid == tok.mask_token_id:
        return tid, "the tokenizer's mask token"
    if tid >= len(tok):
        return tid, f"a free embedding row (the tokenizer uses {len(tok)} of {v.vocab_size})"
    why = f"speculators' fallback {tok.convert_ids_to_tokens(tid)!r} (no mask token, no free embedding row)"
    spare = [t for t in tok.all_special_ids if used is not None and t not in used and t < v.vocab_size]
    if used is not None and tid in used and spare:
        old, tid = tid, spare[0]
        why = (
            f"special token {tok.convert_ids_to_tokens(tid)!r}, since speculators' "
            f"fallback {tok.convert_ids_to_tokens(old)!r} occurs in the training inputs"
        )
    return tid, why


def used_ids(folder) -> set[int]:
    from datasets import load_from_disk

    return {int(t) for row in load_from_disk(str(folder)).with_format(None)["input_ids"] for t in row}
