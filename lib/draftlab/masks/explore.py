"""Interactive mask explorer for JupyterLab: sliders redraw the EAGLE-3 and DFlash masks."""

from __future__ import annotations

import matplotlib.pyplot as plt

from draftlab.masks.common import document_lengths, synthetic_pack
from draftlab.masks.dflash import dflash_mask
from draftlab.masks.eagle3 import eagle3_mask
from draftlab.masks.plots import mask_figure
from draftlab.progress import headless


def draw(seq_len: int, docs: int, block_size: int, n_anchors: int, ttt_step: int, flex_block: int = 128):
    """Both masks for one setting of the sliders: [(view, figure)] for EAGLE-3 then DFlash."""
    pack = synthetic_pack(document_lengths(seq_len, docs), seq_len)
    views = [
        eagle3_mask(pack["document_ids"], ttt_step, flex_block),
        dflash_mask(pack["document_ids"], pack["loss_mask"], n_anchors, block_size, flex_block),
    ]
    return [(v, mask_figure(v)) for v in views]


def mask_explorer(seq_len=512, docs=3, block_size=8, n_anchors=8, ttt_step=2, flex_block=128):
    """Sliders for sequence length, documents per pack, block size, anchors and TTT step; None, with
    a note, in a headless run, where nothing could move them and a widget can stall nbclient
    (jupyter/nbclient#312)."""
    if headless():
        print("headless run (draftlab run / papermill): no live sliders; open this notebook in JupyterLab for them.")
        return None
    import ipywidgets as w
    from IPython.display import display

    sliders = {
        "seq_len": w.IntSlider(seq_len, min=128, max=1024, step=128, description="seq length"),
        "docs": w.IntSlider(docs, min=1, max=8, description="docs / pack"),
        "block_size": w.IntSlider(block_size, min=2, max=16, description="block size"),
        "n_anchors": w.IntSlider(n_anchors, min=1, max=32, description="anchors"),
        "ttt_step": w.IntSlider(ttt_step, min=0, max=3, description="TTT step"),
    }
    out = w.Output()

    def redraw(_change=None):
        with out:
            out.clear_output(wait=True)
            for view, fig in draw(**{k: s.value for k, s in sliders.items()}, flex_block=flex_block):
                display(fig)
                plt.close(fig)
                print(view.arithmetic)

    for s in sliders.values():
        s.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox(list(sliders.values())[:3]), w.HBox(list(sliders.values())[3:]), out])
