"""Serving's faults, each refused or said before (or instead of) a vLLM that fails late or silently: a server that
never answers, a draft trained for another verifier of the same shapes, a final/ without its weights, a port in
use, and a $DRAFTLAB_VLLM that is not vLLM. None of these tests starts a real vLLM: fake executables stand in."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

from draftlab import DraftlabError
from draftlab.acceptance.proposers import check_frozen
from draftlab.run import main
from draftlab.serving import command
from draftlab.serving.process import free_port, group_members
from draftlab.serving.server import Server

pytestmark = pytest.mark.usefixtures("one_thread")


def _script(path, body: str):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """$DRAFTLAB_VLLM set to a script (written by the test); the version cache in tmp_path's data/cache, cleared."""
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    command._probe.cache_clear()
    yield lambda exe: monkeypatch.setenv("DRAFTLAB_VLLM", str(exe))
    command._probe.cache_clear()


@pytest.fixture
def no_process(monkeypatch):
    """A `vllm serve` started fails the test: every fault here is refused before one (probes like `--version` run)."""
    real = subprocess.Popen

    def popen(args, *a, **k):
        if "serve" in list(args)[1:2]:
            raise AssertionError(f"a server was started: {args}")
        return real(args, *a, **k)

    monkeypatch.setattr(subprocess, "Popen", popen)


@pytest.fixture(scope="module")
def draft_dir(serve_verifier, tmp_path_factory):
    from draftlab.drafts.draft import build_eagle3

    path = tmp_path_factory.mktemp("faults_eagle3") / "final"
    build_eagle3(serve_verifier, None).model.save_pretrained(path)
    return path


def _serve(capsys, draft, verifier, port: int | None = None) -> tuple[int, str]:
    rc = main(["serve", "--draft", str(draft), "--verifier", str(verifier), "--port", str(port or free_port())])
    return rc, capsys.readouterr().err


# 1. a vLLM that answers --version and then never serves


def test_a_server_that_never_answers_shows_its_wait_and_names_the_setting_to_raise(
    tiny_dir, tmp_path, fake_vllm, monkeypatch, capsys
):
    fake_vllm(
        _script(
            tmp_path / "vllm",
            'if [ "$1" = "--version" ]; then echo 0.32.0+cpu; exit 0; fi\necho "INFO still loading"\nexec sleep 300\n',
        )
    )
    monkeypatch.setenv("DRAFTLAB_VLLM_STARTUP_TIMEOUT", "2")
    monkeypatch.setenv("DRAFTLAB_HEADLESS", "1")
    log = tmp_path / "vllm.log"
    s = Server(tiny_dir, log_path=log)
    assert s.startup_timeout == 2
    with pytest.raises(DraftlabError) as err:
        s.start()
    msg = str(err.value)
    assert msg.startswith(  # the log named on the first line: what notebook 05's table keeps of an error
        f"vLLM did not answer /health within 2 s (its log: {log}). If it is only slow, set DRAFTLAB_VLLM_STARTUP_TIM"
    )
    assert f"last lines of {log}:\nINFO still loading" in msg
    out = capsys.readouterr().out
    assert f"vLLM starting on port {s.port} (its log: {log})" in out and "s waited" in out, out
    assert s.proc.poll() is not None and group_members(s.proc.pid) == [], "the hung server is stopped"


@pytest.mark.parametrize("value", ["ten", "0", "-5"])
def test_a_startup_timeout_that_is_not_a_positive_number_is_refused_naming_it(tiny_dir, value, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_VLLM_STARTUP_TIMEOUT", value)
    with pytest.raises(DraftlabError, match=f"DRAFTLAB_VLLM_STARTUP_TIMEOUT='{value}': give the seconds"):
        Server(tiny_dir)


# 2. a draft trained for a verifier of the same shapes but other weights


def test_serve_refuses_a_draft_trained_for_a_verifier_of_the_same_shape_but_other_weights(
    serve_dir, draft_dir, tmp_path, fake_vllm, no_process, capsys
):
    import torch
    from safetensors.torch import load_file, save_file

    fake_vllm(_script(tmp_path / "vllm", "echo 0.32.0+cpu\n"))
    other = tmp_path / "other_finetune"
    shutil.copytree(serve_dir, other)
    state = load_file(other / "model.safetensors")
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"] + 0.01 * torch.randn_like(
        state["model.embed_tokens.weight"]
    )
    save_file(state, other / "model.safetensors", metadata={"format": "pt"})
    check_frozen(serve_dir, draft_dir, "float32")  # the verifier it was made for passes
    rc, err = _serve(capsys, draft_dir, other)
    assert rc == 1
    assert f"the draft's frozen ['embed_tokens'] differ from verifier {other}'s" in err, err


# 3. a final/ folder without (complete) weights


@pytest.mark.parametrize("fault", ["missing", "cut short", "bad config"])
def test_a_checkpoint_without_its_weights_is_refused_before_any_process(
    serve_dir, draft_dir, tmp_path, fault, no_process, capsys
):
    final = tmp_path / "final"
    shutil.copytree(draft_dir, final)
    weights = final / "model.safetensors"
    if fault == "missing":
        weights.unlink()
    elif fault == "cut short":
        weights.write_bytes(weights.read_bytes()[:-100])
    else:
        (final / "config.json").write_text('{"speculators_model_type": "eagle3",')
    want = {
        "missing": f"{weights} is missing: the draft checkpoint needs config.json and its weights. Re-run notebook 04",
        "cut short": f"{weights} is cut short or unreadable: the draft checkpoint needs config.json",
        "bad config": f"{final / 'config.json'} cannot be read (",
    }[fault]
    with pytest.raises(DraftlabError) as err:
        Server(serve_dir, final)
    assert str(err.value).startswith(want), err.value
    rc, out = _serve(capsys, final, serve_dir)
    assert rc == 1 and out.startswith(f"draftlab: {want}"), out


# 4. a port already in use


def test_serve_on_a_port_in_use_says_it_is_taken_before_any_process(serve_dir, draft_dir, no_process, capsys):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        rc, err = _serve(capsys, draft_dir, serve_dir, port)
    assert rc == 1
    assert err.startswith(f"draftlab: port {port} on 127.0.0.1 is taken (") and "Pass another --port" in err, err


# 5. a $DRAFTLAB_VLLM that is not vLLM


@pytest.mark.parametrize(
    "kind, body, said",
    [
        ("false", None, "exit code 1"),
        ("silent failure", "exit 3\n", "exit code 3, printed nothing"),
        ("a Python", None, "exit code 0, but it printed 'Python 3."),
        ("garbage", "echo 'usage: frobnicate [--fast]'\n", "exit code 0, but it printed 'usage: frobnicate [--fast]'"),
        ("no shebang", "", "it could not run: Exec format error"),
    ],
)
def test_a_draftlab_vllm_that_is_not_vllm_is_said_with_what_it_answered_and_never_kept(
    kind, body, said, serve_dir, draft_dir, tmp_path, fake_vllm, no_process, capsys
):
    exe = {"false": shutil.which("false"), "a Python": sys.executable}.get(kind)
    if exe is None:
        exe = tmp_path / "vllm"
        if kind == "no shebang":
            exe.write_text("echo 0.32.0\n")
            exe.chmod(0o755)
        else:
            _script(exe, body)
    fake_vllm(exe)
    reason = command.unavailable()
    assert reason.startswith(f"`{exe} --version` did not answer like `vllm --version` ({said}"), reason
    assert "make vllm-env" in reason and "set DRAFTLAB_VLLM to a `vllm` executable" in reason
    assert command.vllm_version() is None
    cache = tmp_path / "data" / "cache" / "vllm-version.json"
    assert not cache.exists() or str(exe) not in cache.read_text(), "a bad answer is not kept"
    s = Server(serve_dir, log_path=tmp_path / "vllm.log")
    with pytest.raises(DraftlabError, match="did not answer like `vllm --version`"):
        s.start()
    assert s.proc is None, "nothing was started"
    rc, err = _serve(capsys, draft_dir, serve_dir)
    assert rc == 1 and err.startswith(f"draftlab: `{exe} --version` did not answer like"), err


def test_a_fixed_draftlab_vllm_is_asked_again_and_then_kept(tmp_path, fake_vllm):
    exe = _script(tmp_path / "vllm", "echo hello\n")
    fake_vllm(exe)
    assert command.unavailable() is not None
    _script(exe, "echo 0.32.0+cpu\n")
    command._probe.cache_clear()
    assert command.unavailable() is None and command.vllm_version() == "0.32.0+cpu"
    kept = json.loads((tmp_path / "data" / "cache" / "vllm-version.json").read_text())
    assert list(kept.values()) == [[None, "0.32.0+cpu"]]


def test_serve_starts_vllm_for_a_sound_draft_on_a_free_port(serve_dir, draft_dir, tmp_path, fake_vllm, capsys):
    """The checks refuse only the faults: the draft with the verifier it was made for reaches `vllm serve`."""
    args = tmp_path / "args"
    fake_vllm(_script(tmp_path / "vllm", f'[ "$1" = "--version" ] && echo 0.32.0+cpu && exit 0\necho "$@" > {args}\n'))
    port, before = free_port(), signal.getsignal(signal.SIGTERM)
    try:  # the fake ends at once, with code 0: a server that stops on its own is a failure, said with its log
        assert main(["serve", "--draft", str(draft_dir), "--verifier", str(serve_dir), "--port", str(port)]) == 1
    finally:
        signal.signal(signal.SIGTERM, before)  # `draftlab serve` makes SIGTERM stop it as Ctrl-C does
    got = args.read_text()
    assert got.startswith(f"serve {serve_dir} --host 127.0.0.1 --port {port} ") and "--speculative-config" in got
    err = capsys.readouterr().err
    said = rf"died while starting: its API process \(pid \d+\) exited with code 0\. Its log is {tempfile.gettempdir()}/"
    assert re.search(said + "draftlab-serve-", err), err[-2000:]


def test_a_non_version_answer_an_older_draftlab_kept_is_not_taken_as_vllm(tmp_path, fake_vllm):
    exe = _script(tmp_path / "vllm", "echo 0.32.0+cpu\n")
    fake_vllm(exe)
    cache = tmp_path / "data" / "cache" / "vllm-version.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({f"{exe}@{exe.stat().st_mtime_ns}": [None, "Python 3.12.3"]}))
    assert command.unavailable().startswith(
        f"`{exe} --version` did not answer like `vllm --version` (exit code 0, but it printed 'Python 3.12.3'"
    )


# 6. every question to the vLLM executable bounded, and named as a server's start is


def test_every_question_to_the_vllm_environment_is_bounded_and_names_the_setting(tmp_path, fake_vllm, monkeypatch):
    import time

    from draftlab.data import extract_vllm

    monkeypatch.setenv("DRAFTLAB_VLLM_PROBE_TIMEOUT", "1")
    hangs = 'echo "INFO importing torch"\nsleep 60 &\nwait\n'  # a child of its own keeps the pipes open too
    fake_vllm(_script(tmp_path / "vllm", hangs))
    t0 = time.monotonic()
    why = command.unavailable()
    assert time.monotonic() - t0 < 15, "bounded: the child holding its pipes is ended too"
    assert why.startswith(f"`{tmp_path / 'vllm'} --version` (its version) did not answer in 1 s, its last line ")
    assert "'INFO importing torch'. If it is only slow, set DRAFTLAB_VLLM_PROBE_TIMEOUT to more seconds" in why
    assert not (tmp_path / "data" / "cache" / "vllm-version.json").exists(), "a timeout is not kept"
    bin_ = tmp_path / "env" / "bin"
    bin_.mkdir(parents=True)
    fake_vllm(_script(bin_ / "vllm", f'[ "$1" = "--version" ] && echo 0.32.0+cpu && exit 0\n{hangs}'))
    _script(bin_ / "python", hangs)  # the extraction probe asks the environment's python
    with pytest.raises(DraftlabError, match=r"serve --help=all` \(the flags its `vllm serve` takes\) did not answer"):
        command.supported_flags()
    extract_vllm._probe.cache_clear()
    with pytest.raises(
        DraftlabError, match=r"python -c <script>` \(whether its hidden-states connector runs here\) did not"
    ):
        extract_vllm.connector_problem()
    extract_vllm._probe.cache_clear()
    monkeypatch.setenv("DRAFTLAB_VLLM_PROBE_TIMEOUT", "soon")
    with pytest.raises(DraftlabError, match=r"DRAFTLAB_VLLM_PROBE_TIMEOUT='soon': give the seconds `vllm` may take"):
        command.supported_flags()


def test_a_drafts_server_that_dies_in_notebook_05_is_its_error_whole_and_a_warning_the_others_go_on(
    serve_verifier, draft_dir, tmp_path, fake_vllm, monkeypatch
):
    """The branch for a draft's server that died (tests/test_faults_vllm.py kills a real one: the verifier alone's):
    fake servers that answer /health, the workload replaced."""
    from draftlab.acceptance import served
    from draftlab.serving.logs import ServerDied

    health = (
        "import sys, http.server as h\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        "class H(h.BaseHTTPRequestHandler):\n"
        "    def do_GET(self): self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "h.HTTPServer(('127.0.0.1', port), H).serve_forever()\n"
    )
    (tmp_path / "health.py").write_text(health)
    body = '[ "$1" = "--version" ] && echo 0.32.0+cpu && exit 0\n[ "$2" = "--help=all" ] && exit 0\n'
    fake_vllm(_script(tmp_path / "vllm", body + f'exec {sys.executable} {tmp_path / "health.py"} "$@"\n'))

    def workload(server, *a):
        if server.draft_dir is not None:
            raise server.death("its API process (pid 1) was killed by SIGKILL", "answering /v1/chat/completions")
        return {"outputs": []}

    monkeypatch.setattr(served, "serve_levels", workload)
    monkeypatch.setattr(Server, "tokenize", lambda self, chat: [])
    prompts = [{"id": "p0", "source": "chat", "text": "hi", "ids": [5, 6]}]
    with pytest.warns(served.ServedDiedWarning, match=r"the vLLM server of draft .* died while answering"):
        got = served.measure(serve_verifier, {"eagle3": draft_dir}, prompts, 3, 8, tmp_path, (1,))
    error = got["runs"]["eagle3"]["error"]
    assert got["available"] and "verifier alone" in got["runs"]
    assert error.startswith(f"the vLLM server of draft {draft_dir} (port ") and "killed by SIGKILL" in error
    assert f"Its log is {tmp_path / 'vllm-eagle3.log'}" in error and "last error lines of" in error, "kept whole"
    assert ServerDied.__mro__[1] is DraftlabError
