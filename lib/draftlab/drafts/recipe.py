"""What stages 03 and 04 know of a draft family, looked up by name: `recipe(kind)`.

A family's module (`drafts/<name>.py`) holds its `RECIPE`, made from one of the two layouts here
(`families.LAYOUTS`) with the family's own differences. Stage code asks the recipe, never the family's
name: which profile keys shape it, what `build_draft` hands speculators beyond the shared options (and
why), the forward options of training and evaluation, `speculators train`'s per-family flags, what a
checkpoint records so a resume refuses another shape, what a saved model says about how it was
trained, what a load must restore (`after_load`), and which of the forward's metrics hold the accuracy
of each drafted position.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftlab.families import family, stage_module


def mask_token(verifier, path, data, given: dict) -> tuple[int, tuple[str, str]]:
    """(the mask token a draft's not-yet-drafted positions embed, its (choice, why) line): `inputs.pick_mask_token`
    over the ids stage 01's data uses, the one `given` (the profile's `mask_token_id`) if set."""
    from draftlab.drafts.inputs import pick_mask_token, used_ids

    used = used_ids(data) if data is not None else None
    token, why = pick_mask_token(verifier, path, given.get("mask_token_id"), used)
    return token, (f"{token} {verifier.tokenizer.convert_ids_to_tokens(token)!r}", why)


def slot_accuracies(record: dict, shift: int = 0) -> dict[int, float]:
    """The forward's `position_{i}_acc` metrics as {drafted position (1-based): accuracy}, slot i drafting position
    i + shift (DFlash's slot 0 is the anchor itself; P-EAGLE's depth 0 and DSpark's anchor slot draft position 1)."""
    return {
        int(k.split("_")[1]) + shift: v for k, v in record.items() if k.startswith("position_") and k.endswith("_acc")
    }


@dataclass(frozen=True)
class Layout:
    """What both layouts leave as speculators has it: the vocabulary asked for, no further build options or
    checkpoint fields, nothing to restore after a load."""

    name: str

    def vocab(self, verifier, requested: int | None) -> tuple[int | None, str | None]:
        """(draft vocabulary size, why) from the one asked for (None: stage 01's mapping or the verifier's); a
        family that cannot take a reduced vocabulary overrides it and says why (`build_draft` records it)."""
        return requested, None

    def build_options(self, verifier, path, data, given: dict) -> tuple[dict, dict]:
        """(flat TrainConfig options beyond the shared ones, {what: (choice, why)}) for build_draft."""
        return {}, {}

    def saved(self, config) -> dict:
        """Fields of the model config a checkpoint records beside the shared ones (a resume checks them)."""
        return {}

    def after_load(self, model) -> None:
        """Restore what speculators' `from_pretrained` leaves undone in a loaded model (nothing by default)."""

    def loaded(self, model) -> dict:
        """Flat TrainConfig options a saved model was trained with, for its forward's trainer kwargs."""
        return {}


@dataclass(frozen=True)
class Chain(Layout):
    """EAGLE-3's layout: one token per step, training unrolls `ttt_steps` steps over a shifted pack."""

    shift: bool = True  # speculators' `shift_batch` (eagle3/data.py) before collation, as `speculators train` does

    def profile_args(self, cfg) -> dict:
        """build_draft's arguments from a stage config (the profile's keys)."""
        return {"num_layers": cfg.draft_layers}

    def forward_options(self, s) -> dict:
        return {"ttt_steps": s.ttt_steps, "ttt_step_loss_decay": s.ttt_step_loss_decay}

    def torchrun_flags(self, s, cfg: dict) -> dict:
        return {"ttt-steps": s.ttt_steps, "ttt-step-loss-decay": s.ttt_step_loss_decay}

    def loaded(self, model) -> dict:
        return {
            "target_layer_ids": model.target_layer_ids,
            "ttt_steps": model.config.speculators_config.proposal_methods[0].speculative_tokens,
        }

    first_key = "full_acc_0"  # the forward's metric: first drafted position's accuracy

    def position_accuracies(self, record: dict) -> dict[int, float]:
        """Accuracy per drafted position (1-based) from one metrics record: the TTT steps."""
        return {int(k.split("_")[2]) + 1: v for k, v in record.items() if k.startswith("full_acc_")}


@dataclass(frozen=True)
class Block(Layout):
    """DFlash's layout: a block of positions after an anchor in one forward, anchors sampled in the pack."""

    shift: bool = False

    def profile_args(self, cfg) -> dict:
        return {
            "num_layers": cfg.dflash_layers,
            "block_size": cfg.dflash_block_size,
            "mask_token_id": cfg.mask_token_id,
        }

    def build_options(self, verifier, path, data, given: dict) -> tuple[dict, dict]:
        """The block size given (None: speculators' default for the family) and a mask token for the block's
        unknown positions (`mask_token`)."""
        token, line = mask_token(verifier, path, data, given)
        flat = {"mask_token_id": token}
        if given.get("block_size") is not None:
            flat["block_size"] = given["block_size"]
        return flat, {"mask token": line}

    def forward_options(self, s) -> dict:
        return {"max_anchors": s.n_anchors}

    def torchrun_flags(self, s, cfg: dict) -> dict:
        return {"block-size": cfg["block_size"], "max-anchors": s.n_anchors, "mask-token-id": cfg["mask_token_id"]}

    def saved(self, config) -> dict:
        return {"block_size": int(config.block_size), "mask_token_id": int(config.mask_token_id)}

    first_key = "position_1_acc"

    def position_accuracies(self, record: dict) -> dict[int, float]:
        """Accuracy per drafted position (1-based) from one metrics record: the block's positions."""
        return slot_accuracies(record)


def recipe(kind: str):
    """The `RECIPE` of family `kind` (`drafts/<kind>.py`); a family draftlab refuses is refused here by name."""
    family(kind)
    return stage_module("drafts", kind).RECIPE
