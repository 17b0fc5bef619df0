"""The life of a server process: a free port, its own process group, death with the parent, and a stop
that leaves no member behind.

Every server runs as its own process group (vLLM starts an engine core and workers under its API
server), so stopping it means the whole group: SIGTERM (vLLM shuts its engine down), then SIGKILL
to what is left. PR_SET_PDEATHSIG covers the parent's own death, so a killed kernel leaves no
engine process either.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from draftlab import DraftlabError

# vLLM's words when a worker process vanished without an exception of its own (SIGKILL), and what to say instead
KILLED_WORKER = "died unexpectedly"
KILLED_WHY = (
    "a vLLM worker process was killed from outside (on a CPU most often the kernel's out-of-memory killer: see "
    "`dmesg`); free memory, lower VLLM_CPU_KVCACHE_SPACE (GiB of KV cache per server, draftlab's default 1) or serve "
    "fewer drafts at once (draft_kinds)"
)


def positive_env(name: str, default: float, what: str, example: str) -> float:
    """The positive number environment variable `name` holds (`what` it counts), else `default`. An environment
    variable, so that every server reads it: `draftlab run`'s kernels (notebooks 01, 04 and 05) inherit it."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise DraftlabError(
            f"{name}={raw!r}: give {what} as a positive number (e.g. {name}={example}), or unset it for the "
            f"default {default:g}."
        )
    return value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """Refuse a port something already listens on, by binding it first: vLLM would load the model, then die on
    its bind with a traceback. (A port taken between this check and vLLM's bind is still vLLM's to report.)"""
    if not 0 < port < 65536:
        raise DraftlabError(f"--port {port}: pick a port between 1 and 65535 (e.g. --port 8000).")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM's server binds: a closed one's port is free
        try:
            s.bind((host, port))
        except OSError as e:
            raise DraftlabError(
                f"port {port} on {host} is taken ({e.strerror}): another server (an earlier `draftlab serve`?) "
                f"listens there. Pass another --port (e.g. --port {free_port()}), or stop what holds it "
                f"(`ss -ltnp 'sport = :{port}'` names it)."
            ) from None


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In the child before exec: `sig` when the parent dies (Linux), so a killed kernel leaves no server."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (from /proc); zombies count as gone."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    """Whether process `pid` runs (not a zombie), from /proc: true in any process, a loader forked from the one that
    started it included (`Popen.poll` there takes the server for exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_group(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM to the process group `proc` leads (vLLM shuts its engine down), SIGKILL to what is left after
    `grace_s`; returns once no member is alive."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        end = time.monotonic() + wait
        while time.monotonic() < end and (proc.poll() is None or group_members(pgid)):
            time.sleep(0.2)
        if proc.poll() is not None and not group_members(pgid):
            break
    proc.wait(timeout=10)


def stop_groups(procs: list[subprocess.Popen], grace_s: float = 30) -> None:
    """`stop_group` for several servers at once: every group is sent SIGTERM before any is waited for, so
    they shut down side by side and the whole stop takes about the slowest one's time."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc in procs:
        stop_group(proc, grace_s)


def serve_forever(
    verifier_dir, draft_dir, k: int = 5, dtype: str = "float32", device: str = "cpu", port: int = 8000, *, check
) -> int:
    """`draftlab serve`: the same server in the foreground, its log on the terminal and in a file, until Ctrl-C or
    SIGTERM (130). Every fault draftlab can see is refused before vLLM starts: the draft's files, its fit to the
    verifier (shapes and frozen tensors: `check(verifier_dir, draft_dir, dtype)`, the loop's
    `acceptance.proposers.check_frozen`), the port, and the vLLM executable. A server that stops on its own (its
    process exited, or its engine died: `/health` 503) is a `logs.ServerDied` naming the log file and its last
    error lines, so the command exits non-zero."""
    import shlex
    import tempfile
    import threading

    from draftlab.serving import logs
    from draftlab.serving.command import serve_command, server_env, unavailable

    cmd = serve_command(verifier_dir, draft_dir, k, dtype, device, port=port)  # the pair's files and shapes checked
    check_port(port)
    reason = unavailable()
    if reason:
        raise DraftlabError(reason)
    check(verifier_dir, draft_dir, dtype)  # seconds: loads the verifier and the draft on the CPU
    log_path = Path(tempfile.mkstemp(prefix="draftlab-serve-", suffix=".log")[1])
    print(f"{shlex.join(cmd)}\n(its log is also written to {log_path})", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the server as Ctrl-C does
    proc = subprocess.Popen(
        cmd,
        env=server_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    copy = threading.Thread(target=_tee, args=(proc.stdout, log_path), daemon=True)
    copy.start()
    try:
        code, answered = _until_it_stops(proc, f"http://127.0.0.1:{port}")
    except KeyboardInterrupt:
        return 130
    finally:
        stop_group(proc)
        copy.join(timeout=10)
    why = logs.gone(code, proc.pid, log_path)
    what = f"the vLLM server of draft {draft_dir} (port {port})"
    # /health is asked every 2 s: a death between its first 200 and the next ask is told by the log's own line
    answered = answered or "Application startup complete" in log_path.read_text(errors="replace")
    raise logs.ServerDied(logs.death(what, why, "serving" if answered else "starting", log_path))


def _tee(stream, log_path: Path) -> None:
    """The server's output to the terminal and to `log_path`, line by line, as it comes."""
    import sys

    with open(log_path, "ab") as log:
        for line in iter(stream.readline, b""):
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
            log.write(line)
            log.flush()


def _until_it_stops(proc: subprocess.Popen, url: str) -> tuple[int | None, bool]:
    """(the server's exit code, None where vLLM says its engine is dead (/health 503: it then shuts its API down
    too, not always at once); whether it had answered /health), once it stops on its own."""
    from draftlab.serving.logs import health

    answered = False
    while True:
        code = proc.poll()
        if code is not None:
            return code, answered
        status = health(url)
        if status == 503:
            return None, answered
        answered = answered or status == 200
        time.sleep(2)
