"""`sharegpt_turns`: ShareGPT's first human turns only (`first`, the prompts stage 01 always took), or every
later human turn too, each after the conversation before it (`all`), kept in its conversation's split."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict

import pytest

from draftlab import DraftlabError
from draftlab.data.prompts import Prompt, load_prompts, messages, split_of, write_prompt_set
from draftlab.data.sources import Text, sharegpt_texts

from conftest import make_tokenizer

# notebooks/params: n_chat, n_code, eval_fraction, n_sharegpt, bench_fraction, max_prompt_chars (+ n_bench ...)
DEFAULT = ((40, 40, 0.15, 160, 0.15, 1000), {"n_bench": 120})
GPU = ((740, 164, 0.15, 8948, 0.15, 2000), {"n_bench": 600, "bench_max_prompt_chars": 8000})


def _digest(prompts) -> tuple[int, str]:
    rows = [[p.id, p.source, p.text, p.split, p.group] for p in prompts]
    return len(prompts), hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def _conversation(p) -> str:
    return p.id.split("/turn")[0]


@pytest.fixture(scope="module")
def both():
    """The default profile's prompts with `first` and with `all`."""
    args, kw = DEFAULT
    return load_prompts(*args, **kw, sharegpt_turns="first"), load_prompts(*args, **kw, sharegpt_turns="all")


def test_first_is_exactly_the_prompt_set_of_before():
    """The digests are those of the prompt sets commit b492483 (before the key) built with the same settings."""
    args, kw = DEFAULT
    assert _digest(load_prompts(*args, **kw, sharegpt_turns="first")) == (322, "092e485cd110818f")
    assert load_prompts(*args, **kw) == load_prompts(*args, **kw, sharegpt_turns="first"), "first is the default"
    args, kw = GPU
    assert _digest(load_prompts(*args, **kw, sharegpt_turns="first")) == (8881, "f0e9156e99ba7c18")


def test_all_adds_each_conversations_later_turns_after_its_first_with_the_turns_before_them(both):
    first, every = both
    assert [p for p in every if not p.context] == first, "the same conversations, in the same order"
    later = [p for p in every if p.context]
    assert {p.split for p in later} == {"train", "eval", "bench"} and len(later) == 48
    by_id = {p.id: p for p in every}
    for p in later:
        turn = int(p.id.rsplit("/turn", 1)[1])
        assert len(p.context) == 2 * (turn - 1)
        opening = by_id[_conversation(p)]
        assert p.context[0] == opening.text and (p.group, p.split) == (opening.group, opening.split)
        before = by_id[f"{_conversation(p)}/turn{turn - 1}"] if turn > 2 else opening
        assert p.context[:-1] == (*before.context, before.text), "each turn's context extends the one before"
        assert len(p.text) + sum(map(len, p.context)) <= 1000, "max_prompt_chars holds for the whole conversation"
    i = {p.id: n for n, p in enumerate(every)}
    assert all(i[_conversation(p)] < i[p.id] for p in later), "a later turn follows its first turn"


def test_messages_alternate_user_and_assistant_and_end_with_the_user_turn(both, tmp_path):
    _, every = both
    later = [p for p in every if p.context]
    for p in [*later, next(p for p in every if not p.context)]:
        chat = messages(p)
        assert [m["role"] for m in chat] == ["user", "assistant"] * (len(p.context) // 2) + ["user"]
        assert [m["content"] for m in chat] == [*p.context, p.text]
    write_prompt_set(every, tmp_path / "prompts.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert [Prompt(**r) for r in rows] == every, "the prompt set reads back with its contexts"
    assert [messages(r) for r in rows] == [messages(p) for p in every], "stage 05's rows give the same chats"
    assert messages({"id": "old", "text": "hi"}) == [{"role": "user", "content": "hi"}], "a row from before context"
    with pytest.raises(DraftlabError, match="prompt x: its context must end with an assistant turn"):
        messages(Prompt("x", "sharegpt", "q2", "train", "g", ("q1",)))


def test_a_later_turn_is_tokenised_with_its_context_and_only_the_answer_learnt():
    from draftlab.data.dataset import tokenize_conversation
    from draftlab.data.generate import _chat_ids

    tok = make_tokenizer()
    p = Prompt("c/turn2", "sharegpt", "what is the capital of france", "train", "c", ("hello how are you", "i am fine"))
    head = _chat_ids(tok, p)
    assert head == tok.apply_chat_template(messages(p), add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tok.decode(head).count("<|im_start|>") == 4  # user, assistant, user, then the generation prompt
    ids, mask = tokenize_conversation(tok, p, "the quick brown fox")
    assert ids[: len(head)] == head and mask == [0] * len(head) + [1] * (len(ids) - len(head))


def test_served_requests_carry_the_whole_conversation():
    from draftlab.acceptance import workload

    class Recorder:
        spec = None

        def __init__(self):
            self.sent = []

        def metrics_text(self) -> str:
            return ""

        def chat(self, chat, max_tokens):
            self.sent.append(chat)
            return {"token_ids": [1], "prompt_token_ids": [0], "seconds": 0.1}

    row = {"id": "c/turn2", "text": "and now?", "context": ["hi", "hello"]}
    server = Recorder()
    workload.run(server, [row, {"id": "d", "text": "alone"}], 4, concurrency=1)
    assert server.sent == [messages(row), [{"role": "user", "content": "alone"}]]


def test_a_conversation_stays_in_one_split_and_a_group_in_bench_whole():
    args, kw = GPU
    every = load_prompts(*args, **kw, sharegpt_turns="all")
    splits, bench = defaultdict(set), defaultdict(set)
    for p in every:
        splits[_conversation(p)].add(p.split)
        bench[p.group].add(p.split == "bench")
    assert all(len(s) == 1 for s in splits.values()), "a conversation's turns straddle splits"
    assert all(len(b) == 1 for b in bench.values()), "a group straddles bench"
    assert all(p.split == split_of(p.context[0] if p.context else p.text, 0.15, p.group, 0.15) for p in every)
    learnt = [p for p in every if p.context and p.split != "bench"]
    assert learnt and max(len(p.text) + sum(map(len, p.context)) for p in learnt) <= 2000
    deep = [p for p in every if p.context and p.split == "bench"]
    assert 2000 < max(len(p.text) + sum(map(len, p.context)) for p in deep) <= 8000, "bench_max_prompt_chars"


def test_later_turns_are_read_while_the_conversation_alternates_and_fits(sharegpt_file):
    def rec(rid, *turns):
        return {"id": rid, "conversations": [{"from": who, "value": said} for who, said in turns]}

    records = [
        rec("chat_0", ("human", "Q1"), ("gpt", "A1"), ("human", "Q2"), ("gpt", "A2"), ("human", "Q3")),
        rec("chat_1", ("gpt", "more"), ("human", "Q4")),  # a continuation part: not opened by a human turn
        rec("sys_0", ("human", "P1"), ("gpt", "R1"), ("system", "S"), ("human", "P2"), ("gpt", "R2"), ("human", "P3")),
        rec("wide_0", ("human", "x" * 20), ("gpt", "y" * 20), ("human", "z" * 20), ("gpt", "w" * 50), ("human", "v")),
        rec("blank_0", ("human", "B1"), ("gpt", " "), ("human", "B2")),
    ]
    sharegpt_file.write_text(json.dumps(records))
    firsts, counts = sharegpt_texts(100)
    assert firsts == (
        Text("sharegpt/chat_0", "Q1", "sharegpt/chat"),
        Text("sharegpt/sys_0", "P1", "sharegpt/sys"),
        Text("sharegpt/wide_0", "x" * 20, "sharegpt/wide"),
        Text("sharegpt/blank_0", "B1", "sharegpt/blank"),
    )
    assert "later turns kept" not in dict(counts)
    every, counts = sharegpt_texts(100, True)
    assert every == (
        firsts[0],
        Text("sharegpt/chat_0/turn2", "Q2", "sharegpt/chat", ("Q1", "A1")),
        Text("sharegpt/chat_0/turn3", "Q3", "sharegpt/chat", ("Q1", "A1", "Q2", "A2")),
        firsts[1],
        firsts[2],
        Text("sharegpt/wide_0/turn2", "z" * 20, "sharegpt/wide", ("x" * 20, "y" * 20)),  # 60 characters in all
        firsts[3],
    )
    assert dict(counts) == {
        "records read": 5,
        "cut record at the end": 0,
        "dropped: not opened by a human turn": 1,
        "kept": 4,
        "later turns kept": 3,
        "later turns dropped: after a turn out of human / gpt order or without text": 3,  # P2, P3, B2
        "later turns dropped: over 100 characters with the turns before them": 1,  # v: 111 characters in all
    }


def test_a_bad_sharegpt_turns_is_refused_naming_the_key_the_value_and_the_choices():
    from draftlab.config import load_profile, load_stage
    from draftlab.run import PROFILES

    # every profile ships first turns (gpu's later turns read no higher held-out accuracy for three leases instead of
    # one, issue 51); `all` is a setting away
    assert {name: load_profile(name)["sharegpt_turns"] for name in PROFILES} == dict.fromkeys(PROFILES, "first")
    assert load_stage("01", "ci", {"sharegpt_turns": "all"}).sharegpt_turns == "all"
    wanted = r"sharegpt_turns='later' is a str, but the stages expect one of \['first', 'all'\]"
    with pytest.raises(DraftlabError, match="overrides: " + wanted):
        load_stage("01", "ci", {"sharegpt_turns": "later"})
    with pytest.raises(DraftlabError, match="load_prompts: " + wanted):
        load_prompts(*DEFAULT[0], sharegpt_turns="later")
