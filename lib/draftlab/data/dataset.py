"""Chat-template tokenisation with assistant-only loss masks, handed to speculators.

speculators' `build_speculator_training_dataset` passes rows that already carry `input_ids`
and `loss_mask` straight through (it would otherwise need a vLLM server to render), so the Arrow
dataset saved here is exactly what its `ArrowDataset` reads.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from draftlab import DraftlabError
from draftlab.data.prompts import messages
from draftlab.writes import writing


def require_chat_template(tok, where: object = "the verifier") -> None:
    if not getattr(tok, "chat_template", None):
        raise DraftlabError(
            f"The tokenizer of {where} has no chat template, so assistant turns cannot be masked. "
            "Add one (tokenizer.chat_template = ...; tokenizer.save_pretrained(dir)) or use an instruct model."
        )


def tokenize_conversation(tok, prompt, response: str) -> tuple[list[int], list[int]]:
    """Token ids of a prompt's chat (`prompts.messages`: a Prompt or prompt-set row) and the verifier's
    `response`, and a mask that is 1 on the response's tokens only: a later turn's context, the dataset's
    assistant replies included, is read and never learnt, since only the response is the verifier's text."""
    chat = messages(prompt)
    head = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    answered = chat + [{"role": "assistant", "content": response}]
    full = tok.apply_chat_template(answered, tokenize=True, return_dict=False)
    if full[: len(head)] != head:
        raise DraftlabError(
            "The chat template renders the prompt differently once an answer follows it, so the "
            "assistant span cannot be found by prefix; use a template whose generation prompt is a prefix."
        )
    return list(full), [0] * len(head) + [1] * (len(full) - len(head))


@dataclass
class SplitStats:
    rows: int = 0
    tokens: int = 0
    supervised_tokens: int = 0
    truncated: int = 0
    dropped_unsupervised: int = 0
    lengths: list[int] = field(default_factory=list)


def build_rows(
    tok, prompts, responses: dict[str, str], max_length: int, extra: dict[str, list[str]] | None = None
) -> tuple[dict, dict[str, SplitStats]]:
    """Rows per split, truncated to max_length; truncations and fully-masked rows are counted, not hidden.
    `extra` holds further (sampled) answers of train prompts: more rows, never in the eval split."""
    require_chat_template(tok)
    rows = {"train": {"input_ids": [], "loss_mask": []}, "eval": {"input_ids": [], "loss_mask": []}}
    stats = {"train": SplitStats(), "eval": SplitStats()}
    extra = extra or {}
    pairs = [(p, r) for p in prompts for r in [responses[p.id], *(extra.get(p.id, []) if p.split == "train" else [])]]
    for p, response in pairs:
        ids, mask = tokenize_conversation(tok, p, response)
        st = stats[p.split]
        if len(ids) > max_length:
            st.truncated += 1
            ids, mask = ids[:max_length], mask[:max_length]
        if sum(mask) == 0:
            st.dropped_unsupervised += 1  # the prompt alone fills max_length: nothing to learn
            continue
        rows[p.split]["input_ids"].append(ids)
        rows[p.split]["loss_mask"].append(mask)
        st.rows += 1
        st.tokens += len(ids)
        st.supervised_tokens += sum(mask)
        st.lengths.append(len(ids))
    for split, st in stats.items():
        if st.rows == 0:
            raise DraftlabError(
                f"The {split} split has no usable rows ({st.dropped_unsupervised} dropped with no assistant "
                f"token inside max_length={max_length}); raise max_length or add prompts."
            )
    return rows, stats


def rows_fingerprint(rows: dict) -> str:
    h = hashlib.sha256()
    for ids, mask in zip(rows["input_ids"], rows["loss_mask"], strict=True):
        h.update(repr((ids, mask)).encode())
    return h.hexdigest()[:16]


def save_split(rows: dict, tok, out_dir: Path, max_length: int):
    """Write one split through speculators; rewritten only when its rows changed."""
    from datasets import Dataset, load_from_disk
    from speculators.data_generation.preprocessing import build_speculator_training_dataset

    out_dir = Path(out_dir)
    fp = rows_fingerprint(rows)
    stamp = out_dir / "rows.fingerprint"
    if stamp.exists() and stamp.read_text() == fp:
        ds = load_from_disk(str(out_dir))
        ds.set_format(type="torch")
        return ds
    ds = build_speculator_training_dataset(Dataset.from_dict(rows), tok, max_length=max_length, num_proc=1)
    tmp = out_dir.with_name(out_dir.name + ".arrow-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with writing(out_dir, "the tokenised rows (Arrow)", kept="the rows there before are kept", remove=tmp):
        ds.save_to_disk(str(tmp))
        out_dir.mkdir(parents=True, exist_ok=True)
    for old in list(out_dir.glob("data-*.arrow")) + [out_dir / "dataset_info.json", out_dir / "state.json"]:
        old.unlink(missing_ok=True)
    for f in tmp.iterdir():
        f.replace(out_dir / f.name)
    tmp.rmdir()
    stamp.write_text(fp)
    ds = load_from_disk(str(out_dir))
    ds.set_format(type="torch")
    return ds
