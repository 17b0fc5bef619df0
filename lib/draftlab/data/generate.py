"""The verifier's own answers to prompts (stage 01), written by transformers' `generate` (`generate_hf`) or
by a real `vllm serve` of the same checkpoint (`generate_vllm`).

Answers are appended to a jsonl file as they finish, each line with the settings that make its text
(the verifier's fingerprint, max_new_tokens, temperature, seed, engine, gen_dtype): an interrupted
run keeps what it finished and resumes, and a file made with other settings is refused.

`engine`: "hf" (transformers, batches of similar length), "vllm" (a `vllm serve` draftlab starts and
stops, many requests at once), or "auto": vllm where the vLLM environment works
(`serving.command.unavailable()` is None) and can serve this verifier, else hf with the reason printed.
`gen_dtype`: "auto" is the dtype the verifier is loaded in, the one that writes the hidden states,
so the answers are the verifier's own greedy text as training sees it. "bfloat16" is faster with
vLLM on CPU but changes most answers (bf16 rounding), and fewer of their tokens are the verifier's
own greedy choice (BENCHMARKS.md, "Stage 01's engines side by side"), so it is a choice, not the default.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import asdict
from pathlib import Path

from draftlab import DraftlabError
from draftlab.data.gen_engine import ENGINES, GEN_DTYPES, Engine, dtype_name, eos_ids, new_tokens  # noqa: F401
from draftlab.data.generate_hf import hf_answers
from draftlab.data.prompts import messages
from draftlab.data.verifier import check_token_ids
from draftlab.files import read_jsonl
from draftlab.progress import progress_bar
from draftlab.writes import writing


def _chat_ids(tok, prompt) -> list[int]:
    """The token ids the verifier answers: a Prompt or prompt-set row's chat (`prompts.messages`) through the
    chat template, with the generation prompt."""
    return tok.apply_chat_template(messages(prompt), add_generation_prompt=True, tokenize=True, return_dict=False)


def read_done(path: Path, settings: dict, verifier_dtype: str, requested: str = "") -> dict[str, str]:
    """Answers already in `path`; refuses lines made with other settings. Lines written before the engine
    choice existed came from transformers in the verifier's dtype."""
    done: dict[str, str] = {}
    if not path.exists():
        return done
    fix = (
        "Delete that line (notebook 01 answers its prompt again), or the file to regenerate every answer; "
        "draftlab writes each line with its id, response and settings."
    )
    # a line cut by an interruption (mid-character too) is left out: its prompt is answered again
    for rec in read_jsonl(path, fix, ("id", "response", "settings"), skip_unreadable=True):
        have = {"engine": "hf", "gen_dtype": verifier_dtype, **rec["settings"]}
        for key, want in settings.items():
            if have.get(key) != want:
                keep = f"Set {key}={have.get(key)!r} to keep them, use" if key in ("engine", "gen_dtype") else "Use"
                picked = f" (engine={requested!r} picked {want!r})" if key == "engine" and requested != want else ""
                raise DraftlabError(
                    f"{path} holds responses made with {key}={have.get(key)!r}, not {want!r}{picked}. "
                    f"{keep} another dataset_name or delete that file to regenerate."
                )
        done[rec["id"]] = rec["response"]
    return done


def drop_cut_tail(path: Path) -> None:
    """Cut a last line an interruption left without its newline: appended to, it would swallow the next answer."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        with path.open("r+b") as fh:
            fh.truncate(data.rfind(b"\n") + 1)


def generate_responses(
    verifier,
    prompts: list,
    path: Path,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    batch_size: int = 8,
    seed: int = 0,
    batch_tokens: int | None = None,
    engine: str | Engine = "hf",
    gen_dtype: str = "auto",
) -> dict[str, str]:
    """Answers keyed by prompt id, appended to `path` as they finish: an interrupted run resumes.
    `engine` is a name (an Engine is opened and closed for this call) or an open Engine (one server for
    several calls; then gen_dtype is the Engine's). hf: batches of prompts of similar length and, on CPU,
    at most `batch_tokens` padded prompt tokens (default 64 per row of `batch_size`): there the prefill is
    compute-bound, so short prompts must not pay for one long one. vllm: `batch_size` requests at once."""
    if not isinstance(engine, Engine):
        with Engine(verifier, engine, gen_dtype) as eng:
            return generate_responses(
                verifier, prompts, path, max_new_tokens, temperature, batch_size, seed, batch_tokens, eng
            )
    from draftlab.data.dataset import require_chat_template

    tok = verifier.tokenizer
    require_chat_template(tok, verifier.path)
    path = Path(path)

    def settings() -> dict:
        return {
            "verifier": verifier.fingerprint,
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "seed": seed,
            "engine": engine.name,
            "gen_dtype": engine.dtype,
        }

    done = read_done(path, settings(), dtype_name(verifier.dtype), engine.requested)
    todo = [p for p in prompts if p.id not in done]
    engine.stats["prompts resumed"] += len(prompts) - len(todo)
    if not todo:
        return {p.id: done[p.id] for p in prompts}
    seqs = {p.id: _chat_ids(tok, p) for p in todo}
    check_token_ids(
        verifier,
        seqs,
        f"the prompts for {path}",
        "the tokenizer gives ids the model has no embedding for: use the tokenizer saved with the model, or "
        "resize the model's embeddings (model.resize_token_embeddings(len(tokenizer))) and save it again.",
    )
    limit = getattr(verifier.config, "max_position_embeddings", None)
    over = [p.id for p in todo if limit and len(seqs[p.id]) + max_new_tokens > limit]
    if over:
        warnings.warn(
            f"{len(over)} prompt(s) (first {over[0]}) plus "
            f"max_new_tokens={max_new_tokens} pass the verifier's position "
            f"limit ({limit}): their answers are not what it was trained to give. "
            "Lower max_prompt_chars or max_new_tokens.",
            stacklevel=2,
        )
    todo.sort(key=lambda p: len(seqs[p.id]))
    server = None
    if engine.name == "vllm":
        from draftlab.data.generate_vllm import needed_len, probe

        try:
            server = engine.vllm_server(needed_len(seqs.values(), max_new_tokens, limit))
            probe(server, seqs[todo[0].id])
        except DraftlabError as e:
            if engine.requested != "auto":
                raise
            server = None
            engine.fall_back(f"vLLM could not serve the verifier: {e}".splitlines()[0])
            done = read_done(
                path, settings(), dtype_name(verifier.dtype), engine.requested
            )  # the engine changed: check anew
    path.parent.mkdir(parents=True, exist_ok=True)
    drop_cut_tail(path)
    want, eos = settings(), eos_ids(verifier)
    with (
        path.open("a") as fh,
        progress_bar(
            total=len(todo), desc=f"Regenerating responses ({engine.name}, {engine.dtype})", unit="prompt"
        ) as bar,
    ):

        def write(p, ids: list[int]) -> None:
            text = tok.decode(ids, skip_special_tokens=True).strip()
            done[p.id] = text
            with writing(path, "the verifier's answers", kept="the answers written before are kept; a re-run resumes"):
                fh.write(json.dumps({"id": p.id, "prompt": asdict(p), "response": text, "settings": want}) + "\n")
                fh.flush()
            engine.stats["prompts generated"] += 1
            engine.stats["new tokens"] += new_tokens(ids, eos)
            bar.update(1)

        t0 = time.perf_counter()
        try:
            if server is not None:
                from draftlab.data.generate_vllm import serve_answers
                from draftlab.serving.server import ServerDied

                try:
                    serve_answers(server, todo, seqs, write, max_new_tokens, temperature, seed, batch_size)
                except ServerDied as e:  # what it answered is in the file: the same command resumes after it
                    raise ServerDied(
                        f"{e}\nThe {len(done)} answers written are kept in {path}; run notebook 01 again "
                        "to go on from them."
                    ) from None
            else:
                hf_answers(
                    engine.hf_verifier(), todo, seqs, write, max_new_tokens, temperature, batch_size, seed, batch_tokens
                )
        finally:
            engine.stats["generation s"] += time.perf_counter() - t0
    return {p.id: done[p.id] for p in prompts}


def sample_responses(
    verifier,
    prompts: list,
    run_dir: Path,
    n: int,
    temperature: float,
    max_new_tokens: int = 128,
    batch_size: int = 8,
    seed: int = 0,
    engine: str | Engine = "hf",
    gen_dtype: str = "auto",
) -> dict[str, list[str]]:
    """`n` further answers per prompt, sampled at `temperature`: more training text for the price of
    generation only (the targets are the verifier's logits, so sampled context is still exact signal).
    One resumable file per sample, responses-sampled-<j>.jsonl, with seed + 1 + j."""
    if n and temperature <= 0:
        raise DraftlabError(
            f"extra_samples={n} needs sample_temperature > 0 (got {temperature}): "
            "greedy answers would repeat the first one."
        )
    out: dict[str, list[str]] = {p.id: [] for p in prompts}
    if not n:
        return out
    if not isinstance(engine, Engine):
        with Engine(verifier, engine, gen_dtype) as eng:
            return sample_responses(verifier, prompts, run_dir, n, temperature, max_new_tokens, batch_size, seed, eng)
    for j in range(n):
        got = generate_responses(
            verifier,
            prompts,
            Path(run_dir) / f"responses-sampled-{j}.jsonl",
            max_new_tokens,
            temperature,
            batch_size,
            seed + 1 + j,
            engine=engine,
        )
        for pid, text in got.items():
            out[pid].append(text)
    return out
