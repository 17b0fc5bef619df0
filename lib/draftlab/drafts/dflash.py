"""DFlash at stages 03-04: the block layout as speculators trains it (qwen3 layers, anchors, ce loss)."""

from draftlab.drafts.recipe import Block

RECIPE = Block("dflash")
