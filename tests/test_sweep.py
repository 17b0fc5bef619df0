"""Issue 51's sweep (benchmarks/sweep_levers.py): an arm that changes stage 01 gets a dataset of its own, one that
changes training shares the base dataset, and the levers table marks the arm chosen on eval, beside its bench tau."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _sweep():
    spec = importlib.util.spec_from_file_location("sweep_levers", ROOT / "benchmarks" / "sweep_levers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arms_of_stage_01_get_their_own_dataset_and_the_table_marks_the_eval_choice():
    sweep = _sweep()
    assert sweep.arm_run("default", "ttt3", {"ttt_steps": 3}, "smollm2-default").dataset_name == "smollm2-default"
    assert sweep.arm_run("default", "ttt3", {"ttt_steps": 3}, "smollm2-default").run_name == "default-ttt3"
    assert (
        sweep.arm_run("default", "vocab", {"draft_vocab_size": 8192}, "smollm2-default").dataset_name
        == "smollm2-default-vocab"
    )
    assert (
        sweep.arm_run("default", "text", {"extra_samples": 1}, "smollm2-default").dataset_name == "smollm2-default-text"
    )

    def tau(v):
        return {"value": v, "lo": v - 0.1, "hi": v + 0.1}

    rows = [
        {
            "arm": a,
            "settings": s,
            "steps": 9,
            "training seconds": 4.0,
            "position 1": 0.5,
            "eval tau": tau(e),
            "bench tau": tau(b),
        }
        for a, s, e, b in (("base", {}, 1.2, 1.3), ("noise", {"state_noise": 0.1}, 1.4, 1.25))
    ]
    text = sweep.table({"chosen on eval": "noise", "arms": rows})
    assert (
        '| noise (chosen on eval) | {"state_noise": 0.1} | 9 | 4 | 0.500 | 1.400 [1.300, 1.500] '
        "| 1.250 [1.150, 1.350] |" in text
    )
    assert "| base | - | 9 |" in text
