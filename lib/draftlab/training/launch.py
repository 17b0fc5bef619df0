"""Several GPUs: the same run through `speculators train` under torchrun, configured from draftlab's
settings. draftlab does not train distributed itself; this writes the command line, and finds the
checkpoint it saved (`find_checkpoint`; `proposers.load_draft` takes the save folder as it is).

Differences from draftlab's loop, stated rather than hidden (speculators 0.9.0, `speculators/train/`):
- Split: it trains on the first `--train-data-ratio` (0.9) of the train folder's rows and validates on
  the rest at the end of each epoch (`data.ArrowDataset`); draftlab's eval folder is not used, so it
  sees 10% fewer rows, and in other packs (the same sampler and seed over another row set).
- Precision: fp32 master weights and AdamW state, the forward under bf16 autocast
  (`--hidden-states-dtype`), checkpoints saved in bf16. draftlab trains the draft in the verifier's dtype
  (bf16 weights and optimizer state on CUDA), without autocast.
- Clipping at 1.0, fixed in its trainer (draftlab: `grad_clip`). Schedule: transformers' cosine with
  warm-up over `--max-steps`, as draftlab's. Loss and forward: the same model code and loss choice.
- Parallelism: DDP, one replica per GPU (FSDP only with `--fsdp-shard`); `--nproc-per-node=1` is a
  one-rank process group.
- Epochs: after `--max-steps` its epoch loop goes on, and each further epoch trains one more step and
  validates again, so `--epochs` is counted exactly with its own sampler (`epoch_steps`).
- Checkpoints: `<save>/<epoch>/` (config.json, bf16 model.safetensors, optimizer_state_dict.pt,
  scheduler_state_dict.pt, training_state.json); a save inside an epoch overwrites that epoch's folder;
  `checkpoint_best` links the saved epoch of lowest validation loss; nothing is rotated, so every save
  stays on disk. `--checkpoint-freq` is set for a save about every `checkpoint_every` steps but about
  MAX_SAVES a run at most (plus epoch 0's, always written), the last step's included
  (`checkpoint_freq`). `--save-best` is not used: it skips the last epoch's save when that epoch's
  validation loss is not the lowest, and deletes every other epoch.
- Resume: it continues from the newest epoch folder under `--save-path`, whatever run left it there,
  so `torchrun_command` refuses a save path that already holds epochs (pass resume=True to continue).
- Data loading: worker processes (`--num-workers`, `--prefetch-factor`) read ahead only within an
  epoch: `train_epoch` iterates the DataLoader afresh each epoch, so every epoch's first pack is read
  while the GPU waits, and validation and saving run between epochs. With two packs an epoch that
  is half of all steps (issue 21 saw fetch_frac 0.49 on the ci data, H200); no flag changes it, only
  more packs an epoch (more rows for the pack length) do. Its timer's "fetch" also holds the previous
  step's metric logging (one console line a step at the default `--log-freq 1`; a larger one leaves
  GPU backlog in the next logged step's fetch instead). Pinned memory is always on; spawned workers
  each open a CUDA context (`dataloader._worker_init_fn`), which nvidia-smi counts. Hidden states are
  cast to `--hidden-states-dtype` in the workers: bf16 data (CUDA stage 01) is copied, not converted.
  Per row `ArrowDataset._get_raw_data` formats the dataset row to torch twice (token check, loss
  mask): most of a row's read time in a profile on a CPU here, and no flag changes it either.
- Environment: the verifier must be a local directory (else speculators downloads it as a Hub id);
  no variable needs setting. Paths are absolute: generate the command on the machine that runs it.
"""

from __future__ import annotations

import math
import shlex
import shutil
import sys
from importlib.metadata import version
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.drafts import checks
from draftlab.drafts.attention import FLEX
from draftlab.layout import dataset_and_folder

MAX_SAVES = 4  # speculators keeps every save (optimizer state included); draftlab keeps 2
NUM_WORKERS = 4  # per loader; the validation loader starts as many again


def epoch_steps(
    lengths, total_seq_len: int, nproc: int, seed: int, steps: int, train_data_ratio: float = 0.9
) -> list[int]:
    """Optimizer steps of each epoch speculators will run for `steps` steps: its own sampler over the
    rows its train split takes, one list entry per epoch (the last one may be cut short by max_steps)."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    rows = list(lengths)[: int(len(lengths) * train_data_ratio)]  # data.ArrowDataset's train split
    sampler = MultipackDistributedBatchSamplerV2(total_seq_len, rows, num_replicas=nproc, rank=0, seed=seed)
    counts: list[int] = []
    while sum(counts) < steps:
        sampler.set_epoch(len(counts))
        if not (n := len(sampler)):
            raise DraftlabError(
                f"speculators' train split ({len(rows)} rows at train_data_ratio={train_data_ratio}) "
                f"gives no pack for {nproc} processes; use fewer processes or more data (stage 01)."
            )
        counts.append(n)
    return counts


def checkpoint_freq(counts: list[int], steps: int, every: int, max_saves: int = MAX_SAVES) -> float:
    """`--checkpoint-freq` for a save about every `every` steps (about `max_saves` a run at most), the last included.

    Below 1 it is a share of an epoch's steps (a save each `round(n * freq)` steps, plus each epoch's end);
    from 1 on it counts epochs, and speculators saves epoch 0 and each epoch e with (e + 1) % freq == 0:
    freq is taken as a divisor of the epoch count, so the last epoch is one of them."""
    interval = max(every, math.ceil(steps / max_saves))
    n, epochs = sum(counts) / len(counts), len(counts)
    if interval < n:
        return round(interval / n, 6)
    target = min(epochs, max(1, round(interval / n)))
    return float(next(d for d in range(target, epochs + 1) if epochs % d == 0))


def check_verifier(path) -> Path:
    """The verifier folder speculators reads (config, tokenizer, embeddings, lm_head, norm), absolute."""
    from draftlab.data.verifier import resolve_verifier

    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise DraftlabError(
            f"verifier {path} is not a local directory here: speculators would ask the Hugging Face "
            "Hub for it. Generate the command on the machine that trains, after stage 01 (it writes "
            "data/verifiers/)."
        )
    return resolve_verifier(path)


def epochs_in(save_path: Path) -> list[int]:
    root = Path(save_path)
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir()) if root.is_dir() else []


def speculators_flags(
    draft,
    data: Path,
    settings,
    save_path: Path,
    counts: list[int],
    train_data_ratio: float = 0.9,
    num_workers: int = NUM_WORKERS,
    prefetch_factor: int = 4,
) -> list[str]:
    """`speculators train` flags (checked against its own parser in the tests)."""
    s, cfg = settings, draft.train_config.flatten()
    train = Path(data).resolve() / "train"
    n = cfg["draft_vocab_size"]
    loss, _ = checks.pick_loss("cuda", True, torch.__version__, version("speculators"))
    T, _ = checks.pack_length(s.pack_len, draft.kind, FLEX)
    flags = {
        "speculator-type": draft.kind,
        "verifier-name-or-path": check_verifier(cfg["verifier_name_or_path"]),
        "data-path": train,
        "on-missing": "raise",
        "hidden-states-dtype": "bfloat16",
        "total-seq-len": T,
        "train-data-ratio": train_data_ratio,
        "num-workers": num_workers,
        "prefetch-factor": prefetch_factor,
        "target-layer-ids": cfg["target_layer_ids"],
        "num-layers": cfg["num_layers"],
        "draft-vocab-size": n,
        "draft-attn-impl": FLEX,
        "loss-implementation": loss,
        "optimizer": "adamw",
        "lr": s.learning_rate,
        "weight-decay": s.weight_decay,
        "scheduler-type": "cosine",
        "scheduler-warmup-steps": s.warmup_steps,
        "scheduler-total-steps": s.train_steps,
        "max-steps": s.train_steps,
        "epochs": len(counts),
        "checkpoint-freq": f"{checkpoint_freq(counts, s.train_steps, s.checkpoint_every):g}",
        "seed": s.seed,
        "save-path": Path(save_path).resolve(),
    }
    if (train / f"d2t-{n}.npy").exists():
        flags.update({"d2t-path": train / f"d2t-{n}.npy", "t2d-path": train / f"t2d-{n}.npy"})
    if draft.kind == "eagle3":
        flags.update({"ttt-steps": s.ttt_steps, "ttt-step-loss-decay": s.ttt_step_loss_decay})
    else:
        flags.update(
            {"block-size": cfg["block_size"], "max-anchors": s.n_anchors, "mask-token-id": cfg["mask_token_id"]}
        )
    out = []
    for key, value in flags.items():
        out += [f"--{key}", *map(str, value)] if isinstance(value, list) else [f"--{key}", str(value)]
    return out


def torchrun_command(
    draft,
    data,
    settings,
    nproc: int,
    save_path: Path | None = None,
    resume: bool = False,
    train_data_ratio: float = 0.9,
    num_workers: int = NUM_WORKERS,
) -> list[str]:
    """`torchrun --standalone --nproc-per-node N -m speculators.train <flags>` for this draft and data.

    `data` is a run's `RunLayout` (checkpoints go to its `speculators_save(kind)` unless `save_path` is
    given), or a stage-01 dataset folder with `save_path` given; a save path that already
    holds epoch folders is refused unless `resume` (speculators would continue that run). Where the
    `torchrun` on PATH is not this Python's, `python -m torch.distributed.run` (the same launcher)."""
    from draftlab.training.data import open_split

    if nproc < 1:
        raise DraftlabError(f"nproc={nproc}: need at least one GPU process.")
    data, save_path = dataset_and_folder(
        data, save_path, lambda lay: lay.speculators_save(draft.kind), "torchrun_command"
    )
    save_path = save_path.resolve()
    if (found := epochs_in(save_path)) and not resume:
        raise DraftlabError(
            f"{save_path} already holds speculators epochs {found}: the command would resume that "
            "run. Remove the folder (or pick another save_path) for a fresh run, or pass resume=True "
            "to continue it."
        )
    T, _ = checks.pack_length(settings.pack_len, draft.kind, FLEX)
    lengths = open_split(draft, Path(data) / "train", T).approx_lengths
    counts = epoch_steps(lengths, T, nproc, settings.seed, settings.train_steps, train_data_ratio)
    flags = speculators_flags(draft, data, settings, save_path, counts, train_data_ratio, num_workers)
    return [*launcher(), "--standalone", f"--nproc-per-node={nproc}", "-m", "speculators.train", *flags]


def launcher() -> list[str]:
    """`torchrun` when it is this Python's (next to its executable), else the same launcher as a module."""
    found = shutil.which("torchrun")
    if found and Path(found).absolute().parent == Path(sys.executable).absolute().parent:
        return ["torchrun"]
    return [sys.executable, "-m", "torch.distributed.run"]


def _complete(f: Path) -> bool:
    """A safetensors file whose header and data are all there (an interrupted save is not)."""
    import json

    try:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
    except (OSError, ValueError):
        return False
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    return f.stat().st_size >= 8 + n + end


def loadable(folder: Path) -> bool:
    """config.json of a speculators model and complete weights: what `SpeculatorModel.from_pretrained` loads."""
    import json

    folder = Path(folder)
    try:
        kind = json.loads((folder / "config.json").read_text()).get("speculators_model_type")
    except (OSError, ValueError):
        return False
    return kind is not None and _complete(folder / "model.safetensors")


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
    if prefer == "best" and best.is_dir() and loadable(best.resolve()):
        return root / best.resolve().name if best.resolve().parent == root.resolve() else best.resolve()
    good = [root / str(e) for e in epochs_in(root) if loadable(root / str(e))]
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
    `final/` or the checkpoint of speculators' save under `speculators/`, the newer if both; None if neither."""
    kind_dir = Path(kind_dir)
    found = [p for p in (kind_dir / "final", kind_dir / "speculators") if p.is_dir()]
    found = [p for p in (q if loadable(q) else _found(q) for q in found) if p is not None]
    return max(found, key=lambda p: (p / "model.safetensors").stat().st_mtime, default=None)


def _found(save_path: Path) -> Path | None:
    try:
        return find_checkpoint(save_path)
    except DraftlabError:
        return None


def as_shell(command: list[str]) -> str:
    return shlex.join(command)
