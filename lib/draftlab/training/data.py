"""Batches for training, through speculators' own data pipeline, in an order a resume can replay.

Rows come from speculators' `ArrowDataset` (stage-01 folders), are grouped into packs of at most
`pack_len` tokens by its `MultipackDistributedBatchSamplerV2` (one replica) and packed by its
`CollateFn` (`collate`, which every stage that packs rows calls); EAGLE-3 gets speculators'
`shift_batch`, as `speculators train` applies it. The sampler's order is a pure function of (seed,
epoch), so the batch of global step *s* is found by walking the epochs' batch counts: a resume needs
only the step number, no iterator state. The pack length is decided here too (`pack_length`): the
flex BlockMask of EAGLE-3 only fits whole flex blocks.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask

from draftlab import DraftlabError
from draftlab.data import manifest
from draftlab.training.attention import FLEX

# The block speculators' BlockMasks are built with: it calls create_block_mask without BLOCK_SIZE,
# so torch's default for that parameter (torch keeps the constant itself private).
FLEX_BLOCK = inspect.signature(create_block_mask).parameters["BLOCK_SIZE"].default


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


def open_split(draft, folder: Path, pack_len: int, online=None):
    """speculators' ArrowDataset for one stage-01 split, after checking it belongs to this draft; `online`: the
    states come from that server (`rows`), and stage 01's files, if any, are not read."""
    folder = Path(folder)
    man = manifest.read(folder)
    if man is None:
        raise DraftlabError(
            f"{folder} has no manifest.json; run stage 01 (notebook "
            f"01) to write data/runs/<dataset_name>/{folder.name}."
        )
    v = draft.verifier
    for key, want in (
        ("verifier_fingerprint", v.fingerprint),
        ("hidden_size", v.hidden_size),
        ("layer_ids", list(draft.model.target_layer_ids)),
    ):
        if man.get(key) != want:
            raise DraftlabError(
                f"{folder} does not match the draft: manifest field {key!r} "
                f"is {man.get(key)!r} there but {want!r} for the draft "
                f"(verifier {v.path}); train on data extracted from this verifier, "
                f"or build the draft from {man.get('verifier_path')!r}."
            )
    if not man.get("complete", True):
        raise DraftlabError(
            f"{folder}: stage-01 extraction did not finish (manifest complete=false); re-run notebook 01, it resumes."
        )
    state = folder / "state.json"
    if state.exists() and not json.loads(state.read_text()).get("_data_files"):
        raise DraftlabError(
            f"{folder} holds no rows; nothing to train on. Re-run stage 01 with more prompts (n_chat / n_code)."
        )
    ds = rows(folder, pack_len, draft.dtype, online)
    if len(ds) == 0:
        raise DraftlabError(
            f"{folder} holds no rows; nothing to train on. Re-run stage 01 with more prompts (n_chat / n_code)."
        )
    if online is None:
        manifest.verify_files(folder)  # before speculators reads a cut or altered file deep in its loader
    shortest = min(ds.approx_lengths)
    if shortest > pack_len:
        raise DraftlabError(
            f"pack_len={pack_len} is shorter than every sample in {folder} "
            f"(shortest {shortest} tokens): each pack would be one "
            f"truncated row. Raise pack_len to at least {shortest}, or re-run stage 01 with max_length <= {pack_len}."
        )
    return ds


def require_states(ds, folder: Path) -> None:
    """Training offline reads every row's states from stage 01's files: refuse a split 01 extracted online (the
    first rows only, for notebooks 02-04), which speculators would meet as a missing file mid-epoch."""
    n = (manifest.read(folder) or {}).get("num_samples", len(ds))
    if n < len(ds):
        raise DraftlabError(
            f"{folder} holds hidden states for its first {n} of {len(ds)} rows only (stage 01 ran with "
            "hidden_states: online, keeping those for notebooks 02-04): train with hidden_states: online, or "
            "re-run notebook 01 with hidden_states: offline to write them all."
        )


def open_eval(draft, folder: Path, pack_len: int, online=None):
    """The held-out split, read from stage 01's files wherever they hold every row (01 keeps eval whole in either
    mode, `extract.rows_to_store`), else through `online`. Evaluation reads the same packs at every evaluation, so
    making their states again each time buys nothing: on the H200 an online evaluation of the gpu profile's 1,214
    eval rows took 140-150 s against a 0.05 s training step (BENCHMARKS.md, "Online hidden states")."""
    if online is not None:
        ds = open_split(draft, folder, pack_len)
        try:
            require_states(ds, folder)
            return ds
        except DraftlabError:
            pass
    return open_split(draft, folder, pack_len, online)


class Packs:
    """Packs of one split in speculators' order: `indices(step)` for training, `all()` for eval."""

    def __init__(self, draft, ds, pack_len: int, seed: int):
        from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

        self.ds, self.seed = ds, seed
        self.length, self.why = pack_length(pack_len, draft.kind, draft.attention)
        self.sampler = MultipackDistributedBatchSamplerV2(
            self.length, ds.approx_lengths, num_replicas=1, rank=0, seed=seed
        )
        # (hidden size, aux layers, dtype, EAGLE-3's shift) for `collate`
        self.shape = (
            draft.verifier.hidden_size,
            len(draft.model.target_layer_ids),
            draft.dtype,
            draft.kind == "eagle3",
        )
        self._epochs: dict[int, list] = {}

    def epoch(self, epoch: int) -> list:
        if epoch not in self._epochs:
            self.sampler.set_epoch(epoch)
            self._epochs[epoch] = list(self.sampler)
        return self._epochs[epoch]

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, index within epoch) of the pack used by global step `step` (0-based)."""
        epoch = 0
        while step >= (n := len(self.epoch(epoch))):
            step -= n
            epoch += 1
        return epoch, step

    def batch(self, indices) -> dict:
        hidden, n_layers, dtype, shift = self.shape
        return collate([self.ds[int(i)] for i in indices], self.length, hidden, n_layers, dtype, shift)

    def at(self, step: int) -> tuple[dict, tuple[int, int]]:
        epoch, k = self.position(step)
        return self.batch(self.epoch(epoch)[k]), (epoch, k)

    def stream(self, start: int, end: int, workers: int = 0):
        """(batch, position) for global steps start..end-1, in order. With `workers` > 0 they are read
        and collated ahead by that many processes (torch's DataLoader; the order is still `at`'s)."""
        if workers == 0 or end <= start:
            yield from (self.at(s) for s in range(start, end))
            return
        from torch.utils.data import DataLoader

        self.position(end - 1)  # walk the epochs here, once, not in every worker
        # The steps themselves are the dataset and `at` the collate, run in the workers. Its own
        # generator: starting workers would otherwise draw from the global RNG, and shift DFlash's
        # random anchors away from those of an in-process run.
        yield from DataLoader(
            range(start, end),
            batch_size=None,
            collate_fn=self.at,
            num_workers=workers,
            prefetch_factor=4,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def all(self, limit: int | None = None):
        """Every pack of epoch 0 (a fixed order, so evaluations are comparable), at most `limit`."""
        for indices in self.epoch(0)[:limit]:
            yield self.batch(indices)


def tokens(batch: dict) -> int:
    return int((batch["document_ids"] != -1).sum())


def supervised(batch: dict) -> int:
    return int(torch.as_tensor(batch["loss_mask"]).sum())


def pack_length(max_len: int, kind: str, attn_impl: str) -> tuple[int, str]:
    """The length to pack batches to, and why.

    EAGLE-3 under flex attention extends its BlockMask once per TTT step with
    `extend_mask_for_draft_tokens`, which rebuilds it from block counts: its lengths become whole
    multiples of the flex block (128). A pack of 8191 tokens then meets a mask made for 8192
    ("block_mask was created for a larger length"). Padding the pack to a multiple of the block
    makes both agree; the padded tail has document id -1 and no loss.
    """
    if kind == "eagle3" and attn_impl == FLEX and max_len % FLEX_BLOCK:
        padded = -(-max_len // FLEX_BLOCK) * FLEX_BLOCK
        return padded, f"EAGLE-3 + flex: {max_len} padded to {padded}, a multiple of the {FLEX_BLOCK}-token flex block"
    return (
        max_len,
        "no padding needed" if kind != "eagle3" or attn_impl != FLEX else f"already a multiple of {FLEX_BLOCK}",
    )


def check_pack(batch: dict, kind: str, attn_impl: str) -> None:
    n = batch["input_ids"].shape[1]
    want, _ = pack_length(n, kind, attn_impl)
    if want != n:
        raise DraftlabError(
            f"A pack of {n} tokens fails EAGLE-3 with flex attention (its extended BlockMask covers {want}); "
            f"collate with max_len={want} (draftlab.training.data.pack_length) or pad with pad_batch(batch, {want})."
        )


def pad_batch(batch: dict, length: int) -> dict:
    """Right-pad a packed [1, T, ...] batch to `length`: zeros, document id -1, no loss."""
    out = dict(batch)
    for key, t in batch.items():
        if not torch.is_tensor(t) or t.dim() < 2 or t.shape[1] >= length:
            continue
        fill = -1 if key == "document_ids" else 0
        pad = t.new_full((t.shape[0], length - t.shape[1], *t.shape[2:]), fill)
        if key == "position_ids":
            pad = torch.arange(t.shape[1], length, device=t.device, dtype=t.dtype).expand(t.shape[0], -1)
        out[key] = torch.cat([t, pad], dim=1)
    return out
