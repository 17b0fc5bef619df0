"""Stage 01's answers from transformers' `generate` (`generate.generate_responses` appends each to the jsonl).

Prompts go in batches of similar length: on CPU the prefill is compute-bound, so a batch is also cut
at a number of padded prompt tokens, and short prompts do not pay for one long one.
"""

from __future__ import annotations

import torch


def length_batches(lengths: list[int], batch_size: int, max_tokens: int) -> list[list[int]]:
    """Consecutive indices of length-sorted rows, cut at `batch_size` rows or when the padded size
    (rows x longest) would pass `max_tokens`; a row longer than `max_tokens` goes alone."""
    out: list[list[int]] = []
    cur: list[int] = []
    for i, n in enumerate(lengths):
        if cur and (len(cur) == batch_size or (len(cur) + 1) * max(n, lengths[cur[-1]]) > max_tokens):
            out.append(cur)
            cur = []
        cur.append(i)
    return out + [cur] if cur else out


@torch.no_grad()
def hf_answers(
    v,
    todo: list,
    seqs: dict,
    write,
    max_new_tokens: int,
    temperature: float,
    batch_size: int,
    seed: int,
    batch_tokens: int | None,
) -> None:
    """transformers' generate over batches of similar length; `write(prompt, new token ids)` per answer."""
    tok = v.tokenizer
    torch.manual_seed(seed)
    cap = batch_tokens or (64 * batch_size if v.device.type == "cpu" else 1 << 40)
    for rows in length_batches([len(seqs[p.id]) for p in todo], batch_size, cap):
        batch = [todo[i] for i in rows]
        padded = tok.pad({"input_ids": [seqs[p.id] for p in batch]}, padding_side="left", return_tensors="pt").to(
            v.device
        )
        width = padded["input_ids"].shape[1]
        out = v.model.generate(
            **padded,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=None,
            top_k=None,
            pad_token_id=tok.pad_token_id,
        )
        for p, row in zip(batch, out[:, width:].tolist(), strict=True):
            write(p, row)
