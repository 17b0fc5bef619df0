"""Grouped-query attention handed whole to torch's SDPA kernel, for a verifier on the CPU.

transformers' sdpa path copies every key/value head once for each query head it serves
(`repeat_kv`) whenever an attention mask is present, which is every step of batched, left-padded
generation: a copy of the whole KV cache per layer and token. On the CPU torch's kernel takes the
grouped heads directly (`enable_gqa=True`): the same greedy tokens, faster generation
(BENCHMARKS.md, "Generation"). On CUDA transformers' own choice stands (there, GQA with a mask
falls back to the slow math kernel).
"""

from __future__ import annotations

import torch

NAME = "sdpa_gqa"


def sdpa_gqa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **_):
    """transformers' `sdpa_attention_forward` (no paged cache, no position bias) minus the copy."""
    q_len = query.shape[2]
    causal = (
        q_len > 1
        and attention_mask is None
        and (getattr(module, "is_causal", True) if is_causal is None else is_causal)
    )
    if causal and key.shape[2] > q_len:  # as transformers does: is_causal aligns top-left
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def use_on_cpu(model, device: str) -> str:
    """Switch a CPU model that shares key/value heads from sdpa to `sdpa_gqa`; returns what it uses."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    cfg = model.config
    grouped = getattr(cfg, "num_key_value_heads", None) not in (None, cfg.num_attention_heads)
    if device == "cpu" and grouped and cfg._attn_implementation == "sdpa":
        AttentionInterface.register(NAME, sdpa_gqa)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        model.set_attn_implementation(NAME)
    return cfg._attn_implementation
