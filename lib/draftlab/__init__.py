"""draftlab: a workbench for speculative-decoding draft models on top of `speculators`."""

__version__ = "0.1.0"


class DraftlabError(ValueError):
    """Bad input or state, caught before it reaches torch; the message names the fix."""
