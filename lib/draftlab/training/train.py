"""Stage 04: short training runs of a draft on stage-01 data, on CPU or one GPU, with resume.

A thin loop around speculators' pieces (its dataset, packing sampler and collate in `training.data`,
the model's own losses and metrics through `training.forward`, `build_optimizers` for AdamW and
transformers' cosine schedule with warm-up as `speculators train` uses, in `training.settings`):
what it adds is what a notebook needs, a
JSONL of metrics per step, held-out evaluation, checkpoints vLLM can load, an exact resume, and
a stop that names the step when the loss stops being finite. Several GPUs go through
`speculators train` itself: `torchrun_command` writes that command line, it trains nothing.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import sys
import time
from contextlib import closing
from dataclasses import asdict
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.layout import RunLayout, dataset_and_folder
from draftlab.training import checkpoint as ckpt
from draftlab.training.data import Packs, open_split, tokens
from draftlab.training.device import loader_workers
from draftlab.training.forward import evaluate, forward, normalise
from draftlab.training.launch import torchrun_command  # noqa: F401  (several GPUs: speculators' own trainer)
from draftlab.training.lock import run_lock
from draftlab.training.settings import CADENCE, Settings, checked, forward_options, optimizer_and_schedule


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


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


# an earlier run set aside by a fresh one (.previous.2, ... where one is set aside already), until that one finishes
PREVIOUS = ".previous"
RUN_FILES = ("checkpoints", "final", "metrics.jsonl")


def _start(run_dir: Path, draft, opt, sched, hp: dict, resume: bool | None) -> tuple[int, str]:
    """(the step to start after, what became of the run folder's earlier run, "" if there was none).
    Resume: restore the latest checkpoint, keep metrics up to it. Fresh: set a run that has a
    checkpoint or a final/ aside (`_set_aside`: nothing a user has is deleted before the new run
    finishes); clear a run that has neither. `resume=None` resumes an interrupted run (checkpoints,
    no final/) trained with these settings (`hp`), and starts afresh over any other."""
    last = ckpt.latest(run_dir)
    finished = (run_dir / "final" / "config.json").exists()
    saved = ckpt.saved_hparams(last) if last else {}
    if resume is None:
        resume = last is not None and not finished and not ckpt.differences(saved, hp)
    if resume and last is not None:
        step = ckpt.load(last, draft, opt, sched, hp)["step"]
        kept = [r for r in read_metrics(run_dir) if r["step"] <= step]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
        return step, (
            f"Resuming the run in {run_dir} from {last.name} (its settings are these); delete "
            f"{run_dir / 'checkpoints'} to start afresh instead."
        )
    note = (
        _set_aside(run_dir, "finished" if finished else f"interrupted at {last.name}", saved, hp)
        if last is not None or finished
        else ""
    )
    for p in ("checkpoints", "final"):
        shutil.rmtree(run_dir / p, ignore_errors=True)
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    return 0, note


def _set_aside(run_dir: Path, state: str, saved: dict, hp: dict) -> str:
    """Move the run in `run_dir` into a free `.previous*` folder (one set aside earlier stays where it
    is); says so, with the settings that differ: it is deleted when the new run finishes."""
    names = itertools.chain([PREVIOUS], (f"{PREVIOUS}.{i}" for i in itertools.count(2)))
    prev = next(run_dir / n for n in names if not (run_dir / n).exists())
    prev.mkdir()
    for p in RUN_FILES:
        if (run_dir / p).exists():
            (run_dir / p).rename(prev / p)
    changed = ckpt.differences(saved, hp) if saved else []
    why = (
        "; trained with " + ", ".join(f"{k}={saved.get(k)!r} (now {hp.get(k)!r})" for k in changed[:4])
        if changed
        else ""
    )
    return (
        f"A fresh run in {run_dir}: the earlier run ({state}{why}) is kept in {prev} until this one finishes, "
        f"then deleted; to keep it, move {prev} elsewhere now or stop and use another run name."
    )


def _finished(run_dir: Path) -> None:
    """The new run has its final/: the runs it set aside go."""
    for prev in _previous(run_dir):
        shutil.rmtree(prev)


def _previous(run_dir: Path) -> list[Path]:
    return sorted(p for p in Path(run_dir).glob(f"{PREVIOUS}*") if p.is_dir())


def train(
    draft,
    data: RunLayout | Path,
    settings: Settings | None = None,
    run_dir: Path | None = None,
    *,
    resume: bool | None = None,
    stop_after: int | None = None,
    progress: bool = True,
) -> Path:
    """Train `draft` on `data/train`, evaluating on `data/eval`; returns the run folder.

    `data` is a run's `RunLayout` (the run folder is its `draft(kind)`), or a stage-01 dataset folder
    with `run_dir` given. `resume=True` continues from the newest checkpoint in the run folder
    (refused if a hyper-parameter changed), `resume=False` starts afresh, and the default continues an
    interrupted run with the same hyper-parameters (re-running notebook 04) and starts afresh over any
    other; an earlier run is set aside, not deleted, until the fresh one finishes. `stop_after=N` ends
    after global step N with a checkpoint, as an interruption would, without writing `final/`.
    The run folder is locked for the run (`lock.run_lock`): a second training into it is refused.
    """
    s = checked(settings, "train()")
    data, run_dir = dataset_and_folder(data, run_dir, lambda lay: lay.draft(draft.kind), "train()")
    with run_lock(run_dir):
        return _train(draft, data, s, run_dir, resume, stop_after, progress)


def _train(draft, data: Path, s: Settings, run_dir: Path, resume: bool | None, stop_after, progress: bool) -> Path:
    from draftlab.progress import progress_bar

    options = forward_options(draft.kind, s)
    train_packs = Packs(draft, open_split(draft, data / "train", s.pack_len), s.pack_len, s.seed)
    eval_packs = Packs(draft, open_split(draft, data / "eval", s.pack_len), s.pack_len, 0)
    run_dir.mkdir(parents=True, exist_ok=True)
    hp = ckpt.hparams(draft, {k: v for k, v in asdict(s).items() if k not in CADENCE})
    rows = data / "train" / "rows.fingerprint"
    hp["train_rows"] = rows.read_text() if rows.exists() else None
    opt, sched = optimizer_and_schedule(draft, s)
    step, note = _start(run_dir, draft, opt, sched, hp, resume)
    draft.choices.pop("run folder", None)
    if note:  # on stderr, and among the draft's choices: a run in its own process reports them (jobs._collect)
        print(note, file=sys.stderr)
        draft.choices["run folder"] = (f"resumed after step {step}" if step else "fresh, earlier run set aside", note)
    if step == 0:
        torch.manual_seed(s.seed)
    end = min(s.train_steps, stop_after or s.train_steps)
    metrics_path = run_dir / "metrics.jsonl"
    workers, why = loader_workers(s.loader_workers, str(draft.device))
    # what this run chose, recorded on the draft it trains (its `report()` shows them)
    draft.choices["data loading"] = (f"{workers} loader processes" if workers else "in process", why)
    draft.choices["pack length"] = (train_packs.length, train_packs.why)
    draft.model.train()
    bar = progress_bar(total=end, initial=step, desc=f"train {draft.kind}", disable=not progress)
    t0 = time.perf_counter()
    batches = train_packs.stream(step, end, workers)
    with closing(batches):  # a stop (NaN, interrupt) ends the loader's worker processes at once
        for batch, position in batches:
            lr = sched.get_last_lr()[0]
            _, loss, m = forward(draft, batch, **options)
            if not torch.isfinite(loss):
                raise DraftlabError(
                    f"loss is {loss.item()} at step {step + 1}: training stopped. "
                    f"Last good checkpoint: {ckpt.latest(run_dir)}"
                    f"{_kept(run_dir)}. Lower learning_rate (now {s.learning_rate}) or check the data of this pack."
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_([p for p in draft.model.parameters() if p.requires_grad], s.grad_clip)
            if not torch.isfinite(norm):
                raise DraftlabError(
                    f"gradient norm is {norm.item()} at step {step + 1}: training stopped. Last good checkpoint: "
                    f"{ckpt.latest(run_dir)}{_kept(run_dir)}."
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
                "tokens_per_s": tokens(batch) / seconds,
                "seconds": seconds,
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
        ckpt.write_final(run_dir, draft)
        _finished(run_dir)
    return run_dir


def _kept(run_dir: Path) -> str:
    prev = _previous(run_dir)
    return (
        f"; the earlier run is kept in {', '.join(map(str, prev))} (to use it, put its {', '.join(RUN_FILES)} "
        "in place of this run's)"
        if prev
        else ""
    )


def first_accuracy(kind: str, record: dict) -> float:
    """Share of supervised positions where the draft's first proposal is the verifier's argmax."""
    return float(record.get("full_acc_0" if kind == "eagle3" else "position_1_acc", math.nan))


def position_accuracies(kind: str, record: dict) -> dict[int, float]:
    """Accuracy per drafted position, 1-based: EAGLE-3's TTT steps, DFlash's block positions."""
    if kind == "eagle3":
        return {int(k.split("_")[2]) + 1: v for k, v in record.items() if k.startswith("full_acc_")}
    return {int(k.split("_")[1]): v for k, v in record.items() if k.startswith("position_") and k.endswith("_acc")}


def summary(kind: str, records: list[dict]) -> dict:
    """The last evaluation of a run, its first-position accuracy, the median training speed, and the
    first step's seconds: on CUDA that step compiles the draft's forward and backward, the largest
    fixed cost of a short run."""
    import statistics

    last = [r for r in records if r["split"] == "eval"][-1]
    train_rows = [r for r in records if r["split"] == "train"]
    return {
        "steps": last["step"],
        "eval loss": last["loss"],
        "eval first-position accuracy": first_accuracy(kind, last),
        "train tokens/s (median)": statistics.median(r["tokens_per_s"] for r in train_rows),
        "first step (s)": train_rows[0].get("seconds", math.nan),
    }
