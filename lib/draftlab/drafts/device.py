"""What the device a draft trains on decides: a compiled forward, the loss kernel, how evaluation runs
(how many processes read packs ahead is `training.loaders`).

Each decision takes plain facts (device, whether speculators compiles the forward, torch version,
core count) so it can be unit-tested on a CPU machine; the GPU failures they steer around were seen
on the lent H200 and cannot be reproduced here.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from draftlab import DraftlabError

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
    is a second graph to compile per draft (BENCHMARKS.md, "Draft training quality"). Only a draft without dropout
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
