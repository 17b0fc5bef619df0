"""The manifest beside extracted hidden states: what made them, and a checksum per sample file.

It is what lets a folder refuse data from another verifier or layer set (naming the field that
differs) and lets an interrupted extraction resume without trusting a half-written file.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file
from safetensors.torch import save as st_save

from draftlab import DraftlabError
from draftlab.files import json_fault, read_cache
from draftlab.writes import write_atomic

NAME = "manifest.json"
# Fields that must agree before data in a folder may be reused or extended.
IDENTITY = ("verifier_fingerprint", "layer_ids", "dtype", "hidden_size")


def read(folder: Path, redo: bool = False) -> dict | None:
    """A split's manifest.json (None: there is none). Cut or edited, it is an error naming the fix; with
    `redo` (notebook 01 extracting into the split) a warning, and None: each hidden-state file is then
    checked against its row as if there were no manifest, the sound ones kept, the rest redone."""
    path = Path(folder) / NAME
    if not path.exists():
        return None
    found, fault = json_fault(path)
    missing = [k for k in IDENTITY if k not in found] if found is not None else []
    fault = fault or (f"it has no {missing[0]!r} field" if missing else None)
    if fault is None:
        return found
    if not redo:
        raise DraftlabError(
            f"{path} cannot be read: {fault}. Re-run notebook 01 for this dataset_name: it checks each "
            "hidden-state file against its row, keeps the sound ones, redoes the rest and writes the manifest again."
        )
    warnings.warn(
        f"{path} cannot be read ({fault}): each hidden-state file in {folder} is checked against its row "
        "instead; the sound ones are kept, the rest redone, and the manifest written again.",
        stacklevel=2,
    )
    return None


def write(folder: Path, manifest: dict) -> None:
    write_atomic(
        Path(folder) / NAME,
        json.dumps(manifest, indent=1, sort_keys=True),
        "the hidden states' manifest",
        kept="the manifest written before is kept, and so are the sample files; re-running notebook 01 resumes",
    )


def check_identity(folder: Path, expected: dict) -> dict | None:
    """Refuse a folder made by another verifier, layer set, dtype or hidden size."""
    found = read(folder, redo=True)
    if found is None:
        return None
    for key in IDENTITY:
        if key in expected and found.get(key) != expected[key]:
            raise DraftlabError(
                f"{folder} holds data from another run: manifest field {key!r} is {found.get(key)!r} there "
                f"but {expected[key]!r} now (verifier {found.get('verifier_path')!r}). Use another "
                "dataset_name, or delete that folder to start over."
            )
    return found


def ids_digest(ids) -> str:
    return hashlib.sha256(torch.as_tensor(ids, dtype=torch.long).numpy().tobytes()).hexdigest()[:16]


def write_sample(path: Path, token_ids, hs: torch.Tensor) -> dict:
    """One sample file in speculators' layout, written under a temporary name and renamed."""
    blob = st_save({"token_ids": torch.as_tensor(token_ids, dtype=torch.long), "hidden_states": hs.contiguous().cpu()})
    write_atomic(  # a file at its final name is always complete
        path,
        blob,
        "one sample's hidden states",
        kept="the samples already written are kept; re-running notebook 01 resumes from them",
    )
    return {
        "sha256": hashlib.sha256(blob).hexdigest(),
        "tokens": len(token_ids),
        "ids": ids_digest(token_ids),
        "bytes": len(blob),
    }


VERIFIED = (
    ".verified.json"  # sha256 already checked, per (file, size, mtime): a split is hashed once, not at every open
)


def verify_files(folder: Path) -> None:
    """Every sample file of a split against its manifest entry before training reads it: the size first
    (a cut file), then the sha256 (altered bytes), each file hashed once per size and mtime."""
    folder = Path(folder)
    files = (read(folder) or {}).get("files", {})
    cache_path = folder / VERIFIED
    cache = read_cache(cache_path)
    bad = []
    for i, entry in sorted(files.items(), key=lambda kv: int(kv[0])):
        f = folder / "hidden_states" / f"hs_{i}.safetensors"
        if not f.exists():
            bad.append((f, "it is missing"))
            continue
        st = f.stat()
        if "bytes" in entry and st.st_size != entry["bytes"]:
            bad.append(
                (f, f"it holds {st.st_size} bytes, the manifest says {entry['bytes']} (cut short or overwritten)")
            )
            continue
        key = f"{i}:{st.st_size}:{st.st_mtime_ns}"
        if cache.get(key) == entry["sha256"]:
            continue
        if hashlib.sha256(f.read_bytes()).hexdigest() != entry["sha256"]:
            bad.append((f, "its bytes differ from the manifest's sha256 (altered after extraction)"))
            continue
        cache[key] = entry["sha256"]
    write_atomic(cache_path, json.dumps(cache), "the record of sample files already hashed")
    if bad:
        raise DraftlabError(
            f"{folder}: {len(bad)} hidden-state file(s) do not match "
            f"manifest.json; the first, {bad[0][0]}: {bad[0][1]}. "
            "Re-run notebook 01 for this dataset_name: it keeps the sound files and redoes these."
        )


def sound_entry(path: Path, entry: dict | None, ids, n_slots: int, hidden: int) -> dict | None:
    """The manifest entry for a file already on disk if it is sound for this row, else None."""
    from speculators.data_generation.offline import check_hidden_states

    try:
        blob = path.read_bytes()
        digest = hashlib.sha256(blob).hexdigest()
        if entry is not None:
            return entry if entry["sha256"] == digest and entry["ids"] == ids_digest(ids) else None
        data = load_file(path)
        check_hidden_states(data, list(map(int, ids)))
        if tuple(data["hidden_states"].shape[1:]) != (n_slots, hidden):
            return None
        return {"sha256": digest, "tokens": len(ids), "ids": ids_digest(ids)}
    except Exception:  # noqa: BLE001 (any unreadable or mismatched file is redone)
        return None
