"""Rows of a stage-01 split as speculators reads them, packed as speculators packs them.

`rows` is speculators' `ArrowDataset` over a split (states from stage 01's files, or made by vLLM as
each row is read); `collate` its `CollateFn`, which every stage that packs rows calls (01 checks the
shapes, 02 draws masks over a real pack, 03 runs its forward checks on one, 04 trains on them).
"""

from __future__ import annotations

from pathlib import Path

import torch


def rows(folder: Path, max_len: int, dtype: torch.dtype, online=None):
    """speculators' ArrowDataset over a stage-01 split: rows cut at `max_len` tokens, hidden states in `dtype`;
    with `online` (`training.online.Online`) each row's states come from vLLM as it is read, none from disk."""
    from speculators.train.data import ArrowDataset

    if online is None:
        return ArrowDataset(max_len=max_len, datapath=str(folder), on_missing="raise", hidden_states_dtype=dtype)
    from speculators.train.data import FileTransfer  # its default transfer (hs_connectors'), on another folder

    from draftlab.serving.command import SERVED_NAME

    return ArrowDataset(
        max_len=max_len,
        datapath=str(folder),
        transfer=FileTransfer(online.no_cache),
        vllm_endpoint=online.endpoint,
        on_missing="generate",
        hidden_states_dtype=dtype,
        model=SERVED_NAME,
    )


def collate(items: list, length: int, hidden_size: int, n_layers: int, dtype: torch.dtype, shift: bool = False) -> dict:
    """Rows of `rows` packed into one [1, length, ...] batch by speculators' CollateFn, as training packs
    them; `shift=True` first applies EAGLE-3's `shift_batch`, as `speculators train` does."""
    from speculators.train.data import CollateFn

    preprocess = None
    if shift:
        from speculators.models.eagle3.data import shift_batch as preprocess
    return CollateFn(length, hidden_size, n_layers, dtype, preprocess=preprocess)(items)
