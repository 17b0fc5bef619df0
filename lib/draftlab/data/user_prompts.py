"""A researcher's own prompts (profile key `prompts`): local files and folders read as speculators' data
preparation reads them, each a source beside the installed ones.

An entry is a path, or a mapping `{path, n, field, name, split}`: `n` takes the first n conversations of the
file (the read stops there), `field` names a bare prompt column, `name` the source (default: the file's stem),
`split` a `DatasetDict`'s split. Shapes, as speculators' `regenerate-responses` takes them: ShareGPT's
`conversations` of `from` / `value` turns (human / gpt), the chat shape's `messages` or `conversations` of
`role` / `content` turns (user / assistant), either opened by an optional system turn; or a bare prompt
column. The dataset's assistant turns are context for later turns only (`sharegpt_turns: all`): the
verifier writes every answer. A record that cannot be used is counted by reason, never dropped unsaid.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from draftlab import DraftlabError
from draftlab.config import repo_root
from draftlab.data.records import FORMATS, NotJSON, data_files, is_saved_dataset, read_records
from draftlab.data.sources import Text, is_text, later_turns

INSTALLED = ("sharegpt", "chat", "code")
ENTRY_KEYS = ("path", "n", "field", "name", "split")
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
SHAPES = (
    'ShareGPT\'s {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}, the chat '
    'shape {"messages" (or "conversations"): [{"role": "user", "content": "..."}, ...]}, either opened by an '
    "optional system turn, or a bare prompt column named in the entry (`field:`)"
)


@dataclass(frozen=True)
class PromptFile:
    """One entry of the profile's `prompts`, checked: the path exists and is a format draftlab reads."""

    path: Path
    name: str  # the prompts' `source`, and the start of their ids
    n: int | None = None  # the first n conversations of the file; None: every usable one
    field: str | None = None  # a bare prompt column; None: conversations
    split: str | None = None  # a DatasetDict's split (default train)


def prompt_files(entries) -> list[PromptFile]:
    """The profile's `prompts` entries, refused with the fix before any record is read: an entry of another
    form, a key draftlab does not read, a path that is missing or of another format, a name taken twice."""
    out: list[PromptFile] = []
    for entry in entries or ():
        spec = {"path": entry} if isinstance(entry, str) else entry
        if not isinstance(spec, dict) or not isinstance(spec.get("path"), str):
            raise DraftlabError(
                f"prompts: {entry!r} is not a path or a mapping with `path:`; write e.g. `prompts: [data/mine.jsonl]` "
                "or `prompts: [{path: data/mine.jsonl, n: 200}]`."
            )
        if unknown := sorted(set(spec) - set(ENTRY_KEYS)):
            raise DraftlabError(f"prompts: entry {spec['path']!r} has key(s) {unknown}; an entry takes {ENTRY_KEYS}.")
        for key, kind in (("n", int), ("field", str), ("name", str), ("split", str)):
            if spec.get(key) is not None and (type(spec[key]) is not kind or spec[key] in (0, "")):
                what = f"{key}={spec[key]!r} must be a non-empty {kind.__name__}"
                raise DraftlabError(f"prompts: {spec['path']!r}: {what}.")
        if (spec.get("n") or 1) < 1:
            raise DraftlabError(f"prompts: {spec['path']!r}: n={spec['n']} must be 1 or more (left out: every record).")
        path = Path(spec["path"]).expanduser()
        path = path if path.is_absolute() else repo_root() / path
        _check_path(path, spec["path"])
        name = spec.get("name") or (path.stem if path.is_file() else path.name)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in INSTALLED or name in {f.name for f in out}:
            raise DraftlabError(
                f"prompts: {spec['path']!r} would be source {name!r}, which is taken or holds other than letters, "
                f"digits, '.', '_', '-'; give it another `name:` (not {[*INSTALLED, *(f.name for f in out)]})."
            )
        out.append(PromptFile(path, name, spec.get("n"), spec.get("field"), spec.get("split")))
    return out


def _check_path(path: Path, given: str) -> None:
    if not path.exists():
        raise DraftlabError(
            f"prompts: {given!r} does not exist (looked for {path}; a relative path is read from the checkout, "
            f"{repo_root()}); fix the path or take it out of `prompts`."
        )
    if path.is_file() and path.suffix not in FORMATS:
        raise DraftlabError(
            f"prompts: {path} is a {path.suffix or 'suffix-less'} file; draftlab reads {list(FORMATS)} files, a "
            "folder of them, or a `datasets` folder written by save_to_disk. Convert it or rename it to its format."
        )
    if path.is_dir() and not is_saved_dataset(path) and not data_files(path):
        raise DraftlabError(
            f"prompts: the folder {path} holds no {list(FORMATS)} file and is not a `datasets` folder written by "
            "save_to_disk (no state.json or dataset_dict.json); point at the files themselves."
        )


def _turn(turn) -> tuple[object, str | None]:
    """(role: user / assistant / system, or the role as given where draftlab does not know it; the text,
    stripped, or None where it is not text) of one turn of either shape."""
    if not isinstance(turn, dict):
        return None, None
    role = turn.get("from", turn.get("role"))
    said = turn.get("value", turn.get("content"))
    return ROLES.get(role, role) if isinstance(role, str) else role, (
        said.strip() if isinstance(said, str) and is_text(said) else None
    )


def _fault(turn, system: bool = False) -> str | None:
    """Why a conversation cannot open with this turn (a system turn may be empty), or None."""
    if not isinstance(turn, dict) or not ({"from", "role"} & turn.keys() and {"value", "content"} & turn.keys()):
        return "dropped: field missing (a turn without from / value or role / content)"
    role, text = _turn(turn)
    said = turn.get("value", turn.get("content"))
    if role not in ROLES.values():
        return f"dropped: unknown role {str(role)[:40]!r}"
    if not isinstance(said, str):
        key = "value" if "value" in turn else "content"
        return f"dropped: not text (a turn's {key} is not a string: {type(said).__name__})"
    if text is None:
        return "dropped: not text (bytes that are not UTF-8, or a lone surrogate)"
    return None if text or system else "dropped: empty turn"


def _opening(rec: dict, field: str | None) -> str | tuple[str, str, list | None, int]:
    """(system, first user turn, the conversation, where the user turns start) of a record, or why not."""
    if field:
        value = rec.get(field)
        if value is None:
            return f"dropped: field missing ({field})"
        if not isinstance(value, str):
            return f"dropped: not text ({field} is not a string: {type(value).__name__})"
        if not is_text(value):
            return "dropped: not text (bytes that are not UTF-8, or a lone surrogate)"
        return ("", value.strip(), None, 0) if value.strip() else "dropped: empty prompt"
    key = "messages" if "messages" in rec else "conversations" if "conversations" in rec else None
    conv = rec.get(key) if key else None
    if key is None or conv is None:
        return "dropped: field missing (conversations / messages)"
    if conv in ([], ""):
        return "dropped: empty conversation"
    if not isinstance(conv, list):
        return f"dropped: field missing ({key} is a {type(conv).__name__}, not a list of turns)"
    skip = int(_turn(conv[0])[0] == "system")
    if skip and (why := _fault(conv[0], system=True)):
        return why
    if skip < len(conv) and (why := _fault(conv[skip])):
        return why
    if skip >= len(conv) or _turn(conv[skip])[0] != "user":
        users = any(_turn(t)[0] == "user" for t in conv)
        return "dropped: not opened by a user turn (after one system turn)" if users else "dropped: no user turn"
    return (_turn(conv[0])[1] if skip else ""), _turn(conv[skip])[1], conv, skip


def _refuse_shape(f: PromptFile, rec) -> None:
    """A file whose first record is not in a shape draftlab reads is refused, naming what it holds."""
    if isinstance(rec, dict) and (f.field in rec if f.field else {"messages", "conversations"} & rec.keys()):
        return
    held = f"keys {sorted(map(str, rec))[:12]}" if isinstance(rec, dict) else f"a JSON {type(rec).__name__}"
    columns = [k for k, v in rec.items() if isinstance(v, str)][:3] if isinstance(rec, dict) else []
    hint = f"; for a bare prompt column write {{path: {f.path}, field: {columns[0]}}}" if columns else ""
    wanted = f"a {f.field!r} field (`field: {f.field}`)" if f.field else f"one of {SHAPES}"
    raise DraftlabError(
        f"prompts: {f.path} is not in a shape draftlab reads: its first record holds {held}, where each record "
        f"should hold {wanted}{hint}. Convert the file to that shape (or fix `field:`)."
    )


def read_file_texts(
    f: PromptFile, max_chars: int, later: bool, counts: Counter, enough: Callable[[], bool]
) -> Iterator[Text]:
    """The usable conversations of a file in file order, each first turn followed by its later turns (`later`:
    each with the turns before it, as ShareGPT's); `counts` gets the records read, kept and dropped by reason.
    The read stops before the next record once `enough()`. A first turn a conversation repeats (with the same
    system turn) is dropped: two copies could land in two splits."""
    seen, checked = set(), False
    for where, rec in read_records(f.path, f.split):
        if enough():
            counts["read stopped once the conversations asked for were in hand"] = 1
            return
        counts["records read"] += 1
        if isinstance(rec, NotJSON):
            counts["dropped: not JSON"] += 1
            continue
        if not checked:
            _refuse_shape(f, rec)
            checked = True
        got = _opening(rec, f.field) if isinstance(rec, dict) else "dropped: field missing (not a JSON object)"
        if isinstance(got, str):
            counts[got] += 1
            continue
        system, text, conv, skip = got
        key = hash((system, text.lower()))
        why = f"dropped: over {max_chars} characters" if len(system) + len(text) > max_chars else None
        why = why or ("dropped: duplicate first turn" if key in seen else None)
        if why:
            counts[why] += 1
            continue
        seen.add(key)
        counts["kept"] += 1
        rid = f"{f.name}/{where.replace(' ', '')}"
        tag = rec.get("id") if isinstance(rec.get("id"), str | int) and str(rec.get("id")) else None
        group = f"{f.name}/{tag}" if tag is not None else f"{f.name}/{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        yield Text(rid, text, group, (), system)
        if later and conv is not None:
            turns, left = later_turns(conv[skip:], max_chars, _turn, len(system), "user / assistant")
            counts.update(left)
            counts["later turns kept"] += len(turns)
            yield from (Text(f"{rid}/turn{2 + j}", said, group, ctx, system) for j, (ctx, said) in enumerate(turns))


def refuse_unusable(f: PromptFile, counts: Counter, wanted: int | None, have: int) -> None:
    """A file with no usable conversation, or fewer than its `n`, is refused with its counts, before any
    answer is written."""
    if have and (wanted is None or have >= wanted):
        return
    reasons = ", ".join(f"{k.removeprefix('dropped: ')} {v}" for k, v in counts.items() if k.startswith("dropped"))
    what = f"only {have} usable conversation(s), n={wanted} asked" if have else "no usable conversation"
    raise DraftlabError(
        f"prompts: {f.path} holds {what} among {counts['records read']} record(s) read"
        f"{f' ({reasons})' if reasons else ''}. Each record should hold {SHAPES}. Fix those records"
        f"{', lower n' if have else ''} or take the file out of `prompts`."
    )
