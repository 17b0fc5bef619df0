"""What a training run is trained with: its settings, the per-kind forward options they give, and
AdamW with transformers' cosine schedule with warm-up, as `speculators train` builds them.

`Settings` is checked on construction, so a bad value is named here rather than met as a
ZeroDivisionError deep in the loop. The settings in `CADENCE` only change how often things happen,
not what is trained, so they may differ on resume; every other field is part of the run's identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from types import SimpleNamespace

from draftlab import DraftlabError

# Settings that change how often things happen, not what is trained: free to differ on resume.
CADENCE = ("eval_every", "checkpoint_every", "eval_packs", "keep_checkpoints", "loader_workers", "online_requests")
# where the hidden states come from: the same states either way (tests/test_online.py), so not a hyper-parameter
SOURCE = ("hidden_states",)


@dataclass
class Settings:
    train_steps: int = 100
    learning_rate: float = 1e-3
    warmup_steps: int = 10
    pack_len: int = 2048  # tokens per batch (one packed sequence)
    grad_clip: float = 1.0
    weight_decay: float = 0.01  # speculators' AdamW default
    ttt_steps: int = 3  # EAGLE-3
    ttt_step_loss_decay: float = 1.0  # EAGLE-3
    state_noise: float = 0.0  # Gaussian noise on the draft's input states, a fraction of each layer's RMS (noise.py)
    n_anchors: int = 512  # DFlash blocks per pack (speculators' max_anchors)
    seed: int = 0
    eval_every: int = 50
    checkpoint_every: int = 50
    eval_packs: int | None = None  # None: the whole held-out split
    keep_checkpoints: int = 1  # a save is atomic (checkpoint.publish), so the newest is all a resume needs
    loader_workers: int | None = None  # processes reading packs ahead; None: device.loader_workers picks
    hidden_states: str = "offline"  # "offline": stage 01's files; "online": made by vLLM as packs are read
    online_requests: int = 16  # online: rows of its pack each reader asks vLLM for at once (data.read_rows)

    def __post_init__(self):
        """Refused here, named, rather than as a ZeroDivisionError deep in the loop."""
        for name, least in (
            ("train_steps", 1),
            ("eval_every", 1),
            ("checkpoint_every", 1),
            ("pack_len", 1),
            ("warmup_steps", 0),
            ("keep_checkpoints", 1),
            ("online_requests", 1),
        ):
            check_count(
                name,
                getattr(self, name),
                least,
                f"the profile key {name}; an evaluation and a checkpoint are always made at the last step, "
                "so a large interval means 'only at the end'",
            )
        for name, why in (("ttt_steps", "EAGLE-3 training-time-test steps"), ("n_anchors", "DFlash blocks per pack")):
            check_count(name, getattr(self, name), 1, f"the profile key {name}: {why}")
        from draftlab.data.extract import SOURCES

        if self.hidden_states not in SOURCES:  # data.extract.check_source's rule, kept out of the training calls
            raise DraftlabError(f"hidden_states={self.hidden_states!r}: use one of {SOURCES} (training.online).")
        if isinstance(self.state_noise, bool) or not isinstance(self.state_noise, (int, float)) or self.state_noise < 0:
            raise DraftlabError(
                f"state_noise={self.state_noise!r}: must be a number of at least 0 (0: no noise; 0.1: noise of a tenth "
                "of each layer's RMS on the draft's input states, training.noise)."
            )
        if not self.learning_rate > 0:
            raise DraftlabError(f"learning_rate={self.learning_rate}: must be above 0.")


def check_count(name: str, value, least: int, why: str) -> None:
    """A count (steps, processes): a whole number of at least `least`, named with `why` rather than met as
    a TypeError from range() or a fractional step count deep in a library."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < least:
        raise DraftlabError(f"{name}={value!r}: must be at least {least}, a whole number ({why}).")


def checked(settings, what: str) -> Settings:
    """`settings` as a caller passed it to `what`: a Settings, or None for the defaults; a dict is refused
    naming the fix (its keys are Settings' fields)."""
    if settings is None:
        return Settings()
    if not isinstance(settings, Settings):
        fix = f": pass Settings(**{settings!r})" if isinstance(settings, dict) else "."
        raise DraftlabError(f"{what} takes a draftlab.train.Settings, not a {type(settings).__name__}{fix}")
    return settings


def forward_options(kind: str, s: Settings) -> dict:
    """Per-family forward options from the settings (TTT steps and decay, or anchors: the family's recipe): passed
    to every training and evaluation forward, on top of the draft's own `train_kwargs`, which stay as built."""
    from draftlab.drafts.recipe import recipe

    return recipe(kind).forward_options(s)


def optimizer_and_schedule(draft, s: Settings):
    from speculators.train.optimizers import build_optimizers
    from transformers import get_cosine_schedule_with_warmup

    (opt,) = build_optimizers(
        draft.model, SimpleNamespace(optimizer="adamw", lr=s.learning_rate, weight_decay=s.weight_decay)
    )
    return opt, get_cosine_schedule_with_warmup(opt, num_warmup_steps=s.warmup_steps, num_training_steps=s.train_steps)
