"""Several drafts trained side by side on one GPU, each `train.train` in its own process.

A draft this small leaves the H200 mostly idle: a step is bound by Python, kernel launches and
reading packs, and the first step is a CPU-bound torch.compile that, one run after the other, takes
a large share of notebook 04 (BENCHMARKS.md, "Draft training quality"). In two processes the
compiles overlap each other and the steps of the other run. On CPU the cores are
the trainer's, so there the runs go one after the other in the notebook's process.

Each job trains the very draft the notebook built: its build arguments and initial weights travel
with the job, so losses and checkpoints are those of an in-process run. The reload check runs where
the draft trained, right after training (there its graph is compiled already: the notebook's
process would compile it again). The trained drafts come back as the result (`Trained.drafts`):
in this process they are the drafts handed in, trained in place as `train.train` trains; side by
side, each is reloaded from its checked final checkpoint and the drafts handed in are left as they
were. This is not a distributed trainer: one GPU, independent runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.layout import RunLayout
from draftlab.training import train as tr
from draftlab.training.checkpoint import check_reload
from draftlab.training.lock import run_lock
from draftlab.training.online import Online, states_for


def side_by_side(
    device: str, runs: int, cpus: int | None = None, requested: bool | None = None, online: bool = False
) -> tuple[bool, str]:
    """Whether the runs train at once in their own processes, and why."""
    if requested is not None:
        return requested, "as asked (side_by_side)"
    cpus = cpus or os.cpu_count() or 1
    if runs < 2:
        return False, "one draft: trained in this process"
    if not device.startswith("cuda"):
        return False, "CPU: the cores are the trainer's, so the runs go one after the other in this process"
    if online:
        return False, (
            "online: the runs would share one extraction server, whose pace sets theirs (on the H200 a run alone "
            "already waits on it for part of its steps), and their 2 x 12 loader processes the CPUs; one after the "
            'other, each run\'s pace is its own (BENCHMARKS.md, "Online hidden states")'
        )
    if cpus < 4 * runs:
        return False, f"CUDA, but {cpus} CPUs: each run needs its own trainer and pack readers, so one after the other"
    return True, (
        f"CUDA, {cpus} CPUs: {runs} processes share the GPU; a step of a draft this size leaves it mostly idle, "
        "and each run's first step (torch.compile) is CPU work that overlaps the other's"
    )


@dataclass(frozen=True)
class Trained:
    """What `train_drafts` gives back, per kind."""

    drafts: dict  # kind -> the trained `Draft` (use these: side by side, the ones handed in stay untrained)
    runs: dict[str, Path]  # kind -> run folder (metrics.jsonl, checkpoints/, final/)
    seconds: dict[str, float]  # kind -> wall seconds of its run
    reloads: dict[str, dict]  # kind -> `checkpoint.check_reload` of its final checkpoint against the trained draft


def train_drafts(
    drafts: dict, layout: RunLayout, settings: tr.Settings, *, side: bool | None = None, progress: bool = True
) -> Trained:
    """Train every draft on the run's dataset, each in the run's `layout.draft(kind)`. `side` forces the
    choice `side_by_side` would make."""
    if not isinstance(layout, RunLayout):
        raise DraftlabError(
            f"train_drafts takes the run's RunLayout (it names each draft's folder), not {type(layout).__name__}."
        )
    named = {k: d.kind for k, d in drafts.items() if k != d.kind}
    if named:
        raise DraftlabError(
            f"drafts are keyed by kind, each run in layout.draft(kind); got {named} (key: kind). One draft per kind."
        )
    device = str(next(iter(drafts.values())).device)
    on, why = side_by_side(device, len(drafts), requested=side, online=settings.hidden_states == "online")
    training = (f"{len(drafts)} processes side by side" if on else "in this process", why)
    with ExitStack() as held:  # every run folder, before a job folder in it is rewritten (side by side)
        for kind in drafts:
            held.enter_context(run_lock(layout.draft(kind)))
        # online: one extraction server for every draft (they read the same rows and layers), stopped after them
        log = layout.drafts / "vllm-online.log"
        online = held.enter_context(states_for(next(iter(drafts.values())), layout.data, settings.hidden_states, log))
        return _train_all(drafts, layout, settings, progress, on, training, online)


def _train_all(drafts: dict, layout: RunLayout, settings, progress: bool, on: bool, training: tuple, online):
    if on:
        return _in_processes(drafts, layout, settings, progress, training, online)
    runs, seconds, reloads = {}, {}, {}
    for kind, d in drafts.items():
        d.choices["training"] = training  # trained in place: these are the drafts given back
        runs[kind], seconds[kind], reloads[kind] = _train_and_check(
            d, layout.data, layout.draft(kind), settings, progress, online
        )
    return Trained(dict(drafts), runs, seconds, reloads)


def _train_and_check(d, data: Path, run_dir: Path, settings, progress: bool, online=None) -> tuple[Path, float, dict]:
    t0 = time.perf_counter()
    run = tr.train(d, data, settings, run_dir, progress=progress, online=online)
    seconds = time.perf_counter() - t0
    return run, seconds, check_reload(d, run / "final", data, settings)


def _in_processes(drafts: dict, layout: RunLayout, settings: tr.Settings, progress: bool, training: tuple, online):
    from draftlab.progress import progress_bar

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])
        ),
    }
    jobs, bars = {}, {}
    try:
        for kind, d in drafts.items():
            jobs[kind] = _start(kind, d, layout, settings, env, online)
            bars[kind] = progress_bar(total=settings.train_steps, desc=f"train {kind}", disable=not progress)
        while any(p.poll() is None for p, _, _ in jobs.values()):
            _show(bars, jobs)
            time.sleep(1)
    except BaseException:  # an interrupt stops every run; their checkpoints stay for a resume
        for p, _, _ in jobs.values():
            p.terminate()
            p.wait()
        raise
    finally:
        _show(bars, jobs)
        for bar in bars.values():
            bar.close()
        for _, _, log in jobs.values():
            log.close()
    return _collect(drafts, jobs, training)


def _start(kind: str, d, layout: RunLayout, settings: tr.Settings, env: dict, online=None):
    """Write the job (build arguments, initial weights, settings) and start its process."""
    job = layout.job(kind)
    shutil.rmtree(job, ignore_errors=True)
    job.mkdir(parents=True)
    torch.save(
        {
            "kind": kind,
            "verifier": str(d.verifier.path),
            "device": str(d.device),
            "dtype": str(d.dtype).removeprefix("torch."),
            "build": d.build_args,
            "settings": asdict(settings),
            "online": None if online is None else {"endpoint": online.endpoint, "no_cache": str(online.no_cache)},
            "data": str(layout.data),
            "run": str(layout.draft(kind)),
            "threads": torch.get_num_threads(),
            "state": {k: t.detach().cpu() for k, t in d.model.state_dict().items()},
        },
        job / "job.pt",
    )
    log = open(job / "log.txt", "w")
    return (
        subprocess.Popen(
            [sys.executable, "-m", "draftlab.training.jobs", str(job)], stdout=log, stderr=subprocess.STDOUT, env=env
        ),
        job,
        log,
    )


def _show(bars: dict, jobs: dict) -> None:
    """Move each bar to its run's training steps so far: the train records `train._log` wrote,
    matched as text, so a line the run is still writing cannot fail a parse."""
    for kind, bar in bars.items():
        path = jobs[kind][1].parent / "metrics.jsonl"  # the job folder sits in its run folder
        bar.update((path.read_text().count('"split": "train"') if path.exists() else 0) - bar.n)


def _collect(drafts: dict, jobs: dict, training: tuple) -> Trained:
    from draftlab.training.checkpoint import reload

    trained, runs, seconds, reloads, failed = {}, {}, {}, {}, []
    for kind, (p, job, _) in jobs.items():
        result = (
            json.loads((job / "result.json").read_text())
            if (job / "result.json").exists()
            else {"error": f"exit status {p.returncode}, no result"}
        )
        if "error" in result:
            failed.append(f"{kind}: {result['error']} (log: {job / 'log.txt'})")
            continue
        run = Path(result["run"])
        d = trained[kind] = reload(run / "final", drafts[kind])  # checked equal to the trained draft there
        (job / "job.pt").unlink()  # a failed job keeps it, to re-run
        d.choices.update({what: tuple(cw) for what, cw in result["choices"].items() if what != "training"})
        if "run folder" in d.choices:  # said on the job's stderr, its log: said here too
            print(d.choices["run folder"][1], file=sys.stderr)
        d.choices["training"] = training
        runs[kind], seconds[kind], reloads[kind] = run, result["seconds"], result["reload"]
    if failed:
        raise DraftlabError("training failed in its process: " + "; ".join(failed))
    return Trained(trained, runs, seconds, reloads)


def _job(job: Path) -> None:
    """One run, in the process `_in_processes` started: rebuild the draft, train, check the reload, report."""
    from draftlab.data.verifier import load_verifier
    from draftlab.drafts.draft import build_draft

    spec = torch.load(job / "job.pt", weights_only=False)  # written by this module
    torch.set_num_threads(spec["threads"])
    try:
        v = load_verifier(spec["verifier"], spec["device"], spec["dtype"])
        d = build_draft(spec["kind"], v, **spec["build"])
        d.model.load_state_dict(spec["state"])
        run, seconds, reload = _train_and_check(
            d,
            Path(spec["data"]),
            Path(spec["run"]),
            tr.Settings(**spec["settings"]),
            progress=False,
            online=spec["online"] and Online(spec["online"]["endpoint"], Path(spec["online"]["no_cache"])),
        )
        result = {
            "run": str(run),
            "seconds": seconds,
            "reload": reload,
            "choices": {k: [str(c), w] for k, (c, w) in d.choices.items()},
        }
    except Exception as e:  # noqa: BLE001  (reported to the notebook, which raises it)
        traceback.print_exc()
        result = {"error": str(e) if isinstance(e, DraftlabError) else f"{type(e).__name__}: {e}"}
    (job / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    _job(Path(sys.argv[1]))
