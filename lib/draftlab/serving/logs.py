"""What a vLLM server's log says, and how a server that died is named.

Every server draftlab starts writes its log to a file (`Server.log_path`; `draftlab serve` copies the terminal's to
one too), so a fault can name the file and quote it: its root cause (`cause`: the last exception vLLM logged, not
its wrappers), its last error lines (`error_lines`), the aux layers it took. `died` says why a server that was
answering is gone, from its process and its `/health`: the API process exited (with its code, or the signal
that killed it), or vLLM answers that its engine is dead (503); `death` turns that into the message every path
raises (`ServerDied`), whoever was asking.
"""

from __future__ import annotations

import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from draftlab import DraftlabError
from draftlab.serving.process import KILLED_WHY, KILLED_WORKER

ERROR = re.compile(r"ERROR|CRITICAL|Traceback|Error\b|Exception\b|[Kk]illed|died|dead", re.I)


class ServerDied(DraftlabError):
    """A vLLM server draftlab started died while it answered (not a fault of the request): named with its log."""


def lines(path) -> list[str]:
    path = Path(path)
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def tail(path, n: int = 25) -> str:
    return "\n".join(lines(path)[-n:])


def error_lines(path, n: int = 8) -> str:
    """The last `n` lines of the log that say an error (vLLM's ERROR lines, a traceback's, a process killed or dead),
    else its last `n` lines."""
    every = lines(path)
    said = [ln for ln in every if ERROR.search(ln)]
    return "\n".join((said or every)[-n:]) or "(the log is empty)"


def cause(path) -> str:
    """The last exception vLLM logged (`SomeError: ...`, with pydantic's detail line), the best short reason; the
    engine's wrappers ("Engine core initialization failed. See root cause above.") give way to that root cause."""
    every = lines(path)
    if any(KILLED_WORKER in ln for ln in every):  # its own exceptions then only say "cancelled"
        return KILLED_WHY
    hits = [i for i, ln in enumerate(every) if re.search(r"(?:^|[\s.\]])\w+(?:Error|Exception): \S", ln)]
    hits = [i for i in hits if not re.search(r"See (?:root cause|stack trace)", every[i])] or hits
    if not hits:
        return "no exception in its log"
    i = hits[-1]
    text = re.sub(r"^.*?(\w+(?:Error|Exception): )", r"\1", every[i]).strip()
    if "validation error" in text and i + 1 < len(every):
        text += " " + every[i + 1].strip()
    return text[:600]


def aux_layers(path) -> list[int] | None:
    """The aux layer ids vLLM says it took, from its log ("Using auxiliary layers from ... config: (2, 15, 27)")."""
    found = re.findall(r"auxiliary layers from [\w ]*config: [\[(]([\d, ]*)[\])]", "\n".join(lines(path)))
    return [int(x) for x in found[-1].split(",") if x.strip()] if found else None


def health(url: str) -> int | None:
    """The status `/health` answers with (200 up, 503 engine dead), None where nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None


def exited(code: int) -> str:
    """How a process ended, in words: its exit code, or the signal that killed it (SIGKILL: most often the
    kernel's out-of-memory killer on a CPU machine, `dmesg` says)."""
    if code >= 0:
        return f"exited with code {code}"
    name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
    return f"was killed by {name}" + (" (the out-of-memory killer's signal: see `dmesg`)" if -code == 9 else "")


def died(proc, url: str, log_path=None, settle_s: float = 10.0) -> str | None:
    """Why a server that answered is gone, or None while it answers: its API process ended (after its engine, where
    the log says so: vLLM then shuts its API down, with code 0), or its `/health` says the engine is dead (503). A
    server that no longer accepts connections but whose process runs is given `settle_s` to end, then named so."""
    deadline = time.monotonic() + settle_s
    while True:
        code = proc.poll() if proc is not None else None
        if code is not None:
            return gone(code, proc.pid, log_path)
        status = health(url)
        if status == 503:
            return gone(None, proc.pid, log_path)
        if status is not None or time.monotonic() > deadline:
            return None if status is not None else f"its API process (pid {proc.pid}) no longer accepts connections"
        time.sleep(0.5)


def gone(code: int | None, pid: int, log_path=None) -> str:
    """Why a server is gone, in words: its API process's end (`code`; after its engine's, where its log has vLLM's
    EngineDeadError: vLLM then shuts its API down, with code 0), or, `code` None, its /health answering 503."""
    if code is None:
        return "vLLM answers /health with 503: its engine process is dead"
    engine = log_path is not None and any("EngineDeadError" in ln for ln in lines(log_path))
    first = "its engine process died (EngineDeadError in its log), then " if engine else ""
    return f"{first}its API process (pid {pid}) {exited(code)}"


def death(what: str, why: str, doing: str, log_path) -> str:
    """The message for a server that died while it answered: which server, doing what, why it is gone, its log
    file and the log's last error lines (its root cause first)."""
    return (
        f"{what} died while {doing}: {why}. Its log is {log_path}; its root cause: {cause(log_path)}\n"
        f"last error lines of {log_path}:\n{error_lines(log_path)}"
    )
