"""Hidden-state extraction both ways on the same rows: draftlab's transformers hooks, then vLLM's extract_hidden_states
engine (speculators' path), then the check of vLLM's files against draftlab's (relative error per slot, nearest layer).

    DRAFTLAB_VLLM=.venv-vllm/bin/vllm python benchmarks/bench_extract_vllm.py            # ci train rows, this CPU
    python benchmarks/bench_extract_vllm.py --data data/runs/<name>/train --rows 256 --device cuda --dtype bfloat16 \
        --batch-size 64 --speculators       # the GPU: vLLM's stock connector, and speculators' own client too

The server is launched first and the transformers run goes while it starts (on a GPU its start is CPU work:
torch.compile and CUDA graphs; `--wait-for FILE` holds the timed parts until other work has ended); vLLM's timed
run begins once it is ready. tokens/s counts the files written (moved, for vLLM) and leaves out the server's start,
which is given apart. One warm-up request precedes vLLM's timing. `--speculators` then runs speculators' own
client (`speculators generate-offline-data`, its whole process timed) against the same server.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from datasets import load_from_disk

from draftlab.config import repo_root
from draftlab.data import extract_check, extract_vllm
from draftlab.data.extract import default_layer_ids, extract
from draftlab.data.verifier import load_verifier
from draftlab.layout import RunLayout
from draftlab.serving.command import vllm_version


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(RunLayout("smollm2-ci", "ci").split("train")))
    ap.add_argument("--verifier", default=str(repo_root() / "data" / "verifiers" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--rows", type=int, default=50)
    ap.add_argument("--layer-ids", type=int, nargs="+", default=None, help="default: EAGLE-3's [2, L//2, L-3]")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-size", type=int, default=8, help="transformers rows per forward")
    ap.add_argument("--concurrency", type=int, default=32, help="vLLM requests in flight (speculators' default)")
    ap.add_argument("--connector", default="auto", choices=["auto", "stock", "cpu"])
    ap.add_argument("--json", default=None, help="write the results here too")
    ap.add_argument("--log", default=None, help="keep the server's log here (default: a temporary file)")
    ap.add_argument(
        "--speculators",
        action="store_true",
        help="also run speculators' own client (`speculators generate-offline-data`) against the same server, timed",
    )
    ap.add_argument(
        "--wait-for",
        default=None,
        help="start the server at once, then wait for this file before the timed parts (the start overlaps other work)",
    )
    ap.add_argument("--tol", type=float, default=None, help="largest relative error a slot may have (1e-4; bf16 2e-2)")
    args = ap.parse_args()

    ds = load_from_disk(args.data)
    n = min(args.rows, len(ds))
    rows = [list(map(int, r)) for r in ds.with_format(None)["input_ids"][:n]]
    v = load_verifier(args.verifier, device=args.device, dtype=args.dtype)
    layer_ids = args.layer_ids or default_layer_ids(v.num_layers)
    res = {
        "rows": n,
        "tokens": sum(map(len, rows)),
        "layer_ids": layer_ids,
        "vllm": vllm_version(),
        "machine": torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else f"{platform.processor() or 'cpu'} x{torch.get_num_threads()} threads",
    }
    tol = args.tol or (2e-2 if args.dtype == "bfloat16" else 1e-4)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        s = extract_vllm.extraction_server(
            v.path,
            layer_ids,
            tmp / "store",
            dtype=args.dtype,
            device=args.device,
            log_path=args.log or tmp / "vllm.log",
            connector=args.connector,
        )
        res["command"], res["connector"] = shlex.join(s.command), s.connector
        res["stock_connector_problem"] = extract_vllm.connector_problem()
        s.launch()  # its start overlaps what runs until --wait-for exists
        try:
            while args.wait_for and not Path(args.wait_for).exists():
                time.sleep(1.0)
            st = extract(v, ds, tmp / "hf", layer_ids, batch_size=args.batch_size, max_samples=n, progress=False)
            res["transformers"] = {"seconds": round(st.seconds, 2), "tokens_per_s": round(st.tokens_per_s, 1)}
            s.wait_ready()
            extract_vllm.extract(s, rows[:1], tmp / "warmup", args.concurrency)
            t0 = time.perf_counter()
            got = extract_vllm.extract(s, rows, tmp / "vllm", args.concurrency)
            res["vllm_run"] = {
                "seconds": got["seconds"],
                "tokens_per_s": got["tokens_per_s"],
                "server_start_s": round(s.startup_s, 1),
                "wall_s": round(time.perf_counter() - t0, 2),
            }
            if args.speculators:
                res["speculators_run"] = speculators_client(s, args.data, n, args.concurrency, tmp / "spec")
        finally:
            s.stop()
        res["check_against_files"] = extract_check.check(
            v, rows, tmp / "vllm", layer_ids, reference_dir=tmp / "hf", tol=tol
        )
        res["check_against_forward"] = extract_check.check(v, rows, tmp / "vllm", layer_ids, tol=tol)
        if args.speculators:
            res["check_speculators"] = extract_check.check(
                v, rows, tmp / "spec", layer_ids, reference_dir=tmp / "hf", tol=tol
            )
        res["tolerance"] = tol

    c = res["check_against_files"]
    print(
        f"\nverifier {v.path.name}, {v.dtype}, {res['machine']}, vLLM {res['vllm']} ({res['connector']} connector); "
        f"{n} rows, {res['tokens']} tokens; layers {layer_ids}+final"
    )
    print(f"command: {res['command']}")
    print("| engine | seconds | tokens/s | server start (s) |\n| --- | --- | --- | --- |")
    print(
        f"| transformers hooks (batch {args.batch_size}) | "
        f"{res['transformers']['seconds']} | {res['transformers']['tokens_per_s']} | - |"
    )
    print(
        f"| vLLM extract_hidden_states ({args.concurrency} in flight) | {res['vllm_run']['seconds']} | "
        f"{res['vllm_run']['tokens_per_s']} | {res['vllm_run']['server_start_s']} |"
    )
    print(
        "| slot | draftlab id | max rel. error vs draftlab's files | "
        "vs a fresh forward | nearest verifier id (row 0) | runner-up |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    f = res["check_against_forward"]["max_relative_error"]
    for i, sid in enumerate(c["slots"]):
        near, up = c["nearest"][i], c["runner_up"][i]
        print(
            f"| {i} | {sid} | {c['max_relative_error'][i]:.1e} | "
            f"{f[i]:.1e} | {near['layer']} ({near['relative_error']:.1e}) | "
            f"{up['layer']} ({up['relative_error']:.2g}) |"
        )
    if args.speculators:
        r, sc = res["speculators_run"], res["check_speculators"]
        print(
            f"| speculators generate-offline-data ({args.concurrency} in flight) | {r['seconds']} | "
            f"{r['tokens_per_s']} | (same server) |\nspeculators' files against draftlab's hooks, "
            "largest relative error per slot: "
            + ", ".join(f"{e:.1e}" for e in sc["max_relative_error"])
            + f"; nearest layers {[x['layer'] for x in sc['nearest']]}"
        )
    extra = res["check_speculators"]["problems"] if args.speculators else []
    print(f"tolerance {tol:g}; problems:", c["problems"] + res["check_against_forward"]["problems"] + extra or "none")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


def speculators_client(server, data: str, n: int, concurrency: int, out: Path) -> dict:
    """speculators' own extraction client against a started extraction server, on the first `n` rows of `data`
    (a stage-01 split: speculators' prepare-data format), timed as a whole process (its start included)."""
    cmd = [sys.executable, "-m", "speculators", "generate-offline-data", "--endpoint", f"{server.url}/v1"]
    cmd += ["--preprocessed-data", data, "--output", str(out / "hidden_states"), "--max-samples", str(n)]
    cmd += ["--concurrency", str(concurrency), "--validate-outputs", "--fail-on-error"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"speculators generate-offline-data failed ({done.returncode}):\n{done.stderr[-3000:]}")
    tokens = sum(len(r) for r in load_from_disk(data).with_format(None)["input_ids"][:n])
    return {"command": shlex.join(cmd), "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1)}


if __name__ == "__main__":
    main()
