"""Stage 02 (notebook 02): the attention masks drafts train with, built by speculators' mask functions.

Takes packed document ids (synthetic or from stage 01's data); gives each mask as a dense and a
block view, checked against references written independently of speculators, and drawn as heatmaps.
One module per mask family, `eagle3` and `dflash` (`generate_*` mask_mod factories, the builders,
and a `main()` that draws the mask: `python -m draftlab.masks.eagle3`); `common` holds what they
share (MaskView, packs), `checks`, `plots` and `explore` work on the views they return.
"""
