"""Draft vocabulary: token frequencies over loss-masked tokens, mapped by speculators.

The files are named as `speculators train` looks for them (`d2t-N.npy`, `t2d-N.npy` in the data
folder), so a CLI run on the same folder picks up the same mapping.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from draftlab import DraftlabError


def token_frequencies(dataset, folder: Path) -> dict[int, int]:
    """Counted by speculators over assistant tokens; recounted every time (its cache can go stale)."""
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    path = Path(folder) / "token_freq.pt"
    path.unlink(missing_ok=True)
    save_token_frequency_distribution(dataset, path)
    return torch.load(path, weights_only=True)


def build_mapping(freq: dict[int, int], draft_vocab_size: int, target_vocab_size: int, folder: Path):
    """d2t/t2d through speculators, saved beside the data; returns (d2t, t2d)."""
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    if draft_vocab_size > target_vocab_size:
        raise DraftlabError(
            f"draft_vocab_size={draft_vocab_size} exceeds the verifier's vocabulary ({target_vocab_size}); "
            "choose a smaller draft vocabulary."
        )
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size, target_vocab_size)
    np.save(Path(folder) / f"d2t-{draft_vocab_size}.npy", d2t.numpy())
    np.save(Path(folder) / f"t2d-{draft_vocab_size}.npy", t2d.numpy())
    return d2t, t2d


def coverage_curve(freq: dict[int, int]) -> np.ndarray:
    """Share of supervised target tokens covered by the k most frequent tokens, k = 1..len(freq)."""
    counts = np.sort(np.fromiter(freq.values(), dtype=np.int64))[::-1]
    return np.cumsum(counts) / counts.sum()


def coverage_at(freq: dict[int, int], k: int) -> float:
    curve = coverage_curve(freq)
    return float(curve[min(k, len(curve)) - 1])


def heldout_coverage(freq: dict[int, int], t2d: torch.Tensor) -> float:
    """Share of supervised tokens of another split (eval) that the draft vocabulary can emit."""
    total = sum(freq.values())
    inside = sum(c for t, c in freq.items() if bool(t2d[t]))
    return inside / total if total else float("nan")


def coverage_by_size(freq: dict[int, int], heldout: dict[int, int], sizes: list[int], target_vocab_size: int) -> list:
    """Per draft vocabulary size: the share of supervised tokens it can emit on the split it is chosen from (`freq`,
    its top-N) and on a held-out one, through speculators' mapping (built in a temporary folder: nothing is left
    beside the data). A token outside the draft vocabulary is never proposed, so the held-out share bounds every
    drafted position's acceptance: what a larger vocabulary can buy at most, before it is trained."""
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            _, t2d = build_mapping(freq, n, target_vocab_size, Path(tmp))
            train, held = coverage_at(freq, n), heldout_coverage(heldout, t2d)
            rows.append({"draft vocabulary": n, "train coverage": round(train, 4), "eval coverage": round(held, 4)})
    return rows
