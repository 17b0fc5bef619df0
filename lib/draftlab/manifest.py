"""The manifest beside extracted hidden states: what made them, and a checksum per file.

It is what lets a folder refuse data from another verifier or layer set (naming the field that
differs) and lets an interrupted extraction resume without trusting a half-written file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from draftlab import DraftlabError

NAME = "manifest.json"
# Fields that must agree before data in a folder may be reused or extended.
IDENTITY = ("verifier_fingerprint", "layer_ids", "dtype", "hidden_size")


def read(folder: Path) -> dict | None:
    path = Path(folder) / NAME
    return json.loads(path.read_text()) if path.exists() else None


def write(folder: Path, manifest: dict) -> None:
    path = Path(folder) / NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, path)


def check_identity(folder: Path, expected: dict) -> dict | None:
    """Refuse a folder made by another verifier, layer set, dtype or hidden size."""
    found = read(folder)
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
