"""A real `vllm serve` of the verifier, with or without a draft, started and stopped by draftlab.

vLLM is the engine a draft ships to, so it is the judge of acceptance: its chat template, its
reading of the checkpoint's config (aux layers, vocabulary mapping), its kernels. `Server` starts
the command `command.serve_args` writes, in the vLLM environment, on 127.0.0.1 and a free port, as
its own process group; it waits for `/health` and stops the whole group on every path: success,
error, interrupt, and the parent's death (`process.py`), so no engine process outlives the notebook.
It then speaks vLLM's HTTP API: chat, tokenize, metrics, and the reasons in vLLM's log.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from draftlab import DraftlabError
from draftlab.serving import logs
from draftlab.serving.command import SERVED_NAME, serve_args, server_env, unavailable
from draftlab.serving.logs import ServerDied  # noqa: F401  (what every path raises for a server that died)
from draftlab.serving.pair_check import fitting_model_len, speculative_config
from draftlab.serving.process import die_with_parent, free_port, positive_env, stop_group

STARTUP_TIMEOUT_ENV = "DRAFTLAB_VLLM_STARTUP_TIMEOUT"  # seconds a server may take to answer /health
BAR = "{desc}: {n}/{total} s waited"
STARTUP_TIMEOUT_S = 600  # a CPU start of SmolLM2 with a draft takes about 40 s, a GPU one with torch.compile minutes


def default_startup_timeout() -> float:
    """The seconds a server may take to start: $DRAFTLAB_VLLM_STARTUP_TIMEOUT, else STARTUP_TIMEOUT_S."""
    return positive_env(STARTUP_TIMEOUT_ENV, STARTUP_TIMEOUT_S, "the seconds a vLLM server may take to start", "1200")


class Server:
    """`vllm serve <verifier>` (with `--speculative-config` for a draft) as a context manager."""

    def __init__(
        self,
        verifier_dir,
        draft_dir=None,
        k: int = 5,
        dtype: str = "float32",
        device: str = "cpu",
        max_model_len: int | None = None,  # None: 2048, or the verifier's positions if fewer
        log_path=None,
        startup_timeout: float | None = None,
        seed: int = 0,
        extra_args=(),
        extra_env: dict | None = None,
        gpu=None,
        per_request: bool = False,
        spec: dict | None = None,
    ):
        """`extra_args` go after draftlab's own flags, `extra_env` over `server_env()` (extract_vllm.py uses both);
        `gpu` is its share of a GPU (`gpu_memory.GpuShare`), `per_request` asks for each response's acceptance;
        `startup_timeout` None is $DRAFTLAB_VLLM_STARTUP_TIMEOUT or its default (`default_startup_timeout()`)."""
        # `spec`, without a draft: a speculative config with no model (`pair_check.ngram_config`)
        self.draft_cfg, self.spec = (
            (None, spec) if draft_dir is None else speculative_config(verifier_dir, draft_dir, k)
        )
        self.verifier_dir, self.draft_dir, self.k, self.dtype = Path(verifier_dir), draft_dir, k, dtype
        self.port, self.max_model_len = free_port(), max_model_len or fitting_model_len(verifier_dir)
        self.startup_timeout = startup_timeout or default_startup_timeout()
        self.log_path = (
            Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="draftlab-vllm-", suffix=".log")[1])
        )
        length = self.max_model_len
        cmd = serve_args(self.verifier_dir, self.port, dtype, device, length, seed, self.spec, gpu, per_request)
        self.command, self.proc, self.startup_s = cmd + list(extra_args), None, None
        self.extra_env = dict(extra_env or {})

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the process, not waiting for it. Call it from the thread that outlives the server: the parent-death
        signal fires when the launching *thread* ends, so a server launched from a worker thread dies with it."""
        reason = unavailable()  # no vLLM environment, or an executable that is not vLLM: said before anything starts
        if reason:
            raise DraftlabError(reason)
        self._t0 = time.perf_counter()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**server_env(), **self.extra_env},
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self._ready_at = None
        threading.Thread(target=self._watch_ready, daemon=True).start()

    def _watch_ready(self) -> None:
        """Note when /health first answers. Servers launched together are waited on one after another, after work
        that overlapped their start (notebook 05's loop), so the time `wait_ready` returns is not when they were
        ready: on the H200 three servers ready in 70-101 s were reported at 300 s."""
        while self.proc is not None and self.proc.poll() is None and self._ready_at is None:
            if self.healthy():
                self._ready_at = time.perf_counter()
                return
            time.sleep(0.5)

    def healthy(self) -> bool:
        return logs.health(self.url) == 200

    def wait_ready(self) -> None:
        """Until /health answers (startup_s then holds the seconds since launch); on an error or an interrupt the
        server is stopped, so none is left behind."""
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = (self._ready_at or time.perf_counter()) - self._t0

    def _wait_ready(self) -> None:
        """Until `_watch_ready` has seen /health answer, a bar showing the seconds waited against the timeout and
        the log to read."""
        from draftlab.progress import progress_bar

        deadline = time.monotonic() + self.startup_timeout
        desc = f"vLLM starting on port {self.port} (its log: {self.log_path})"
        with progress_bar(total=round(self.startup_timeout), desc=desc, unit="s", bar_format=BAR) as bar:
            while time.monotonic() < deadline:
                if self._ready_at is not None:  # it answered /health (`_watch_ready`): a death after is while serving
                    return
                code = self.proc.poll()
                if code is not None:
                    raise DraftlabError(
                        f"vLLM exited with code {code} before serving (its log: {self.log_path}): {self.cause()}\n"
                        f"command: {' '.join(self.command)}\nlast lines of {self.log_path}:\n{self.log_tail()}"
                    )
                time.sleep(1.0)
                bar.update(round(self.startup_timeout - max(deadline - time.monotonic(), 0)) - bar.n)
        raise DraftlabError(
            f"vLLM did not answer /health within {self.startup_timeout:g} s (its log: {self.log_path}). If it is "
            f"only slow, set {STARTUP_TIMEOUT_ENV} to more seconds (e.g. {STARTUP_TIMEOUT_ENV}="
            f"{2 * self.startup_timeout:.0f}, in the environment of `draftlab run` or of Jupyter); if it hangs, its "
            "log says where.\n"
            f"command: {' '.join(self.command)}\nlast lines of {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self, grace_s: float = 30) -> None:
        if self.proc is not None:
            stop_group(self.proc, grace_s)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 25) -> str:
        return logs.tail(self.log_path, n)

    def cause(self) -> str:
        """The last exception vLLM logged, its root cause (`logs.cause`)."""
        return logs.cause(self.log_path)

    def logged_aux_layers(self) -> list[int] | None:
        return logs.aux_layers(self.log_path)

    @property
    def what(self) -> str:
        """Which server this is, in words, for its faults."""
        serves = (
            f"draft {self.draft_dir}" if self.draft_dir else (self.spec or {}).get("method") or "the verifier alone"
        )
        return f"the vLLM server of {serves} (port {self.port})"

    def died(self) -> str | None:
        """Why this server, which was answering, is gone (`logs.died`), or None while it answers."""
        return logs.died(self.proc, self.url, self.log_path) if self.proc is not None else None

    def death(self, why: str, doing: str) -> ServerDied:
        return ServerDied(logs.death(self.what, why, doing, self.log_path))

    def request(self, path: str, body: dict | None = None, timeout: float = 600):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read().decode()
        except urllib.error.HTTPError as e:  # a 5xx from an engine that died: the death is the fault, not the request
            said, why = e.read().decode()[:500], self.died() if e.code >= 500 else None
            if why:
                raise self.death(why, f"answering {path}") from None
            raise DraftlabError(f"vLLM answered {e.code} to {path}: {said}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException):
            why = self.died()
            if why:
                raise self.death(why, f"answering {path}") from None
            raise
        return json.loads(raw) if raw.lstrip().startswith(("{", "[")) else raw

    def chat(self, chat: list[dict], max_tokens: int, temperature: float = 0.0) -> dict:
        """One chat (`prompts.messages`: {"role", "content"} turns ending with the user's) through vLLM's own chat
        template; the emitted token ids and the prompt's."""
        t0 = time.perf_counter()
        r = self.request(
            "/v1/chat/completions",
            {
                "model": SERVED_NAME,
                "messages": chat,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "seed": 0,
                "return_token_ids": True,
            },
        )
        choice = r["choices"][0]
        return {
            "token_ids": list(choice["token_ids"]),
            "prompt_token_ids": list(r["prompt_token_ids"]),
            "finish_reason": choice["finish_reason"],
            "seconds": time.perf_counter() - t0,
            "spec": (r.get("metrics") or {}).get("speculative_decoding"),  # per_request servers: this request's figures
        }

    def tokenize(self, chat: list[dict]) -> list[int]:
        """vLLM's tokenisation of one chat (`prompts.messages`) with the generation prompt (`/tokenize`)."""
        r = self.request("/tokenize", {"model": SERVED_NAME, "messages": chat, "add_generation_prompt": True})
        return list(r["tokens"])

    def metrics_text(self) -> str:
        return self.request("/metrics")
