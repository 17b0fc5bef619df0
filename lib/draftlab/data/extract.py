"""Hidden-state extraction written as speculators' training data, resumable; the states are read by `hooks.py`.

Layer ids follow vLLM's numbering, which is what the draft will be fed when served: id `i` is the
residual stream *entering* decoder layer `i` (the pre-norm output of layer `i-1`; id 0 is what
enters the first layer: the embedding output, with any scaling or positions the family adds). The
last slot is always id `L`, the last layer's pre-norm output, which speculators turns into verifier
logits with the verifier's own norm and lm_head. Each sample becomes `hidden_states/hs_{i}.safetensors`
with `token_ids [T]` and `hidden_states [T, n_aux+1, H]`.
"""

from __future__ import annotations

import numbers
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from draftlab import DraftlabError
from draftlab.data import manifest
from draftlab.data.hooks import hidden_states
from draftlab.data.verifier import check_token_ids
from draftlab.families import family
from draftlab.progress import progress_bar
from draftlab.writes import room_for, writing

ROOM_FIXES = (
    "free space there, set DRAFTLAB_HOME on a larger disk, train with `hidden_states: online` (04 has vLLM make the "
    "train states as it reads them, none kept), or extract fewer rows (fewer prompts, `extra_samples: 0`)."
)

FORMAT = "draftlab-hidden-states/1"


def default_layer_ids(num_layers: int, kind: str = "eagle3", n: int = 5) -> list[int]:
    """The aux layers family `kind` reads by default (`families.Family.default_layer_ids`), checked."""
    return validate_layer_ids(family(kind).default_layer_ids(num_layers, n), num_layers, default=True)


def validate_layer_ids(ids, num_layers: int, default: bool = False) -> list[int]:
    """Sorted whole-number ids, each a layer of the verifier; anything else refused (int() would turn 2.7 into 2)."""
    listed = hasattr(ids, "__iter__") and not isinstance(ids, (str, bytes))
    ids = list(ids) if listed else ids  # read once (a generator) for the check and the ids
    odd = [i for i in ids if isinstance(i, bool) or not isinstance(i, numbers.Integral)] if listed else [ids]
    if odd:
        raise DraftlabError(
            f"layer_ids={ids!r}: aux layer ids are a list of whole numbers (ints), and {odd[0]!r} is a "
            f"{type(odd[0]).__name__}; write them as ints, e.g. layer_ids=[2, {num_layers // 2}, {num_layers - 3}]."
        )
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad or not ids or len(set(ids)) != len(ids):
        why = f"ids {bad} out of range" if bad else "ids must be distinct and non-empty"
        fix = "pass layer_ids explicitly" if default else f"use distinct ids in [0, {num_layers - 1}]"
        raise DraftlabError(
            f"aux layer ids {ids} are invalid for a verifier with {num_layers} layers: {why}; {fix}. "
            f"(Id i is the state entering decoder layer i, vLLM's numbering; the final state, id "
            f"{num_layers}, is always stored as the last slot.)"
        )
    return sorted(ids)


def _to_host(states: list[torch.Tensor]) -> tuple[list[torch.Tensor], object]:
    """Start one asynchronous device-to-host copy of a batch into pinned memory; the writers wait
    on the returned event, so the GPU runs the next forward while the copy and the writes proceed."""
    if states[0].device.type != "cuda":
        return states, None
    base = states[0]._base if states[0]._base is not None else states[0]
    host = torch.empty(base.shape, dtype=base.dtype, pin_memory=True)
    host.copy_(base, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return [host[b, : len(s)] for b, s in enumerate(states)], event


@dataclass
class ExtractStats:
    samples: int
    written: int
    reused: int
    redone: int
    tokens_written: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_written / self.seconds if self.seconds else float("nan")


SOURCES = ("offline", "online")  # where training's hidden states come from (the profile key hidden_states)
PREVIEW_ROWS = 256  # train rows whose states stage 01 keeps when training makes its own online (notebooks 02-04)


def check_source(mode: str) -> str:
    if mode not in SOURCES:
        raise DraftlabError(
            f"hidden_states={mode!r}: use 'offline' (stage 01 writes every row's states) or 'online' (a vLLM "
            "extraction server makes them while the draft trains; stage 01 keeps only the first rows')."
        )
    return mode


def rows_to_store(mode: str, split: str) -> int | None:
    """How many rows of `split` stage 01 extracts: all of them (None), or, online, the first PREVIEW_ROWS of train
    (for the packs notebooks 02-04 draw and check); eval is always whole (held-out evaluation and notebook 05)."""
    return PREVIEW_ROWS if check_source(mode) == "online" and split == "train" else None


def kept_line(mode: str, rows: dict[str, int], keep: dict[str, int | None]) -> str:
    """One line for notebook 01: which rows' states are written here, and why."""
    if mode == "offline":
        return "hidden_states: offline: every row's states are written here; stage 04 reads them."
    kept = ", ".join(f"{s} {min(rows[s], keep[s] or rows[s])} of {rows[s]}" for s in rows)
    return f"hidden_states: online: stage 04 makes the train rows' states through vLLM as it trains; kept here: {kept}."


def extract(
    verifier,
    dataset,
    out_dir: Path,
    layer_ids: list[int],
    batch_size: int = 8,
    max_samples: int | None = None,
    progress: bool = True,
    writers: int | None = None,
) -> ExtractStats:
    """Fill `out_dir/hidden_states/` for every row of a speculators Arrow dataset; resumable.

    Interrupt it at any point and run it again: files already sound are kept, half-written,
    corrupt or stale ones (rows whose tokens changed) are redone, extras are removed.
    """
    from speculators.data_generation.offline import (
        find_corrupt_hidden_state_indices,
        get_existing_hidden_state_indices,
    )

    layer_ids = validate_layer_ids(layer_ids, verifier.num_layers)
    out_dir = Path(out_dir)
    hs_dir = out_dir / "hidden_states"
    with writing(hs_dir, "the hidden-state folder"):
        hs_dir.mkdir(parents=True, exist_ok=True)
    identity = {
        "verifier_fingerprint": verifier.fingerprint,
        "layer_ids": layer_ids,
        "dtype": str(verifier.dtype).removeprefix("torch."),
        "hidden_size": verifier.hidden_size,
    }
    old = manifest.check_identity(out_dir, identity) or {}
    n = len(dataset) if max_samples is None else min(max_samples, len(dataset))
    if n == 0:
        raise DraftlabError(f"{out_dir}: the dataset has no rows to extract; build it with prompts first.")
    rows = dataset.with_format(None)["input_ids"][:n]
    check_token_ids(
        verifier,
        dict(enumerate(rows)),
        f"the rows of {out_dir}",
        "they were tokenised for another verifier or edited: re-run notebook 01 for this dataset_name with this "
        "verifier (it rewrites rows that changed), or use another dataset_name.",
    )
    n_slots = len(layer_ids) + 1

    with writing(hs_dir, "removing temporary files an interrupted extraction left"):
        for tmp in hs_dir.glob("*.tmp"):
            tmp.unlink()
    existing = get_existing_hidden_state_indices(hs_dir)
    for i in [i for i in existing if i >= n]:
        (hs_dir / f"hs_{i}.safetensors").unlink()
    corrupt = find_corrupt_hidden_state_indices(hs_dir, [i for i in existing if i < n])
    files: dict[str, dict] = {}
    redone = 0
    for i in existing:
        if i >= n:
            continue
        entry = (
            None
            if i in corrupt
            else manifest.sound_entry(
                hs_dir / f"hs_{i}.safetensors", old.get("files", {}).get(str(i)), rows[i], n_slots, verifier.hidden_size
            )
        )
        if entry is None:
            (hs_dir / f"hs_{i}.safetensors").unlink(missing_ok=True)
            redone += 1
        else:
            files[str(i)] = entry
    reused = len(files)
    todo = sorted((i for i in range(n) if str(i) not in files), key=lambda i: len(rows[i]))
    if todo:  # states that cannot fit, refused before the first forward (a finished split resumes on a full disk)
        tokens = sum(len(rows[i]) for i in todo)  # each writes every slot's state and its id: 4.6 GB a million (bf16)
        need = tokens * (n_slots * verifier.hidden_size * verifier.dtype.itemsize + 8)
        room_for(hs_dir, need, f"{out_dir}: the {len(todo)} rows still to extract ({tokens:,} tokens)", ROOM_FIXES)

    state = {
        "format": FORMAT,
        **identity,
        "verifier_path": str(verifier.path),
        "num_layers": verifier.num_layers,
        "slots": [*layer_ids, verifier.num_layers],
        "layer_numbering": "vLLM: id i = state entering decoder layer i; last slot = final pre-norm state",
        "num_samples": n,
        "files": files,
    }
    t0 = time.perf_counter()
    written_tokens, last_save = 0, t0
    # File writes (serialise, hash, write) run on a pool while the next forward runs; hashlib and
    # file I/O release the GIL. At most two batches are in flight, so memory stays bounded.
    pool = ThreadPoolExecutor(max_workers=writers or min(8, os.cpu_count() or 1))
    pending: list = []

    def write(i, hs, event):
        if event is not None:
            event.synchronize()
        return i, manifest.write_sample(hs_dir / f"hs_{i}.safetensors", rows[i], hs)

    try:
        with progress_bar(total=len(todo), desc="Extracting hidden states", unit="sample", disable=not progress) as bar:
            for start in range(0, len(todo), batch_size):
                idx = todo[start : start + batch_size]
                states, event = _to_host(hidden_states(verifier, [rows[i] for i in idx], layer_ids))
                while len(pending) > batch_size:  # keep at most two batches in flight
                    i, entry = pending.pop(0).result()
                    files[str(i)] = entry
                pending += [pool.submit(write, i, hs, event) for i, hs in zip(idx, states, strict=True)]
                written_tokens += sum(len(rows[i]) for i in idx)
                bar.update(len(idx))
                if time.perf_counter() - last_save > 10:
                    manifest.write(out_dir, state)
                    last_save = time.perf_counter()
            for f in pending:
                i, entry = f.result()
                files[str(i)] = entry
            pending = []
    finally:
        pool.shutdown(wait=True)
        for f in pending:  # keep what was written before an interruption
            if f.exception() is None:
                i, entry = f.result()
                files[str(i)] = entry
        state["num_tokens"] = sum(e["tokens"] for e in files.values())
        state["complete"] = len(files) == n
        manifest.write(out_dir, state)
    return ExtractStats(n, len(todo), reused, redone, written_tokens, time.perf_counter() - t0)


def load_sample(out_dir: Path, i: int) -> dict[str, torch.Tensor]:
    return load_file(Path(out_dir) / "hidden_states" / f"hs_{i}.safetensors")
