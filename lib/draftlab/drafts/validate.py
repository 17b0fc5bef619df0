"""What validates a draft: `build_draft`'s inputs (a typed layer config, aux layer ids, vocabulary size)
and the built or reloaded draft (no NaN, frozen tensors equal to the verifier's, a mask its attention takes).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftlab import DraftlabError
from draftlab.drafts import norms
from draftlab.masks.attention import check_mask

if TYPE_CHECKING:
    from draftlab.drafts.draft import Draft


def nan_parameters(model: torch.nn.Module) -> list[str]:
    """Names of floating parameters or buffers holding any NaN (speculators' 'not loaded' marker)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [n for n, t in named if t.is_floating_point() and bool(torch.isnan(t).any())]


def check_layer_ids(layer_ids: list[int], data_ids: list[int] | None) -> None:
    """Aux layer ids must be the ones the data was extracted with: the draft's fc expects
    len(ids) * hidden_size features, and the ids are what vLLM will feed it when served."""
    if data_ids is not None and list(layer_ids) != list(data_ids):
        raise DraftlabError(
            f"aux layer ids {list(layer_ids)} do not match the extracted data ({list(data_ids)}); pass "
            f"layer_ids={list(data_ids)} (or leave it unset), or re-run stage 01 with layer_ids={list(layer_ids)}."
        )


def check_vocab(draft_vocab_size: int, target_vocab_size: int) -> None:
    if not 0 < draft_vocab_size <= target_vocab_size:
        raise DraftlabError(
            f"draft_vocab_size={draft_vocab_size} must be in [1, {target_vocab_size}] (the verifier's vocabulary); "
            "choose a smaller draft vocabulary and rebuild the mapping in stage 01."
        )


def check_typed(value, expected: type, what: str, fix: str):
    """A raw dict where a typed config belongs: speculators would coerce it silently (a dict
    without model_type becomes a Qwen3Config), so draftlab refuses it."""
    if value is not None and not isinstance(value, expected):
        raise DraftlabError(f"{what} must be a {expected.__name__}, got {type(value).__name__}; {fix}.")
    return value


def verify(draft: Draft, saved_dtype: torch.dtype | None = None) -> None:
    """No NaN left (speculators' marker for verifier weights it did not load), and the frozen parts
    equal the verifier's tensors: embeddings (unless the config trains them, `embed_requires_grad`), verifier
    norm, and lm_head rows picked by d2t. A draft saved in another dtype than the verifier's is compared in
    `saved_dtype`: a precision change is not another checkpoint."""
    m, v = draft.model, draft.verifier
    nan = nan_parameters(m)
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
    if getattr(m.config, "embed_requires_grad", False):  # trained (P-EAGLE's default: its mask token's row learns)
        del pairs["embed_tokens"]
    cmp = saved_dtype or m.embed_tokens.weight.dtype
    bad = [n for n, (a, b) in pairs.items() if not torch.equal(a.to(cmp), b.to(a.device, cmp))]
    if not bad:
        norms.check_verifier_norm(m, v)
    if bad:
        name = str(cmp).removeprefix("torch.")
        named = getattr(m, "trained_for", None) or m.config.speculators_config.verifier.name_or_path  # load_model's
        why = (
            "the draft's config names this very path as the verifier it was trained for, but the model there now is "
            "another one of the same shape (replaced since, e.g. by a fine-tune or another download)"
            if Path(str(named)).resolve() == Path(v.path).resolve()
            else f"the draft was made for another verifier ({named})"
        )
        raise DraftlabError(
            f"the draft's frozen {bad} differ from verifier {v.path}'s (compared in {name}): {why}. Load the verifier "
            f"it was trained for, in the dtype it was trained in ({name}), or train a draft for this one."
        )
    if draft.attention != "simple_flex_attention" or str(v.device).startswith("cuda"):
        # The mask builder speculators' model picked for its attention; speculators keeps that choice
        # only in this private attribute (no public accessor), and checking its own pick is the point.
        mask = m._create_mask_fn(lambda b, h, q, kv: q >= kv, B=None, H=None, Q_LEN=128, KV_LEN=128, device=v.device)
        check_mask(draft.attention, mask)
