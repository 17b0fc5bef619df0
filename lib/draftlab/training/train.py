"""Stage 04: short training runs of a draft on stage-01 data, on CPU or one GPU, with resume.

A thin loop around speculators' pieces (its dataset, packing sampler and collate in `training.data`,
the model's own losses and metrics through `drafts.forward`, `build_optimizers` for AdamW and
transformers' cosine schedule with warm-up as `speculators train` uses, in `training.settings`):
what it adds is what a notebook needs, a
JSONL of metrics per step, held-out evaluation, checkpoints vLLM can load, an exact resume (or an
earlier run set aside, `training.start`), one training per run folder (`training.lock`), and
a stop that names the step when the loss stops being finite. Several GPUs go through
`speculators train` itself: `torchrun_command` writes that command line, it trains nothing.
"""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import closing
from dataclasses import asdict
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.drafts.forward import evaluate, forward, normalise
from draftlab.drafts.recipe import recipe
from draftlab.layout import RunLayout, dataset_and_folder
from draftlab.masks.packing import tokens
from draftlab.training import checkpoint as ckpt
from draftlab.training.data import Packs, open_eval, open_split, require_states
from draftlab.training.final import finish
from draftlab.training.launch import torchrun_command  # noqa: F401  (several GPUs: speculators' own trainer)
from draftlab.training.loaders import loader_workers
from draftlab.training.lock import run_lock
from draftlab.training.noise import noised
from draftlab.training.online import states_for, stops_if_it_dies
from draftlab.training.settings import CADENCE, SOURCE, Settings, checked, forward_options, optimizer_and_schedule
from draftlab.training.start import kept, read_metrics, start  # noqa: F401  (read_metrics: for notebooks)


def run_folder(layout: RunLayout, kind: str) -> Path:
    return layout.draft(kind)


def final_checkpoint(layout: RunLayout, kind: str) -> Path:
    """The folder `SpeculatorModel.from_pretrained` and `vllm serve` load (written at the end of a run)."""
    path = layout.final(kind)
    if not (path / "config.json").exists():
        raise DraftlabError(
            f"no trained {kind} draft at {path}; run notebook 04 (draftlab run --only 04) for dataset "
            f"{layout.dataset_name!r}, run {layout.run_name!r}."
        )
    return path


def _log(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def train(
    draft,
    data: RunLayout | Path,
    settings: Settings | None = None,
    run_dir: Path | None = None,
    *,
    resume: bool | None = None,
    stop_after: int | None = None,
    progress: bool = True,
    online=None,
) -> Path:
    """Train `draft` on `data/train`, evaluating on `data/eval`; returns the run folder.

    `data` is a run's `RunLayout` (the run folder is its `draft(kind)`), or a stage-01 dataset folder
    with `run_dir` given. `resume=True` continues from the newest checkpoint in the run folder
    (refused if a hyper-parameter changed), `resume=False` starts afresh, and the default continues an
    interrupted run with the same hyper-parameters (re-running notebook 04) and starts afresh over any
    other; an earlier run is set aside, not deleted, until the fresh one finishes. `stop_after=N` ends
    after global step N with a checkpoint, as an interruption would, without writing `final/`.
    The run folder is locked for the run (`lock.run_lock`): a second training into it is refused.
    `settings.hidden_states="online"` starts a vLLM extraction server for the run (`online.states_for`) unless
    `online` gives a started one to share.
    """
    s = checked(settings, "train()")
    data, run_dir = dataset_and_folder(data, run_dir, lambda lay: lay.draft(draft.kind), "train()")
    with run_lock(run_dir), states_for(draft, data, s.hidden_states, run_dir / "vllm-online.log", online) as online:
        with stops_if_it_dies(online, run_dir):  # its server named, with the checkpoint to resume from
            return _train(draft, data, s, run_dir, resume, stop_after, progress, online)


def _train(draft, data: Path, s: Settings, run_dir: Path, resume: bool | None, stop_after, progress: bool, online):
    from draftlab.progress import progress_bar

    options = forward_options(draft.kind, s)
    train_ds = open_split(draft, data / "train", s.pack_len, online)
    train_packs = Packs(draft, train_ds, s.pack_len, s.seed, s.online_requests, online)
    if online is None:
        require_states(train_packs.ds, data / "train")
    eval_packs = Packs(draft, open_eval(draft, data / "eval", s.pack_len, online), s.pack_len, 0, online=online)
    run_dir.mkdir(parents=True, exist_ok=True)
    hp = ckpt.hparams(draft, {k: v for k, v in asdict(s).items() if k not in CADENCE + SOURCE})
    rows = data / "train" / "rows.fingerprint"
    hp["train_rows"] = rows.read_text() if rows.exists() else None
    opt, sched = optimizer_and_schedule(draft, s)
    step, note = start(run_dir, draft, opt, sched, hp, resume)
    draft.choices.pop("run folder", None)
    if note:  # on stderr, and among the draft's choices: a run in its own process reports them (jobs._collect)
        print(note, file=sys.stderr)
        draft.choices["run folder"] = (f"resumed after step {step}" if step else "fresh, earlier run set aside", note)
    if step == 0:
        torch.manual_seed(s.seed)
    end = min(s.train_steps, stop_after or s.train_steps)
    metrics_path = run_dir / "metrics.jsonl"
    workers, why = loader_workers(s.loader_workers, str(draft.device), online=online is not None)
    # what this run chose, recorded on the draft it trains (its `report()` shows them)
    draft.choices["data loading"] = (f"{workers} loader processes" if workers else "in process", why)
    draft.choices["pack length"] = (train_packs.length, train_packs.why)
    draft.choices["hidden states"] = (
        (
            s.hidden_states,
            f"train: made by vLLM as packs are read ({online.endpoint}, up to {s.online_requests} rows of a pack "
            "asked at once by each reader), none kept on disk; eval: "
            + (
                "stage 01's files (the same packs at every evaluation)"
                if eval_packs.ds.on_missing == "raise"
                else "vLLM"
            ),
        )
        if online
        else (s.hidden_states, "stage 01's files")
    )
    draft.model.train()
    bar = progress_bar(total=end, initial=step, desc=f"train {draft.kind}", disable=not progress)
    t0 = time.perf_counter()
    batches = train_packs.stream(step, end, workers)
    with closing(batches):  # a stop (NaN, interrupt) ends the loader's worker processes at once
        for batch, position in batches:
            waited = time.perf_counter() - t0  # for its pack: reading it (and, online, vLLM making its states)
            lr, n_tokens = sched.get_last_lr()[0], tokens(batch)
            _, loss, m = forward(draft, noised(batch, s.state_noise, s.seed, step + 1, draft.device), **options)
            if not torch.isfinite(loss):
                raise DraftlabError(
                    f"loss is {loss.item()} at step {step + 1}: training stopped. "
                    f"Last good checkpoint: {ckpt.latest(run_dir)}"
                    f"{kept(run_dir)}. Lower learning_rate (now {s.learning_rate}) or check the data of this pack."
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            # A loader process's pack lives in shared memory, and freeing it costs several times what receiving it
            # does (BENCHMARKS.md, bench_loader.py): freed now, while the device runs the backward, not in the wait.
            del batch
            norm = torch.nn.utils.clip_grad_norm_([p for p in draft.model.parameters() if p.requires_grad], s.grad_clip)
            if not torch.isfinite(norm):
                raise DraftlabError(
                    f"gradient norm is {norm.item()} at step {step + 1}: training stopped. Last good checkpoint: "
                    f"{ckpt.latest(run_dir)}{kept(run_dir)}."
                )
            opt.step()
            sched.step()
            step += 1
            loss_value, seconds = loss.item(), time.perf_counter() - t0  # item() waits for the device
            record = {
                "step": step,
                "split": "train",
                "loss": loss_value,
                "lr": lr,
                "grad_norm": norm.item(),
                "tokens_per_s": n_tokens / seconds,
                "seconds": seconds,
                "data_s": waited,
                "epoch": position[0],
                **normalise(m),
            }
            _log(metrics_path, record)
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.3f}", acc0=f"{first_accuracy(draft.kind, record):.2f}")
            if step % s.eval_every == 0 or step == s.train_steps:
                _log(
                    metrics_path,
                    {"step": step, "split": "eval", "lr": lr, **evaluate(draft, eval_packs, s.eval_packs, **options)},
                )
            if step % s.checkpoint_every == 0 or step == end:
                ckpt.save(run_dir, draft, step, opt, sched, train_packs.position(step), hp, s.keep_checkpoints)
            t0 = time.perf_counter()  # a step's time includes waiting for its pack, not the evaluation before it
    bar.close()
    if step >= s.train_steps:
        finish(run_dir, draft)  # final/ written and read back; only then do the runs it set aside go
    return run_dir


def first_accuracy(kind: str, record: dict) -> float:
    """Share of supervised positions where the draft's first proposal is the verifier's argmax."""
    return float(record.get(recipe(kind).first_key, math.nan))


def position_accuracies(kind: str, record: dict) -> dict[int, float]:
    """Accuracy per drafted position, 1-based: EAGLE-3's TTT steps, DFlash's block positions (the family's recipe)."""
    return recipe(kind).position_accuracies(record)


def summary(kind: str, records: list[dict], skip: int = 1) -> dict:
    """The last evaluation of a run, its first-position accuracy, its training speed, and the first step's
    seconds: on CUDA that step compiles the draft's forward and backward, the largest fixed cost of a short run.
    Speed is given two ways, over the steps after the first `skip` (a run keeps its last step at least): the median
    step (the pace when packs are ready) and the whole run (tokens over seconds, what a user waits for). They part
    where packs stall now and then, as online ones do when the extraction server cannot keep up: the median alone
    once hid most of an online run's time (BENCHMARKS.md, "Online hidden states")."""
    import statistics

    last = [r for r in records if r["split"] == "eval"][-1]
    train_rows = [r for r in records if r["split"] == "train"]
    steady = train_rows[min(skip, len(train_rows) - 1) :]
    seconds = sum(r["seconds"] for r in steady)
    return {
        "steps": last["step"],
        "eval loss": last["loss"],
        "eval first-position accuracy": first_accuracy(kind, last),
        "train tokens/s (median)": statistics.median(r["tokens_per_s"] for r in steady),
        "train tokens/s (whole run)": sum(r["tokens_per_s"] * r["seconds"] for r in steady) / seconds,
        "step seconds (median / mean)": (statistics.median(r["seconds"] for r in steady), seconds / len(steady)),
        "first step (s)": train_rows[0].get("seconds", math.nan),
        "share of a step waiting for its pack (median)": statistics.median(
            r.get("data_s", math.nan) / r["seconds"] for r in steady
        ),
        "share of the run waiting for packs": sum(r.get("data_s", math.nan) for r in steady) / seconds,
    }
