"""Every path of a run, named in one place: the stage-01 dataset, the drafts of a run, the stage outputs.

A dataset (`data/runs/<dataset_name>/`) is what notebook 01 made; several runs may train on it, so the
drafts of each run sit under its own name (`drafts/<run_name>/<kind>/`) and two runs on one dataset
never overwrite each other. Figures, tables and each stage's resolved config go to
`outputs/<run_name>/<NN>/`. No other module, notebook, benchmark or test spells these paths
(tests/test_project.py greps for hand-built drafts paths).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftlab import DraftlabError
from draftlab.config import repo_root
from draftlab.files import read_json

SPLITS = ("train", "eval")  # the splits 01 stores rows and hidden states of; bench is prompts only


# Stage-01 keys added after datasets were made -> the value a saved config without them was made with (read so by
# `upstream` and `refuse_rewrite` alike).
IMPLIED_BEFORE = {"sharegpt_turns": "first", "prompts": []}


@dataclass(frozen=True)
class RunLayout:
    dataset_name: str
    run_name: str
    root: Path = field(default_factory=repo_root)

    # stage 01: the dataset, shared by every run on it
    @property
    def data(self) -> Path:
        """`data/runs/<dataset_name>`: what notebook 01 wrote."""
        return Path(self.root) / "data" / "runs" / self.dataset_name

    def split(self, name: str) -> Path:
        """Rows, hidden states, manifest and vocab mappings of one split (`train`, `eval`)."""
        return self.data / name

    @property
    def prompts(self) -> Path:
        """The prompt set with its train / eval / bench splits: written by 01, read by 05 (and benchmarks)."""
        return self.data / "prompts.jsonl"

    @property
    def responses(self) -> Path:
        """The verifier's greedy answers to the train and eval prompts (01 appends as they finish)."""
        return self.data / "responses.jsonl"

    def vocab(self, draft_vocab_size: int) -> tuple[Path, Path]:
        """The d2t / t2d mappings 01 saves beside the train split (named as `speculators train` looks for them)."""
        train = self.split("train")
        return train / f"d2t-{draft_vocab_size}.npy", train / f"t2d-{draft_vocab_size}.npy"

    # stage 04: the drafts of this run
    @property
    def drafts(self) -> Path:
        """`data/runs/<dataset_name>/drafts/<run_name>`: this run's trained drafts, one folder per kind."""
        return self.data / "drafts" / self.run_name

    def draft(self, kind: str) -> Path:
        """One kind's run folder (metrics.jsonl, checkpoints/, final/, job/, speculators/)."""
        return self.drafts / kind

    def final(self, kind: str) -> Path:
        """What `train.train` writes at the end of a run: the folder vLLM and `from_pretrained` load."""
        return self.draft(kind) / "final"

    def speculators_save(self, kind: str) -> Path:
        """`--save-path` of the torchrun command (`speculators train`'s own epochs)."""
        return self.draft(kind) / "speculators"

    def job(self, kind: str) -> Path:
        """Where a training job in its own process takes its inputs from and leaves its result (jobs.py)."""
        return self.draft(kind) / "job"

    # every stage: figures, tables, resolved configs
    @property
    def outputs(self) -> Path:
        """`outputs/<run_name>`: the executed notebooks and `draftlab run`'s summary.json."""
        return Path(self.root) / "outputs" / self.run_name

    def stage(self, stage: str) -> Path:
        """`outputs/<run_name>/<NN>/`: one stage's figures and summary.json."""
        return self.outputs / stage

    def resolved_config(self, stage: str) -> Path:
        """The config a stage ran with, as JSON. 01's sits in the dataset it describes (every run on the
        dataset reads it); the others beside the stage's outputs."""
        return self.data / "config.json" if stage == "01" else self.stage(stage) / "config.json"

    def finish(self, stage: str) -> None:
        """A notebook's last cell: its resolved config marked finished, with the time (`upstream` reads it)."""
        saved = read_json(self.resolved_config(stage), f"Re-run notebook {stage} (draftlab run --only {stage}).")
        write_json(self.resolved_config(stage), {**saved, "finished": time.strftime("%Y-%m-%d %H:%M:%S")})

    def upstream(self, stage: str, cfg, same: tuple[str, ...] = ("verifier",), required: bool = True) -> dict | None:
        """The resolved config an earlier stage wrote for this run (01's: for this dataset), refused when it
        is missing or unfinished (`required=False`: None then) or when a key in `same` differs from `cfg`
        (e.g. a dataset extracted for another verifier)."""
        path = self.resolved_config(stage)
        fix = (
            f"Re-run notebook {stage} to its end (draftlab run --only {stage}; 01 resumes what it finished), "
            "which writes it again."
        )
        saved = read_json(path, fix) if path.exists() else {}
        if saved and not isinstance(saved.get("config"), dict):
            raise DraftlabError(f"{path} cannot be read: it has no 'config' mapping. {fix}")
        if not saved.get("finished"):
            if not required:
                return None
            how = "started but did not finish" if saved else "has no resolved config"
            raise DraftlabError(
                f"stage {stage} {how} ({path}) for dataset {self.dataset_name!r}, run {self.run_name!r}: "
                f"run notebook {stage} to its end first (draftlab run --only {stage}; 01 resumes what it finished)."
            )
        for key in same:
            if saved["config"].get(key) != getattr(cfg, key):
                raise DraftlabError(
                    f"{key}={getattr(cfg, key)!r} here, but stage {stage} ran with {key}={saved['config'].get(key)!r} "
                    f"({path}): use the same {key}, or re-run notebook {stage} with this one."
                )
        used = {**IMPLIED_BEFORE, **saved["config"]} if stage == "01" else saved["config"]
        self._refuse_unread_overrides(stage, cfg, used, path)
        return used

    def _refuse_unread_overrides(self, stage: str, cfg, used: dict, path: Path) -> None:
        """An override of this run (recorded in the calling stage's resolved config) that the calling stage
        does not read and `stage` ran with another value: it would change nothing (e.g. `--set
        draft_vocab_size=64` for 04 alone, which trains on the vocabulary 01 built)."""
        from dataclasses import fields

        from draftlab.config import STAGES

        here = next((n for n, cls in STAGES.items() if type(cfg) is cls), None)
        own = self.resolved_config(here) if here else None
        overrides = json.loads(own.read_text()).get("overrides", {}) if own and own.exists() else {}
        read_here = {f.name for f in fields(cfg)}
        for key, value in overrides.items():
            if key not in read_here and key in used and used[key] != value:
                raise DraftlabError(
                    f"{key}={value!r} is set for run {self.run_name!r}, but stage {here} does not read {key}: it "
                    f"takes stage {stage}'s {key}={used[key]!r} ({path}). Re-run stage {stage} with it too "
                    f"(draftlab run --only {stage},{here} --set {key}=...), or drop that setting."
                )

    def refuse_rewrite(self, config: dict, ignore: tuple[str, ...] = ()) -> None:
        """Refuse, before stage 01 writes anything, to change this dataset (a `config` that differs from the
        one 01 last ran with, keys in `ignore` aside) while other runs hold drafts trained on it: their
        drafts would no longer match their data. Same settings resume. A config saved before a key existed is
        compared as if it held the value it was made with (`IMPLIED_BEFORE`)."""
        path = self.resolved_config("01")
        saved = json.loads(path.read_text()).get("config", {}) if path.exists() else {}
        saved = {**IMPLIED_BEFORE, **saved} if saved else {}
        changed = {k: (saved[k], v) for k, v in config.items() if k in saved and k not in ignore and saved[k] != v}
        others = [r for r in runs_on(self.dataset_name, self.root) if r.run_name != self.run_name]
        if changed and others:
            what = ", ".join(f"{k}={old!r} -> {new!r}" for k, (old, new) in changed.items())
            drafts = ", ".join(str(r.drafts) for r in others)
            raise DraftlabError(
                f"stage 01 would change dataset {self.dataset_name!r} ({self.data}: {what}), but the drafts of "
                f"run(s) {[r.run_name for r in others]} were trained on it ({drafts}). "
                f"Make a new dataset with --set dataset_name=<new name>, or delete those drafts first; "
                f"01 with the settings in {path} resumes the dataset as it is."
            )


def write_json(path: Path, record: dict) -> None:
    """All or nothing (`manifest.write_atomic`): two runs on one dataset both write 01's config."""
    from draftlab.data.manifest import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=1))


def dataset_and_folder(data, folder, pick, what: str) -> tuple[Path, Path]:
    """(dataset folder, a run's folder) from `data` as a caller passes it: a RunLayout names both
    (`pick(layout)` unless `folder` is given); a bare dataset folder needs `folder` itself."""
    if isinstance(data, RunLayout):
        return data.data, Path(folder or pick(data))
    if folder is None:
        raise DraftlabError(
            f"{what}: {data} is a dataset folder, which names no run; pass a RunLayout(dataset_name, run_name) "
            "as data (it names the run's folders), or the folder itself."
        )
    return Path(data), Path(folder)


def runs_on(dataset_name: str, root: Path | None = None) -> list[RunLayout]:
    """Every run that trained drafts on one dataset (each holds `drafts/<run_name>/`), by name."""
    root = Path(root or repo_root())
    every = RunLayout(dataset_name, "_", root).drafts.parent  # the folder holding one folder per run
    return (
        [RunLayout(dataset_name, p.name, root) for p in sorted(every.iterdir()) if p.is_dir()] if every.is_dir() else []
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m draftlab.layout DATASET_GLOB FILE`: each run's `<kind>/FILE` that exists on the datasets
    matching the glob (for shell scripts, which then spell no run path themselves)."""
    import sys

    pattern, name = argv or sys.argv[1:]
    for ds in sorted(p.name for p in (repo_root() / "data" / "runs").glob(pattern) if p.is_dir()):
        for lay in runs_on(ds):
            for kind in sorted(p.name for p in lay.drafts.iterdir() if (p / name).is_file()):
                print(lay.draft(kind) / name)


if __name__ == "__main__":
    main()
