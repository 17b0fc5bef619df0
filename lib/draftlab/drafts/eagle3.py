"""EAGLE-3 at stages 03-04: the chain layout as speculators trains it (1 llama layer, TTT steps, kl_div)."""

from draftlab.drafts.recipe import Chain

RECIPE = Chain("eagle3")
