"""Noise on the verifier's hidden states while a draft trains (`state_noise`), a lever against the chain-start gap.

At a chain's later positions a draft reads inputs built on its own guesses, which teacher forcing never shows it;
EAGLE's recipe trains on the verifier's states with noise added, so that the draft tolerates inputs a little off the
verifier's. speculators 0.9.0 carries no such transform (its earlier releases had `AddGaussianNoise` and
`AddUniformNoise` in `train/data.py`), so draftlab adds one here, for its own loop only (`launch.torchrun_command`
refuses it). The noise is Gaussian, on the draft's input states only (`hidden_states`, never the states its targets
come from), each layer's slice scaled to that slice's own RMS per token, because a verifier's layers differ in
scale by orders of magnitude. It is drawn from a generator seeded by (seed, step), so a resumed run adds the same
noise as a straight one.
"""

from __future__ import annotations

import torch


def noised(batch: dict, level: float, seed: int, step: int, device=None) -> dict:
    """`batch` with N(0, (level * rms)^2) added to each layer's slice of `hidden_states` (`level` 0: `batch` itself),
    on `device` (the draft's: the noise is drawn where it trains). The slices are the verifier's hidden size wide
    (`verifier_last_hidden_states`' width)."""
    if not level:
        return batch
    x = batch["hidden_states"].to(device or batch["hidden_states"].device)
    width = batch["verifier_last_hidden_states"].shape[-1] if "verifier_last_hidden_states" in batch else x.shape[-1]
    slices = x.float().reshape(*x.shape[:-1], x.shape[-1] // width, width)
    g = torch.Generator(device=x.device).manual_seed(seed * 1_000_003 + step)
    noise = torch.randn(slices.shape, generator=g, device=x.device) * slices.pow(2).mean(-1, keepdim=True).sqrt()
    return {**batch, "hidden_states": (slices + level * noise).reshape(x.shape).to(x.dtype)}
