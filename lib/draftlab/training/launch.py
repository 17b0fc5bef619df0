"""Several GPUs: the same run through `speculators train` under torchrun, configured from draftlab's
settings. draftlab does not train distributed itself; this writes the command line, and finds the
checkpoint it saved (`find_checkpoint`; `proposers.load_draft` takes the save folder as it is).
The flags, and how `speculators train` differs from draftlab's loop, are in `training.flags`.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

from draftlab import DraftlabError
from draftlab.files import json_fault, safetensors_fault
from draftlab.layout import dataset_and_folder
from draftlab.masks.attention import FLEX
from draftlab.masks.packing import pack_length
from draftlab.training.flags import NUM_WORKERS, epoch_steps, speculators_flags
from draftlab.training.settings import check_count, checked


def epochs_in(save_path: Path) -> list[int]:
    root = Path(save_path)
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir()) if root.is_dir() else []


def torchrun_command(
    draft,
    data,
    settings,
    nproc: int,
    save_path: Path | None = None,
    resume: bool = False,
    train_data_ratio: float = 0.9,
    num_workers: int = NUM_WORKERS,
    vllm_endpoint: str | None = None,
) -> list[str]:
    """`torchrun --standalone --nproc-per-node N -m speculators.train <flags>` for this draft and data
    (`settings.hidden_states="online"`: the states from `vllm_endpoint` as rows are read, `flags.speculators_flags`).

    `data` is a run's `RunLayout` (checkpoints go to its `speculators_save(kind)` unless `save_path` is
    given), or a stage-01 dataset folder with `save_path` given; a save path that already
    holds epoch folders is refused unless `resume` (speculators would continue that run). Where the
    `torchrun` on PATH is not this Python's, `python -m torch.distributed.run` (the same launcher)."""
    from draftlab.training.data import open_split, require_states

    settings = checked(settings, "torchrun_command")
    if why := lacks(settings):
        raise DraftlabError(why)
    check_count("nproc", nproc, 1, "GPU processes, one per GPU: torchrun's --nproc-per-node")
    data, save_path = dataset_and_folder(
        data, save_path, lambda lay: lay.speculators_save(draft.kind), "torchrun_command"
    )
    save_path = save_path.resolve()
    if save_path.exists() and not save_path.is_dir():
        raise DraftlabError(
            f"save_path {save_path} is a file: speculators train saves its epochs in folders under it, so the "
            "command could only fail. Pass a folder (save_path=..., or leave it out for the run's own), or "
            "move that file away."
        )
    if (found := epochs_in(save_path)) and not resume:
        raise DraftlabError(
            f"{save_path} already holds speculators epochs {found}: the command would resume that "
            "run. Remove the folder (or pick another save_path) for a fresh run, or pass resume=True "
            "to continue it."
        )
    T, _ = pack_length(settings.pack_len, draft.kind, FLEX)
    ds = open_split(draft, Path(data) / "train", T)
    if getattr(settings, "hidden_states", "offline") == "offline":
        require_states(ds, Path(data) / "train")
    lengths = ds.approx_lengths
    counts = epoch_steps(lengths, T, nproc, settings.seed, settings.train_steps, train_data_ratio)
    flags = speculators_flags(
        draft, data, settings, save_path, counts, train_data_ratio, num_workers, vllm_endpoint=vllm_endpoint
    )
    return [*launcher(), "--standalone", f"--nproc-per-node={nproc}", "-m", "speculators.train", *flags]


def launcher() -> list[str]:
    """`torchrun` when it is this Python's (next to its executable), else the same launcher as a module."""
    found = shutil.which("torchrun")
    if found and Path(found).absolute().parent == Path(sys.executable).absolute().parent:
        return ["torchrun"]
    return [sys.executable, "-m", "torch.distributed.run"]


def checkpoint_fault(folder: Path) -> str | None:
    """What keeps `SpeculatorModel.from_pretrained` from loading `folder` (None: a speculators model's
    config.json and whole weights are there), naming the file."""
    folder = Path(folder)
    config, fault = json_fault(folder / "config.json")
    if fault:
        return f"{folder / 'config.json'}: {fault}"
    if config.get("speculators_model_type") is None:
        return f"{folder / 'config.json'}: it is not a speculators config (no speculators_model_type)"
    fault = safetensors_fault(folder / "model.safetensors")
    return f"{folder / 'model.safetensors'}: {fault}" if fault else None


def loadable(folder: Path) -> bool:
    """config.json of a speculators model and complete weights: what `SpeculatorModel.from_pretrained` loads."""
    return checkpoint_fault(folder) is None


def check_checkpoint(folder: Path) -> None:
    """A DraftlabError naming the broken file of a checkpoint folder meant to be whole (draftlab's final/,
    a folder passed by name), before speculators fails on it."""
    fault = checkpoint_fault(folder)
    if fault:
        raise DraftlabError(
            f"checkpoint {folder} is broken: {fault}. Re-run notebook 04 to train and save it again (or copy "
            "the folder again from where it was made), or delete the folder to go on without it."
        )


def find_checkpoint(save_path, prefer: str = "best") -> Path:
    """The folder to load from a speculators save (`<save>/<epoch>/`, `checkpoint_best`): checkpoint_best
    when it links a loadable folder and prefer="best", else the highest-numbered loadable epoch.
    A folder that is itself a checkpoint (draftlab's final/, one epoch folder) is returned as it is."""
    root = Path(save_path)
    if prefer not in ("best", "last"):
        raise DraftlabError(
            f"prefer={prefer!r}: use 'best' (speculators' lowest validation loss) or 'last' (the newest epoch)."
        )
    if loadable(root):
        return root
    best = root / "checkpoint_best"
    good = [root / str(e) for e in epochs_in(root) if loadable(root / str(e))]
    if prefer == "best" and (best.exists() or best.is_symlink()):
        target = best.resolve()
        fault = checkpoint_fault(target) if target.is_dir() else f"{target} is missing"
        if fault:  # speculators chose that epoch by its held-out loss: another one is not quietly taken instead
            newest = f" ({good[-1]})" if good else ", of which there is none"
            raise DraftlabError(
                f"{best} points at {target}, which cannot be loaded ({fault}): speculators' best epoch is cut or "
                f"missing. Pass prefer='last' for the newest whole epoch{newest}, or point checkpoint_best at a "
                f"whole epoch (ln -sfn <epoch> {best})."
            )
        return root / target.name if target.parent == root.resolve() else target
    if good:
        return good[-1]
    seen = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    hint = (
        "; interrupted/ is speculators' save on a stop: pass it itself, or rename it to an epoch number"
        if "interrupted" in seen
        else ""
    )
    raise DraftlabError(
        f"no draft checkpoint at {root}: no config.json with model.safetensors there, nor in a "
        f"speculators epoch folder (<save>/<epoch>/ or checkpoint_best; found {seen[:8] or 'nothing'})"
        f"{hint}. Run notebook 04 or the torchrun command (launch.torchrun_command) to the end, or "
        "pass the folder save_pretrained wrote."
    )


def trained_draft(kind_dir) -> Path | None:
    """What to draft with from one kind's run folder (`RunLayout.draft(kind)`): draftlab's
    `final/` or the checkpoint of speculators' save under `speculators/`, the newer if both; None if neither.
    A broken final/ is an error naming its file (draftlab writes it whole), not taken for an absent one."""
    kind_dir = Path(kind_dir)
    if (kind_dir / "final").is_dir():
        check_checkpoint(kind_dir / "final")
    found = [p for p in (kind_dir / "final", kind_dir / "speculators") if p.is_dir()]
    found = [p for p in (q if loadable(q) else _found(q) for q in found) if p is not None]
    return max(found, key=lambda p: (p / "model.safetensors").stat().st_mtime, default=None)


def _found(save_path: Path) -> Path | None:
    """The checkpoint of a speculators save, None where it holds none; a checkpoint_best that points at a cut or
    missing epoch is an error (`find_checkpoint`), not taken for no checkpoint."""
    best = Path(save_path) / "checkpoint_best"
    if best.exists() or best.is_symlink():
        return find_checkpoint(save_path)
    try:
        return find_checkpoint(save_path)
    except DraftlabError:
        return None


def as_shell(command: list[str]) -> str:
    return shlex.join(command)


def lacks(settings) -> str | None:
    """Why speculators' trainer cannot train this run's settings (None: it can); notebook 04 prints it instead of
    the command, `torchrun_command` refuses with it."""
    if settings.state_noise:
        return (
            f"state_noise={settings.state_noise}: speculators train (0.9.0) has no noise transform, so the torchrun "
            "command would train another draft than this run's. Train with noise in draftlab's loop (one GPU), or "
            "set state_noise: 0 for the torchrun command."
        )
    return None
