"""Checkpoints of a training run: the speculators folder vLLM serves, plus what a resume needs;
and a saved draft reloaded through speculators, checked as a built draft is (`drafts.validate`) and
to give the same outputs.

`checkpoints/step-<N>/` holds `save_pretrained`'s `config.json` + `model.safetensors` and a
`trainer_state.pt` (step, optimizer, scheduler, RNG states, data position, hyper-parameters).
A folder is written under a temporary name and renamed, so an interrupted save never looks like
a checkpoint. The hyper-parameters are compared on resume: a run continued with another model
shape, vocabulary or schedule would not be "the same run", so it is refused, naming the field.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from draftlab import DraftlabError
from draftlab.drafts.device import inference
from draftlab.drafts.recipe import recipe
from draftlab.drafts.validate import nan_parameters
from draftlab.writes import publish

if TYPE_CHECKING:
    from draftlab.drafts.draft import Draft

STATE = "trainer_state.pt"


def hparams(draft, settings: dict) -> dict:
    """Everything that must not change across a resume: the draft's shape and data, and the schedule."""
    m, cfg = draft.model, draft.model.config
    out = {
        "kind": draft.kind,
        "verifier_fingerprint": draft.verifier.fingerprint,
        "target_layer_ids": list(m.target_layer_ids),
        "draft_vocab_size": int(m.draft_vocab_size),
        "num_layers": int(cfg.transformer_layer_config.num_hidden_layers),
        "hidden_size": int(cfg.transformer_layer_config.hidden_size),
        "attention": draft.attention,
        "dtype": str(draft.dtype).removeprefix("torch."),
    }
    out.update(recipe(draft.kind).saved(cfg))
    out.update(settings)
    return out


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}  # noqa: NPY002
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(
    run_dir: Path, draft, step: int, optimizer, scheduler, position: tuple[int, int], hp: dict, keep: int = 1
) -> Path:
    """Write `checkpoints/step-<step>/` atomically; keep the newest `keep` checkpoints. One is the default: with
    AdamW's two moments a checkpoint is three times the draft (400 MB for a SmolLM2 EAGLE-3 draft with its
    embeddings), and a checkout training every family filled a CI disk when two were kept."""
    bad = nan_parameters(draft.model)
    if bad:  # never let a poisoned model overwrite a good checkpoint
        raise DraftlabError(
            f"draft tensors {bad[:3]} are NaN at step {step}; "
            f"not saving. The last good checkpoint is {latest(run_dir)}."
        )

    def fill(tmp: Path) -> None:
        draft.model.save_pretrained(tmp)
        state = {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        torch.save({**state, "rng": rng_state(), "data_position": position, "hparams": hp}, tmp / STATE)

    last = latest(run_dir)
    kept = f"the last complete checkpoint, {last}, is kept" if last else "no earlier checkpoint was touched"
    final = publish(Path(run_dir) / "checkpoints" / f"step-{step}", fill, f"the checkpoint of step {step}", kept)
    for old in checkpoints(run_dir)[:-keep] if keep else []:
        shutil.rmtree(old)
    return final


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step-*") if (p / STATE).exists() and (p / "model.safetensors").exists()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest(run_dir: Path) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def saved_hparams(path: Path) -> dict:
    """The hyper-parameters a checkpoint was trained with (`hparams`, as `save` stored them)."""
    return torch.load(Path(path) / STATE, weights_only=False)["hparams"]


# hyper-parameters added after checkpoints were saved -> the value a checkpoint without them was trained with
ADDED_LATER = {"state_noise": 0.0}


def differences(saved: dict, now: dict) -> list[str]:
    """The hyper-parameters that differ between a checkpoint's and a run's, by name."""
    saved, now = {**ADDED_LATER, **saved}, {**ADDED_LATER, **now}
    return [key for key in sorted(set(saved) | set(now)) if saved.get(key) != now.get(key)]


def check_same(saved: dict, now: dict, where: Path) -> None:
    for key in differences(saved, now)[:1]:
        raise DraftlabError(
            f"cannot resume {where}: it was trained with {key}={saved.get(key)!r}, now {key}={now.get(key)!r}. "
            f"Resume with the same {key}, or start a fresh run (resume=False, or another dataset_name)."
        )


def load(path: Path, draft, optimizer, scheduler, hp: dict) -> dict:
    """Restore weights, optimizer, scheduler and RNG from a checkpoint; returns its state."""
    from safetensors.torch import load_file

    state = torch.load(Path(path) / STATE, weights_only=False)
    check_same(state["hparams"], hp, path)
    weights = load_file(Path(path) / "model.safetensors", device=str(draft.device))
    missing, unexpected = draft.model.load_state_dict(weights, strict=False)
    trainable = {n for n, p in draft.model.named_parameters() if p.requires_grad}
    if unexpected or trainable & set(missing):
        raise DraftlabError(
            f"{path}/model.safetensors does not fit the draft (missing "
            f"{sorted(trainable & set(missing))[:3]}, unexpected {unexpected[:3]})."
        )
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state


def load_model(path: Path, cls, attention: str, device, dtype, verifier_path) -> torch.nn.Module:
    """A saved speculators draft of class `cls` for the verifier at `verifier_path`; `_attn_implementation` is not
    serialised, so it is set again, and what `from_pretrained` leaves undone is restored by the family's recipe
    (`after_load`: XPress's refiner mask). speculators reads the frozen tensors (embeddings, heads, norm) from the
    verifier path the draft's config names, which may be gone or hold another model by now: it is pointed at
    `verifier_path`, the verifier handed in, and the path it named kept as `trained_for` for the checks' words."""
    from speculators import SpeculatorModel

    config = cls.config_class.from_pretrained(path)
    config.transformer_layer_config._attn_implementation = attention
    named = config.speculators_config.verifier
    trained_for, named.name_or_path = named.name_or_path, str(verifier_path)
    model = SpeculatorModel.from_pretrained(path, config=config).to(device=device, dtype=dtype)
    recipe(config.speculators_model_type).after_load(model)
    model.trained_for = trained_for
    return model


def reload(path: Path, like: Draft) -> Draft:
    """Load a saved draft through speculators (`SpeculatorModel.from_pretrained`) and check it (`verify`)."""
    from draftlab.drafts import norms
    from draftlab.drafts.draft import Draft
    from draftlab.drafts.inputs import head_view
    from draftlab.drafts.validate import verify

    model = load_model(
        path, type(like.model), like.attention, like.verifier.device, like.dtype, head_view(like.verifier)
    )
    norms.match_verifier_norm(model, like.verifier)
    draft = Draft(model, like.kind, like.verifier, like.train_config, like.train_kwargs, dict(like.choices))
    verify(draft, saved_dtype(path))
    return draft


def saved_dtype(path: Path) -> torch.dtype | None:
    """The dtype config.json records for the saved weights (speculators' trainer always saves bfloat16)."""
    import json

    saved = json.loads((Path(path) / "config.json").read_text()).get("dtype")
    dtype = getattr(torch, saved, None) if isinstance(saved, str) else None
    return dtype if isinstance(dtype, torch.dtype) else None


def reload_check(like: Draft, path: Path, batch: dict, options: dict | None = None) -> dict:
    """Reload `path` through speculators and run it and `like` on one batch, same seed, same mode
    (`device.inference`: on CUDA the compiled training graph, no second compile).
    The original is re-run rather than remembered: another code path (hooks under torch.compile)
    rounds differently in bf16, which is not a checkpoint fault."""
    from draftlab.drafts.forward import forward

    again = reload(path, like)
    state = again.model.state_dict()
    same_tensors = all(torch.equal(t, state[k]) for k, t in like.model.state_dict().items())
    outs = []
    for d in (like, again):
        with inference(d.model), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            outs.append(forward(d, batch, **(options or {})))
    (t1, l1, m1), (t2, l2, m2) = outs
    tokens_same = (
        t1 is None and t2 is None or all(torch.equal(a, b) for a, b in zip(t1, t2, strict=True))
    )  # DFlash returns None
    same = l1.item() == l2.item() and tokens_same and all(torch.equal(m1[k], m2[k]) for k in m1)
    return {"loss": l1.item(), "reloaded loss": l2.item(), "identical tensors": same_tensors, "identical outputs": same}


def compare(paths: dict, like: Draft, eval_dir: Path, settings) -> dict:
    """Checkpoints of one draft kind from either trainer (draftlab's `final/`, a speculators `--save-path`)
    on the same held-out packs, so a user switching trainers compares like with like. A speculators save
    is read at its last epoch: the same optimizer steps as a finished draftlab run (its checkpoint_best
    is chosen on speculators' own 10% split). `settings` (a `Settings`): the pack length and forward
    options both were trained with."""
    from draftlab.drafts.forward import evaluate
    from draftlab.training import launch, train
    from draftlab.training.data import Packs, open_split
    from draftlab.training.settings import forward_options

    packs = Packs(like, open_split(like, eval_dir, settings.pack_len), settings.pack_len, 0)
    out = {}
    for name, path in paths.items():
        found = launch.find_checkpoint(path, "last")
        r = evaluate(reload(found, like), packs, **forward_options(like.kind, settings))
        out[name] = {
            "checkpoint": str(found),
            "eval first-position accuracy": train.first_accuracy(like.kind, r),
            "eval loss": r["loss"],
            **{f"position {k}": a for k, a in train.position_accuracies(like.kind, r).items()},
        }
    return out


def check_reload(draft, path: Path, data: Path, settings) -> dict:
    """Reload a checkpoint through speculators and compare its outputs with the draft's on one held-out pack,
    with the pack length and forward options of `settings` (the `Settings` it trained with)."""
    from draftlab.training.data import Packs, open_split
    from draftlab.training.settings import forward_options

    n = settings.pack_len
    batch = next(Packs(draft, open_split(draft, Path(data) / "eval", n), n, 0).all())
    return reload_check(draft, path, batch, forward_options(draft.kind, settings))
