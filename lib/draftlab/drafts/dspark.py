"""DSpark at stages 03-04: DFlash's block layout plus a Markov logit-bias head and a confidence head.

speculators' `DSparkDraftModel` is a DFlash backbone (same anchors, masks, mask token and targets) whose block
logits get a low-rank bias from the token before each slot (`MarkovHead`: `markov_w1` indexes the VERIFIER
vocabulary, `markov_w2` projects to the draft's), and a head predicting each slot's acceptance (`ConfidenceHead`,
trained with a BCE term against 1 - TV). What differs from DFlash here:

- `sample_from_anchor` (speculators' DSpark default True): slot 0, the anchor's own query, drafts too, so a block
  drafts B tokens and slot k drafts position k+1. The forward's metric of the first drafted position is therefore
  `position_0_acc` (DFlash: `position_1_acc`, its slot 0 being the anchor itself).
- the heads change the model's shape: a resume must refuse another rank, head type, anchor convention or
  confidence head (`saved`), and `speculators train` must get the same options as the built draft (flags).
"""

from __future__ import annotations

from dataclasses import dataclass

from draftlab.drafts.recipe import Block, slot_accuracies

SHAPE = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")


@dataclass(frozen=True)
class DSpark(Block):
    """The block layout with DSpark's heads. None means speculators' default for the field (TrainConfig's
    `dspark` group: rank 256, vanilla, confidence head on; `sample_from_anchor` resolved to True for dspark)."""

    markov_rank: int | None = None
    markov_head_type: str | None = None  # vanilla | gated | rnn
    sample_from_anchor: bool | None = None

    @property
    def anchor_drafts(self) -> bool:
        """Whether slot 0 drafts (speculators resolves None to True for dspark)."""
        return self.sample_from_anchor is not False

    def build_options(self, verifier, path, data, given: dict) -> tuple[dict, dict]:
        """DFlash's (block size, mask token) plus the heads' options this recipe sets, each choice said."""
        from speculators.train.config.schema import DSparkArgs

        flat, choices = super().build_options(verifier, path, data, given)
        mine = {k: getattr(self, k) for k in ("markov_rank", "markov_head_type", "sample_from_anchor")}
        flat.update({k: v for k, v in mine.items() if v is not None})
        default = {k: f.default for k, f in DSparkArgs.model_fields.items()}
        rank = self.markov_rank if self.markov_rank is not None else default["markov_rank"]
        head = self.markov_head_type or default["markov_head_type"]
        given_or_default = lambda key: "set by the recipe" if mine[key] is not None else "speculators' default"  # noqa: E731
        choices["markov head"] = (
            f"{head}, rank {rank}" if rank else "off (rank 0: DFlash drafting with a confidence head)",
            f"{given_or_default('markov_rank')}; a logit bias from the token before each slot, so a block's tokens "
            "depend on each other (drafting runs it slot by slot)",
        )
        choices["sample from anchor"] = (
            self.anchor_drafts,
            f"{given_or_default('sample_from_anchor')}; "
            + (
                "slot 0 drafts the token after the anchor: B drafts per block"
                if self.anchor_drafts
                else "slot 0 is the anchor itself: B-1 drafts per block"
            ),
        )
        return flat, choices

    def torchrun_flags(self, s, cfg: dict) -> dict:
        """DFlash's flags plus the heads' options exactly as the built draft has them (booleans as speculators'
        --x / --no-x flags), so `speculators train` builds the same model draftlab trains."""
        flags = super().torchrun_flags(s, cfg)
        keys = (*SHAPE, "confidence_head_alpha", "sample_from_anchor")
        flags.update({k.replace("_", "-"): cfg[k] for k in keys if cfg.get(k) is not None})
        return flags

    def saved(self, config) -> dict:
        """DFlash's fields plus what shapes the heads and which slot drafts first."""
        return {
            **super().saved(config),
            "sample_from_anchor": bool(config.sample_from_anchor),
            **{k: getattr(config, k) for k in SHAPE},
        }

    def loaded(self, model) -> dict:
        """A saved model's shape as TrainConfig options, so a loaded draft's train_config says how it was built
        (its trainer kwargs do not depend on them: the loss options are not saved and take their defaults)."""
        c = model.config
        return {
            "block_size": int(c.block_size),
            "mask_token_id": c.mask_token_id,
            "sample_from_anchor": bool(c.sample_from_anchor),
            **{k: getattr(c, k) for k in SHAPE},
        }

    @property
    def first_key(self) -> str:
        return "position_0_acc" if self.anchor_drafts else "position_1_acc"

    def position_accuracies(self, record: dict) -> dict[int, float]:
        """Slot k drafts position k+1 when the anchor drafts (k otherwise, as DFlash)."""
        return slot_accuracies(record, 1 if self.anchor_drafts else 0)


RECIPE = DSpark("dspark")
