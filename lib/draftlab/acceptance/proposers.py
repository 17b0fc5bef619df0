"""Proposers for speculative decoding: who drafts the next k tokens, and how they take back a rejection.

A proposer sees the committed tokens (prompt plus everything emitted, the last one not yet
processed by the verifier) and returns a `Proposal`: the drafted target ids and, for a model
draft, the distributions `q` they were drawn from (sampling verification needs them; `None`
means a point mass, as for prompt lookup). After each verifier pass `update` gets the verifier's
aux hidden states of the positions that pass processed and how many of them were kept, and rolls
any cache back to them. Here: the interface, the n-gram baseline, and loading a run's trained
drafts as proposers; the model drafts themselves are each family's `acceptance/<family>.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.drafts import norms
from draftlab.drafts.recipe import recipe
from draftlab.families import FAMILIES, stage_module, taken


@dataclass
class Proposal:
    tokens: list[int]  # target-vocabulary ids, at most k
    q: torch.Tensor | None = None  # [len(tokens), target vocab] probabilities, None for a point mass


class Proposer:
    """The interface `accept.speculative_generate` drives; `layer_ids` says which aux states it needs."""

    name = "proposer"
    layer_ids: list[int] | None = None

    def reset(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, ids: list[int], k: int, temperature: float, generator: torch.Generator) -> Proposal:
        raise NotImplementedError

    def update(self, aux: torch.Tensor | None, n_kept: int) -> None:
        """aux: [n, n_aux*H] for the n positions of the last verifier pass; the first n_kept are committed."""


class NGramProposer(Proposer):
    """Prompt lookup, on vLLM's rule (`vllm/v1/spec_decode/ngram_proposer.py`): the longest n (max_n down to min_n)
    whose last n tokens occur earlier in the context, at their earliest occurrence, and what followed it. The same
    rule as vLLM's `"method": "ngram"`, so notebook 05 can set the loop's baseline against vLLM's own figure for it.
    No model, no cache; proposes nothing when there is no match."""

    def __init__(self, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n
        self.name = f"ngram (n {min_n}-{max_n})"

    def propose(self, ids, k, temperature, generator):
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            tail = ids[-n:]
            for start in range(len(ids) - n):
                if ids[start : start + n] == tail:
                    return Proposal(ids[start + n : start + n + k])
        return Proposal([])


def make_proposer(draft, target_vocab: int) -> Proposer:
    """The proposer for a loaded draft (`load_draft`), by its kind."""

    return stage_module("acceptance", draft.kind).PROPOSER(draft.model, target_vocab)


def crop(cache, keep: int) -> None:
    """Roll a DynamicCache back to its first `keep` positions (transformers 5: a negative count removes)."""
    extra = cache.get_seq_length() - keep
    if extra > 0:
        cache.crop(-extra)


def load_draft(path, verifier):
    """A stage-04 checkpoint (`RunLayout.final(kind)`), or a speculators `--save-path`
    (its checkpoint found by `launch.find_checkpoint`), as a checked draftlab `Draft`.
    `_attn_implementation` is not serialised; drafting with a KV cache uses sdpa (or eager), never flex."""
    from speculators import SpeculatorModel

    from draftlab.drafts.draft import Draft, _train_config, head_view, verify
    from draftlab.training.checkpoint import load_model, saved_dtype
    from draftlab.training.final import check_trained_for
    from draftlab.training.launch import check_checkpoint, find_checkpoint

    path = Path(path)
    if not (path / "config.json").exists():
        path = find_checkpoint(path)  # speculators' <save>/<epoch>/ layout, or an error naming the fix
    check_checkpoint(path)  # a cut config.json or model.safetensors named, before speculators reads it
    check_trained_for(path, verifier)  # stamped for another verifier (a same-shape one where its verifier was)
    kind = json.loads((path / "config.json").read_text()).get("speculators_model_type")
    if kind not in FAMILIES:
        raise DraftlabError(f"{path}/config.json is a {kind!r} speculator; draftlab drafts with {', '.join(taken())}.")
    rec = recipe(kind)  # a family draftlab refuses is refused here, by name
    cls = SpeculatorModel.registry[kind]
    attention = "eager" if str(verifier.device) == "mps" else "sdpa"
    model = load_model(path, cls, attention, verifier.device, verifier.dtype, head_view(verifier)).eval()
    norms.match_verifier_norm(model, verifier)
    if model.config.transformer_layer_config.hidden_size != verifier.hidden_size:
        raise DraftlabError(
            f"draft {path} has hidden size {model.config.transformer_layer_config.hidden_size}, "
            f"the verifier {verifier.hidden_size}: it was trained for another verifier."
        )
    flat = {"loss_implementation": "eager", "draft_vocab_size": model.config.draft_vocab_size, **rec.loaded(model)}
    train_config = _train_config(kind, head_view(verifier), **{k: v for k, v in flat.items() if v is not None})
    train_kwargs, _ = cls.get_trainer_kwargs(**train_config.flatten())
    draft = Draft(
        model, kind, verifier, train_config, train_kwargs, {"checkpoint": (str(path), "loaded for drafting, sdpa")}
    )
    verify(draft, saved_dtype(path))
    return draft


@dataclass
class RunDrafts:
    """A run's proposers, each model one with the draft and the checkpoint it was loaded from."""

    proposers: dict[str, Proposer]  # name -> proposer, the n-gram baseline first
    drafts: dict  # name -> the loaded draftlab `Draft` (model proposers only)
    paths: dict[str, Path]  # name -> the checkpoint folder it came from
    notes: list[str]  # per model draft, in order: loaded from where, or why it was skipped


def load_run_drafts(layout, verifier, kinds=("ngram", "eagle3", "dflash"), extra=None, ngram_max=3) -> RunDrafts:
    """The proposers of `kinds` for a run (`RunLayout`): `ngram` (prompt lookup up to
    `ngram_max` tokens), and each draft family among them whose stage-04 checkpoint exists (skipped with a
    note otherwise): `launch.trained_draft`, final/ or speculators' own save (torchrun), the newer. `extra`
    ({name: checkpoint folder}) adds or replaces drafts by name, loaded as they are (`load_draft`)."""
    from draftlab.training.launch import trained_draft

    out = RunDrafts({"ngram": NGramProposer(ngram_max)} if "ngram" in kinds else {}, {}, {}, [])
    found = {kind: trained_draft(layout.draft(kind)) for kind in kinds if kind != "ngram"}
    for name, path in {**found, **{n: Path(p) for n, p in (extra or {}).items()}}.items():
        if path is None:
            where = layout.draft(name)
            out.notes.append(
                f"{name}: no checkpoint under {where} (final/ or speculators/); skipped (run notebook 04 first)."
            )
            continue
        out.drafts[name], out.paths[name] = load_draft(path, verifier), path
        out.proposers[name] = make_proposer(out.drafts[name], verifier.vocab_size)
        out.notes.append(f"{name}: loaded {path} (aux layer ids {out.drafts[name].model.target_layer_ids})")
    return out


def check_frozen(verifier_dir, draft_dir, dtype: str) -> None:
    """Refuse a draft whose frozen parts (embeddings, heads, verifier norm) are not this verifier's tensors: the
    loop's own check (`load_draft`), on the CPU. A verifier of the same shapes but other weights (another
    fine-tune) passes `serving.pair_check.check_pair`, and vLLM would serve the draft against it, accepting little,
    with nothing said. Notebook 05's servers take drafts its loop loaded with this check already; `draftlab serve`
    calls it."""
    from draftlab.data.verifier import load_verifier

    load_draft(draft_dir, load_verifier(verifier_dir, device="cpu", dtype=dtype))
