"""`speculators train` flags from draftlab's settings, for the same run on several GPUs under torchrun
(`launch.torchrun_command` puts them on a command line).

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
  is half of all steps (BENCHMARKS.md, "The multi-GPU path run for real": fetch_frac); no flag changes it, only
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
from importlib.metadata import version
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.drafts.device import pick_loss
from draftlab.drafts.recipe import recipe
from draftlab.masks.attention import FLEX
from draftlab.masks.packing import pack_length

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
    from draftlab.data.verifier_dir import resolve_verifier

    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise DraftlabError(
            f"verifier {path} is not a local directory here: speculators would ask the Hugging Face "
            "Hub for it. Generate the command on the machine that trains, after stage 01 (it writes "
            "data/verifiers/)."
        )
    return resolve_verifier(path)


def speculators_flags(
    draft,
    data: Path,
    settings,
    save_path: Path,
    counts: list[int],
    train_data_ratio: float = 0.9,
    num_workers: int = NUM_WORKERS,
    prefetch_factor: int = 4,
    vllm_endpoint: str | None = None,
) -> list[str]:
    """`speculators train` flags (checked against its own parser in the tests). `settings.hidden_states="online"`
    asks `vllm_endpoint` (an extraction server's `/v1`, every rank must reach it; speculators' default where None,
    where its scripts/launch_vllm.py serves) for every row's states: `--on-missing generate`, and a
    `--hidden-states-path` beside the save path that holds no files, so stage 01's files are not read."""
    s, cfg = settings, draft.train_config.flatten()
    train = Path(data).resolve() / "train"
    n = cfg["draft_vocab_size"]
    loss, _ = pick_loss("cuda", True, torch.__version__, version("speculators"))
    T, _ = pack_length(s.pack_len, draft.kind, FLEX)
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
    if getattr(s, "hidden_states", "offline") == "online":
        if not vllm_endpoint:  # speculators' own default: its scripts/launch_vllm.py serves there
            from speculators.train.config.schema import GenerationArgs

            vllm_endpoint = GenerationArgs.model_fields["vllm_endpoint"].default
        no_cache = Path(save_path).resolve().parent / f"{Path(save_path).name}-no-cache"
        no_cache.mkdir(parents=True, exist_ok=True)
        flags.update({"on-missing": "generate", "vllm-endpoint": vllm_endpoint, "hidden-states-path": no_cache})
    if (train / f"d2t-{n}.npy").exists():
        flags.update({"d2t-path": train / f"d2t-{n}.npy", "t2d-path": train / f"t2d-{n}.npy"})
    flags.update(recipe(draft.kind).torchrun_flags(s, cfg))
    out = []
    for key, value in ((k, x) for k, x in flags.items() if x is not None):  # a recipe's None drops a shared flag
        if isinstance(value, bool):  # speculators' BooleanOptionalAction options take no value: --x / --no-x
            out.append(f"--{key}" if value else f"--no-{key}")
        else:
            out += [f"--{key}", *map(str, value)] if isinstance(value, list) else [f"--{key}", str(value)]
    return out
