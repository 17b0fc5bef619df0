"""Stage 02 (notebook 02): the attention masks drafts train with, built by speculators' mask functions.

Takes packed document ids (synthetic or from stage 01's data); gives each mask as a dense and a
block view, checked against references written independently of speculators, and drawn as heatmaps.
"""
