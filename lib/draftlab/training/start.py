"""How a training starts in its run folder: it resumes the run there, or sets that run aside.

A fresh run moves an earlier run's checkpoints, final/ and metrics.jsonl into `.previous/` (`.previous.2`,
... where one is set aside already) and deletes them only when it has written its own final/: a fresh
run that fails or is interrupted leaves the earlier run whole. Without an explicit `resume`, an
interrupted run (checkpoints, no final/) trained with the same hyper-parameters is resumed, which is
what re-running notebook 04 after an interruption does; over one trained otherwise the fresh run says,
naming the settings that differ, where the earlier run is kept.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

from draftlab.training import checkpoint as ckpt


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of a run; a line an interruption cut is left out (training appends as it goes)."""
    from draftlab.files import read_jsonl

    path = Path(run_dir) / "metrics.jsonl"
    return read_jsonl(path, "Delete that line, or the file.", skip_unreadable=True) if path.exists() else []


# an earlier run set aside by a fresh one (.previous.2, ... where one is set aside already), until that one finishes
PREVIOUS = ".previous"
RUN_FILES = ("checkpoints", "final", "metrics.jsonl")


def start(run_dir: Path, draft, opt, sched, hp: dict, resume: bool | None) -> tuple[int, str]:
    """(the step to start after, what became of the run folder's earlier run, "" if there was none).
    Resume: restore the latest checkpoint, keep metrics up to it. Fresh: set a run that has a
    checkpoint or a final/ aside (`set_aside`: nothing a user has is deleted before the new run
    finishes); clear a run that has neither. `resume=None` resumes an interrupted run (checkpoints,
    no final/) trained with these settings (`hp`), and starts afresh over any other."""
    last = ckpt.latest(run_dir)
    done = (run_dir / "final" / "config.json").exists()
    saved = ckpt.saved_hparams(last) if last else {}
    if resume is None:
        resume = last is not None and not done and not ckpt.differences(saved, hp)
    if resume and last is not None:
        step = ckpt.load(last, draft, opt, sched, hp)["step"]
        rows = [r for r in read_metrics(run_dir) if r["step"] <= step]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return step, (
            f"Resuming the run in {run_dir} from {last.name} (its settings are these); delete "
            f"{run_dir / 'checkpoints'} to start afresh instead."
        )
    note = (
        set_aside(run_dir, "finished" if done else f"interrupted at {last.name}", saved, hp)
        if last is not None or done
        else ""
    )
    for p in ("checkpoints", "final"):
        shutil.rmtree(run_dir / p, ignore_errors=True)
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    return 0, note


def set_aside(run_dir: Path, state: str, saved: dict, hp: dict) -> str:
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


def on_finish(run_dir: Path) -> None:
    """The new run has its final/, and it loads (`final.finish`): the runs it set aside go."""
    for prev in previous(run_dir):
        shutil.rmtree(prev)


def previous(run_dir: Path) -> list[Path]:
    return sorted(p for p in Path(run_dir).glob(f"{PREVIOUS}*") if p.is_dir())


def kept(run_dir: Path) -> str:
    prev = previous(run_dir)
    return (
        f"; the earlier run is kept in {', '.join(map(str, prev))} (to use it, put its {', '.join(RUN_FILES)} "
        "in place of this run's)"
        if prev
        else ""
    )
