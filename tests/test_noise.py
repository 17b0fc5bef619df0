"""Issue 51's noise lever (`state_noise`, training.noise): each layer's slice of the draft's input states gets noise of
`level` times its own RMS, drawn from (seed, step); the states the targets come from are untouched. Training with it:
tests/test_train.py."""

from __future__ import annotations

import torch

from draftlab.training.noise import noised


def test_noise_is_the_level_asked_in_every_layer_drawn_from_seed_and_step_and_leaves_the_targets():
    scale = torch.tensor([1.0, 100.0, 0.01]).repeat_interleave(64)  # three layers of very different scale
    batch = {"hidden_states": torch.randn(1, 500, 192) * scale, "verifier_last_hidden_states": torch.randn(1, 500, 64)}
    a, b = noised(batch, 0.1, 0, 7), noised(batch, 0.1, 0, 7)
    assert torch.equal(a["hidden_states"], b["hidden_states"])
    assert a["verifier_last_hidden_states"] is batch["verifier_last_hidden_states"]
    assert not torch.equal(a["hidden_states"], noised(batch, 0.1, 0, 8)["hidden_states"])
    added = (a["hidden_states"] - batch["hidden_states"]).reshape(1, 500, 3, 64)
    rms = batch["hidden_states"].reshape(1, 500, 3, 64).pow(2).mean(-1).sqrt()
    ratio = added.pow(2).mean(-1).sqrt() / rms  # per token and layer: about 0.1 whatever the layer's scale
    assert 0.08 < ratio.median() < 0.12 and ratio.reshape(-1, 3).median(0).values.sub(0.1).abs().max() < 0.02
    assert noised(batch, 0.0, 0, 7) is batch
