"""The verifier's residual stream read through forward hooks: the states a draft is trained on.

Id `i` < L is read where vLLM defines it, as the hidden state *entering* decoder layer `i` (a
forward pre-hook), so id 0 is what the model feeds its first layer, with whatever it adds after the
embedding module; id `L` is the last layer's pre-norm output. A family whose layers pass something
other than a [batch, tokens, hidden] tensor is refused rather than read wrong.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from draftlab import DraftlabError


def _tensor(what, value, verifier):
    """The [B, T, H] hidden state in a decoder layer's input or output, or a refusal naming what was found."""
    found = value[0] if isinstance(value, (tuple, list)) and value else value
    if not torch.is_tensor(found) or found.dim() != 3 or found.shape[-1] != verifier.hidden_size:
        desc = f"a {type(value).__name__}" + (
            f" whose first item is a {type(found).__name__}" if found is not value else ""
        )
        shape = f" of shape {tuple(found.shape)}" if torch.is_tensor(found) else ""
        raise DraftlabError(
            f"{type(verifier.model).__name__}: {what} is {desc}{shape}, not a [batch, tokens, {verifier.hidden_size}] "
            "hidden state; draftlab cannot read this family's layers (extraction would store another tensor than the "
            "residual stream)."
        )
    return found


@contextmanager
def capture(verifier, layer_ids: list[int]):
    """Hooks filling {layer id: tensor} for the aux ids plus the final id L.

    Id i < L is read where it is defined, as the hidden state *entering* decoder layer i (a forward
    pre-hook): so id 0 is what the model feeds its first layer, with whatever it adds after the
    embedding module (Gemma's scaling, GPT-2's learned positions). Id L is the last layer's output."""
    store: dict[int, torch.Tensor] = {}
    n = verifier.num_layers

    def entering(i):
        def hook(_module, args, kwargs):
            value = args[0] if args else kwargs.get("hidden_states")
            store[i] = _tensor(f"the input of decoder layer {i}", value, verifier)

        return hook

    def leaving(_module, _inputs, out):
        store[n] = _tensor(f"the output of decoder layer {n - 1}", out, verifier)

    handles = [verifier.layers[i].register_forward_pre_hook(entering(i), with_kwargs=True) for i in layer_ids if i < n]
    handles.append(verifier.layers[n - 1].register_forward_hook(leaving))
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def hidden_states(verifier, batch_ids: list[list[int]], layer_ids: list[int]) -> list[torch.Tensor]:
    """[T_b, n_aux+1, H] per sample, from one right-padded forward of the decoder (no lm_head)."""
    pad = verifier.tokenizer.pad_token_id or 0
    width = max(map(len, batch_ids))
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in batch_ids], device=verifier.device)
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in batch_ids], device=verifier.device)
    decoder = verifier.model.get_decoder()
    with capture(verifier, layer_ids) as store:
        decoder(input_ids=ids, attention_mask=attn, use_cache=False)
    stacked = torch.stack([store[i] for i in [*layer_ids, verifier.num_layers]], dim=2)
    return [stacked[b, : len(s)] for b, s in enumerate(batch_ids)]
