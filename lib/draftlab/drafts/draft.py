"""EAGLE-3 and DFlash drafts for any verifier, built through speculators' own training path.

`build_eagle3(verifier, data)` / `build_dflash(verifier, data)` do what `speculators train` does
before its first step (typed `TrainConfig`, `create_transformer_layer_config`, vocab mappings,
`from_training_args`, `load_verifier_weights`), with every choice made out loud and checked:
attention, loss, pack length, dtype, mask token, and after construction no NaN anywhere and the
draft's embeddings, lm_head and verifier norm equal to the verifier's own tensors.

speculators reads verifier weights from `speculators_config.verifier.name_or_path` by key suffix
and its config by `AutoConfig`; a wrapper (config under `text_config`, weights under
`language_model.`) of a model_type transformers does not know fails there, and suffix matching can
pick a vision tower's tensor. For nested verifiers draftlab therefore writes a head-only *view*
(text config, tokenizer, embeddings, lm_head, final norm, taken from the loaded `Verifier`) and
points speculators at it; plain verifiers are used as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from draftlab import DraftlabError
from draftlab.config import data_dir, pick_dtype
from draftlab.data import manifest
from draftlab.data.extract import default_layer_ids, validate_layer_ids
from draftlab.data.verifier import Verifier, load_verifier
from draftlab.drafts import checks, norms
from draftlab.drafts.attention import attention_settings, check_mask, pick_attention, require_impl

KINDS = ("eagle3", "dflash")


@dataclass
class Draft:
    model: torch.nn.Module
    kind: str
    verifier: Verifier
    train_config: object  # speculators.train.config.schema.TrainConfig
    train_kwargs: dict  # forward kwargs from the model class's get_trainer_kwargs
    choices: dict[str, tuple[object, str]] = field(default_factory=dict)  # what -> (choice, why)
    build_args: dict = field(default_factory=dict)  # build_draft's arguments: another process rebuilds the same draft

    @property
    def attention(self) -> str:
        return self.model.config.transformer_layer_config._attn_implementation

    @property
    def dtype(self) -> torch.dtype:
        return self.model.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.fc.weight.device

    def forward(self, batch: dict, cast: bool = False, **overrides):
        """speculators' training forward on one packed batch, after draftlab's checks; a pack length
        the flex BlockMask cannot serve is padded (and the choice recorded). `overrides` replace
        forward kwargs of `train_kwargs` for this call only (e.g. ttt_steps)."""
        for impl in attention_settings(self.model):  # every call: a setting changed after build would mask nothing
            require_impl(impl)
        batch = checks.check_batch_dtype(batch, self.dtype, cast)
        ids = self.model.target_layer_ids
        checks.check_layer_ids(ids, None, self.verifier.hidden_size, batch["hidden_states"].shape[-1])
        n, why = checks.pack_length(batch["input_ids"].shape[1], self.kind, self.attention)
        if n != batch["input_ids"].shape[1]:
            batch = checks.pad_batch(batch, n)
            self.choices["pack length"] = (n, why)
        checks.check_pack(batch, self.kind, self.attention)
        names = (
            "hidden_states",
            "input_ids",
            "loss_mask",
            "verifier_last_hidden_states",
            "document_ids",
            "position_ids",
        )
        return self.model(
            **{k: batch[k].to(self.device) for k in names if k in batch}, **{**self.train_kwargs, **overrides}
        )

    def report(self) -> dict:
        return {what: f"{choice}  ({why})" for what, (choice, why) in self.choices.items()}


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
    if n is None or n not in sizes:
        if draft_vocab_size is None and not sizes:
            return man["layer_ids"], man, None, None
        raise DraftlabError(
            f"{folder}: no unique d2t-N.npy for draft_vocab_size={draft_vocab_size} "
            f"(found {sizes}); pass one of {sizes}."
        )
    d2t = torch.from_numpy(np.load(folder / f"d2t-{n}.npy"))
    t2d = torch.from_numpy(np.load(folder / f"t2d-{n}.npy"))
    if not torch.equal(torch.arange(n) + d2t, t2d.nonzero().flatten()):
        raise DraftlabError(
            f"{folder}: d2t-{n}.npy and t2d-{n}.npy disagree; rebuild both with draftlab.vocab.build_mapping."
        )
    return man["layer_ids"], man, d2t, t2d


def verify(draft: Draft, saved_dtype: torch.dtype | None = None) -> None:
    """No NaN left (speculators' marker for verifier weights it did not load), and the frozen parts
    equal the verifier's tensors: embeddings, verifier norm, and lm_head rows picked by d2t. A draft
    saved in another dtype than the verifier's is compared in `saved_dtype`: a precision change is not
    another checkpoint."""
    m, v = draft.model, draft.verifier
    nan = checks.nan_parameters(m)
    if nan:
        raise DraftlabError(
            f"draft tensors {nan} are NaN after construction: speculators did not "
            f"load them from {m.config.speculators_config.verifier.name_or_path}."
        )
    rows = v.lm_head.weight
    if m.d2t is not None:
        rows = rows[torch.arange(len(m.d2t), device=rows.device) + m.d2t.to(rows.device)]
    pairs = {
        "embed_tokens": (m.embed_tokens.weight, v.embed.weight),
        "lm_head": (m.lm_head.weight, rows),
        "verifier_lm_head": (m.verifier_lm_head.weight, rows),
        "verifier_norm": (m.verifier_norm.weight, v.norm.weight),
    }
    cmp = saved_dtype or m.embed_tokens.weight.dtype
    bad = [n for n, (a, b) in pairs.items() if not torch.equal(a.to(cmp), b.to(a.device, cmp))]
    if not bad:
        norms.check_verifier_norm(m, v)
    if bad:
        name = str(cmp).removeprefix("torch.")
        raise DraftlabError(
            f"the draft's frozen {bad} differ from verifier {v.path}'s (compared in {name}): the draft was made for "
            f"another verifier ({m.config.speculators_config.verifier.name_or_path}). Load the verifier it was trained "
            f"for, in the dtype it was trained in ({name}), or train a draft for this one."
        )
    if draft.attention != "simple_flex_attention" or str(v.device).startswith("cuda"):
        mask = m._create_mask_fn(lambda b, h, q, kv: q >= kv, B=None, H=None, Q_LEN=128, KV_LEN=128, device=v.device)
        check_mask(draft.attention, mask)


def build_draft(
    kind: str,
    verifier="smollm2",
    data=None,
    *,
    layer_ids=None,
    draft_vocab_size=None,
    num_layers=None,
    attention=None,
    loss=None,
    block_size=None,
    mask_token_id=None,
    layer_config=None,
    device="auto",
    dtype="auto",
    view_root=None,
) -> Draft:
    """One call from a verifier (spec or loaded `Verifier`) and an optional stage-01 train folder
    (its layer ids and d2t/t2d are used) to a checked speculators draft. None means its default."""
    # Taken from the parameters themselves, so a new one also travels to a training process (train_jobs).
    build_args = {k: x for k, x in locals().items() if k not in ("kind", "verifier", "device", "dtype")}
    from importlib.metadata import version

    from speculators import SpeculatorModel
    from speculators.train.cli import create_transformer_layer_config
    from transformers import PretrainedConfig

    if kind not in KINDS:
        raise DraftlabError(f"draft kind {kind!r} unknown; use one of {KINDS}.")
    checks.check_typed(
        layer_config,
        PretrainedConfig,
        "layer_config",
        "build it with transformers.AutoConfig.for_model(**d) so its model_type "
        "is explicit (speculators would turn a dict without one into a Qwen3Config)",
    )
    v = verifier if isinstance(verifier, Verifier) else load_verifier(verifier, device, dtype)
    if getattr(v, "lm_head", None) is None:
        raise DraftlabError(
            f"verifier {v.path} has no lm_head; drafts copy the "
            "verifier's output projection: pass a *ForCausalLM checkpoint."
        )
    norms.refuse_unsupported_norm(v)
    dev = str(v.device)
    dt = v.dtype if dtype == "auto" else pick_dtype(dtype, dev)  # auto: the verifier's, however it was loaded
    name = str(dt).removeprefix("torch.")
    if dt != v.dtype:
        have = str(v.dtype).removeprefix("torch.")
        raise DraftlabError(
            f"draft dtype {name} (from dtype={dtype!r} on {dev}) differs from the verifier's {have}; build with "
            f"dtype={have!r}, or load the verifier with dtype={name!r}."
        )
    data_ids, man, d2t, t2d = read_data(data, v, draft_vocab_size)
    if man and man.get("dtype") != name:
        raise DraftlabError(
            f"{data} stores hidden states as {man.get('dtype')} but the draft is {name}; "
            f"build with dtype={man.get('dtype')!r} or re-extract stage 01 in {name}."
        )
    ids = (
        validate_layer_ids(layer_ids, v.num_layers)
        if layer_ids is not None
        else data_ids or default_layer_ids(v.num_layers, kind)
    )
    checks.check_layer_ids(ids, data_ids, v.hidden_size)
    n_vocab = draft_vocab_size or (len(d2t) if d2t is not None else v.vocab_size)
    checks.check_vocab(n_vocab, v.vocab_size)
    if d2t is None and n_vocab != v.vocab_size:
        raise DraftlabError(
            f"draft_vocab_size={n_vocab} < {v.vocab_size} needs the d2t/t2d mapping: "
            f"pass data=<stage-01 train folder> holding d2t-{n_vocab}.npy."
        )
    path = head_view(v, view_root)
    impl, impl_why = pick_attention(dev, attention)
    loss_impl, loss_why = checks.pick_loss(
        dev, checks.forward_is_compiled(), torch.__version__, version("speculators"), loss
    )
    choices = {
        "verifier for speculators": (
            path,
            "unwrapped head-only view of a nested verifier" if v.nested else "the verifier itself",
        ),
        "aux layer ids": (
            ids,
            "from the data's manifest"
            if data_ids and layer_ids is None
            else "given"
            if layer_ids is not None
            else "default",
        ),
        "draft vocab": (n_vocab, "d2t/t2d from stage 01" if d2t is not None else "full verifier vocabulary"),
        "dtype / device": (f"{name} / {dev}", "the verifier's, which is the stored hidden states' too"),
        "attention": (impl, impl_why),
        "loss": (loss_impl, loss_why),
    }
    flat = dict(
        num_layers=num_layers,
        target_layer_ids=ids,
        draft_vocab_size=n_vocab,
        draft_attn_impl=impl,
        loss_implementation=loss_impl,
    )
    if kind == "dflash":
        used = checks.used_ids(data) if data is not None else None
        flat.update(block_size=block_size, mask_token_id=None)
        flat["mask_token_id"], why = checks.pick_mask_token(v, path, mask_token_id, used)
        choices["mask token"] = (
            f"{flat['mask_token_id']} {v.tokenizer.convert_ids_to_tokens(flat['mask_token_id'])!r}",
            why,
        )
    cfg = _train_config(kind, path, **{k: val for k, val in flat.items() if val is not None})
    args = cfg.flatten()
    with checks.shape_source(path, v) as src:
        tl = layer_config or create_transformer_layer_config(
            src,
            args["num_layers"],
            args["draft_arch"],
            args["draft_hidden_act"],
            args["sliding_window"],
            args["full_attention_indices"],
            args["draft_mrope_full_head_hack"],
        )
    tl = tl.__class__.from_dict(tl.to_dict())  # a copy: from_training_args mutates it
    tl._attn_implementation = impl
    cls = SpeculatorModel.registry[kind]
    model = cls.from_training_args(tl, t2d=t2d, d2t=d2t, **args).to(device=dev, dtype=dt)
    swapped = norms.match_verifier_norm(model, v)
    choices["verifier norm"] = (
        norms.norm_gain(v.norm),
        f"swapped for Gemma3RMSNorm: {swapped}" if swapped else "speculators' verifier_norm computes it",
    )
    train_kwargs, _ = cls.get_trainer_kwargs(**args)
    draft = Draft(model, kind, v, cfg, train_kwargs, choices, build_args)
    verify(draft)
    return draft


def build_eagle3(verifier="smollm2", data=None, **kw) -> Draft:
    """EAGLE-3 draft (speculators' defaults: 1 llama layer, 3 TTT steps, kl_div loss)."""
    return build_draft("eagle3", verifier, data, **kw)


def build_dflash(verifier="smollm2", data=None, **kw) -> Draft:
    """DFlash draft (speculators' defaults: 5 qwen3 layers, block size 16, ce loss)."""
    return build_draft("dflash", verifier, data, **kw)
