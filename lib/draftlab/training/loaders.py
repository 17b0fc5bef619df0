"""How many processes read a run's packs ahead of training, and why."""

from __future__ import annotations

ONLINE_WORKERS = 12  # online on CUDA: loader processes, each waiting on its own vLLM request
OFFLINE_WORKERS = 8  # offline on CUDA, at most half the cores (4 and 8 waited alike: the wait was not theirs)
READ_AHEAD = 16  # packs read ahead across the loader processes (each in /dev/shm until the GPU takes it)


def prefetch(workers: int) -> int:
    """Packs each loader process reads ahead: `READ_AHEAD` across them (at least 2 each), so that more processes
    read faster without holding more of /dev/shm."""
    return max(2, READ_AHEAD // max(workers, 1))


def loader_workers(
    requested: int | None, device: str, cpus: int | None = None, shm_free: int | None = None, online: bool = False
) -> tuple[int, str]:
    """How many processes read packs ahead of training, and why.

    Reading a pack (Arrow rows to tensors, then speculators' collate) is Python-bound: on a GPU it
    can take as long as a whole training step (BENCHMARKS.md), so the GPU would wait on it every step. On CUDA
    worker processes read ahead while the GPU trains; on CPU the cores are the trainer's. Half the cores read:
    with 4 processes the `gpu` profile's steps still waited, which looked like a supply limit, but 8 waited as
    much, flat in every epoch; the wait was the training process freeing each pack's shared memory as the next
    arrived, which `train` now does during the step (BENCHMARKS.md, 2026-12-07). Workers hand packs over through
    /dev/shm, which containers often keep small. Online, a worker spends its time
    waiting on vLLM (speculators asks for one row at a time), not on a core: each worker is one more request in
    flight for the server to batch, so there are more of them (BENCHMARKS.md, "Online hidden states").
    """
    import os
    import shutil

    if requested is not None:
        return requested, "as asked (loader_workers)"
    cpus = cpus or os.cpu_count() or 1
    if not device.startswith("cuda") or cpus < 4:
        return 0, "CPU (or few cores): packs are read in the training process, between steps"
    if shm_free is None:
        shm_free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    if shm_free < 2 << 30:
        return 0, (
            f"CUDA, but /dev/shm has {shm_free >> 20} MiB free and worker processes pass packs through it: read in "
            f"process (give the container more shared memory, e.g. docker --shm-size=8g, to read ahead)"
        )
    if online:
        n = min(ONLINE_WORKERS, cpus - 2)
        return n, f"CUDA, online: {n} processes each keep a row's request in flight to vLLM while the GPU trains"
    n = min(OFFLINE_WORKERS, cpus // 2)
    return n, f"CUDA: {n} processes read and collate packs while the GPU trains ({cpus} CPUs here)"
