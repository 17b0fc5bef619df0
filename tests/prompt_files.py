"""A researcher's prompt files, made here in every shape and format draftlab reads (nothing downloaded): the
worked example of the "prompts and splits" docs and the input of tests/test_user_prompts.py."""

from __future__ import annotations

import json
from pathlib import Path

TOPICS = ["rivers", "prime numbers", "bread", "volcanoes", "chess", "the moon", "bicycles", "tea", "owls", "rain"]
ASKS = [
    "Tell me three facts about {}.",
    "Why do people like {}?",
    "Write a short poem about {}.",
    "Explain {} to a child.",
]


def conversations(n: int, start: int = 0) -> list[list[tuple[str, str]]]:
    """n two-round conversations of (role, text), distinct first turns, every fifth with a system turn."""
    out = []
    for i in range(start, start + n):
        topic, ask = TOPICS[i % len(TOPICS)], ASKS[(i // len(TOPICS)) % len(ASKS)]
        turns = [("user", f"{ask.format(topic)} (#{i})"), ("assistant", f"Here is something about {topic}.")]
        turns += [("user", f"And what else about {topic}?"), ("assistant", "That is all I know.")]
        out.append([("system", "You are terse.")] * (i % 5 == 0) + turns)
    return out


def sharegpt(conv: list[tuple[str, str]], i: int) -> dict:
    speaker = {"user": "human", "assistant": "gpt", "system": "system"}
    return {"id": f"conv{i}", "conversations": [{"from": speaker[r], "value": t} for r, t in conv]}


def chat(conv: list[tuple[str, str]], i: int) -> dict:
    return {"id": f"conv{i}", "messages": [{"role": r, "content": t} for r, t in conv]}


BAD_LINES = {  # one record per reason stage 01 counts, as a JSON line
    "not JSON": '{"conversations": [{"from": "human", "value": "cut',
    "unknown role 'bot'": json.dumps({"conversations": [{"from": "bot", "value": "hello"}]}),
    "no user turn": json.dumps({"conversations": [{"from": "gpt", "value": "I speak first"}]}),
    "field missing (conversations / messages)": json.dumps({"text": "a record of another shape"}),
    "not text (a turn's value is not a string: list)": json.dumps({"conversations": [{"from": "human", "value": [1]}]}),
    "empty turn": json.dumps({"conversations": [{"from": "human", "value": "   "}]}),
    "empty conversation": json.dumps({"conversations": []}),
    "not opened by a user turn (after one system turn)": json.dumps(
        {"conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "hello"}]}
    ),
    "field missing (a turn without from / value or role / content)": json.dumps({"conversations": [{"from": "human"}]}),
    "not text (bytes that are not UTF-8, or a lone surrogate)": json.dumps(
        {"conversations": [{"from": "human", "value": "\ud800 lone"}]}
    ),
}


def write_examples(folder: Path, n: int = 40) -> dict[str, Path]:
    """The same n conversations in each shape and format: ShareGPT JSONL (with one bad record per reason), a
    chat-shape JSON array, a Parquet file and a `datasets` folder of bare prompts (`field: question`)."""
    import datasets

    folder.mkdir(parents=True, exist_ok=True)
    convs = conversations(n)
    paths = {
        "sharegpt_jsonl": folder / "mine_sharegpt.jsonl",
        "chat_json": folder / "mine_chat.json",
        "chat_parquet": folder / "mine_table.parquet",
        "bare_saved": folder / "mine_questions",
    }
    lines = [json.dumps(sharegpt(c, i)) for i, c in enumerate(convs)]
    paths["sharegpt_jsonl"].write_text("\n".join([*lines[:5], *BAD_LINES.values(), *lines[5:]]) + "\n")
    paths["chat_json"].write_text(json.dumps([chat(c, i) for i, c in enumerate(convs)], indent=1))
    datasets.Dataset.from_list([chat(c, i) for i, c in enumerate(convs)]).to_parquet(paths["chat_parquet"])
    bare = [{"qid": i, "question": next(t for r, t in c if r == "user")} for i, c in enumerate(convs)]
    datasets.Dataset.from_list(bare).save_to_disk(str(paths["bare_saved"]))
    return paths
