"""Which attention implementation a draft uses, chosen out loud and checked against its mask.

A flex-attention `BlockMask` only means something to flex attention; sdpa and eager take a dense
mask. speculators picks its mask builder from the transformer config's `_attn_implementation`
and fills in flex when it is None, which fails on CPU (no backward there in this torch). draftlab
picks explicitly: flex on CUDA, sdpa with a dense boolean mask on CPU, and says why. The choice is
made when a draft is built and checked again at every training forward (`drafts.forward`).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import torch
from torch.nn.attention.flex_attention import BlockMask

from draftlab import DraftlabError

FLEX = "simple_flex_attention"  # speculators' registered name for its flex forward
ALIASES = {"flex": FLEX, "flex_attention": FLEX, FLEX: FLEX, "sdpa": "sdpa", "eager": "eager"}


def pick_attention(device: str | torch.device, force: str | None = None) -> tuple[str, str]:
    """(implementation, reason). `force` overrides the choice: flex, sdpa or eager."""
    cuda = str(device).startswith("cuda")
    if force:
        if force not in ALIASES:
            raise DraftlabError(f"attention={force!r} unknown; use one of flex, sdpa, eager (or leave it unset).")
        impl = ALIASES[force]
        if impl == FLEX and not cuda:
            raise DraftlabError(
                f"attention={force!r} on {device}: torch's flex attention has no backward on CPU, so this draft "
                "could not train. Use attention='sdpa' (or leave it unset) on CPU; flex is for CUDA."
            )
        return impl, f"forced by parameter ({force})"
    if cuda:
        return FLEX, "CUDA: flex attention consumes the BlockMask directly (sparse blocks skipped, fused kernel)"
    return "sdpa", "CPU: flex attention has no backward here, so sdpa with a dense boolean mask"


def mask_builder(impl: str):
    """The builder speculators itself pairs with `impl` (same choice as its Eagle3DraftModel)."""
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    # isort: split
    from speculators.models.attention import create_float_mask

    require_impl(impl)
    return {FLEX: create_block_mask, "eager": create_float_mask}.get(impl, create_mask)


def require_impl(impl: str | None) -> str:
    if impl is None:
        raise DraftlabError(
            "_attn_implementation is unset (None): speculators would silently default to flex attention, "
            "which has no backward on CPU. Set it explicitly, e.g. draftlab.masks.attention.pick_attention(device)."
        )
    if impl not in ALIASES.values():
        raise DraftlabError(f"_attn_implementation={impl!r} is not one draftlab supports: {FLEX}, sdpa or eager.")
    return impl


def attention_settings(model) -> set:
    """The `_attn_implementation` of every config a module of `model` reads (the draft's layers share one;
    a None set on any of them after build makes transformers' eager path add a boolean mask as 0/1)."""
    return {
        m.config._attn_implementation
        for m in model.modules()
        if hasattr(getattr(m, "config", None), "_attn_implementation")
    }


def require_built(model, device, training: bool) -> None:
    """Every layer on the attention the draft was built with (speculators picks the mask builder when it builds a
    draft, `_create_mask_fn`: one set to another implementation after computes another loss, e.g. sdpa's boolean
    mask added as 0/1 by eager), and no training forward of flex on a CPU (torch has no backward there)."""
    built = getattr(model, "_attn_impl", None)
    layers = [m.config for m in model.modules() if m is not model and hasattr(m, "config")]
    now = {getattr(c, "_attn_implementation", None) for c in [*layers, model.config.transformer_layer_config]}
    changed = sorted(now - {built, None}) if built else []
    name = {FLEX: "flex"}
    cpu = not str(device).startswith("cuda")
    no_backward = "; flex has no backward on CPU (torch's flex attention), so on CPU pick sdpa" if cpu else ""
    choose = "choose attention when the draft is built: build_draft(..., attention=...) or the profile key attention"
    if changed:
        raise DraftlabError(
            f"the draft was built with {name.get(built, built)} attention, and its layers now run "
            f"{', '.join(name.get(c, c) for c in changed)}: speculators fixed its attention mask for "
            f"{name.get(built, built)} when it built the draft, so the loss would be another. Do not set "
            f"_attn_implementation after build; {choose} (flex, sdpa or eager){no_backward if FLEX in changed else ''}."
        )
    if training and built == FLEX and cpu:
        raise DraftlabError(
            f"flex attention on {device}: this draft cannot train here{no_backward}. To train on CPU, {choose} "
            "(sdpa, or unset: sdpa on CPU, flex on CUDA)."
        )


def check_mask(impl: str | None, mask) -> None:
    """Raise before torch does when the mask type does not fit the implementation."""
    require_impl(impl)
    if isinstance(mask, BlockMask) and impl != FLEX:
        raise DraftlabError(
            f"A flex-attention BlockMask was handed to {impl}, which needs a dense mask. Build it with "
            f"draftlab.masks.attention.mask_builder({impl!r}) (torch's create_mask), or use flex attention on CUDA."
        )
    if impl == FLEX and not isinstance(mask, BlockMask):
        raise DraftlabError(
            f"flex attention needs a BlockMask, got {type(mask).__name__}; build it with create_block_mask "
            "or switch the draft to sdpa."
        )


@contextmanager
def eager_flex():
    """Flex attention outside torch.compile, on purpose: one-off forwards and small comparisons, where
    compiling would cost more than the unfused kernel, so torch's warning about it is only noise."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile", category=UserWarning)
        yield


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, impl: str | None) -> torch.Tensor:
    """One attention call through `impl`, with the mask checked first ([B, H, T, D] tensors)."""
    check_mask(impl, mask)
    if impl == FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        with eager_flex():
            return flex_attention(q, k, v, block_mask=mask)
    dense = mask if mask.dim() == 4 else mask[None, None]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
