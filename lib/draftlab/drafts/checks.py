"""Checks and decisions around a draft, each made before torch could fail deep inside a kernel.

The decision functions take plain facts (device, whether speculators compiles the forward, torch
version, pack length) so they can be unit-tested on a CPU machine; the GPU failures they steer
around were seen on the lent H200 and cannot be reproduced here.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import _DEFAULT_SPARSE_BLOCK_SIZE as FLEX_BLOCK

from draftlab import DraftlabError
from draftlab.drafts.attention import FLEX

# speculators 0.9.0 + torch 2.11 on an H200: the fused Triton loss inside the compiled forward dies
# with "ListVariable(length=21) is already tracked for mutation". Versions at or past these are
# treated as affected until a release proves otherwise.
FUSED_UNDER_COMPILE_BROKEN = {"speculators": (0, 9, 0), "torch": (2, 11)}


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("+")[0].split(".")[:3] if p.isdigit())


def forward_is_compiled() -> bool:
    """speculators wraps forward in torch.compile at import time iff CUDA is visible, whatever the
    device the draft sits on (`speculators.models.utils.conditional_torch_compile`)."""
    return torch.cuda.is_available() and hasattr(torch, "compile")


def dropout_free(model: torch.nn.Module) -> bool:
    """True when training mode computes what eval mode does: no dropout module or attention dropout above 0."""
    return not any(
        (isinstance(m, torch.nn.Dropout) and m.p > 0) or (getattr(m, "attention_dropout", 0) or 0) > 0
        for m in model.modules()
    )


@contextmanager
def inference(model: torch.nn.Module, reuse_graph: bool | None = None):
    """For forwards whose outputs are only read (held-out evaluation, reload checks).

    Where the forward is compiled (CUDA) they run as training does, gradients on and in training
    mode (nothing is backpropagated), so the compiled training graph serves them: no-grad eval mode
    is a second graph, about 25 s of compiling per draft on the H200. Only a draft without dropout
    qualifies, so the outputs are eval mode's; elsewhere eval mode without gradients."""
    reuse = (forward_is_compiled() if reuse_graph is None else reuse_graph) and dropout_free(model)
    was = model.training
    model.train(reuse)
    try:
        with torch.set_grad_enabled(reuse):
            yield
    finally:
        model.train(was)


def pick_loss(
    device: str, compiled: bool, torch_version: str, speculators_version: str, force: str | None = None
) -> tuple[str, str]:
    """('fused' | 'eager', reason). Fused needs Triton on CUDA, and must not meet the compile bug."""
    cuda = str(device).startswith("cuda")
    broken = (
        compiled
        and _version(speculators_version) <= FUSED_UNDER_COMPILE_BROKEN["speculators"]
        and _version(torch_version)[:2] >= FUSED_UNDER_COMPILE_BROKEN["torch"]
    )
    if force not in (None, "auto", "fused", "eager"):
        raise DraftlabError(f"loss_implementation={force!r} unknown; use auto, fused or eager.")
    if force == "fused" and not cuda:
        raise DraftlabError("loss_implementation='fused' needs Triton kernels on a CUDA device; use 'eager' on CPU.")
    if force in ("fused", "eager"):
        note = "; warning: known to fail under torch.compile with these versions" if force == "fused" and broken else ""
        return force, f"forced by parameter{note}"
    if not cuda:
        return "eager", "CPU: the fused loss is a Triton kernel, which needs CUDA"
    if broken:
        return "eager", (
            f"CUDA, forward compiled, speculators {speculators_version} with torch {torch_version}: the fused "
            "Triton loss fails under torch.compile ('ListVariable ... already tracked for mutation')"
        )
    return "fused", "CUDA: fused Triton loss (no [T, vocab] softmax materialised)"


def pack_length(max_len: int, kind: str, attn_impl: str) -> tuple[int, str]:
    """The length to pack batches to, and why.

    EAGLE-3 under flex attention extends its BlockMask once per TTT step with
    `extend_mask_for_draft_tokens`, which rebuilds it from block counts: its lengths become whole
    multiples of the flex block (128). A pack of 8191 tokens then meets a mask made for 8192
    ("block_mask was created for a larger length"). Padding the pack to a multiple of the block
    makes both agree; the padded tail has document id -1 and no loss.
    """
    if kind == "eagle3" and attn_impl == FLEX and max_len % FLEX_BLOCK:
        padded = -(-max_len // FLEX_BLOCK) * FLEX_BLOCK
        return padded, f"EAGLE-3 + flex: {max_len} padded to {padded}, a multiple of the {FLEX_BLOCK}-token flex block"
    return (
        max_len,
        "no padding needed" if kind != "eagle3" or attn_impl != FLEX else f"already a multiple of {FLEX_BLOCK}",
    )


def check_pack(batch: dict, kind: str, attn_impl: str) -> None:
    n = batch["input_ids"].shape[1]
    want, _ = pack_length(n, kind, attn_impl)
    if want != n:
        raise DraftlabError(
            f"A pack of {n} tokens fails EAGLE-3 with flex attention (its extended BlockMask covers {want}); "
            f"collate with max_len={want} (draftlab.draft_checks.pack_length) or pad with pad_batch(batch, {want})."
        )


def pad_batch(batch: dict, length: int) -> dict:
    """Right-pad a packed [1, T, ...] batch to `length`: zeros, document id -1, no loss."""
    out = dict(batch)
    for key, t in batch.items():
        if not torch.is_tensor(t) or t.dim() < 2 or t.shape[1] >= length:
            continue
        fill = -1 if key == "document_ids" else 0
        pad = t.new_full((t.shape[0], length - t.shape[1], *t.shape[2:]), fill)
        if key == "position_ids":
            pad = torch.arange(t.shape[1], length, device=t.device, dtype=t.dtype).expand(t.shape[0], -1)
        out[key] = torch.cat([t, pad], dim=1)
    return out


def check_batch_dtype(batch: dict, dtype: torch.dtype, cast: bool = False) -> dict:
    """Float tensors of a batch must be in the draft's dtype; `cast=True` converts them (documented,
    lossy for fp32 -> bf16), otherwise a clear error instead of a matmul dtype crash in torch."""
    wrong = {k: t.dtype for k, t in batch.items() if torch.is_tensor(t) and t.is_floating_point() and t.dtype != dtype}
    if not wrong:
        return batch
    if cast:
        return {k: t.to(dtype) if k in wrong else t for k, t in batch.items()}
    name = str(dtype).removeprefix("torch.")
    raise DraftlabError(
        f"batch tensors {sorted(wrong)} are {sorted({str(d).removeprefix('torch.') for d in wrong.values()})} but the "
        f"draft is {name}; collate with CollateFn(..., dtype=torch.{name}), "
        f"pass cast=True, or build the draft with dtype={name!r}."
    )


def check_layer_ids(
    layer_ids: list[int], data_ids: list[int] | None, hidden_size: int, width: int | None = None
) -> None:
    """Aux layer ids must be the ones the data was extracted with: the draft's fc expects
    len(ids) * hidden_size features, and the ids are what vLLM will feed it when served."""
    if data_ids is not None and list(layer_ids) != list(data_ids):
        raise DraftlabError(
            f"aux layer ids {list(layer_ids)} do not match the extracted data ({list(data_ids)}); pass "
            f"layer_ids={list(data_ids)} (or leave it unset), or re-run stage 01 with layer_ids={list(layer_ids)}."
        )
    if width is not None and width != len(layer_ids) * hidden_size:
        raise DraftlabError(
            f"hidden_states carry {width} features per token, but {len(layer_ids)} aux layers x hidden size "
            f"{hidden_size} = {len(layer_ids) * hidden_size}; the data was "
            f"extracted with {width // hidden_size if hidden_size else '?'} "
            "layers or another verifier: use the layer_ids in the data's manifest.json."
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


def nan_parameters(model: torch.nn.Module) -> list[str]:
    """Names of floating parameters or buffers holding any NaN (speculators' 'not loaded' marker)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [n for n, t in named if t.is_floating_point() and bool(torch.isnan(t).any())]


def pick_mask_token(v, path, mask_token_id: int | None = None, used: set[int] | None = None) -> tuple[int, str]:
    """DFlash fills draft blocks with a mask token. speculators' resolver picks the tokenizer's
    mask token, else a free embedding row, else pad/eos/unk; a fallback that also occurs in the
    training inputs (SmolLM2's pad is <|im_end|>, which closes every turn) is swapped for a special
    token that never does, so a block of masks cannot look like real text."""
    if mask_token_id is not None:
        if not 0 <= int(mask_token_id) < v.vocab_size:
            raise DraftlabError(
                f"mask_token_id={mask_token_id} is outside the verifier's "
                f"vocabulary [0, {v.vocab_size}); pass a valid id or None."
            )
        return int(mask_token_id), "given"
    from speculators.train.utils import resolve_mask_token_id

    tok = v.tokenizer
    with warnings.catch_warnings():  # its fallback warning is replaced by the reason returned here
        warnings.simplefilter("ignore")
        tid = resolve_mask_token_id(str(path), v.vocab_size)
    if tid == tok.mask_token_id:
        return tid, "the tokenizer's mask token"
    if tid >= len(tok):
        return tid, f"a free embedding row (the tokenizer uses {len(tok)} of {v.vocab_size})"
    why = f"speculators' fallback {tok.convert_ids_to_tokens(tid)!r} (no mask token, no free embedding row)"
    spare = [t for t in tok.all_special_ids if used is not None and t not in used and t < v.vocab_size]
    if used is not None and tid in used and spare:
        old, tid = tid, spare[0]
        why = (
            f"special token {tok.convert_ids_to_tokens(tid)!r}, since speculators' "
            f"fallback {tok.convert_ids_to_tokens(old)!r} occurs in the training inputs"
        )
    return tid, why


def used_ids(folder) -> set[int]:
    from datasets import load_from_disk

    return {int(t) for row in load_from_disk(str(folder)).with_format(None)["input_ids"] for t in row}


@contextmanager
def shape_source(path, v):
    """Where speculators reads the draft layer's shape from: the verifier's config, or a config-only copy of it
    with the head_dim the verifier computes (hidden // heads) when its config has none (Qwen2, Phi-3, Qwen3-MoE):
    speculators passes a missing head_dim on as None, which DFlash's Qwen3Config refuses."""
    if getattr(v.config, "head_dim", None) is not None:
        yield str(path)
        return
    cfg = json.loads((Path(path) / "config.json").read_text())
    with tempfile.TemporaryDirectory(prefix="draftlab-shape-") as tmp:
        (Path(tmp) / "config.json").write_text(
            json.dumps({**cfg, "head_dim": v.hidden_size // v.config.num_attention_heads})
        )
        yield tmp
