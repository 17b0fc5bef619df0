"""XPress at stages 03-04: DFlash's block layout plus speculators' causal refiner head (`XPressDraftModel`).

The backbone, its anchors, mask token and block size are DFlash's (`Block`), and so is everything built from
them. What differs, and why:
- Loss: speculators' XPress default `{"ce": 0.1, "tv": 0.9}` (its TrainConfig resolves the loss per family and
  draftlab keeps it), eager on the CPU as any family's (`drafts.device.pick_loss`). The forward scores it on
  the teacher-forced refined logits, on `consistency_passes` free-running Jacobi rounds, and on the backbone's
  own logits (the anchor term that keeps the rounds' seed from decaying).
- `first_key` is the forward's `accuracy`, which is NOT a first-position accuracy: XPress's forward reports no
  per-position metric, and its `accuracy` is the argmax of the teacher-forced refined logits over every drafted
  slot 1..B-1 (each slot given the true tokens before it), against the data token (the teacher's argmax with a
  reduced vocabulary). A table or curve of "first-position accuracy" shows that for xpress: all slots,
  teacher-forced. `position_accuracies` is empty for the same reason: there is nothing per position to read.
- `after_load`: the refiner's `causal_tril` is a non-persistent buffer, so speculators' `from_pretrained` leaves it
  as uninitialised memory and a reloaded draft would mix its block with garbage; every load writes it again,
  as the head's own __init__ builds it.
- The refiner's shape (rank, MLP ratio) is part of a checkpoint's identity (a resume refuses another), read back
  from a saved model, and handed to `speculators train` with the Jacobi settings, so every trainer builds the
  same head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftlab.drafts.recipe import Block

SHAPE = ("xpress_rank", "xpress_mlp_ratio")  # the refiner head's parameter shapes
ROUNDS = ("num_jacobi_passes", "consistency_passes", "consistency_weight", "base_anchor_weight")


@dataclass(frozen=True)
class XPress(Block):
    def build_options(self, verifier, path, data, given: dict) -> tuple[dict, dict]:
        """DFlash's options (mask token, block size), and the refiner's settings said out loud: speculators'
        XPress defaults, which draftlab does not change."""
        from draftlab.drafts.inputs import _train_config

        flat, choices = super().build_options(verifier, path, data, given)
        cfg = _train_config(self.name, path).flatten()  # speculators' per-family defaults
        choices["loss terms"] = (
            cfg["loss_fn"],
            "speculators' XPress default, on the teacher-forced refined logits, the Jacobi rounds and the backbone's",
        )
        choices["refiner"] = (
            f"rank {cfg['xpress_rank']}, MLP x{cfg['xpress_mlp_ratio']}",
            "speculators' defaults, the released XPress checkpoints' shape",
        )
        choices["Jacobi rounds"] = (
            f"{cfg['consistency_passes']} in training (weight {cfg['consistency_weight']}), "
            f"{cfg['num_jacobi_passes']} when drafting",
            "training unrolls the drafting recurrence on the refiner's own argmax; stage 05 drafts with "
            "num_jacobi_passes, as the config records it for an engine",
        )
        return flat, choices

    def torchrun_flags(self, s, cfg: dict) -> dict:
        return {**super().torchrun_flags(s, cfg), **{k.replace("_", "-"): cfg[k] for k in SHAPE + ROUNDS}}

    def saved(self, config) -> dict:
        return {**super().saved(config), **{k: int(getattr(config, k)) for k in SHAPE}}

    def loaded(self, model) -> dict:
        """The refiner's shape and drafting passes as saved, so the loaded draft's TrainConfig describes it."""
        return {k: getattr(model.config, k) for k in (*SHAPE, "num_jacobi_passes")}

    def after_load(self, model) -> None:
        """`XPressRefinerHead.causal_tril` written again: tril of ones, as its __init__ builds it."""
        tril = model.refiner_head.causal_tril
        with torch.no_grad():
            tril.copy_(torch.tril(torch.ones_like(tril)))

    first_key = "accuracy"  # all drafted slots, teacher-forced (see the module's docstring), not position 1

    def position_accuracies(self, record: dict) -> dict[int, float]:
        """Empty: XPress's forward reports no accuracy per drafted position."""
        return {}


RECIPE = XPress("xpress")
