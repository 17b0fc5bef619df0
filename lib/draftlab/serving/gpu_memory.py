"""How much of one GPU each `vllm serve` draftlab starts may take, sized from what is free.

On a GPU the notebook kernel (the verifier, the drafts, the decoding loop) and every server draftlab
starts share one device. vLLM's defaults assume it is alone: `--gpu-memory-utilization 0.9` asks for
90% of the card at start-up and refuses to start when that much is not free, and its KV-cache size
comes from profiling the free memory while it loads, which other processes starting or allocating at
the same moment (notebook 05 starts three servers together) falsify. So each server gets an explicit
share: `--gpu-memory-utilization` (the start-up check) from the memory free now, less what the kernel
keeps, split between the servers started together, and `--kv-cache-memory-bytes` (vLLM then skips
the profiling that others' allocations would distort) as that share less a margin for the weights,
activations and CUDA graphs. A share too small to serve is refused before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftlab import DraftlabError
from draftlab.serving.process import positive_env

GiB = 1 << 30
KV_CAP = 32 * GiB  # a cap, not a need: more only delays a start and crowds the other servers
KV_CAP_ENV = "DRAFTLAB_KV_CAP_GIB"  # a lower cap where more servers share the card (e.g. runs side by side)
MIN_KV = 1 * GiB


@dataclass(frozen=True)
class GpuShare:
    """One server's share of the GPU: the two flags it is started with, and why those values."""

    utilization: float  # --gpu-memory-utilization: the fraction of the card vLLM checks is free at its start
    kv_cache_bytes: int  # --kv-cache-memory-bytes
    why: str

    def args(self) -> list[str]:
        return [
            "--gpu-memory-utilization",
            f"{self.utilization:.4f}",
            "--kv-cache-memory-bytes",
            str(self.kv_cache_bytes),
        ]


def overhead_bytes(weights_bytes: int) -> int:
    """What a server holds besides its KV cache: the weights (and a draft's, counted as much again for
    compile workspace and activations at vLLM's 8192 batched tokens), CUDA graphs and its CUDA context."""
    return 2 * int(weights_bytes) + 4 * GiB


def size_share(
    n_servers: int, free_bytes: int, total_bytes: int, weights_bytes: int, keep_bytes: int | None = None
) -> GpuShare:
    """Each of `n_servers` started together gets (free - keep) / n, at most what a KV cache of KV_CAP (or
    $DRAFTLAB_KV_CAP_GIB) needs; `keep` (default: 10% of the card, at least 8 GiB) stays for the notebook's own
    process."""
    if n_servers < 1:
        raise DraftlabError(f"n_servers={n_servers}: size a share for at least one server.")
    keep = max(8 * GiB, total_bytes // 10) if keep_bytes is None else int(keep_bytes)
    overhead = overhead_bytes(weights_bytes)
    cap = int(positive_env(KV_CAP_ENV, KV_CAP / GiB, "the GiB of KV cache each vLLM server may take", "8") * GiB)
    per = min((free_bytes - keep) // n_servers, overhead + max(cap, MIN_KV))
    if per < overhead + MIN_KV:
        raise DraftlabError(
            f"{free_bytes / GiB:.1f} of {total_bytes / GiB:.1f} GiB are free on this GPU: {n_servers} vLLM "
            f"server(s) of this verifier need {(overhead + MIN_KV) / GiB:.1f} GiB each and the notebook keeps "
            f"{keep / GiB:.1f} GiB. "
            "Free GPU memory (other processes, or this kernel's: `torch.cuda.empty_cache()`), or start fewer servers."
        )
    util = int(per / total_bytes * 10_000) / 10_000  # rounded down: the start-up check compares against free memory
    kv = per - overhead
    why = (
        f"{n_servers} vLLM server(s) on one GPU beside this notebook: {free_bytes / GiB:.1f} of "
        f"{total_bytes / GiB:.1f} GiB free, {keep / GiB:.1f} GiB kept for the notebook; each server "
        f"--gpu-memory-utilization {util:.4f} ({per / GiB:.1f} GiB) with --kv-cache-memory-bytes {kv} "
        f"({kv / GiB:.1f} GiB; vLLM's own profiling of free memory is skipped, since servers starting "
        "together would distort it)"
    )
    return GpuShare(util, kv, why)


def cuda_share(device, n_servers: int, weights_bytes: int, keep_bytes: int | None = None) -> GpuShare:
    """`size_share` from what CUDA reports free on `device` now."""
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(device))
    return size_share(n_servers, free, total, weights_bytes, keep_bytes)


def weights_bytes(*dirs) -> int:
    """Bytes of the safetensors weights in the given model folders (the verifier, and any draft)."""
    from pathlib import Path

    return sum(f.stat().st_size for d in dirs if d for f in Path(d).glob("*.safetensors"))
