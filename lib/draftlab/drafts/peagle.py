"""P-EAGLE at stages 03-04: the chain layout (EAGLE-3's shifted pack, aux layers and draft), drafting k tokens at once.

What differs from EAGLE-3, as speculators trains it (`models/peagle`, its CLI):
- a mask token: the chain rows beyond the first stand for tokens not drafted yet and embed it, so
  `from_training_args` must get one (None crashes its forward); picked as for DFlash (`inputs.pick_mask_token`);
- trainable embeddings (`PEagleSpeculatorConfig.embed_requires_grad`, True whatever TrainConfig says): the mask
  token's row must learn, so a trained draft's `embed_tokens` is no longer the verifier's (`validate.verify` skips
  trained embeddings);
- COD sampling in the forward: `max_anchors` chain seeds per pack (the profile's `n_anchors`, speculators' one field
  for DFlash anchors and P-EAGLE seeds) and `num_depths` parallel depths (speculators' default; drafting proposes at
  most that many tokens), recorded in the model config as its proposal's `speculative_tokens`;
- padding rows of a pack see no key (`masks/peagle.py`): eager attention's softmax over an empty row is NaN, and the
  NaN reaches the loss through the masked-out rows (NaN * 0), so eager is refused at build; sdpa (CPU) and flex
  (CUDA) give those rows zeros. Drafting has no padding rows, so `proposers.load_draft`'s eager on mps is fine;
- metrics per depth: `position_{d}_acc` is the accuracy of drafted token d+1, so the first is `position_0_acc`.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftlab import DraftlabError
from draftlab.drafts.recipe import Chain, mask_token, slot_accuracies


@dataclass(frozen=True)
class PEagle(Chain):
    """EAGLE-3's chain layout with P-EAGLE's mask token, COD sampling options and per-depth metrics."""

    def profile_args(self, cfg) -> dict:
        return {"num_layers": cfg.draft_layers, "mask_token_id": cfg.mask_token_id}

    def build_options(self, verifier, path, data, given: dict) -> tuple[dict, dict]:
        """A mask token (`inputs.pick_mask_token`, as for DFlash); attention that keeps padding rows finite."""
        from speculators.train.config.schema import PEagleArgs

        if given.get("attention") == "eager":
            raise DraftlabError(
                "attention='eager' for a peagle draft: padding rows of a P-EAGLE pack attend to no key, and eager "
                "attention's softmax over such a row is NaN, which reaches the loss (NaN * 0) and every gradient. "
                "Use attention='sdpa' (on CPU and mps too) or leave it unset (flex on CUDA, sdpa elsewhere); only "
                "drafting, which has no padding rows, runs eager on mps (proposers.load_draft)."
            )
        token, line = mask_token(verifier, path, data, given)
        depths = PEagleArgs().num_depths
        return {"mask_token_id": token}, {
            "mask token": line,
            "parallel depths": (depths, "speculators' default (num_depths): one forward drafts up to this many tokens"),
            "embeddings": ("trained", "P-EAGLE's config default: the mask token's embedding row learns"),
        }

    def forward_options(self, s) -> dict:
        return {"max_anchors": s.n_anchors}

    def torchrun_flags(self, s, cfg: dict) -> dict:
        return {
            "num-depths": cfg["num_depths"],
            "down-sample-ratio": cfg["down_sample_ratio"],
            "down-sample-ratio-min": cfg["down_sample_ratio_min"],
            "max-anchors": s.n_anchors,
            "mask-token-id": cfg["mask_token_id"],
        }

    def saved(self, config) -> dict:
        depths = config.speculators_config.proposal_methods[0].speculative_tokens
        return {"mask_token_id": int(config.mask_token_id), "num_depths": int(depths)}

    def loaded(self, model) -> dict:
        return {
            "target_layer_ids": model.target_layer_ids,
            "num_depths": model.config.speculators_config.proposal_methods[0].speculative_tokens,
            "mask_token_id": model.config.mask_token_id,
        }

    first_key = "position_0_acc"  # depth 0: the first drafted token

    def position_accuracies(self, record: dict) -> dict[int, float]:
        """Accuracy per drafted position (1-based): depth d drafts token d+1."""
        return slot_accuracies(record, 1)


RECIPE = PEagle("peagle")
