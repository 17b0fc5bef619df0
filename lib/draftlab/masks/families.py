"""Each draft family's masks over one pack, looked up by name: `masks/<family>.py`'s `views`, checked."""

from __future__ import annotations

from draftlab.families import stage_module
from draftlab.masks.checks import run_checks


def views(kind: str, pack: dict, cfg, device="cpu") -> list:
    """(file name, `MaskView`) of every mask family `kind` trains with over `pack` (notebook 02's figures)."""
    return stage_module("masks", kind).views(pack, cfg, device)


def checked(kind: str, pack: dict, cfg, device="cpu") -> tuple[list, list[dict]]:
    """`views`, and each one's checks against the family's intended semantics (`masks.checks.run_checks`)."""
    made = views(kind, pack, cfg, device)
    return made, [{"family": kind, "mask": v.name, **c} for _, v in made for c in run_checks(v, cfg.flex_block)]
