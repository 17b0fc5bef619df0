"""vLLM servers killed while they answer (issue 50), on the CPU build: each path draftlab starts one on (stage 01's
answers, stage 05's served measurement, online hidden states, `draftlab serve`) stops within a minute or two and
says the server died, names its log file and quotes its last error lines; nothing is left running; online training
counts no step without hidden states and resumes from its last good checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from draftlab.serving.command import unavailable
from draftlab.serving.process import group_members
from draftlab.serving.server import ServerDied

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("one_thread")]
LIB = str(Path(__file__).resolve().parents[1] / "lib")


@pytest.fixture(autouse=True)
def needs_vllm():
    if unavailable() is not None:
        pytest.skip(f"no working vLLM environment: {unavailable()}")


def engine_core(api_pid: int) -> int:
    """The pid of the engine core process vLLM's API server `api_pid` started (its process title says so)."""
    for pid in group_members(api_pid):
        said = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") + Path(f"/proc/{pid}/comm").read_bytes()
        if pid != api_pid and b"EngineCore" in said:
            return pid
    raise AssertionError(f"no EngineCore among {group_members(api_pid)}")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def kill_when(ready, which: str, api_pid) -> threading.Thread:
    """A thread that SIGKILLs the server's engine core (`which` "engine") or API process ("api") once `ready()`."""

    def run():
        deadline = time.monotonic() + 600
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.2)
        pid = api_pid() if which == "api" else engine_core(api_pid())
        os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_stage_01s_answers_stop_naming_the_server_when_its_engine_is_killed(serve_verifier, tmp_path):
    from draftlab.data.generate import Engine, generate_responses
    from draftlab.data.prompts import Prompt

    prompts = [Prompt(f"chat/{i}", "chat", f"count from {i} to {i + 40}", "train") for i in range(40)]
    out, log = tmp_path / "responses.jsonl", tmp_path / "vllm-generate.log"
    engine = Engine(serve_verifier, "vllm", log_path=log)
    answered = lambda: out.exists() and out.read_text().count("\n") >= 2  # noqa: E731
    killer = kill_when(answered, "engine", lambda: engine.server.proc.pid)
    t0 = time.monotonic()
    with engine, pytest.raises(ServerDied) as err:
        generate_responses(serve_verifier, prompts, out, max_new_tokens=48, batch_size=1, engine=engine)
    killer.join()
    msg = str(err.value)
    assert time.monotonic() - t0 < 300
    assert (
        msg.startswith("the vLLM server of the verifier alone (port ") and "died while answering /v1/completions" in msg
    )
    assert f"Its log is {log}" in msg and f"last error lines of {log}:\n" in msg, msg
    kept = out.read_text().count("\n")
    assert kept >= 2 and f"The {kept} answers written are kept in {out}; run notebook 01 again" in msg
    assert engine.server is None or group_members(engine.server.proc.pid) == []


def test_stage_05s_verifier_alone_dying_is_said_as_such_not_as_a_verifier_vllm_cannot_serve(
    serve_verifier, tmp_path, monkeypatch
):
    from draftlab.acceptance import served
    from draftlab.data.generate import _chat_ids

    rows = [{"id": f"p{i}", "source": "chat", "text": f"say {i} twice"} for i in range(4)]
    prompts = [{**r, "ids": _chat_ids(serve_verifier.tokenizer, r)} for r in rows]
    real, killed = served.serve_levels, []

    def killed_first(server, *a):  # its API process killed as its workload starts: every request meets it dead
        os.kill(server.proc.pid, signal.SIGKILL)
        killed.append(server)
        return real(server, *a)

    monkeypatch.setattr(served, "serve_levels", killed_first)
    with pytest.warns(served.ServedDiedWarning):
        got = served.measure(serve_verifier, {}, prompts, 3, 16, tmp_path, (1,))
    assert got["available"] is False, "the served section has no baseline; the rest of stage 05 goes on"
    msg = got["reason"]
    assert "could not serve the verifier" not in msg
    assert msg.startswith("the vLLM server of the verifier alone (port ") and "died while answering /v1/chat/" in msg
    assert "its API process (pid" in msg and "was killed by SIGKILL" in msg, msg
    assert f"Its log is {tmp_path / 'vllm-verifier.log'}" in msg and "last error lines of" in msg
    assert group_members(killed[0].proc.pid) == [], "every server stopped"


def test_online_training_stops_when_its_extraction_engine_dies_and_resumes_from_the_last_checkpoint(
    serve_verifier, tmp_path, monkeypatch
):
    import test_online

    from draftlab.drafts.draft import build_draft
    from draftlab.training import online as online_module
    from draftlab.training.settings import Settings
    from draftlab.training.train import read_metrics, train

    data = test_online.make_splits(serve_verifier, tmp_path / "data")
    s = Settings(train_steps=6, pack_len=128, eval_every=6, checkpoint_every=2, warmup_steps=1, hidden_states="online")
    run, started = tmp_path / "run", []
    real = online_module.state_server

    @contextmanager
    def state_server(*a, **kw):  # the server this run starts, for the test to kill
        with real(*a, **kw) as on:
            started.append(on.server)
            yield on

    monkeypatch.setattr(online_module, "state_server", state_server)
    d = build_draft("eagle3", serve_verifier, data / "train", layer_ids=test_online.LAYER_IDS, attention="sdpa")
    killer = kill_when(lambda: (run / "checkpoints" / "step-2").is_dir(), "engine", lambda: started[0].proc.pid)
    t0 = time.monotonic()
    with pytest.raises(ServerDied) as err:
        train(d, data, s, run, progress=False)
    killer.join()
    took = time.monotonic() - t0
    msg = str(err.value)
    assert "died while making the hidden states of training's packs" in msg, msg
    assert f"Its log is {run / 'vllm-online.log'}" in msg and "last error lines of" in msg
    assert "The last good checkpoint is" in msg and "run the same command again to resume from it" in msg
    steps = [r["step"] for r in read_metrics(run) if r["split"] == "train"]
    last = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))
    # a pack read before the kill may still make a step after the last checkpoint (the fresh-clone CI's run took
    # step 3); no step is logged past the packs that had states, and no checkpoint past the steps logged
    assert steps == list(range(1, len(steps) + 1)) and 2 <= last <= steps[-1], "only steps with hidden states"
    assert took < 240, f"stopped {took:.0f} s after it started"
    assert group_members(started[0].proc.pid) == []
    d = build_draft("eagle3", serve_verifier, data / "train", layer_ids=test_online.LAYER_IDS, attention="sdpa")
    train(d, data, s, run, progress=False)  # the same command again: resumes, a new server, and finishes
    assert d.choices["run folder"][0] == f"resumed after step {last}"
    assert [r["step"] for r in read_metrics(run) if r["split"] == "train"] == list(range(1, 7))


def test_draftlab_serve_exits_non_zero_naming_its_log_when_its_engine_dies(serve_dir, serve_verifier, tmp_path):
    from draftlab.drafts.draft import build_eagle3
    from draftlab.serving.logs import health
    from draftlab.serving.process import free_port

    draft = tmp_path / "final"
    build_eagle3(serve_verifier, None).model.save_pretrained(draft)
    port = free_port()
    cmd = [sys.executable, "-m", "draftlab", "serve", "--draft", str(draft), "--verifier", str(serve_dir)]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)],
        env={**os.environ, "PYTHONPATH": LIB},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while health(f"http://127.0.0.1:{port}") != 200 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        api = next((c for c in children(proc.pid) if b"vllm" in Path(f"/proc/{c}/cmdline").read_bytes()), None)
        if api is None:  # draftlab serve stopped before its vLLM answered /health: what it said is the failure
            out, err = proc.communicate(timeout=60)
            pytest.fail(f"draftlab serve exited with {proc.returncode} before vLLM served: {(out + err)[-3000:]}")
        os.kill(engine_core(api), signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err[-3000:]
    assert "died while serving" in err and "Its log is " in err and "last error lines of" in err, err[-3000:]
    log = Path(err.split("Its log is ")[1].split(";")[0])
    assert str(port) in log.read_text(), "the terminal's log, kept in the file it names"
    assert group_members(api) == [], "no vLLM process left"
