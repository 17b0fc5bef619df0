"""What notebook 03 shows of a built draft: its modules, the shapes through one forward, agreement.

Read-only views for the walk-through; building and checking drafts is `draftlab.draft`.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from draftlab.drafts.draft import Draft
from draftlab.drafts.recipe import recipe
from draftlab.masks.attention import eager_flex


def parameter_table(model: torch.nn.Module) -> list[dict]:
    """One row per top-level module: size, trainable or frozen, dtype, device."""
    rows = []
    for name, mod in model.named_children():
        ps = list(mod.parameters())
        if ps:
            train = {p.requires_grad for p in ps}
            rows.append(
                {
                    "module": name,
                    "params": sum(p.numel() for p in ps),
                    "trainable": "yes" if train == {True} else "no" if train == {False} else "partly",
                    "dtype": ", ".join(sorted({str(p.dtype).removeprefix("torch.") for p in ps})),
                    "device": str(ps[0].device),
                }
            )
    return rows


def first_agreement(draft: Draft, metrics: dict) -> float:
    """Share of supervised positions where the draft's first proposal is the verifier's argmax."""
    key = recipe(draft.kind).first_key
    return float(metrics[f"{key}_sum"] / metrics[f"{key}_total"].clamp(min=1))


@contextmanager
def one_off():
    """Forwards inside run eagerly. On CUDA speculators compiles the draft's forward; a forward run
    once or twice (this walk-through, a reload check) would spend tens of seconds compiling for
    nothing, and hooks see the modules as they run."""
    with torch.compiler.set_stance("force_eager"), eager_flex():
        yield


@torch.no_grad()
def forward_shapes(draft: Draft, batch: dict) -> tuple[tuple, list[dict]]:
    """The forward's result and the shape of every tensor entering it or leaving a top-level
    module (first call of each), in call order, for the notebook's walk through one batch."""
    rows = [
        {"tensor": f"batch.{k}", "shape": tuple(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        for k, t in batch.items()
        if torch.is_tensor(t)
    ]
    seen = set()

    def hook(name):
        def fn(_m, _i, out):
            t = out[0] if isinstance(out, tuple) else out
            if name not in seen and torch.is_tensor(t):
                seen.add(name)
                rows.append(
                    {"tensor": f"{name} output", "shape": tuple(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                )

        return fn

    mods = [
        (n, m)
        for n, m in draft.model.named_modules()
        if n and "." not in n.removeprefix("layers.") and not isinstance(m, torch.nn.ModuleList)
    ]
    handles = [m.register_forward_hook(hook(n)) for n, m in mods]
    try:
        with one_off():
            out = draft.forward(batch)
    finally:
        for h in handles:
            h.remove()
    return out, rows
