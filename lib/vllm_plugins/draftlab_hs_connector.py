"""vLLM's ExampleHiddenStatesConnector with its device-to-host copy made plain, for vLLM's CPU builds.

Runs inside the vLLM environment (imported by name through `kv_connector_module_path`, with this folder alone on
PYTHONPATH); it is not part of the draftlab package. The stock connector (vllm 0.32.0) copies each finished request's
hidden states into pinned host memory on a CUDA copy stream: `torch.empty_like(..., device="cpu", pin_memory=True)`,
which a CPU-only torch refuses ("RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no pinned
memory allocator is available on this system."), killing the engine at the first request; and it then polls the copy
with `event.query()`, which vLLM's CPU stand-in for torch.cuda.Event lacks. On CPU the cache already lives in host
memory, so this subclass indexes it and clones, and reports the copy done at once. Everything else (which layers the
engine captures, the cache-only layer, which tokens, the file format, the lock the client waits on) is vLLM's own.
"""

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _CopyDone:
    """What the stock connector expects of its CUDA event: the copy is over once the clone returns."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class DraftlabCPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (
            torch.arange(self._block_size, dtype=torch.long)[None, :] + blocks[:, None] * self._block_size
        ).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)  # held since wait_for_save; closing it releases the client
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _CopyDone()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
