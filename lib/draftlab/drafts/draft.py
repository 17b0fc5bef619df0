"""Drafts of every family draftlab takes (`families`), for any verifier, built through speculators' own training path.

`build_draft(kind, verifier, data)` (and `build_eagle3` / `build_dflash`) do what `speculators train` does
before its first step (typed `TrainConfig`, `create_transformer_layer_config`, vocab mappings,
`from_training_args`, `load_verifier_weights`), with every choice made out loud and checked:
attention, loss, dtype, mask token, and after construction no NaN anywhere and the draft's
embeddings, lm_head and verifier norm equal to the verifier's own tensors (`drafts.validate`).
What speculators is handed (the verifier or its head-only view, stage 01's data, the layer shape,
the mask token) is prepared in `drafts.inputs`, what differs per family is its recipe (`drafts/<family>.py`); the
forward a draft trains with is `drafts.forward`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftlab import DraftlabError
from draftlab.data.extract import default_layer_ids, validate_layer_ids
from draftlab.data.verifier import Verifier, load_verifier
from draftlab.devices import pick_dtype
from draftlab.drafts import forward, norms
from draftlab.drafts.device import forward_is_compiled, pick_loss
from draftlab.drafts.inputs import _train_config, head_view, read_data, shape_source
from draftlab.drafts.recipe import recipe
from draftlab.drafts.validate import check_layer_ids, check_typed, check_vocab, verify
from draftlab.families import taken
from draftlab.masks.attention import pick_attention

KINDS = tuple(taken())  # the families draftlab builds, trains and drafts


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
        """This draft's `drafts.forward.forward`: speculators' training forward after draftlab's checks."""
        return forward.forward(self, batch, cast, **overrides)

    def report(self) -> dict:
        return {what: f"{choice}  ({why})" for what, (choice, why) in self.choices.items()}


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

    rec = recipe(kind)  # an unknown or refused family is refused here, by name
    check_typed(
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
    draft_vocab_size, vocab_why = rec.vocab(v, draft_vocab_size)  # a family needing the full vocabulary says so
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
    check_layer_ids(ids, data_ids)
    n_vocab = draft_vocab_size or (len(d2t) if d2t is not None else v.vocab_size)
    check_vocab(n_vocab, v.vocab_size)
    if d2t is None and n_vocab != v.vocab_size:
        raise DraftlabError(
            f"draft_vocab_size={n_vocab} < {v.vocab_size} needs the d2t/t2d mapping: "
            f"pass data=<stage-01 train folder> holding d2t-{n_vocab}.npy."
        )
    path = head_view(v, view_root)
    impl, impl_why = pick_attention(dev, attention)
    loss_impl, loss_why = pick_loss(dev, forward_is_compiled(), torch.__version__, version("speculators"), loss)
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
        "draft vocab": (
            n_vocab,
            vocab_why or ("d2t/t2d from stage 01" if d2t is not None else "full verifier vocabulary"),
        ),
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
    given = {"block_size": block_size, "mask_token_id": mask_token_id, "attention": impl}  # a recipe may refuse impl
    extra, extra_choices = rec.build_options(v, path, data, given)
    flat.update(extra)
    choices.update(extra_choices)
    cfg = _train_config(kind, path, **{k: val for k, val in flat.items() if val is not None})
    args = cfg.flatten()
    with shape_source(path, v) as src:
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


def build_from_profile(kind: str, verifier, data, cfg, **kw) -> Draft:
    """`build_draft` with the family's own profile keys (`recipe.profile_args`: layers, block size, mask token) from
    the stage config `cfg`, and `kw` (what every family shares: vocabulary, attention, loss)."""
    return build_draft(kind, verifier, data, **recipe(kind).profile_args(cfg), **kw)


def build_eagle3(verifier="smollm2", data=None, **kw) -> Draft:
    """EAGLE-3 draft (speculators' defaults: 1 llama layer, 3 TTT steps, kl_div loss)."""
    return build_draft("eagle3", verifier, data, **kw)


def build_dflash(verifier="smollm2", data=None, **kw) -> Draft:
    """DFlash draft (speculators' defaults: 5 qwen3 layers, block size 16, ce loss)."""
    return build_draft("dflash", verifier, data, **kw)
