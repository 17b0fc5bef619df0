"""`draftlab run`: every notebook in order through papermill, stopping at the first failure."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from unittest.mock import patch

from draftlab import DraftlabError
from draftlab.config import load_profile, notebooks_dir
from draftlab.layout import RunLayout
from draftlab.progress import HEADLESS_ENV
from draftlab.writes import writable_folder

PROFILES = ("ci", "default", "gpu", "gemma")  # the profiles notebooks/params/ ships


def notebooks(only: list[str] | None = None) -> list[Path]:
    found = sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb"))
    if only:
        wanted = {o.strip().zfill(2) for o in only if o.strip()}
        unknown = wanted - {p.name[:2] for p in found}
        if unknown:
            raise DraftlabError(f"--only {sorted(unknown)}: no such notebook; have {[p.name for p in found]}.")
        found = [p for p in found if p.name[:2] in wanted]
    return found


class NotebookFailed(RuntimeError):
    pass


# A cell that outlives this is stuck, not slow (the longest default-profile cell on 2 CPU cores,
# generating the answers in 01, takes about 4 minutes): nbclient can block forever on a kernel
# message (jupyter/nbclient#312), and a bounded failure naming the cell beats a CI job killed at its
# wall clock with no summary.
CELL_TIMEOUT_S = 1800
OUTPUTS_ELSEWHERE = "choose another --run-name, or another DRAFTLAB_HOME"


def run(
    profile: str = "default",
    only=None,
    run_name: str | None = None,
    kernel: str = "python3",
    cell_timeout: int = CELL_TIMEOUT_S,
    overrides: dict | None = None,
    check: bool = False,
) -> list[dict]:
    """Every notebook of the run in order, after every check its stages make as they start (`profile.plan`, printed
    with what each stage reads and writes); `check`: only that, nothing run."""
    import logging

    from draftlab.profile import plan

    log = logging.getLogger("papermill")  # stream each cell's output to the console as it runs
    if not log.handlers:
        log.addHandler(logging.StreamHandler(sys.stdout))
        log.setLevel(logging.INFO)
    params = load_profile(profile)  # refused here, whole, before any notebook starts
    nbs = notebooks(only)
    run_name = run_name or profile
    print(plan(profile, [p.name[:2] for p in nbs], run_name, overrides or {}, convert=check), flush=True)
    if check:
        print("--check: every setting is one the stages take; nothing was run.")
        return []
    out = RunLayout({**params, **(overrides or {})}["dataset_name"], run_name).outputs
    writable_folder(out, "the run's outputs folder", OUTPUTS_ELSEWHERE)
    # the notebooks' parameters cells: each loads its own stage's config from the profile (config.start_stage)
    params = {"profile": profile, "run_name": run_name, "overrides": overrides or {}}
    summary: list[dict] = []
    with patch.dict(os.environ, kernel_env()):  # kernels inherit it: text progress, no widgets (progress.py)
        _run_each(nbs, params, out, kernel, cell_timeout, summary)
    print_summary(summary)
    return summary


def kernel_env() -> dict[str, str]:
    """What the notebooks' kernels get on top of this environment: HEADLESS_ENV, and a relative $DRAFTLAB_VLLM made
    absolute, because papermill runs each notebook from notebooks/, where that path would name nothing."""
    vllm = os.environ.get("DRAFTLAB_VLLM")
    return {**HEADLESS_ENV, **({"DRAFTLAB_VLLM": os.path.abspath(vllm)} if vllm and not os.path.isabs(vllm) else {})}


def _run_each(nbs: list[Path], params: dict, out: Path, kernel: str, cell_timeout: int, summary: list[dict]) -> None:
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    from draftlab.data.manifest import write_atomic  # torch with it: not for `draftlab --help`

    profile = params["profile"]
    for nb in nbs:
        t0 = time.perf_counter()
        rec = {"notebook": nb.name, "output": str(out / nb.name)}
        print(f"==> {nb.name} (profile {profile})", flush=True)
        try:
            pm.execute_notebook(
                str(nb),
                str(out / nb.name),
                parameters=params,
                kernel_name=kernel,
                cwd=str(nb.parent),
                log_output=True,
                progress_bar=False,
                execution_timeout=cell_timeout,
                kernel_manager_class=_kernel_manager(),
            )
            rec.update(status="ok")
        except PapermillExecutionError as e:
            rec.update(status="failed", cell=e.cell_index, execution_count=e.exec_count, error=f"{e.ename}: {e.evalue}")
        except CellTimeoutError as e:
            rec.update(
                status="failed",
                cell=_running_cell(out / nb.name),
                execution_count=None,
                error=f"no reply within {cell_timeout} s ({str(e).splitlines()[0]}); if the cell is only slow, "
                f"raise the limit with `draftlab run --cell-timeout SECONDS`",
            )
        except DeadKernelError as e:
            rec.update(
                status="failed",
                cell=_running_cell(out / nb.name),
                execution_count=None,
                error=f"the kernel died ({e}); out of memory is the usual cause: a smaller profile or batch size",
            )
        rec["seconds"] = round(time.perf_counter() - t0, 1)
        summary.append(rec)
        write_atomic(out / "summary.json", json.dumps(summary, indent=1), "the run's summary")
        if rec["status"] != "ok":
            print_summary(summary)
            raise NotebookFailed(
                f"{nb.name} failed in cell {rec['cell']} (execution count {rec['execution_count']}): {rec['error']}\n"
                f"The executed notebook with the traceback is {out / nb.name}."
            )
    return summary


def _kernel_manager() -> type:
    """nbclient's kernel manager, its kernel sent SIGKILL the moment this runner dies (PR_SET_PDEATHSIG, as
    `serving.process` does for servers; the kernel's own servers then follow it). ipykernel's own check of its
    parent runs in a Python thread, so a cell holding the GIL (one long C call) kept the kernel of a killed
    `draftlab run` computing on its own for minutes."""
    import functools
    import signal

    from jupyter_client.manager import AsyncKernelManager

    from draftlab.serving.process import die_with_parent

    class DiesWithRunner(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            kw["preexec_fn"] = functools.partial(die_with_parent, signal.SIGKILL)
            return await super()._async_launch_kernel(kernel_cmd, **kw)

    return DiesWithRunner


def _running_cell(executed: Path):
    """The last cell papermill started in the notebook it saved (the one that timed out), or None."""
    try:
        cells = json.loads(executed.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return None
    started = [i for i, c in enumerate(cells) if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    return started[-1] if started else None


def print_summary(summary: list[dict]) -> None:
    print(f"\n{'notebook':40s} {'status':8s} {'seconds':>8s}")
    for r in summary:
        print(f"{r['notebook']:40s} {r['status']:8s} {r['seconds']:8.1f}")


def parse_overrides(pairs: list[str]) -> dict:
    """`KEY=VALUE` pairs from the command line, each VALUE read as YAML (so 0 is an int, null is None, 1e-3 a float;
    `profile.read_yaml`: a fault named with the --set, line and column)."""
    from draftlab.profile import read_yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise DraftlabError(f"--set {pair!r}: write KEY=VALUE, e.g. --set n_sharegpt=0")
        out[key.strip()] = read_yaml(value, f"--set {pair!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="draftlab", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute the notebooks in order with papermill")
    r.add_argument("--profile", default="default", help=f"one of {PROFILES} (notebooks/params/*.yaml)")
    r.add_argument("--only", default=None, help="comma-separated notebook numbers, e.g. 01,03")
    r.add_argument("--run-name", default=None, help="outputs/<run-name>/ (default: the profile name)")
    r.add_argument("--kernel", default="python3")
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="override one profile parameter (YAML value; checked against every stage's keys), "
        "e.g. --set n_sharegpt=0 --set dataset_name=smollm2-gpu-nosg",
    )
    r.add_argument(
        "--cell-timeout", type=int, default=CELL_TIMEOUT_S, help="seconds one cell may run before the run fails"
    )
    r.add_argument(
        "--check", action="store_true", help="check the profile and every --set, print the plan, run nothing"
    )
    s = sub.add_parser(
        "serve", help="serve the verifier with a trained draft through `vllm serve` (foreground, Ctrl-C stops it)"
    )
    s.add_argument(
        "--draft",
        required=True,
        help="a stage-04 final/ folder (RunLayout.final), e.g. data/runs/smollm2-default/drafts/default/eagle3/final",
    )
    s.add_argument("--verifier", default="smollm2", help="'smollm2' (embedded) or a local HF causal-LM directory")
    s.add_argument("--k", type=int, default=5, help="speculative tokens per verifier pass")
    s.add_argument("--dtype", default="float32", help="float32 | bfloat16 (the dtype the draft was trained in)")
    s.add_argument("--device", default="cpu", help="cpu (runs --enforce-eager) | cuda")
    s.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "serve":
            from draftlab.acceptance.proposers import check_frozen
            from draftlab.data.verifier_dir import resolve_verifier
            from draftlab.serving.process import serve_forever

            where = (resolve_verifier(args.verifier), args.draft)
            return serve_forever(*where, args.k, args.dtype, args.device, args.port, check=check_frozen)
        run(
            args.profile,
            args.only.split(",") if args.only else None,
            args.run_name,
            args.kernel,
            args.cell_timeout,
            parse_overrides(args.overrides),
            args.check,
        )
    except (DraftlabError, NotebookFailed) as e:
        print(f"draftlab: {e}", file=sys.stderr)
        return 1
    return 0
