"""A verifier's directory: which one a spec names, checked before any load, and its fingerprint.

`resolve_verifier` refuses, with the fix, what would fail later or load something else: a path that
is not a directory, no config.json, no weights or cut ones, an encoder-only checkpoint. The
fingerprint names a verifier by its config and its weights' contents, so data, drafts and runs
made for one verifier are never taken for another's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from draftlab import DraftlabError
from draftlab.config import data_dir
from draftlab.data.embedded import EMBEDDED, convert_embedded
from draftlab.data.gemma import GEMMA, convert_gemma
from draftlab.data.manifest import write_atomic
from draftlab.files import read_cache, safetensors_fault

WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")
# What a causal LM's architecture is called (a nested one, e.g. a vision-language wrapper: ForConditionalGeneration)
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
# Heads of encoder models (BERT-style): no next-token logits, so never a verifier.
ENCODER_SUFFIXES = (
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
    "ForPreTraining",
    "ForNextSentencePrediction",
)


def resolve_verifier(spec: str | Path | None) -> Path:
    """'smollm2' (the default), 'gemma3-270m' (optional: `make gemma`) or a local HF causal-LM directory; checked
    before any load."""
    if spec is None or str(spec).lower() in (EMBEDDED, "embedded", "default"):
        return convert_embedded()
    if str(spec).lower() == GEMMA:
        return convert_gemma()
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise DraftlabError(
            f"verifier={str(spec)!r} is not a directory. Pass 'smollm2' for the embedded default, "
            f"{GEMMA!r} for Gemma 3 270M (`make gemma`), or a local HF causal-LM directory holding config.json "
            "and *.safetensors."
        )
    if not (path / "config.json").exists():
        raise DraftlabError(f"verifier directory {path} has no config.json; save the model with save_pretrained().")
    weights = [f for g in WEIGHT_GLOBS for f in sorted(path.glob(g))]
    if not weights:
        raise DraftlabError(
            f"verifier directory {path} has a config.json but no weights (*.safetensors or "
            "pytorch_model*.bin); copy the weight files next to config.json."
        )
    cut = {f.name: fault for f in weights if (fault := _weight_fault(f))}
    if cut:
        name, fault = next(iter(cut.items()))
        raise DraftlabError(
            f"verifier directory {path}: weight file(s) {list(cut)} are empty or cut short; copy them again "
            f"from the source checkpoint ({name}: {fault})."
        )
    archs = json.loads((path / "config.json").read_text()).get("architectures") or []
    if archs and not any(a.endswith(CAUSAL_SUFFIXES) for a in archs):
        what = "an encoder head" if all(a.endswith(ENCODER_SUFFIXES) for a in archs) else "a model with no lm_head"
        raise DraftlabError(
            f"verifier {path} is a {archs} checkpoint, {what}: draftlab needs a decoder-only causal LM (an "
            "architecture such as LlamaForCausalLM), whose next-token logits a draft can learn. Point verifier at "
            "the causal LM's directory (what AutoModelForCausalLM.save_pretrained writes)."
        )
    return path


def _weight_fault(f: Path) -> str | None:
    """A safetensors file's header gives its full length, so a cut one is seen before a load; a .bin file
    is at least not empty."""
    if f.suffix == ".safetensors":
        return safetensors_fault(f)
    return "it is empty" if f.stat().st_size < 8 else None


# config.json keys that say who wrote the file, not what the model is: the embedded verifier converted on the lent
# GPU (transformers 5.17) and here (5.19) was seen to differ in `transformers_version`, so a draft trained there was
# refused here as trained for another verifier
WRITER_KEYS = ("transformers_version",)


def fingerprint(path: Path, cache: Path | None = None) -> str:
    """Identity of a verifier: its config (what it says, less `WRITER_KEYS`, key order aside) and a digest of
    each weight file's contents, so a fine-tuned or re-quantised copy with the same config and file sizes is
    another verifier, and the same conversion made by another transformers is not. Digests are cached by
    path, size and mtime (`data/cache/weight-digests.json`): a file is read once, not at every load."""
    said = {k: v for k, v in json.loads((path / "config.json").read_text()).items() if k not in WRITER_KEYS}
    h = hashlib.sha256(json.dumps(said, sort_keys=True).encode())
    for g in WEIGHT_GLOBS:
        for f in sorted(path.glob(g)):
            h.update(f"{f.name}:{file_digest(f, cache)}".encode())
    return h.hexdigest()[:16]


def file_digest(f: Path, cache: Path | None = None) -> str:
    """sha256 of a file, remembered by (resolved path, size, mtime)."""
    cache = Path(cache or data_dir() / "cache" / "weight-digests.json")
    st = f.stat()
    key = f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    known = read_cache(cache)
    if key not in known:
        digest = hashlib.sha256()
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                digest.update(block)
        known[key] = digest.hexdigest()
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps(known, indent=0))
    return known[key]
