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


def drawn(kinds, pack: dict, cfg, folder, device="cpu") -> tuple[list, list[dict]]:
    """Notebook 02 for every family in `kinds`: each mask's figure (token view and BlockMask) saved under `folder`
    by its file name, and the checks of all of them; returns (the `MaskView`s in order, the checks)."""
    from draftlab.figures import save
    from draftlab.masks.plots import mask_figure

    made, checks = [], []
    for kind in kinds:
        views_of, found = checked(kind, pack, cfg, device)
        checks += found
        for name, view in views_of:
            save(mask_figure(view), folder, name)
            made.append(view)
    return made, checks
