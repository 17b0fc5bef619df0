"""Every verifier family a researcher brings (issue 20): one tiny random verifier per family through draftlab's public
pipeline (stage-01 extraction, EAGLE-3 and DFlash drafts, two training steps, reload, the speculative loop, vLLM), and
the compatibility table of docs/verifiers.md, which must be what this run measured (benchmarks/family_table.py
renders it)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from draftlab.families import FAMILIES as DRAFT_FAMILIES
from draftlab.layout import RunLayout

from families import CELLS, FAMILIES, OK, draft_family, drafts, extraction, loop, refusal, served, training

ROOT = Path(__file__).resolve().parents[1]
# `make test` serves every family (about a minute each); DRAFTLAB_FAMILIES_VLLM=one serves only the
# families marked serve=True, for a quicker local run (the other vLLM cells then keep the page's value)
SERVE_ALL = os.environ.get("DRAFTLAB_FAMILIES_VLLM", "all") == "all"
RESULTS: dict[str, dict[str, str | None]] = {}
NA = "–"
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("one_thread")]


def _table():
    spec = importlib.util.spec_from_file_location("family_table", ROOT / "benchmarks" / "family_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _results() -> dict:
    return {
        "serve_all": SERVE_ALL,
        "complete": set(RESULTS) == set(FAMILIES),
        "families": [
            {"name": n, "label": f.label, "served_in_make_test": f.serve or SERVE_ALL, "cells": RESULTS[n]}
            for n, f in FAMILIES.items()
            if n in RESULTS
        ],
    }


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """DRAFTLAB_HOME in a temporary folder: the runs, the nested verifiers' views and the digest cache go there."""
    root, before = tmp_path_factory.mktemp("families_home"), os.environ.get("DRAFTLAB_HOME")
    os.environ["DRAFTLAB_HOME"] = str(root)
    yield root
    # Not a MonkeyPatch: datasets' map(num_proc=...) (speculators' preprocessing) swaps os.environ for a copy, and a
    # MonkeyPatch would undo on the old object, leaving DRAFTLAB_HOME set for every later test module.
    if before is None:
        os.environ.pop("DRAFTLAB_HOME", None)
    else:
        os.environ["DRAFTLAB_HOME"] = before


@pytest.fixture(scope="session")
def family_root(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family(name, home, family_root):
    from draftlab.data.verifier import load_verifier
    from draftlab.serving.command import unavailable

    from families import build_dir

    fam, cells = FAMILIES[name], RESULTS.setdefault(name, dict.fromkeys(CELLS))
    run, out = RunLayout(name, "families", home).data, {}

    def extract():
        out["v"] = load_verifier(build_dir(name, family_root), device="cpu", dtype="float32")
        return extraction(out["v"], run)

    stages = [
        ("extraction", extract),
        ("draft", lambda: drafts(out["v"], run)),
        ("train", lambda: training(out["draft"], run)),
        ("loop", lambda: loop(out["v"], out["train"])),
    ]
    if fam.serve or SERVE_ALL:
        stages.append(("vLLM", lambda: None if unavailable() else served(out["v"], run)))
    try:
        for cell, fn in stages:
            if any(c.startswith("refused") for c in cells.values() if c):
                cells[cell] = NA  # needs what a refused stage would have made
                continue
            try:
                out[cell] = fn()
                cells[cell] = out[cell] if cell == "vLLM" else OK
            except Exception as e:  # noqa: BLE001 (an expected refusal is recorded, anything else re-raised)
                cells[cell] = refusal(name, cell, e)
    except BaseException as e:
        cells.update(
            {c: f"FAILED: {type(e).__name__}" if c == cell else "not reached" for c in CELLS if cells[c] is None}
        )
        raise
    finally:
        path = ROOT / "outputs" / "families" / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_text(json.dumps(_results(), indent=1, ensure_ascii=False))
        path.with_suffix(".tmp").replace(path)  # benchmarks/family_table.py never reads half a file
    unmet = [c for c in fam.refused if not cells[c].startswith("refused")]
    assert not unmet, f"{name}: expected a refusal at {unmet}, got {[cells[c] for c in unmet]}"
    if cells["vLLM"] not in (None, NA) and fam.vllm is None:
        assert cells["vLLM"].startswith(OK), cells["vLLM"]


def test_docs_table_is_what_this_run_measured():
    if set(RESULTS) != set(FAMILIES):
        pytest.skip(f"only {sorted(RESULTS)} of the matrix ran in this session")
    t = _table()
    text = (ROOT / "docs" / "verifiers.md").read_text()
    want = t.render(_results(), t.page_cells(text))
    assert t.block(text) == want, (
        "docs/verifiers.md's family table differs from this run: run `python benchmarks/family_table.py --write`"
    )
    assert t.NOT_RUN not in want, "a cell was never measured: run once with DRAFTLAB_FAMILIES_VLLM=all, then --write"


def test_the_table_renders_a_refusal_and_keeps_cells_a_run_did_not_produce():
    t = _table()
    results = {
        "families": [
            {
                "label": "A",
                "cells": {
                    "extraction": OK,
                    "draft": "refused: final norm is a LayerNorm",
                    "train": NA,
                    "loop": NA,
                    "vLLM": None,
                },
            }
        ]
    }
    old = t.page_cells(f"{t.START}\n| family | {' | '.join(CELLS)} |\n| --- |\n| A | x | x | x | x | kept |\n{t.END}")
    rows = t.render(results, old).splitlines()
    assert rows[2] == f"| A | {OK} | refused: final norm is a LayerNorm | {NA} | {NA} | kept |"
    assert t.render(results).splitlines()[2].endswith(f"| {t.NOT_RUN} |")


def test_rms_norm_conventions_are_told_apart_and_a_layernorm_is_none():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from draftlab.drafts.norms import norm_gain

    for dtype in (torch.float32, torch.bfloat16):
        plain, gemma = LlamaRMSNorm(16).to(dtype), Gemma3RMSNorm(16).to(dtype)
        for n in (plain, gemma):
            torch.nn.init.normal_(n.weight)
        got = (norm_gain(plain), norm_gain(gemma), norm_gain(torch.nn.LayerNorm(16).to(dtype)))
        assert got == ("x*w", "x*(1+w)", None), dtype


def test_a_gemma_eagle3_draft_gets_the_gemma_norm_and_without_it_is_refused(home, family_root, tmp_path):
    """speculators' EAGLE-3 rebuilds the verifier's logits with x*w; for Gemma's x*(1+w) draftlab swaps the norm in,
    at build and at every load, and `verify` refuses a draft that computes another norm than the verifier's."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from draftlab import DraftlabError
    from draftlab.acceptance.proposers import load_draft
    from draftlab.data.verifier import load_verifier
    from draftlab.drafts.draft import build_eagle3, verify

    from families import build_dir

    v = load_verifier(build_dir("gemma3", family_root), device="cpu", dtype="float32")
    d = build_eagle3(v, None, num_layers=1)
    assert (
        type(d.model.verifier_norm).__name__ == "Gemma3RMSNorm"
        and "swapped for Gemma3RMSNorm" in d.report()["verifier norm"]
    )
    d.model.save_pretrained(tmp_path / "draft")
    assert type(load_draft(tmp_path / "draft", v).model.verifier_norm).__name__ == "Gemma3RMSNorm"
    plain = LlamaRMSNorm(v.hidden_size)
    plain.weight.data.copy_(d.model.verifier_norm.weight)
    d.model.verifier_norm = plain
    with pytest.raises(
        DraftlabError, match=r"verifier_norm \(LlamaRMSNorm\) holds verifier .* weight but computes another function"
    ):
        verify(d)


NEW_FAMILIES = [k for k in DRAFT_FAMILIES if k not in ("eagle3", "dflash")]  # eagle3 and dflash: test_family above


@pytest.mark.parametrize("kind", NEW_FAMILIES)
@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_draft_family(name, kind, home, family_root):
    """Issue 32: every draft family speculators trains, through extraction to served (or refused by name, in
    speculators' or vLLM's words) on the Llama and Qwen3 verifiers."""
    from draftlab.data.verifier import load_verifier

    from families import build_dir

    v = load_verifier(build_dir(name, family_root), device="cpu", dtype="float32")
    run = RunLayout(f"{name}-drafts", "families", home).data
    if not (run / "train" / "manifest.json").exists():
        extraction(v, run)
    cells = draft_family(v, run, kind)
    assert set(cells) <= {"draft", "train", "loop", "vLLM"} and all(cells.values()), cells
