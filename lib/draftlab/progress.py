"""Progress bars (and widgets) that suit where the code runs.

In JupyterLab a bar is a widget. Headless (`draftlab run` sets DRAFTLAB_HEADLESS for its kernels)
it is plain text on stdout, redrawn every 30 s: papermill's log then shows the progress of long
cells instead of only a bar's first frame, and no widget comm can stall nbclient (jupyter/nbclient#312).
"""

from __future__ import annotations

import os
import sys

HEADLESS = "DRAFTLAB_HEADLESS"
# Kernels started by `draftlab run` inherit these: the libraries' own bars (weights loading,
# dataset maps) are switched off there, draftlab's text bars stay.
HEADLESS_ENV = {HEADLESS: "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


def headless() -> bool:
    """True in kernels started by `draftlab run`: nothing there can show or move a widget."""
    return os.environ.get(HEADLESS) == "1"


def progress_bar(*args, **kwargs):
    """tqdm.auto's bar, or a text bar on stdout when headless."""
    if headless():
        from tqdm.std import tqdm

        kwargs.setdefault("mininterval", 30.0)
        return tqdm(*args, file=sys.stdout, ascii=True, **kwargs)
    from tqdm.auto import tqdm

    return tqdm(*args, **kwargs)
