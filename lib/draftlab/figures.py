"""Saving the notebooks' figures: every plot function returns its Figure, and the notebook (or a
runner) decides where it goes; `save` writes it in the one format all of them share."""

from __future__ import annotations

from pathlib import Path


def save(fig, folder: Path, name: str):
    """Writes `fig` as `folder/<name>.png` (110 dpi, trimmed to its content), creating `folder`; returns `fig`."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    fig.savefig(Path(folder) / f"{name}.png", dpi=110, bbox_inches="tight")
    return fig
