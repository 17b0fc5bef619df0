"""Where notebook 01's time goes, phase by phase: its code cells run in one fresh process per repeat (a new
dataset each, so the answers are written and the states extracted anew), each phase timed by wrapping the
function that does it; the median over repeats per phase (BENCHMARKS.md, "Notebook 01's phases").

    python benchmarks/stage01_phases.py --profile default --repeat 3
"""  # fmt: skip

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (module, attribute, phase): the function each phase is spent in
PHASES = [
    ("draftlab.data.sources", "read_json_records", "ShareGPT file parsed"),
    ("draftlab.data.prompts", "load_prompts", "prompts (ShareGPT included)"),
    ("draftlab.serving.command", "_probe", "`vllm --version` probe (engine auto)"),
    ("draftlab.data.gen_engine", "Engine.vllm_server", "vLLM server start"),
    ("draftlab.data.generate_vllm", "serve_answers", "generation (vLLM)"),
    ("draftlab.data.dataset", "save_split", "rows saved (speculators import)"),
    ("draftlab.data.extract", "extract", "extraction (transformers, fp32)"),
]


def _wrap(owner, name: str, label: str, spent: dict) -> None:
    f = getattr(owner, name)

    @functools.wraps(f)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t

    setattr(owner, name, timed)


def once(profile: str, dataset: str) -> dict:
    import importlib

    cells = json.loads((ROOT / "notebooks" / "01_extract_hidden_states.ipynb").read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    spent: dict = {}
    scope: dict = {"__name__": "__main__"}
    t0 = time.perf_counter()
    for i, cell in enumerate(code):
        src = "".join(cell["source"])
        if i == 0:  # the parameters cell
            src = f"profile = {profile!r}\nrun_name = {dataset!r}\noverrides = {{'dataset_name': {dataset!r}}}\n"
        first = src.splitlines()[0][:40]
        t = time.perf_counter()
        exec(compile(src.replace("display(", "(lambda *a, **k: None)("), f"cell {i}", "exec"), scope)
        spent[f"cell {i}: {first}"] = time.perf_counter() - t
        if i == 1:  # the imports: every phase's function is loaded now; time each from here on
            spent["imports and config"] = spent.pop(f"cell 1: {first}")
            for mod, attr, label in PHASES:
                owner, _, name = attr.rpartition(".")
                m = importlib.import_module(mod)
                _wrap(getattr(m, owner) if owner else m, name, label, spent)
            _wrap(_Scope(scope), "load_verifier", "verifier loaded", spent)
    spent["notebook"] = time.perf_counter() - t0
    return spent


class _Scope:
    """Attribute access onto the notebook's globals (load_verifier is imported there by name)."""

    def __init__(self, scope: dict):
        object.__setattr__(self, "scope", scope)

    def __getattr__(self, name):
        return self.scope[name]

    def __setattr__(self, name, value):
        self.scope[name] = value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="default")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--once", default=None, help=argparse.SUPPRESS)  # one run, in this process: its dataset
    args = ap.parse_args()
    if args.once:
        print(json.dumps(once(args.profile, args.once)))
        return
    from draftlab.config import data_dir

    runs = []
    for r in range(args.repeat):
        dataset = f"phases-{args.profile}-{r}"
        shutil.rmtree(data_dir() / "runs" / dataset, ignore_errors=True)
        done = subprocess.run(
            [sys.executable, __file__, "--profile", args.profile, "--once", dataset],
            capture_output=True, text=True, cwd=ROOT / "notebooks", env={**os.environ, "DRAFTLAB_HEADLESS": "1"},
        )  # fmt: skip
        if done.returncode:
            sys.exit(done.stderr[-3000:])
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"run {r}: notebook {runs[-1]['notebook']:.1f} s", flush=True)
    for label in runs[0]:
        if not label.startswith("cell "):
            values = [run.get(label, 0.0) for run in runs]
            print(f"{statistics.median(values):8.2f} s  {label}  ({' / '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
