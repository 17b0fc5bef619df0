"""Stage 01's answers through a real `vllm serve` (the engine parameter): the same greedy text as
transformers in fp32, the same resume and cache-key guarantees, and `auto` falling back to hf with
the reason when vLLM is unavailable or cannot serve the verifier."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from draftlab import DraftlabError
from draftlab.data import generate_vllm
from draftlab.data.generate import Engine, generate_responses, sample_responses
from draftlab.data.prompts import Prompt
from draftlab.serving.process import group_members

pytestmark = pytest.mark.usefixtures("one_thread")
TEXTS = [
    "hello how are you today",
    "what is the capital of france",
    "def add(a, b): return a + b",
    "i am fine thank you",
    "the quick brown fox jumps over the lazy dog and then the fox jumps again",
    "print('hello world')",
    "for i in range(10): print(i)",
    "speculative decoding drafts tokens that a verifier accepts",
]
PROMPTS = [Prompt(f"p{i}", "chat", t, "train" if i % 4 else "eval") for i, t in enumerate(TEXTS)]
N_NEW = 12


@pytest.fixture(scope="module")
def vllm_engine(serve_verifier, tmp_path_factory):
    """One server for the module's vLLM tests (a start costs ~30 s here); stopped at the end."""
    with Engine(serve_verifier, "vllm", log_path=tmp_path_factory.mktemp("vllm") / "vllm.log") as eng:
        yield eng
        pgid = eng.server.proc.pid if eng.server else None
    assert eng.server is None and (pgid is None or group_members(pgid) == []), (
        "the server and its engine processes are gone"
    )


@pytest.fixture
def requests_sent(monkeypatch):
    sent = []
    orig = generate_vllm.answer

    def counted(server, ids, max_new_tokens, *a):
        if max_new_tokens > 1:  # the one-token probe of a fresh server aside
            sent.append(ids)
        return orig(server, ids, max_new_tokens, *a)

    monkeypatch.setattr(generate_vllm, "answer", counted)
    return sent


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_vllm_greedy_answers_are_the_hf_answers_in_fp32(serve_verifier, vllm_engine, tmp_path, requests_sent):
    hf = generate_responses(serve_verifier, PROMPTS, tmp_path / "hf.jsonl", N_NEW, batch_size=3)
    got = generate_responses(serve_verifier, PROMPTS, tmp_path / "vllm.jsonl", N_NEW, batch_size=8, engine=vllm_engine)
    assert got == hf, "vLLM fp32 greedy writes transformers' fp32 greedy text"
    assert len(set(hf.values())) > 1 and all(hf.values()), hf
    tok = serve_verifier.tokenizer
    assert sorted(requests_sent) == sorted(
        tok.apply_chat_template(
            [{"role": "user", "content": p.text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for p in PROMPTS
    )
    settings = {tuple(sorted(r["settings"].items())) for r in _lines(tmp_path / "vllm.jsonl")}
    assert (
        len(settings) == 1
        and dict(next(iter(settings)))["engine"] == "vllm"
        and dict(next(iter(settings)))["gen_dtype"] == "float32"
    )
    assert {r["settings"]["engine"] for r in _lines(tmp_path / "hf.jsonl")} == {"hf"}
    s = vllm_engine.summary()
    assert s["engine"] == "vllm" and s["answers dtype"] == "float32" and s["hidden states dtype"] == "float32"
    assert s["prompts generated"] == len(PROMPTS) and 0 < s["new tokens"] <= N_NEW * len(PROMPTS) and s["tokens/s"] > 0
    assert s["server start-up s"] > 0 and vllm_engine.server.max_model_len == 256


def test_an_interrupted_vllm_run_resumes_without_regenerating_finished_prompts(
    serve_verifier, vllm_engine, tmp_path, requests_sent
):
    path = tmp_path / "responses.jsonl"
    full = generate_responses(serve_verifier, PROMPTS, path, N_NEW, engine=vllm_engine)
    lines = path.read_text().splitlines()
    assert len(lines) == len(PROMPTS) and len(requests_sent) == len(PROMPTS)
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:25])  # interrupted mid-line
    kept = {json.loads(line)["id"] for line in lines[:3]}
    requests_sent.clear()
    again = generate_responses(serve_verifier, PROMPTS, path, N_NEW, engine=vllm_engine)
    assert len(requests_sent) == len(PROMPTS) - 3, "only the unfinished prompts are asked again"
    assert again == full
    assert (
        generate_responses(serve_verifier, PROMPTS, path, N_NEW, engine=vllm_engine) == full
        and len(requests_sent) == len(PROMPTS) - 3
    )
    assert {r["id"] for r in _lines(path)[:3]} == kept and len({r["id"] for r in _lines(path)}) == len(PROMPTS)


def test_sampled_vllm_answers_are_seeded_per_prompt_and_resumable(serve_verifier, vllm_engine, tmp_path, requests_sent):
    train = [p for p in PROMPTS if p.split == "train"]
    greedy = generate_responses(serve_verifier, train, tmp_path / "responses.jsonl", N_NEW, engine=vllm_engine)
    extra = sample_responses(serve_verifier, train, tmp_path, 2, 1.0, N_NEW, engine=vllm_engine)
    assert all(len(v) == 2 for v in extra.values())
    assert any(extra[p.id][0] != greedy[p.id] for p in train) and any(extra[p.id][0] != extra[p.id][1] for p in train)
    assert [r["settings"]["seed"] for r in _lines(tmp_path / "responses-sampled-1.jsonl")] == [2] * len(train)
    path = tmp_path / "responses-sampled-0.jsonl"
    path.write_text("\n".join(path.read_text().splitlines()[:2]) + "\n")
    requests_sent.clear()
    assert sample_responses(serve_verifier, train, tmp_path, 2, 1.0, N_NEW, engine=vllm_engine) == extra, (
        "a resumed prompt is sampled with its own seed: the answer it had"
    )
    assert len(requests_sent) == len(train) - 2


def test_a_file_made_by_another_engine_is_refused_before_any_server(serve_verifier, tmp_path):
    path = tmp_path / "responses.jsonl"
    generate_responses(serve_verifier, PROMPTS[:2], path, 4)
    eng = Engine(serve_verifier, "vllm")
    with pytest.raises(
        DraftlabError, match=r"holds responses made with engine='hf', not 'vllm'\. Set engine='hf' to keep them"
    ):
        generate_responses(serve_verifier, PROMPTS[:2], path, 4, engine=eng)
    assert eng.server is None
    with pytest.raises(DraftlabError, match=r"gen_dtype='float32', not 'bfloat16'"):
        generate_responses(serve_verifier, PROMPTS[:2], path, 4, gen_dtype="bfloat16")
    legacy = (
        tmp_path / "legacy.jsonl"
    )  # written before engine and gen_dtype were recorded: transformers in the verifier's dtype
    legacy.write_text(
        "".join(
            json.dumps({**r, "settings": {k: v for k, v in r["settings"].items() if k not in ("engine", "gen_dtype")}})
            + "\n"
            for r in _lines(path)
        )
    )
    assert generate_responses(serve_verifier, PROMPTS[:2], legacy, 4) == generate_responses(
        serve_verifier, PROMPTS[:2], path, 4
    )


def test_auto_falls_back_to_hf_with_the_reason_when_vllm_is_unavailable(serve_verifier, tmp_path, monkeypatch, capsys):
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named vllm' >&2\nexit 1\n")
    fake.chmod(0o755)
    real = os.environ.get("DRAFTLAB_VLLM")
    monkeypatch.setenv("DRAFTLAB_VLLM", str(fake))
    eng = Engine(serve_verifier, "auto")
    assert eng.name == "hf" and "No module named vllm" in eng.reason and str(fake) in eng.reason
    assert "engine auto -> hf: vLLM is unavailable" in capsys.readouterr().out
    with eng:
        got = generate_responses(serve_verifier, PROMPTS[:3], tmp_path / "r.jsonl", 6, engine=eng)
    assert {r["settings"]["engine"] for r in _lines(tmp_path / "r.jsonl")} == {"hf"} and eng.server is None
    assert got == generate_responses(serve_verifier, PROMPTS[:3], tmp_path / "plain.jsonl", 6)
    assert eng.summary()["engine"] == "hf" and "No module named vllm" in eng.summary()["engine reason"]
    with pytest.raises(DraftlabError, match=r"engine='hf', not 'vllm' \(engine='auto' picked 'vllm'\)"):
        generate_responses(
            serve_verifier,
            PROMPTS[:3],
            tmp_path / "r.jsonl",
            6,
            engine=_working_auto(serve_verifier, monkeypatch, real),
        )


def _working_auto(verifier, monkeypatch, real: str | None) -> Engine:
    """An `auto` engine with the vLLM environment the session had before the fake one."""
    if real is None:
        monkeypatch.delenv("DRAFTLAB_VLLM")
    else:
        monkeypatch.setenv("DRAFTLAB_VLLM", real)
    from draftlab.serving.command import unavailable

    if unavailable() is not None:
        pytest.skip(f"no working vLLM environment: {unavailable()}")
    return Engine(verifier, "auto")


def test_auto_falls_back_to_hf_when_vllm_cannot_serve_the_verifier(tiny, tmp_path, capsys):
    """The shared tiny verifier has head_dim 8, which vLLM's CPU attention does not take."""
    with Engine(tiny, "auto", log_path=tmp_path / "vllm.log") as eng:
        assert eng.name == "vllm", eng.reason
        got = generate_responses(tiny, PROMPTS[:3], tmp_path / "r.jsonl", 5, engine=eng)
    assert eng.name == "hf" and eng.reason.startswith("vLLM could not serve the verifier: vLLM "), eng.reason
    assert "engine auto -> hf: vLLM could not serve" in capsys.readouterr().out
    assert {r["settings"]["engine"] for r in _lines(tmp_path / "r.jsonl")} == {"hf"}
    assert got == generate_responses(tiny, PROMPTS[:3], tmp_path / "plain.jsonl", 5)
    assert [c for c in Path("/proc").glob("[0-9]*/cmdline") if _reads(c, str(tiny.path))] == []


def _reads(cmdline, what: str) -> bool:
    try:
        return what in cmdline.read_bytes().decode(errors="replace")
    except OSError:  # the process ended while we looked
        return False


def test_sampled_answers_to_many_long_prompts_at_once_keep_vllm_cpu_alive(serve_verifier, vllm_engine, tmp_path):
    """vLLM's CPU build died on seeded sampling where it cut a prefill in two ('CPU Generator does not use offset':
    the `default` profile with extra_samples 1, 120 prompts at once, 2026-12-06; this tiny verifier does not reproduce
    it), so draftlab's CPU generation server schedules each prefill whole; 48 prompts of about 350 tokens, past the
    scheduler's default budget of 2048 tokens a step, all come back sampled."""
    long = [Prompt(f"long{i}", "chat", " ".join([TEXTS[i % len(TEXTS)]] * 7), "train") for i in range(48)]
    got = sample_responses(serve_verifier, long, tmp_path, 1, 1.0, N_NEW, batch_size=48, engine=vllm_engine)
    assert len(got) == 48 and all(len(v) == 1 for v in got.values())
    assert "--no-enable-chunked-prefill" in vllm_engine.server.command
