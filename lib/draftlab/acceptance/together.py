"""Servers started together on one machine, waited for at once, and stopped on every path.

Notebook 05 starts the verifier alone and each draft's server at once: on a CPU a start is mostly processes
importing vLLM one after another, on a GPU torch.compile and CUDA-graph capture on the CPU, so together they
take about the slowest one's time, and on a GPU they can start while the notebook's own decoding loop runs
(`launch` returns at once). Each gets its share of the GPU (`gpu_memory`). Every path stops them all: a
failed or interrupted start, the end of `served.measure`, and, inside IPython, any later cell that fails.
"""

from __future__ import annotations

from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from draftlab import DraftlabError
from draftlab.serving.command import PER_REQUEST_FLAG, supported_flags, unavailable
from draftlab.serving.gpu_memory import cuda_share, weights_bytes
from draftlab.serving.pair_check import ngram_config
from draftlab.serving.process import stop_groups
from draftlab.serving.server import Server


@dataclass
class Launched:
    """Servers started (not yet waited for): the verifier alone and each draft, on one share of the GPU each.
    `stop()` stops every one; a launch inside IPython also stops them when a later cell fails (`_stop_on_error`),
    so servers started early in notebook 05 never outlive an error in the cells between."""

    servers: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)  # a draft refused before any process: {kind: {"error": ...}}
    reason: str | None = None  # why nothing was launched
    gpu: str | None = None  # how the GPU was shared (gpu_memory.GpuShare.why)
    per_request: bool = False  # the servers report each response's acceptance
    _hook: object = None

    def stop(self) -> None:
        stop_all(self.servers)
        if self._hook is not None:
            _unregister(self._hook)
            self._hook = None

    def __enter__(self) -> Launched:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def launch(
    verifier, drafts: dict[str, Path], prompts: list[dict], k: int, max_tokens: int, log_dir, ngram: int | None = None
) -> Launched:
    """Start the verifier alone and each draft together, without waiting: their starts (on a GPU mostly
    torch.compile and CUDA-graph capture on the CPU) then overlap whatever the notebook does next. `ngram` (the
    longest n, `spec_ngram_max`) adds vLLM's own prompt lookup as the server "ngram", the loop baseline's rule."""
    reason = unavailable()
    if reason:
        return Launched(reason=reason)
    dtype = str(verifier.dtype).removeprefix("torch.")
    device = str(verifier.device)
    per_request = PER_REQUEST_FLAG in supported_flags()
    out = Launched(per_request=per_request)
    gpu = None
    if device.startswith("cuda"):
        gpu = cuda_share(verifier.device, 1 + len(drafts) + bool(ngram), weights_bytes(verifier.path, *drafts.values()))
        out.gpu = gpu.why
    common = {"dtype": dtype, "device": device, "max_model_len": model_len(prompts, max_tokens, k), "gpu": gpu}
    out.servers["verifier alone"] = Server(verifier.path, None, log_path=Path(log_dir) / "vllm-verifier.log", **common)
    for kind, path in drafts.items():
        try:
            out.servers[kind] = Server(
                verifier.path, path, k, log_path=Path(log_dir) / f"vllm-{kind}.log", per_request=per_request, **common
            )
        except DraftlabError as e:  # a checkpoint the pair check refuses: no server for it
            out.errors[kind] = {"error": str(e).splitlines()[0]}
    if ngram:
        spec = ngram_config(k, ngram)
        log = Path(log_dir) / "vllm-ngram.log"
        out.servers["ngram"] = Server(
            verifier.path, None, k, log_path=log, per_request=per_request, spec=spec, **common
        )
    try:
        for s in out.servers.values():
            s.launch()
    except BaseException:
        out.stop()
        raise
    out._hook = _stop_on_error(out)
    return out


def start_together(servers: dict[str, Server]) -> dict[str, DraftlabError | None]:
    """Launch every server from this thread (their parent-death signal follows the launching thread), then wait
    for all at once (`wait_all`)."""
    try:
        for s in servers.values():
            s.launch()
    except BaseException:
        stop_all(servers)
        raise
    return wait_all(servers)


def wait_all(servers: dict[str, Server]) -> dict[str, DraftlabError | None]:
    """Wait for every launched server at once; per name None, or the DraftlabError its start raised (a failed
    start leaves no process behind). Any other exception, in this thread (an interrupt) or in a wait, stops
    every server at once (the other waits then end as their processes go) and propagates."""
    pool = ThreadPoolExecutor(max_workers=max(len(servers), 1))

    def ready(s: Server):
        try:
            s.wait_ready()
        except DraftlabError as e:
            return e
        return None

    try:
        futures = {name: pool.submit(ready, s) for name, s in servers.items()}
        done, _ = wait(futures.values(), return_when=FIRST_EXCEPTION)
        for f in done:
            if f.exception() is not None:
                raise f.exception()
        return {name: f.result() for name, f in futures.items()}
    except BaseException:
        stop_all(servers)
        raise
    finally:
        pool.shutdown(wait=True)


def stop_all(servers: dict[str, Server]) -> None:
    """Every launched server stopped, side by side (`process.stop_groups`)."""
    stop_groups([s.proc for s in servers.values() if s.proc is not None])


def _stop_on_error(launched: Launched):
    """In IPython: stop `launched`'s servers when a cell raises (a notebook stopped halfway keeps no server)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    if ip is None:
        return None

    def check(result):
        if result.error_in_exec is not None or result.error_before_exec is not None:
            launched.stop()

    ip.events.register("post_run_cell", check)
    return (ip, check)


def _unregister(hook) -> None:
    ip, check = hook
    try:
        ip.events.unregister("post_run_cell", check)
    except ValueError:
        pass


def model_len(prompts, max_tokens, k) -> int:
    """--max-model-len for a workload, in blocks of 256: a small KV cache starts faster."""
    longest = max(len(p["ids"]) for p in prompts)
    return 256 * -(-(longest + max_tokens + k + 16) // 256)  # room for the prompt, the answer and one draft
