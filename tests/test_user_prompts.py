"""A researcher's own prompt files (profile key `prompts`): every shape and format, every reason a record is
dropped, every file refused by name, streaming reads of a large file, splits that hold when a file grows."""

from __future__ import annotations

import json
import time
import tracemalloc
from collections import Counter

import pytest
from prompt_files import BAD_LINES, chat, conversations, sharegpt, write_examples

from draftlab import DraftlabError
from draftlab.config import load_stage
from draftlab.data import records
from draftlab.data.prompts import load_prompts, messages, record_counts
from draftlab.data.records import NotJSON, json_array, read_records

ARGS = (0, 0, 0.25, 0, 0.15, 600)  # no installed source: n_chat, n_code, eval_fraction, n_sharegpt, bench, chars


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return write_examples(tmp_path_factory.mktemp("own"))


def _load(entry, **kw):
    return load_prompts(*ARGS, files=[entry], **kw)


def test_every_shape_and_format_gives_the_same_conversations(examples):
    got = {
        "sharegpt_jsonl": _load(str(examples["sharegpt_jsonl"]), sharegpt_turns="all"),
        "chat_json": _load(str(examples["chat_json"]), sharegpt_turns="all"),
        "chat_parquet": _load({"path": str(examples["chat_parquet"]), "name": "table"}, sharegpt_turns="all"),
    }
    convs = conversations(40)
    for name, ps in got.items():
        firsts = [p for p in ps if not p.context]
        assert [p.text for p in firsts] == [next(t for r, t in c if r == "user") for c in convs], name
        assert len(ps) == 80, f"{name}: every conversation's later turn too"
        later = next(p for p in ps if p.context and p.system)
        assert messages(later) == [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": later.context[0]},
            {"role": "assistant", "content": later.context[1]},
            {"role": "user", "content": later.text},
        ]
        by_group = {}
        for p in ps:  # a conversation's turns share one split
            assert by_group.setdefault(p.group, p.split) == p.split
    first = _load(str(examples["chat_json"]))  # sharegpt_turns: first
    assert len(first) == 40 and not any(p.context for p in first)
    bare = _load({"path": str(examples["bare_saved"]), "field": "question"})
    assert [p.text for p in bare] == [p.text for p in first] and not any(p.system for p in bare)
    assert {p.source for p in bare} == {"mine_questions"}


def test_every_unusable_record_is_counted_by_its_reason(examples):
    ps = _load(str(examples["sharegpt_jsonl"]), sharegpt_turns="all")
    counts = record_counts(ps, 600, "all")["mine_sharegpt records"]
    assert {k.removeprefix("dropped: "): v for k, v in counts.items() if k.startswith("dropped")} == dict.fromkeys(
        BAD_LINES, 1
    )
    assert counts["records read"] == 40 + len(BAD_LINES) and counts["kept"] == 40 == counts["later turns kept"]


def test_later_turns_stop_at_a_break_and_are_counted(tmp_path):
    conv = [("user", "a question"), ("assistant", "an answer"), ("user", "more?"), ("tool", "x"), ("user", "lost")]
    conv += [("assistant", "y"), ("user", "lost too")]
    path = tmp_path / "mine.jsonl"
    others = [json.dumps(chat(c, 1 + i)) + "\n" for i, c in enumerate(conversations(10))]
    path.write_text(json.dumps(chat(conv, 0)) + "\n" + "".join(others))
    ps = load_prompts(0, 0, 0.5, 0, 0.0, 600, files=[str(path)], sharegpt_turns="all")
    assert [p.text for p in ps if p.group == "mine/conv0"] == ["a question", "more?"]
    assert ps.records["mine"]["later turns dropped: after a turn out of user / assistant order or without text"] == 2


@pytest.mark.parametrize(
    "entry, match",
    [
        ("missing.jsonl", r"'missing.jsonl' does not exist \(looked for .*missing.jsonl"),
        ({"path": "x.jsonl", "shape": "chat"}, r"has key\(s\) \['shape'\]"),
        ({"path": "x.jsonl", "n": 0}, "n=0 must be a non-empty int"),
        (3, "is not a path or a mapping with `path:`"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(entry, match):
    with pytest.raises(DraftlabError, match=match):
        _load(entry)


def test_a_bad_file_is_refused_by_name_before_any_answer(tmp_path, examples):
    (tmp_path / "notes.csv").write_text("a,b\n")
    with pytest.raises(
        DraftlabError, match=r"notes.csv is a .csv file; draftlab reads \['.jsonl', '.json', '.parquet'"
    ):
        _load(str(tmp_path / "notes.csv"))
    (tmp_path / "other.jsonl").write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    with pytest.raises(
        DraftlabError, match=r"other.jsonl is not in a shape .* \['answer', 'question'\].* field: question}"
    ):
        _load(str(tmp_path / "other.jsonl"))
    (tmp_path / "bad.jsonl").write_text("\n".join(list(BAD_LINES.values())[1:]) + "\n")
    with pytest.raises(DraftlabError, match=r"bad.jsonl holds no usable conversation among 9 record\(s\) read \(.*"):
        _load(str(tmp_path / "bad.jsonl"))
    with pytest.raises(DraftlabError, match=r"mine_chat.json holds only 40 usable conversation\(s\), n=41 asked"):
        _load({"path": str(examples["chat_json"]), "n": 41})
    with pytest.raises(DraftlabError, match=r"source 'mine_chat', which is taken"):
        load_prompts(*ARGS, files=[str(examples["chat_json"]), str(examples["chat_json"])])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftlabError, match="the folder .*empty holds no"):
        _load(str(tmp_path / "empty"))


def test_the_profile_key_takes_paths_and_mappings_and_refuses_other_types():
    assert load_stage("01", "ci", {"prompts": ["a.jsonl", {"path": "b", "n": 3}]}).prompts[1] == {"path": "b", "n": 3}
    with pytest.raises(DraftlabError, match="prompts='a.jsonl' is a str"):
        load_stage("01", "ci", {"prompts": "a.jsonl"})


def test_a_file_beside_the_installed_sources_shares_the_bench_quota(examples):
    ps = load_prompts(8, 8, 0.25, 24, 0.15, 600, n_bench=12, files=[{"path": str(examples["chat_json"]), "n": 20}])
    bench = Counter(p.source for p in ps if p.split == "bench")
    assert sum(bench.values()) == 12 and bench["mine_chat"] > 0
    alone = load_prompts(8, 8, 0.25, 24, 0.15, 600, n_bench=12)
    assert [p for p in ps if p.source != "mine_chat" and p.split != "bench"] == [p for p in alone if p.split != "bench"]


def test_splits_hold_when_a_file_grows(tmp_path):
    path = tmp_path / "grows.jsonl"
    path.write_text("".join(json.dumps(sharegpt(c, i)) + "\n" for i, c in enumerate(conversations(60))))
    before = load_prompts(0, 0, 0.25, 0, 0.15, 600, files=[{"path": str(path), "n": 40}], n_bench=4)
    with path.open("a") as fh:
        fh.write("".join(json.dumps(sharegpt(c, 60 + i)) + "\n" for i, c in enumerate(conversations(300, 60))))
    after = load_prompts(0, 0, 0.25, 0, 0.15, 600, files=[{"path": str(path), "n": 40}], n_bench=4)
    assert after == before, "the first 40 conversations and the bench draw stay"
    every = {p.id: p.split for p in load_prompts(0, 0, 0.25, 0, 0.15, 600, files=[str(path)])}
    assert all(every[p.id] == p.split for p in before) and len(every) == 360


def test_a_large_file_is_read_streaming_and_a_count_stops_the_read(tmp_path, monkeypatch):
    path = tmp_path / "large.jsonl"
    line = json.dumps(sharegpt(conversations(1)[0], 0)) + "\n"
    with path.open("w") as fh:
        for i in range(200_000):
            fh.write(line.replace('"conv0"', f'"c{i}"').replace("(#0)", f"(#{i})"))
    t0 = time.perf_counter()
    ps = _load({"path": str(path), "n": 50})
    assert ps.records["large"]["records read"] < 100 and time.perf_counter() - t0 < 2
    tracemalloc.start()
    n = sum(1 for _ in read_records(path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n == 200_000 and peak < 2e6 < path.stat().st_size / 10, f"peak {peak} bytes for {path.stat().st_size}"
    monkeypatch.setattr(records, "CHUNK", 64)  # a JSON array across many chunk boundaries
    array = tmp_path / "array.json"
    recs = [sharegpt(c, i) for i, c in enumerate(conversations(30))] + [{"n": 12345678}, 7, "s"]
    array.write_text(json.dumps(recs, indent=2))
    assert [r for _, r in json_array(array)] == recs
    array.write_text(json.dumps(recs)[:-30])  # cut inside a record
    got = [r for _, r in json_array(array)]
    assert got[:-1] == recs[: len(got) - 1] and isinstance(got[-1], NotJSON)
