"""Batches for training, through speculators' own data pipeline, in an order a resume can replay.

Rows come from speculators' `ArrowDataset` (stage-01 folders), are grouped into packs of at most
`pack_len` tokens by its `MultipackDistributedBatchSamplerV2` (one replica) and packed by its
`CollateFn` (`collate`, which every stage that packs rows calls); EAGLE-3 gets speculators'
`shift_batch`, as `speculators train` applies it. The sampler's order is a pure function of (seed,
epoch), so the batch of global step *s* is found by walking the epochs' batch counts: a resume needs
only the step number, no iterator state. The pack length is `masks.packing.pack_length`'s: the flex
BlockMask of EAGLE-3 only fits whole flex blocks.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.data import manifest
from draftlab.data.packing import collate, rows
from draftlab.drafts.recipe import recipe
from draftlab.masks.packing import pack_length
from draftlab.training.loaders import prefetch


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


def stored_rows(ds, folder: Path) -> int:
    """How many of the split's rows stage 01 stored states for (all of them offline; online, the first ones)."""
    return min(len(ds), (manifest.read(folder) or {}).get("num_samples", len(ds)))


def require_states(ds, folder: Path) -> None:
    """Training offline reads every row's states from stage 01's files: refuse a split 01 extracted online (the
    first rows only, for notebooks 02-04), which speculators would meet as a missing file mid-epoch."""
    n = stored_rows(ds, folder)
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
        if stored_rows(ds, folder) == len(ds):
            return ds
    return open_split(draft, folder, pack_len, online)


def read_rows(ds, indices, requests: int = 1) -> list:
    """The rows of one pack, in order. Online each row is a request to vLLM that waits for its states; asked one
    at a time, each reader keeps one request in flight and the server idles between them (BENCHMARKS.md, "Online
    hidden states"), so up to `requests` rows of a pack are asked at once from threads (vLLM batches what is in
    flight). The first row is read alone: it sets up speculators' client. A row speculators gave up on ends the read
    (`Packs.batch` refuses the pack): each other row would wait out the same retries."""
    from concurrent.futures import ThreadPoolExecutor

    idx = [int(i) for i in indices]
    if not idx:
        return []
    first = ds[idx[0]]
    if not isinstance(first, dict):  # speculators gave up on it (its retries spent): the others would wait as long
        return [first]
    if requests < 2 or len(idx) < 2 or getattr(ds, "on_missing", None) != "generate":
        rows = [first]
        for i in idx[1:]:
            rows.append(ds[i])
            if not isinstance(rows[-1], dict):
                break
        return rows
    with ThreadPoolExecutor(min(requests, len(idx) - 1)) as pool:
        return [first, *pool.map(ds.__getitem__, idx[1:])]


class Packs:
    """Packs of one split in speculators' order: `indices(step)` for training, `all()` for eval."""

    def __init__(self, draft, ds, pack_len: int, seed: int, requests: int = 1, online=None):
        from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

        self.ds, self.seed, self.requests, self.online = ds, seed, requests, online
        self.length, self.why = pack_length(pack_len, draft.kind, draft.attention)
        self.sampler = MultipackDistributedBatchSamplerV2(
            self.length, ds.approx_lengths, num_replicas=1, rank=0, seed=seed
        )
        # (hidden size, aux layers, dtype, EAGLE-3's shift) for `collate`
        self.shape = (
            draft.verifier.hidden_size,
            len(draft.model.target_layer_ids),
            draft.dtype,
            recipe(draft.kind).shift,
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
        """One pack, collated; refused where a row has no hidden states (speculators gives up on a row after its
        retries, or finds its stored states made for other tokens) rather than trained or evaluated on without it."""
        from speculators.train.recovery import SampleUnavailable

        hidden, n_layers, dtype, shift = self.shape
        if self.online is not None:
            self.online.check()
        rows = read_rows(self.ds, indices, self.requests)
        missing = [r for r in rows if isinstance(r, SampleUnavailable)]
        if missing:
            raise DraftlabError(
                f"a pack of {len(indices)} rows has {'a row' if len(missing) == 1 else f'{len(missing)} rows'} "
                f"without hidden states ({missing[0].reason[:400]}): no step is taken on such a pack."
            )
        return collate(rows, self.length, hidden, n_layers, dtype, shift)

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
            prefetch_factor=prefetch(workers),
            generator=torch.Generator().manual_seed(self.seed),
        )

    def all(self, limit: int | None = None):
        """Every pack of epoch 0 (a fixed order, so evaluations are comparable), at most `limit`."""
        for indices in self.epoch(0)[:limit]:
            yield self.batch(indices)
