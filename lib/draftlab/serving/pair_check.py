"""A draft checkpoint and the verifier it is served with, checked before any process starts.

vLLM reads a speculators checkpoint's own config (its method, aux layers, vocabulary), so a draft
trained for another verifier would start and then fail, or serve nonsense; `check_pair` refuses it
first, naming the verifier it was trained for. `speculative_config` is what vLLM is told about it.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftlab import DraftlabError
from draftlab.families import FAMILIES

FINAL = "RunLayout.final: data/runs/<dataset_name>/drafts/<run_name>/<kind>/final"
METHODS = {n: f.vllm for n, f in FAMILIES.items() if f.vllm}  # speculators_model_type -> vLLM's method


def draft_config(draft_dir: Path) -> dict:
    """The checkpoint's config, once it holds what vLLM loads: a readable config.json of a kind draftlab serves and
    complete weights (vLLM would start, then fail deep in its worker a minute later)."""
    from draftlab.files import safetensors_fault

    path = Path(draft_dir) / "config.json"
    if not path.exists():
        raise DraftlabError(
            f"no draft checkpoint at {draft_dir} (no config.json): run notebook 04, or pass the "
            f"final/ folder it wrote ({FINAL})."
        )
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DraftlabError(f"{path} cannot be read ({e}): re-run notebook 04 to write {FINAL} again.") from None
    kind = cfg.get("speculators_model_type") if isinstance(cfg, dict) else None
    if kind in FAMILIES and kind not in METHODS:
        why = FAMILIES[kind].vllm_refused or FAMILIES[kind].refused
        raise DraftlabError(f"{path} is a {kind!r} checkpoint, which vLLM does not serve: {why}")
    if kind not in METHODS:
        raise DraftlabError(f"{path} is a {kind!r} checkpoint; draftlab serves {sorted(METHODS)}.")
    weights = Path(draft_dir) / "model.safetensors"
    if safetensors_fault(weights) is not None:
        why = "is missing" if not weights.exists() else "is cut short or unreadable"
        raise DraftlabError(
            f"{weights} {why}: the draft checkpoint needs config.json and its weights. Re-run notebook 04 to write "
            f"{FINAL} again, or copy the whole folder from where it was trained."
        )
    return cfg


def aux_layer_ids(cfg: dict) -> list[int]:
    """The verifier layers whose outputs a speculators checkpoint reads, as vLLM takes them (EAGLE-3 and
    DFlash name the key differently; vLLM maps both to its eagle_aux_hidden_state_layer_ids)."""
    return list(cfg.get("eagle_aux_hidden_state_layer_ids") or cfg.get("aux_hidden_state_layer_ids") or [])


def check_pair(verifier_dir: Path, draft_dir: Path) -> dict:
    """Refuse, before any process starts, a draft whose shapes do not fit this verifier."""
    cfg = draft_config(draft_dir)
    vcfg = json.loads((Path(verifier_dir) / "config.json").read_text())
    vcfg = vcfg.get("text_config", vcfg)
    layer = cfg["transformer_layer_config"]
    trained_for = cfg.get("speculators_config", {}).get("verifier", {}).get("name_or_path")
    target_hidden = cfg.get("target_hidden_size") or layer["hidden_size"]
    for what, draft_value, verifier_value in (
        ("hidden size", target_hidden, vcfg["hidden_size"]),
        ("vocabulary size", layer["vocab_size"], vcfg["vocab_size"]),
    ):
        if draft_value != verifier_value:
            raise DraftlabError(
                f"draft {draft_dir} has {what} {draft_value}, the verifier {verifier_dir} {verifier_value}: "
                f"it was trained for another verifier ({trained_for}). Serve it with that verifier, or train a "
                "draft for this one (notebooks 01 and 04)."
            )
    bad = [i for i in aux_layer_ids(cfg) if not 0 <= i <= vcfg["num_hidden_layers"]]
    if bad:
        raise DraftlabError(
            f"draft {draft_dir} reads verifier layers {bad}, but {verifier_dir} has {vcfg['num_hidden_layers']} "
            f"layers: it was trained for another verifier ({trained_for})."
        )
    return cfg


def ngram_config(k: int, max_n: int) -> dict:
    """vLLM's `--speculative-config` for its own prompt lookup, the rule of draftlab's n-gram baseline
    (`acceptance.proposers.NGramProposer`): no model, so no pair to check."""
    if not isinstance(k, int) or k < 1 or not isinstance(max_n, int) or max_n < 1:
        raise DraftlabError(f"k={k!r}, spec_ngram_max={max_n!r}: the served n-gram needs integers >= 1.")
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": max_n, "prompt_lookup_min": 1}


def speculative_config(verifier_dir, draft_dir, k: int) -> tuple[dict, dict]:
    """(the draft's config, vLLM's `--speculative-config` for it at k tokens), the pair checked first."""
    if not isinstance(k, int) or k < 1:
        raise DraftlabError(f"k={k!r}: a served draft needs an integer number of speculative tokens >= 1.")
    cfg = check_pair(verifier_dir, draft_dir)
    spec = {
        "method": METHODS[cfg["speculators_model_type"]],
        "model": str(Path(draft_dir).resolve()),
        "num_speculative_tokens": k,
        **dict(FAMILIES[cfg["speculators_model_type"]].vllm_options),
    }
    return cfg, spec


def fitting_model_len(verifier_dir, wanted: int = 2048) -> int:
    """`wanted` positions, or fewer where the verifier has fewer (its max_position_embeddings): vLLM refuses a
    max_model_len past the model's at start ("User-specified max_model_len ... is greater than the derived")."""
    cfg = json.loads((Path(verifier_dir) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    return min(wanted, int(cfg.get("max_position_embeddings") or wanted))
