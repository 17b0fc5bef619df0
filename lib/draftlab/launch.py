"""Several GPUs: the same run through `speculators train` under torchrun, configured from draftlab's
settings. draftlab does not train distributed itself; this writes the command line.

Differences from draftlab's loop, stated rather than hidden: speculators splits one data folder
into train/validation by `--train-data-ratio` (draftlab's separate eval folder is not used),
clips gradients at 1.0 (fixed in its trainer), and saves `save_path/<epoch>/` checkpoints
(its own resume format), not draftlab's `checkpoints/step-N/` + `final/`.
"""

from __future__ import annotations

import math
import shlex
from importlib.metadata import version
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab import draft_checks as checks
from draftlab.attention import FLEX


def speculators_flags(draft, data: Path, settings, save_path: Path, packs_per_epoch: int, nproc: int,
                      train_data_ratio: float = 0.9, num_workers: int = 4) -> list[str]:
    """`speculators train` flags (checked against its own parser in the tests)."""
    s, cfg = settings, draft.train_config.flatten()
    train = Path(data) / "train"
    n = cfg["draft_vocab_size"]
    loss, _ = checks.pick_loss("cuda", True, torch.__version__, version("speculators"))
    T, _ = checks.pack_length(s.pack_len, draft.kind, FLEX)
    steps_per_epoch = max(1, math.floor(packs_per_epoch * train_data_ratio / nproc))
    flags = {
        "speculator-type": draft.kind, "verifier-name-or-path": cfg["verifier_name_or_path"],
        "data-path": train, "on-missing": "raise", "hidden-states-dtype": "bfloat16", "total-seq-len": T,
        "train-data-ratio": train_data_ratio, "num-workers": num_workers,
        "target-layer-ids": cfg["target_layer_ids"], "num-layers": cfg["num_layers"], "draft-vocab-size": n,
        "draft-attn-impl": FLEX, "loss-implementation": loss,
        "optimizer": "adamw", "lr": s.learning_rate, "weight-decay": s.weight_decay,
        "scheduler-type": "cosine", "scheduler-warmup-steps": s.warmup_steps, "scheduler-total-steps": s.steps,
        "max-steps": s.steps, "epochs": math.ceil(s.steps / steps_per_epoch), "seed": s.seed, "save-path": save_path,
    }
    if (train / f"d2t-{n}.npy").exists():
        flags.update({"d2t-path": train / f"d2t-{n}.npy", "t2d-path": train / f"t2d-{n}.npy"})
    if draft.kind == "eagle3":
        flags.update({"ttt-steps": s.ttt_steps, "ttt-step-loss-decay": s.ttt_step_loss_decay})
    else:
        flags.update({"block-size": cfg["block_size"], "max-anchors": s.n_anchors, "mask-token-id": cfg["mask_token_id"]})
    out = []
    for key, value in flags.items():
        out += [f"--{key}", *map(str, value)] if isinstance(value, list) else [f"--{key}", str(value)]
    return out


def torchrun_command(draft, data: Path, settings, nproc: int, save_path: Path | None = None, packs_per_epoch: int | None = None) -> list[str]:
    """`torchrun --standalone --nproc-per-node N -m speculators.train <flags>` for this draft and data.

    Run it on the GPU host from the repository root; checkpoints go to `save_path` (default
    `<data>/drafts/<kind>/speculators`). `packs_per_epoch` (for `--epochs`) defaults to the count
    draftlab's sampler gives for the train split."""
    if nproc < 1:
        raise DraftlabError(f"nproc={nproc}: need at least one GPU process.")
    if packs_per_epoch is None:
        from draftlab.train_data import Packs, open_split

        packs_per_epoch = len(Packs(draft, open_split(draft, Path(data) / "train", settings.pack_len), settings.pack_len, settings.seed).epoch(0))
    save_path = Path(save_path or Path(data) / "drafts" / draft.kind / "speculators")
    flags = speculators_flags(draft, data, settings, save_path, packs_per_epoch, nproc)
    return ["torchrun", "--standalone", f"--nproc-per-node={nproc}", "-m", "speculators.train", *flags]


def as_shell(command: list[str]) -> str:
    return shlex.join(command)
