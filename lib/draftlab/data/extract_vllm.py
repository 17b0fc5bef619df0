"""Hidden states through vLLM's own engine (speculators' `generate-offline-data` path).

speculators makes offline training data by sending each row to a `vllm serve` started with the
`extract_hidden_states` speculative method and vLLM's ExampleHiddenStatesConnector (its
scripts/launch_vllm.py): a completion of the row's token ids with max_tokens=1; the engine stores the
prefill's states of the listed layers in a cache-only layer, the connector writes `token_ids [T]` and
`hidden_states [T, n, H]` to `<shared_storage_path>/<request>.safetensors` and the path comes back in
`kv_transfer_params`. `extract_check.check` compares those files with draftlab's own extraction.

Numbering: vLLM's decoders collect the residual stream before layer 0 as id 0 and after layer `idx` as
id `idx + 1`, so id i is the state entering layer i and id L the last layer's pre-norm output:
draftlab's numbering (extract.py), no off-by-one. speculators asks for [aux ids..., L]; so does this
module, and the files equal draftlab's slot for slot.

CPU builds: the stock connector cannot run there (`connector_problem` says why, from the installed vLLM
and torch; BENCHMARKS.md has the traceback); `lib/vllm_plugins/draftlab_hs_connector.py` replaces only
its pinned-memory copy. On a CUDA machine the stock connector is used, with speculators' own server flags.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from draftlab import DraftlabError
from draftlab.data.extract import validate_layer_ids
from draftlab.serving.command import (
    SERVED_NAME,
    ask_vllm,
    kept_per_executable,
    unavailable,
    vllm_executable,
)
from draftlab.serving.server import Server

PLUGINS = Path(__file__).resolve().parents[2] / "vllm_plugins"  # imported inside the vLLM environment only
STOCK, CPU_CONNECTOR = "ExampleHiddenStatesConnector", "DraftlabCPUHiddenStatesConnector"
_PROBE = """
import importlib.util, json, pathlib
src = pathlib.Path(importlib.util.find_spec("vllm").submodule_search_locations[0], "distributed", "kv_transfer",
                   "kv_connector", "v1", "example_hidden_states_connector.py")
found = {"connector": src.is_file(), "pins": src.is_file() and "pin_memory=True" in src.read_text(), "error": None}
import torch
try:
    torch.empty(1, pin_memory=True)
except RuntimeError as e:
    found["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(found))
"""


@functools.cache
def _probe(exe: str) -> tuple[str | None, str | None]:
    """(why the stock connector cannot run, why nothing can) for one `vllm` executable: a read of the installed
    connector's source and one pinned allocation in the vLLM environment's torch (seconds: it imports torch; no
    server). Kept in data/cache per executable and its modification time, so notebook 01 pays it once per vLLM
    environment."""
    return tuple(kept_per_executable("vllm-extract-probe.json", exe, lambda: (_run_probe(exe), True)))


def _run_probe(exe: str) -> tuple[str | None, str | None]:
    python = Path(exe).parent / "python"  # a venv's, or a wrapper's beside it (benchmarks/gpu_pipeline.sh writes one)
    if not python.is_file():
        return None, f"no `python` beside {exe} to read the vLLM environment with (a venv's bin/ has one)"
    done = ask_vllm([str(python), "-c", _PROBE], "whether its hidden-states connector runs here")
    if done.returncode != 0:
        return None, f"the vLLM environment's python failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if not found["connector"]:
        return (
            None,
            f"this vLLM has no {STOCK} "
            "(vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py)",
        )
    if found["pins"] and found["error"]:
        return (
            f"vLLM's {STOCK} copies each request's hidden states into pinned memory "
            f"(torch.empty_like(..., pin_memory=True)), which this torch refuses: {found['error']}"
        ), None
    return None, None


def connector_problem() -> str | None:
    """Why vLLM's stock connector cannot extract here (the error it dies with), or None when it can or vLLM is missing."""  # noqa: E501
    return None if unavailable() else _probe(str(vllm_executable()))[0]


def status_line() -> str:
    """One line for notebook 01 and its summary: whether hidden states can come through vLLM on this build, and how."""
    why_not = unavailable() or _probe(str(vllm_executable()))[1]
    if why_not:
        return f"vLLM hidden-state extraction: not available: {why_not}; using transformers"
    problem = connector_problem()
    if problem:
        return (
            "vLLM hidden-state extraction: vLLM's stock connector "
            f"is not available on this build: {problem.rstrip('.')}; "
            f"draftlab's {CPU_CONNECTOR} (lib/vllm_plugins) runs it; stage 01 uses transformers"
        )
    return f"vLLM hidden-state extraction: available (vLLM's {STOCK}); stage 01 uses transformers"


def extraction_server(
    verifier_dir,
    layer_ids,
    storage_dir,
    dtype: str = "float32",
    device: str = "cpu",
    max_model_len: int = 2048,
    log_path=None,
    connector: str = "auto",
    **kw,
) -> Server:
    """A `Server` (not yet started) that extracts the states entering `layer_ids` plus the final one, as
    speculators' launch_vllm.py starts it: `connector` is "stock", "cpu" (draftlab's) or "auto" (stock where it runs)."""  # noqa: E501
    cfg = json.loads((Path(verifier_dir) / "config.json").read_text())
    n = cfg.get("text_config", cfg)["num_hidden_layers"]
    slots = [*validate_layer_ids(layer_ids, n), n]
    if connector == "auto":
        connector = "cpu" if connector_problem() else "stock"
    if connector not in ("stock", "cpu"):
        raise DraftlabError(f"connector={connector!r}: use 'stock' (vLLM's {STOCK}), 'cpu' (draftlab's) or 'auto'.")
    storage = Path(storage_dir).resolve()
    storage.mkdir(parents=True, exist_ok=True)
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": slots}},
    }
    kv = {
        "kv_connector": STOCK,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    env = {}
    if str(device).startswith("cuda") and "gpu" not in kw:
        from draftlab.serving.gpu_memory import cuda_share, weights_bytes

        kw["gpu"] = cuda_share(device, 1, weights_bytes(verifier_dir))
    if connector == "cpu":
        kv.update(kv_connector=CPU_CONNECTOR, kv_connector_module_path="draftlab_hs_connector")
        env["PYTHONPATH"] = str(PLUGINS)  # that folder alone: the vLLM environment keeps its own torch
    s = Server(
        verifier_dir,
        dtype=dtype,
        device=device,
        max_model_len=max_model_len,
        log_path=log_path,
        extra_args=["--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv)],
        extra_env=env,
        **kw,
    )
    s.slots, s.storage, s.connector = slots, storage, connector
    return s


def _one(server: Server, ids: list[int], dest: Path) -> None:
    """One row as speculators' vllm_client sends it; the file moved to `dest` once the connector's lock is released."""
    r = server.request(
        "/v1/completions", {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "return_token_ids": True}
    )
    got = r["choices"][0].get("prompt_token_ids")
    if got != ids:
        raise DraftlabError(
            f"vLLM read another prompt than the row's {len(ids)} token ids (got {None if got is None else len(got)})."
        )
    path = (r.get("kv_transfer_params") or {}).get("hidden_states_path")
    if path is None:
        raise DraftlabError(
            f"vLLM's answer has no kv_transfer_params.hidden_states_path: is {server.url} an extraction server?"
        )
    lock = path + ".lock"
    if os.path.exists(lock):
        with open(lock) as fh:
            fcntl.flock(fh, fcntl.LOCK_SH)  # sleeps until the connector's writer has closed the file
        os.remove(lock)
    shutil.move(path, dest)


def extract(server: Server, rows: list[list[int]], out_dir, concurrency: int = 32) -> dict:
    """`out_dir/hidden_states/hs_{i}.safetensors` for every row through a started `extraction_server`, in speculators'
    format, `concurrency` requests in flight (speculators' default, 32: vLLM batches what is in flight, and
    fewer make the extraction slower, BENCHMARKS.md "Hidden states through vLLM"); returns rows, tokens,
    seconds and tokens/s (files moved included)."""
    hs_dir = Path(out_dir) / "hidden_states"
    hs_dir.mkdir(parents=True, exist_ok=True)
    rows = [list(map(int, r)) for r in rows]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for f in [pool.submit(_one, server, r, hs_dir / f"hs_{i}.safetensors") for i, r in enumerate(rows)]:
            f.result()
    seconds = time.perf_counter() - t0
    tokens = sum(map(len, rows))
    info = {
        "engine": "vllm",
        "connector": server.connector,
        "slots": server.slots,
        "command": server.command,
        "rows": len(rows),
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
    }
    (Path(out_dir) / "extract_vllm.json").write_text(json.dumps(info, indent=1))
    return info
