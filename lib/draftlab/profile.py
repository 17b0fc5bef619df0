"""A profile as a user writes it: its YAML read with the place of any fault, the values each key takes, and the
plan of a run, all before the first notebook starts.

`config` refuses an unknown key or a value of the wrong type; what a stage would refuse minutes later (a family
named twice, a block of no tokens, no request in flight, a draft vocabulary larger than the verifier's) is
refused here too, by `RULES` (one key) and `fits_verifier` (a key against the verifier's own config), each
naming the key and the values it takes. `plan` runs every check a stage would run at its start, for the
stages of a run, and says what each will read and write: `draftlab run --check` prints it and runs nothing,
and every `draftlab run` prints it first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from draftlab import DraftlabError


class _Loader(yaml.SafeLoader):
    """PyYAML's YAML 1.1, which reads `1e-3` (no dot, or no sign in the exponent) as the string '1e-3': a float here,
    the number a user writing a learning rate means."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_yaml(text: str, where: str):
    """`text` as YAML (`_Loader`); a fault is a DraftlabError naming `where` (a file, a `--set`), line and column."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark, started = e.problem_mark or e.context_mark, e.context_mark if e.problem_mark else None
        at = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        since = f" ({e.context}, from line {started.line + 1}, column {started.column + 1})" if started else ""
        raise DraftlabError(f"{where}{at}: not valid YAML: {e.problem or e.context}{since}. Fix it there.") from None
    except yaml.YAMLError as e:
        raise DraftlabError(f"{where}: not valid YAML ({e}). Fix it there.") from None


def _at_least(least: int, why: str):
    def rule(value):
        return None if value >= least else f"a whole number of at least {least} ({why})"

    return rule


def _kinds(kinds: list) -> str | None:
    from draftlab.families import FAMILIES, partition, taken

    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    unknown = [k for k in kinds if k not in FAMILIES]
    if not kinds or twice or unknown or not partition(kinds)[0]:
        said = (
            "it is empty"
            if not kinds
            else f"{unknown[0]!r} is no family"
            if unknown
            else f"it names {', '.join(map(repr, twice))} twice"
            if twice
            else "it names no family draftlab trains"
        )
        return f"a list naming each family once, at least one of {taken()} ({said})"
    return None


def _concurrency(levels: list) -> str | None:
    if levels and all(c >= 0 for c in levels):
        return None
    return "a list of at least one number of requests in flight, each 1 or more, or 0 for every prompt at once"


def _runs(names: list) -> str | None:
    bad = [n for n in names if not n or n.count("/") > 1 or n != n.strip()]
    if not bad and len(set(names)) == len(names):
        return None
    said = f"{bad[0]!r} is not one" if bad else "a run is named twice"
    return f"a list of run names, each `run` (this dataset) or `dataset/run`, each once ({said})"


def _choice(module: str, name: str):
    def rule(value):
        import importlib

        allowed = getattr(importlib.import_module(module), name)
        return None if value in allowed else f"one of {list(allowed)}"

    return rule


# key -> rule(value): None where the value is one the stages take, else the values they take (with why)
RULES = {
    "draft_kinds": _kinds,
    "dflash_block_size": _at_least(2, "a DFlash block holds its anchor and at least one drafted token"),
    "n_anchors": _at_least(1, "DFlash blocks per pack"),
    "ttt_steps": _at_least(1, "EAGLE-3 training-time-test steps"),
    "spec_k": _at_least(1, "draft tokens per verifier pass"),
    "serve_concurrency": _concurrency,
    "draft_vocab_size": _at_least(1, "tokens the draft predicts; the verifier's vocabulary is the most"),
    "engine": _choice("draftlab.data.gen_engine", "ENGINES"),
    "gen_dtype": _choice("draftlab.data.gen_engine", "GEN_DTYPES"),
    "hidden_states": _choice("draftlab.data.extract", "SOURCES"),
    "compare_runs": _runs,
}


def check_rules(params: dict, where) -> None:
    """Refuse a value of a key in `RULES` the stages would refuse later (its type already checked), naming the key and
    the values it takes."""
    for key, value in params.items():
        wrong = RULES[key](value) if key in RULES else None
        if wrong:
            raise DraftlabError(f"{where}: {key}={value!r} is refused: {key} takes {wrong}.")


def fits_verifier(cfg, convert: bool = True) -> str:
    """Stage 01's settings against its verifier's config.json (no weights loaded): a causal LM (`resolve_verifier`),
    `draft_vocab_size` within its vocabulary, `layer_ids` within its layers. What it found, in one line; where the
    embedded verifier is not converted yet and not `convert`, nothing checked (notebook 01 checks it as it starts)."""
    from draftlab.data.embedded import EMBEDDED
    from draftlab.data.verifier_dir import resolve_verifier

    if not convert and str(cfg.verifier).lower() == EMBEDDED and not _embedded_ready():
        return f"verifier {cfg.verifier}: not converted yet; notebook 01 converts and checks it as it starts"
    path = resolve_verifier(cfg.verifier)
    text = json.loads((path / "config.json").read_text())
    text = text.get("text_config", text)
    vocab, layers = text.get("vocab_size"), text.get("num_hidden_layers")
    if vocab and cfg.draft_vocab_size > vocab:
        raise DraftlabError(
            f"draft_vocab_size={cfg.draft_vocab_size} is refused: the verifier {path} has {vocab} tokens, and the "
            f"draft vocabulary is a part of it. draft_vocab_size takes 1 to {vocab}."
        )
    if cfg.layer_ids and layers:
        from draftlab.data.extract import validate_layer_ids

        validate_layer_ids(cfg.layer_ids, layers)
    return f"verifier {cfg.verifier}: {path} ({layers} layers, {vocab} tokens)"


def _embedded_ready() -> bool:
    from draftlab.config import data_dir
    from draftlab.data.embedded import EMBEDDED_NAME

    return (data_dir() / "verifiers" / EMBEDDED_NAME / "model.safetensors").exists()


def refuse_unread(overrides: dict, stages: list[str]) -> None:
    """Refuse a `--set` key that no stage of this run reads: it would change nothing, silently (e.g.
    `--set draft_vocab_size=64 --only 04`: 04 trains on the vocabulary 01 already built)."""
    from draftlab.config import readers

    for key, value in overrides.items():
        by = readers(key)
        if not set(by) & set(stages):
            with_it = ",".join(sorted({*stages, by[-1]}))
            raise DraftlabError(
                f"--set {key}={value!r}: only stage {'/'.join(by)} reads {key}, and this run runs stage "
                f"{'/'.join(stages)}, so it would change nothing. Add stage {by[-1]} to the run "
                f"(--only {with_it}), or drop the --set."
            )


def plan(profile: str, stages: list[str], run_name: str, overrides: dict, convert: bool = True) -> str:
    """Every check the stages of this run make as they start (the profile, each `--set`, each stage's typed config,
    its values, stage 01's verifier and dataset, 04's training settings), then what each stage reads and writes.
    `convert`: the embedded verifier is converted to be checked, if it is not yet (`fits_verifier`)."""
    from draftlab.config import STAGES, check_values, load_profile, open_stage
    from draftlab.layout import RunLayout

    params = {**load_profile(profile), **overrides}
    check_values(overrides, "--set")
    refuse_unread(overrides, stages)
    layout = RunLayout(params["dataset_name"], run_name)
    lines = [
        f"profile {profile}, run {run_name!r}, dataset {params['dataset_name']!r}: D = {_rel(layout, layout.data)}, "
        f"O = {_rel(layout, layout.outputs)}"
    ]
    for stage in [s for s in stages if s in STAGES]:
        cfg, layout = open_stage(stage, profile, run_name, overrides)  # 01: refuses rewriting another run's dataset
        if stage == "01":
            lines.append(fits_verifier(cfg, convert))
        if stage == "04":
            from draftlab.training.settings import Settings

            Settings(**cfg.pick(Settings))  # the training settings, refused as notebook 04 would refuse them
        reads, writes = _paths(stage, cfg, layout)
        lines.append(f"{stage} {STAGES[stage].__name__.lower():8s} reads {reads}; writes {writes}")
    return "\n".join(lines)


def _arm(name: str, cfg, layout):
    """An arm of `compare_runs` as 04 will read it: its drafts' folder, refused now where a kind has no metrics."""
    from draftlab.families import partition
    from draftlab.training.arms import arm_layout, untrained

    arm = arm_layout(name, layout)
    missing = [k for k in partition(cfg.draft_kinds)[0] if not (arm.draft(k) / "metrics.jsonl").is_file()]
    if missing:
        raise untrained(name, arm, f"no {missing[0]} run at {arm.draft(missing[0])}")
    return arm.drafts


def _rel(layout, path) -> str:
    """`path` relative to the checkout, with the run's dataset as D/ and its outputs as O/ (`plan`'s first line)."""
    path = Path(path)
    for short, root in (("D", layout.data), ("O", layout.outputs)):
        if path.is_relative_to(root) and path != root:
            return f"{short}/{path.relative_to(root)}"
    return str(path.relative_to(layout.root)) if path.is_relative_to(layout.root) else str(path)


def _paths(stage: str, cfg, layout) -> tuple[str, str]:
    """(what stage `stage` reads, what it writes), in `_rel`'s words."""
    from draftlab.families import partition

    kinds = "{" + ",".join(partition(cfg.draft_kinds)[0]) + "}" if hasattr(cfg, "draft_kinds") else ""
    run = _rel(layout, layout.drafts)
    out = _rel(layout, layout.stage(stage))
    if stage == "01":
        from draftlab.data.user_prompts import prompt_files

        own = "".join(f", {f.name} ({f.n or 'every'} from {f.path})" for f in prompt_files(cfg.prompts))
        reads = f"the verifier; ShareGPT {cfg.n_sharegpt}, chatterbot {cfg.n_chat}, HumanEval {cfg.n_code}{own} prompts"
        return reads, f"D/prompts.jsonl, D/responses.jsonl, D/train, D/eval, D/config.json, {out}"
    if stage in ("02", "03"):
        return "D/train (rows, hidden states, the draft vocabulary)", out
    if stage == "04":
        source = (
            "hidden states made by a vLLM server as packs are read" if cfg.hidden_states == "online" else "01's states"
        )
        arms = "".join(f", {_rel(layout, _arm(name, cfg, layout))}" for name in cfg.compare_runs)
        return f"D/train, D/eval ({source}){arms}", f"{run}/{kinds}, {out}"
    served = " (each served by vLLM too)" if cfg.serve_with_vllm else ""
    return f"D/prompts.jsonl (bench), {run}/{kinds}/final{served}", out
