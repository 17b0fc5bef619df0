"""DFlash-2 at stages 03-04: DFlash's block layout (anchors, mask token, no shift) plus what speculators adds.

speculators' `DFlash2DraftModel` is DFlash with, in every layer, a local dynamic convolution around attention
and around the MLP (it mixes each block slot with the `conv_kernel_size - 1` slots before it in its block),
and a candidate selector: the unary head's top `selector_top_k` tokens of a slot are re-scored by a rank
`selector_rank` bilinear term of the predecessor token and the slot's state, trained by a K-way cross-entropy
beside the unary loss (`kl_div`, fixed exponential position weights). Its sliding layers attend their block
bidirectionally (`sliding_window_non_causal`, True for this family only).

What differs from DFlash here, and why:
- Vocabulary: speculators refuses a reduced one ("DFlash2 currently requires the full verifier vocabulary"):
  both codebooks are indexed by verifier ids. So `vocab` always answers the verifier's size, whatever stage 01
  mapped or notebook 04 asks, and the build says so among its choices; stage 01's d2t/t2d are not read, and
  `speculators train` gets no `--draft-vocab-size` (with one it would write a d2t-<V> identity mapping into
  stage 01's folder, from its token_freq.pt, and train with it).
- The shape speculators' checks would refuse deep in the build (conv group size not dividing the hidden size,
  a kernel longer than the block, more selector candidates than the vocabulary) is refused first, by name.
- A checkpoint records the convolution and selector shape and the block's attention, so a resume cannot mix them.
- Metrics: `position_{p}_acc` (hence `first_key` and `position_accuracies`) and `full_acc` are the UNARY head's
  argmax accuracy (speculators' dflash2 metrics), not the selector's choice, which is what drafting emits; the
  selector is reported only pooled (`teacher_forced_selector_acc`, on positions whose target is in the unary
  top-k) and through `eal` (its greedy path). Stage 05's acceptance measures what the selector drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftlab import DraftlabError
from draftlab.drafts.recipe import Block
from draftlab.masks.dflash2 import SHAPE, defaults


@dataclass(frozen=True)
class DFlash2(Block):
    """The block layout with DFlash-2's full vocabulary, convolution and selector (module docstring: why)."""

    def vocab(self, verifier, requested):
        why = (
            "speculators' DFlash-2 requires the full verifier vocabulary (its selector codebooks are indexed by "
            "verifier ids); stage 01's d2t/t2d are not used"
        )
        if requested is not None and requested != verifier.vocab_size:
            why += f" (draft_vocab_size={requested} asked for is overridden)"
        return verifier.vocab_size, why

    def build_options(self, verifier, path, data, given: dict) -> tuple[dict, dict]:
        flat, choices = super().build_options(verifier, path, data, given)
        d = defaults()
        block = given.get("block_size") or d["block_size"]
        hidden, vocab = verifier.hidden_size, verifier.vocab_size
        for bad, fix in (
            (hidden % d["conv_group_size"], f"conv_group_size={d['conv_group_size']} must divide hidden size {hidden}"),
            (d["conv_kernel_size"] > block, f"conv_kernel_size={d['conv_kernel_size']} exceeds block_size={block}"),
            (d["selector_top_k"] > vocab, f"selector_top_k={d['selector_top_k']} exceeds the vocabulary ({vocab})"),
        ):
            if bad:
                raise DraftlabError(f"dflash2 draft refused: {fix} (speculators' constraint); change that setting.")
        choices["local convolution"] = (
            f"kernel {d['conv_kernel_size']}, group {d['conv_group_size']} channels",
            "speculators' defaults: around attention and MLP, slot p mixes slots p-K+1..p of its own block",
        )
        choices["candidate selector"] = (
            f"top {d['selector_top_k']} of the unary head, rank {d['selector_rank']}",
            "speculators' defaults: reranks each slot's unary top-k given the token drafted before it",
        )
        choices["block attention"] = (
            "bidirectional" if d["sliding_window_non_causal"] else "causal",
            "speculators' DFlash-2 default (sliding_window_non_causal) in its sliding layers",
        )
        return flat, choices

    def torchrun_flags(self, s, cfg: dict) -> dict:
        """DFlash's, the convolution and selector shape spelled out, and no `--draft-vocab-size` (docstring)."""
        shape = {k.replace("_", "-"): cfg[k] for k in SHAPE}
        return {**super().torchrun_flags(s, cfg), **shape, "draft-vocab-size": None, "d2t-path": None, "t2d-path": None}

    def saved(self, config) -> dict:
        keep = (*SHAPE, "sliding_window_non_causal", "sample_from_anchor")
        return {**super().saved(config), **{k: getattr(config, k) for k in keep}}


RECIPE = DFlash2("dflash2")
