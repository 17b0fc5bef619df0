"""A draft's training forward on one packed batch, and held-out evaluation through it.

`forward` is speculators' own training forward (losses and metrics from the model class), run after
the checks that must come before torch could fail deep inside a kernel: the attention setting of
every layer, the batch's dtype and feature width, and a pack length the flex BlockMask can serve.
"""

from __future__ import annotations

import time

import torch

from draftlab import DraftlabError
from draftlab.drafts.device import inference
from draftlab.masks.attention import attention_settings, require_built, require_impl
from draftlab.masks.packing import check_pack, pack_length, pad_batch, tokens

INPUTS = ("hidden_states", "input_ids", "loss_mask", "verifier_last_hidden_states", "document_ids", "position_ids")


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
        f"draft is {name}; collate with draftlab.training.data.collate(..., dtype=torch.{name}), "
        f"pass cast=True, or build the draft with dtype={name!r}."
    )


def check_width(layer_ids: list[int], hidden_size: int, width: int) -> None:
    """The draft's fc expects len(aux layer ids) * hidden_size features per token."""
    if width != len(layer_ids) * hidden_size:
        raise DraftlabError(
            f"hidden_states carry {width} features per token, but {len(layer_ids)} aux layers x hidden size "
            f"{hidden_size} = {len(layer_ids) * hidden_size}; the data was "
            f"extracted with {width // hidden_size if hidden_size else '?'} "
            "layers or another verifier: use the layer_ids in the data's manifest.json."
        )


def forward(draft, batch: dict, cast: bool = False, **overrides):
    """speculators' training forward on one packed batch, after draftlab's checks; a pack length
    the flex BlockMask cannot serve is padded (no loss on the tail; `training.data.Packs` packs to that
    length already, and `train` records it). `overrides` replace forward kwargs of `train_kwargs` for
    this call only (`settings.forward_options`: TTT steps, DFlash anchors). The draft is not written to."""
    for impl in attention_settings(draft.model):  # every call: a setting changed after build would mask nothing
        require_impl(impl)
    require_built(draft.model, draft.device, torch.is_grad_enabled())
    batch = check_batch_dtype(batch, draft.dtype, cast)
    check_width(draft.model.target_layer_ids, draft.verifier.hidden_size, batch["hidden_states"].shape[-1])
    n, _ = pack_length(batch["input_ids"].shape[1], draft.kind, draft.attention)
    if n != batch["input_ids"].shape[1]:
        batch = pad_batch(batch, n)
    check_pack(batch, draft.kind, draft.attention)
    device = draft.device
    return draft.model(**{k: batch[k].to(device) for k in INPUTS if k in batch}, **{**draft.train_kwargs, **overrides})


def normalise(sums: dict) -> dict:
    from speculators.train.utils import normalize_counted_metrics

    return normalize_counted_metrics({k: float(v) for k, v in sums.items()})


def evaluate(draft, packs, limit: int | None = None, seed: int = 0, reuse_graph: bool | None = None, **options) -> dict:
    """Held-out metrics over `packs` (a `training.data.Packs`), summed over packs before dividing (so each
    token counts once). RNG is forked and seeded, so DFlash's random anchors are the same at every
    evaluation and training's random stream is untouched. On CUDA the compiled training graph serves
    it (`device.inference`). `options`: the forward options training runs with (`forward`'s overrides)."""
    sums: dict = {}
    n, t0 = 0, time.perf_counter()
    with torch.random.fork_rng(devices=[]), inference(draft.model, reuse_graph):
        torch.manual_seed(seed)
        for batch in packs.all(limit):
            _, _, m = forward(draft, batch, **options)
            for k, v in m.items():
                sums[k] = sums.get(k, 0) + v.detach().float().cpu()
            n += tokens(batch)
    seconds = time.perf_counter() - t0
    return {**normalise(sums), "tokens_per_s": n / seconds, "seconds": seconds}
