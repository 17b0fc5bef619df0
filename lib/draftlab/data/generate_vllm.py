"""Stage 01's answers from a real `vllm serve` (`serve.Server`): many requests at once, so vLLM batches
them, each answer handed back as it finishes (`generate.generate_responses` appends it to the jsonl).

The requests go to `/v1/completions` with the chat-templated token ids draftlab's hf path feeds
`generate`, so the prompt tokens are the same by construction (vLLM's echo of them is checked), and
the answer's token ids come back (`return_token_ids`) to be decoded exactly as the hf path decodes.
Every sampling knob is sent explicitly (top_p 1, top_k and min_p off, no penalties): vLLM would
otherwise take defaults from the checkpoint's generation_config.json, which transformers' path here
does not use. A sampled request carries its own seed, from the run's seed and the prompt id, so a
resumed run asks each prompt what it would have asked it in one go.

Not speculators' `regenerate-responses` (speculators 0.9.0), although it talks to a vLLM server too:
it reads its prompts through `datasets`, sends chat messages for vLLM's own template instead of
token ids, writes token-id training rows instead of this stage's text lines, moves empty answers
to an error file, loads the tokenizer under the served name, and resumes by row id alone, with no
check of the settings that made a line, which is the guarantee stage 01's cache gives.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
from collections.abc import Callable, Iterable

from draftlab import DraftlabError

REQUEST_TIMEOUT_S = 3600  # a request may wait its turn behind vLLM's running batch (max_num_seqs)


def needed_len(seqs: Iterable[list[int]], max_new_tokens: int, limit: int | None) -> int:
    """The server's max_model_len: the longest prompt plus its answer, rounded up to 256, at most the
    verifier's position limit (vLLM refuses more, and refuses requests past it)."""
    longest = max(map(len, seqs), default=0) + max_new_tokens
    if limit and longest > limit:
        raise DraftlabError(
            f"a prompt plus max_new_tokens={max_new_tokens} needs {longest} positions, past the verifier's "
            f"limit ({limit}), which vLLM refuses: lower max_prompt_chars or max_new_tokens, or use engine='hf'."
        )
    return min(-(-longest // 256) * 256, limit) if limit else -(-longest // 256) * 256


def request_seed(seed: int, prompt_id: str) -> int:
    return int(hashlib.sha256(f"{seed}:{prompt_id}".encode()).hexdigest()[:8], 16)


def request_body(ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> dict:
    from draftlab.serving.command import SERVED_NAME

    return {
        "model": SERVED_NAME,
        "prompt": ids,
        "max_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "seed": seed,
        "return_token_ids": True,
    }


def answer(server, ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> list[int]:
    """One completion: the new token ids (with the end-of-sequence token when it stopped there)."""
    r = server.request(
        "/v1/completions", request_body(ids, max_new_tokens, temperature, seed), timeout=REQUEST_TIMEOUT_S
    )
    choice = r["choices"][0]
    echoed = choice.get("prompt_token_ids") or r.get("prompt_token_ids")
    if echoed is not None and list(echoed) != list(ids):
        raise DraftlabError(
            f"vLLM read other prompt tokens than it was sent ({len(echoed)} vs {len(ids)}; first at "
            f"{next((i for i, (a, b) in enumerate(zip(echoed, ids, strict=False)) if a != b), min(len(echoed), len(ids)))})."  # noqa: E501 (one replacement field)
        )
    return list(choice["token_ids"])


def probe(server, ids: list[int]) -> None:
    """One token of one prompt: a server can pass /health and still fail its first request (a verifier its
    kernels do not take), and that must be known before any answer is written."""
    try:
        answer(server, ids, 1, 0.0, 0)
    except (DraftlabError, OSError) as e:  # OSError: the engine died and took the port with it
        raise DraftlabError(f"vLLM failed its first request ({e}); its log: {server.cause()}") from None


def serve_answers(
    server,
    todo: list,
    seqs: dict,
    write: Callable,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    concurrency: int,
) -> None:
    """`concurrency` requests in flight on threads; `write(prompt, token ids)` on this thread, in the order
    they finish. On an error or an interrupt the queued requests are dropped at once (the caller's
    Engine then stops the server, which ends those in flight)."""
    pool = cf.ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(todo))), thread_name_prefix="draftlab-vllm")
    try:
        futures = {
            pool.submit(answer, server, seqs[p.id], max_new_tokens, temperature, request_seed(seed, p.id)): p
            for p in todo
        }
        for f in cf.as_completed(futures):
            write(futures[f], f.result())
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
