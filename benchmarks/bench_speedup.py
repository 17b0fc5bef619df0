"""Served speed-up where speculation pays (issue 48): a verifier, its expansion to a large model's shape, each
with its drafts at several k, served by vLLM at 1, 8 and 32 requests in flight, beside a cost model.

    python benchmarks/bench_speedup.py --like 8b --draft eagle3=<final/> --ks 1,2,3,5,7 --prompts-from smollm2-default \
        --prompts 16 --max-tokens 128 --device cuda --dtype bfloat16 --reference --out /tmp/speedup.json

For each verifier (the original, and `data.expand`'s stand-in for each --like): its weight GEMMs and each draft's timed
as the engine replays them (`acceptance.costs`), then servers, --parallel at a time (started together, measured one
after the other while the others idle): the verifier alone; each draft (widened by `drafts.expand` for a stand-in)
at each k; vLLM's n-gram at --ngram-ks. --reference adds the reference model's own shape served with random weights
(vLLM's dummy load format) alone and with a random EAGLE-3 of its shape at k 5, beside the stand-in with a random
draft of its own shape: the cost check (same engine, same kernels, acceptance zero on both). Writes every workload and
a table: tokens/s, vLLM's tau, speed-up with its interval (paired bootstrap over prompts at one in flight, the range of
--repeats workloads above). `analyse RESULT.json` prints the checks (the stand-in against its reference's cost, its
greedy text and tau against the original's) and the cost model's predictions beside the measured speed-ups.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import torch

from draftlab.acceptance import costs, speedup, workload
from draftlab.acceptance.evaluate import load_spec_prompts
from draftlab.acceptance.served import WARMUP_CHAT, WARMUP_TOKENS
from draftlab.acceptance.speedup import (
    host_line,
    one_in_flight,
    predict_taus,
    spec_fixed,
    taus_from_shares,
    verifier_costs,
)
from draftlab.acceptance.together import start_together, stop_all
from draftlab.data import stand_in
from draftlab.data.expand import expand
from draftlab.data.verifier_dir import resolve_verifier
from draftlab.drafts.expand import expand_draft, never_accepted
from draftlab.layout import RunLayout
from draftlab.serving.counters import served_metrics
from draftlab.serving.gpu_memory import GpuShare
from draftlab.serving.pair_check import ngram_config
from draftlab.serving.server import Server


def random_twin(draft_dir: Path, verifier_cfg: dict, out: Path) -> Path:
    """An EAGLE-3 config of the verifier's shape with no weights, served with vLLM's dummy load format: a draft whose
    tokens are never accepted, so every step verifies k+1 tokens (the cost check)."""
    cfg = json.loads((draft_dir / "config.json").read_text())
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")
    cfg["transformer_layer_config"].update({k: verifier_cfg[k] for k in keys if k in verifier_cfg})
    cfg["transformer_layer_config"]["head_dim"] = (
        verifier_cfg.get("head_dim") or verifier_cfg["hidden_size"] // verifier_cfg["num_attention_heads"]
    )
    cfg.update(d2t=None, t2d=None)
    layers = verifier_cfg["num_hidden_layers"]  # aux layers that exist in this verifier (speculators' default rule)
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, layers // 2, layers - 3]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def reference_dir(like: str, tokenizer_from: Path, out: Path) -> Path:
    """The reference model's config (`stand_in.reference_config`), the verifier's tokenizer beside it, no weights."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(stand_in.reference_config(like), indent=1))
    for f in tokenizer_from.iterdir():
        if (
            f.is_file()
            and f.suffix not in (".safetensors",)
            and f.name not in ("config.json", "expansion.json")
            and "index" not in f.name
        ):
            shutil.copy2(f, out / f.name)
    return out


def slim(src: Path, dst: Path) -> None:
    """A draft checkpoint without the verifier's embeddings (frozen, the verifier's own: `with_embeddings` puts them
    back from the verifier on the other side) and in bf16, so that it travels beside a staging call's other parts."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(src / "model.safetensors"))
    weights.pop("embed_tokens.weight", None)
    keep = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()}
    save_file(keep, str(dst / "model.safetensors"))  # in bf16, the dtype it is served in there
    shutil.copy2(src / "config.json", dst / "config.json")


def with_embeddings(draft: Path, verifier: Path, out: Path) -> Path:
    """`draft` as it was trained: the verifier's embeddings back in it where `slim` took them out."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    weights = load_file(str(draft / "model.safetensors"))
    if "embed_tokens.weight" in weights:
        return draft
    for f in sorted(verifier.glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            if "model.embed_tokens.weight" in st.keys():
                dtype = next(v.dtype for v in weights.values() if v.is_floating_point())
                weights["embed_tokens.weight"] = st.get_tensor("model.embed_tokens.weight").to(dtype)
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy2(draft / "config.json", out / "config.json")
    return out


def measure(server: Server, prompts, pool, max_tokens: int, levels, repeats: int) -> dict:
    server.chat(WARMUP_CHAT, WARMUP_TOKENS)  # first-request kernel compiles left out of the seconds
    runs = {}
    for c in levels:
        work = prompts if c == 1 else (prompts + pool)[: max(len(prompts), 3 * c)]
        reps = [workload.run(server, work, max_tokens, c) for _ in range(1 if c == 1 else repeats)]
        runs[c] = {
            "tokens_per_s": [r["tokens_per_s"] for r in reps],
            "wall_s": [r["wall_s"] for r in reps],
            "tokens": [r["tokens"] for r in reps],
            "metrics": served_metrics(reps[0]["counts"]) if server.spec else None,
            "outputs": [{k: o[k] for k in ("token_ids", "seconds", "prompt_token_ids")} for o in reps[0]["outputs"]]
            if c == 1
            else None,
        }
    return {"command": server.command, "startup_s": server.startup_s, "levels": runs}


def plan_servers(args, variants: dict, drafts: dict, tmp: Path) -> list[tuple[str, dict, float]]:
    """(name, Server kwargs, GiB it holds on a GPU) of every server, in the order they are measured: each verifier
    alone and with its drafts at the first k, then the cost check, then the other k, then the n-gram."""
    gib = 2**30
    size = {v: sum(f.stat().st_size for f in Path(d).glob("*.safetensors")) / gib for v, d in variants.items()}
    kv = {v: args.kv_gib if v != "original" else 1.0 for v in variants}
    extra = ["--max-num-seqs", str(max(args.concurrency))]  # CUDA graphs captured for the batches served, no more

    def server(name, v, **kw):
        draft = kw.get("draft_dir")
        held = (
            size[v]
            + (sum(f.stat().st_size for f in Path(draft).glob("*.safetensors")) / gib if draft else 0)
            + kv[v]
            + 4  # activations, CUDA graphs, the CUDA context
        )
        return name, {**kw, "extra_args": extra + kw.pop("extra_args", [])} | {"verifier_dir": variants[v]}, held

    ks = {kind: args.kind_ks.get(kind, args.ks) for v in variants for kind in drafts[v]}
    lead = next(iter(drafts["original"]), None)  # the first draft given: measured at every k before the others
    order = list(reversed(variants))  # the stand-ins first
    first = [server(f"{v} alone", v) for v in order]
    first += [server(f"{v} {lead} k{ks[lead][0]}", v, draft_dir=drafts[v][lead], k=ks[lead][0]) for v in order if lead]
    check = [  # a speculative step's fixed cost on each stand-in: its draft, never accepted (`spec_fixed`)
        server(f"{v} {lead} k5 never accepted", v, draft_dir=never_accepted(drafts[v][lead], tmp / f"never-{v}"), k=5)
        for v in args.like
        if lead and args.spec_check
    ]
    if args.reference:
        dummy = ["--load-format", "dummy"]
        for like in args.like:
            ref = reference_dir(like, variants[like], tmp / f"reference-{like}")
            ref_gib = stand_in.count_parameters(stand_in.reference_config(like)) * 2 / gib
            base = next(iter(drafts[like].values()))
            for name, d in ((f"reference {like}", ref), (f"{like} (random weights)", variants[like])):
                twin = random_twin(
                    base, json.loads((d / "config.json").read_text()), tmp / f"twin-{name.split()[0]}-{like}"
                )
                spec = {"method": "eagle3", "model": str(twin), "num_speculative_tokens": 5}
                if name.startswith("reference"):
                    check.append(
                        (f"{name} alone", {"verifier_dir": d, "extra_args": extra + dummy}, ref_gib + kv[like] + 3)
                    )
                held = (ref_gib if name.startswith("reference") else size[like]) + kv[like] + 5
                check.append(
                    (
                        f"{name} random eagle3 k5",
                        {"verifier_dir": d, "k": 5, "spec": spec, "extra_args": extra + dummy},
                        held,
                    )
                )
    rest = [
        server(f"{v} {kind} k{k}", v, draft_dir=d, k=k)
        for k in args.ks[1:]
        for v in variants
        for kind, d in drafts[v].items()
    ]
    ngram = [
        server(f"{v} ngram k{k}", v, k=k, spec=ngram_config(k, 3))
        for k in args.ngram_ks
        for v in variants
        if v != "original"
    ]
    return first + check + rest + ngram


def groups(todo: list, budget_gib: float, most: int) -> list[list]:
    """Consecutive servers started together while their GPU memory fits the budget (at most `most` at once)."""
    out, held = [[]], 0.0
    for item in todo:
        if out[-1] and (held + item[2] > budget_gib or len(out[-1]) >= most):
            out.append([])
            held = 0.0
        out[-1].append(item)
        held += item[2]
    return [g for g in out if g]


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--verifier", default="smollm2")
    a.add_argument("--like", action="append", default=[], help="stand-in(s) to expand to: 8b, 1b")
    a.add_argument("--draft", action="append", default=[], help="kind=final/ folder trained for the verifier")
    a.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[5])
    a.add_argument(
        "--kind-ks",
        type=lambda s: {kv.split("=")[0]: [int(x) for x in kv.split("=")[1].split(",")] for kv in s.split(";") if kv},
        default={},
        help="other k for a kind, e.g. 'dflash=5,7'",
    )
    a.add_argument("--ngram-ks", type=lambda s: [int(x) for x in s.split(",") if x], default=[])
    a.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    a.add_argument("--prompts-from", required=True, help="a dataset_name whose bench split is served")
    a.add_argument("--prompts", type=int, default=16)
    a.add_argument("--max-tokens", type=int, default=128)
    a.add_argument("--repeats", type=int, default=3)
    a.add_argument("--device", default="cuda")
    a.add_argument("--dtype", default="bfloat16")
    a.add_argument("--parallel", type=int, default=6, help="at most this many servers started together")
    a.add_argument("--reference", action="store_true")
    a.add_argument(
        "--spec-check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve each stand-in with its draft never accepted (a speculative step's fixed cost)",
    )
    a.add_argument("--kv-gib", type=float, default=4.0, help="each server's KV cache on a GPU")
    a.add_argument(
        "--define-reference",
        action="append",
        default=[],
        help="name=hidden,intermediate,layers,heads,kv_heads,head_dim,vocab: a reference shape of one's own (tests)",
    )
    a.add_argument("--out", required=True)
    args = a.parse_args()
    t0, out_path, tmp = time.time(), Path(args.out), Path(args.out).with_suffix(".work")
    for d in args.define_reference:
        name, nums = d.split("=", 1)
        stand_in.REFERENCES[name] = stand_in.Reference(f"{name} reference", *map(int, nums.split(",")), False)
    dtype = getattr(torch, args.dtype)
    src = resolve_verifier(args.verifier)
    variants = {"original": src, **{like: expand(src, like, dtype=dtype, device=args.device) for like in args.like}}
    given = dict(d.split("=", 1) for d in args.draft)
    drafts = {"original": {kind: with_embeddings(Path(p), src, tmp / f"{kind}-trained") for kind, p in given.items()}}
    for like in args.like:
        drafts[like] = {kind: expand_draft(Path(p), variants[like]) for kind, p in drafts["original"].items()}
    result = {"args": vars(args), "variants": {v: str(p) for v, p in variants.items()}, "costs": {}, "servers": {}}
    print(f"expanded in {time.time() - t0:.0f} s: {result['variants']}", flush=True)
    for v, vdir in variants.items():  # before any server holds the GPU
        vcfg = json.loads((vdir / "config.json").read_text())
        ver = costs.time_gemms(costs.linear_shapes(vcfg), range(1, max(args.ks) + 3), args.device, dtype)
        drf = {}
        for kind, d in drafts[v].items():
            dcfg = json.loads((d / "config.json").read_text())
            tl = {**dcfg["transformer_layer_config"], "draft_vocab_size": dcfg.get("draft_vocab_size")}
            drf[kind] = costs.time_gemms(costs.linear_shapes(tl, draft=True), [1], args.device, dtype)[1]
        result["costs"][v] = {"verify_s": ver, "draft_s": drf}
        print(f"costs {v}: V(1) {ver[1] * 1e3:.3f} ms, V(6) {ver.get(6, 0) * 1e3:.3f} ms, drafts {drf}", flush=True)
        torch.cuda.empty_cache() if args.device.startswith("cuda") else None
    if args.reference:
        for like in args.like:
            ref = stand_in.reference_config(like)
            t = costs.time_gemms(costs.linear_shapes(ref), [1, 6], args.device, dtype)
            result["costs"][f"reference {like}"] = {"verify_s": t}
            print(f"costs reference {like}: V(1) {t[1] * 1e3:.3f} ms, V(6) {t[6] * 1e3:.3f} ms", flush=True)
    tok = __import__("transformers").AutoTokenizer.from_pretrained(src)
    prompts_file = RunLayout(args.prompts_from, "").prompts
    prompts = load_spec_prompts(prompts_file, tok, "bench", args.prompts)
    pool = [p for p in load_spec_prompts(prompts_file, tok, "bench") if p["id"] not in {q["id"] for q in prompts}]
    todo = plan_servers(args, variants, drafts, tmp)
    max_len = max(len(p["ids"]) for p in prompts + pool) + args.max_tokens + max(args.ks) + 64
    budget = (torch.cuda.mem_get_info()[0] / 2**30 - 2) if args.device.startswith("cuda") else 1e9
    for group in groups(todo, budget, args.parallel):
        total = torch.cuda.mem_get_info()[1] / 2**30 if args.device.startswith("cuda") else 1
        servers = {
            name: Server(
                dtype=args.dtype,
                device=args.device,
                max_model_len=max_len,
                gpu=GpuShare(
                    int(held / total * 1e4) / 1e4,
                    int((args.kv_gib if "original" not in name else 1) * 2**30),
                    f"{held:.1f} GiB",
                )
                if args.device.startswith("cuda")
                else None,
                log_path=tmp / f"{name.replace(' ', '_').replace('(', '').replace(')', '')}.log",
                **kw,
            )
            for name, kw, held in group
        }
        print(f"[{time.time() - t0:.0f} s] starting {list(servers)}", flush=True)
        try:
            started = start_together(servers)
            for name, s in servers.items():
                if started[name] is not None:
                    result["servers"][name] = {"error": str(started[name]).splitlines()[0], "log_tail": s.log_tail(15)}
                else:
                    result["servers"][name] = measure(s, prompts, pool, args.max_tokens, args.concurrency, args.repeats)
                print(f"[{time.time() - t0:.0f} s] {name}: {summary_line(result['servers'][name])}", flush=True)
                s.stop()
                out_path.write_text(json.dumps(result, indent=1, default=str))
        finally:
            stop_all(servers)
    result["table"] = table(result, args)
    out_path.write_text(json.dumps(result, indent=1, default=str))
    print_table(result["table"])


def summary_line(r: dict) -> str:
    if "error" in r:
        return "ERROR " + r["error"]
    parts = [
        f"c{c}: {sum(lv['tokens_per_s']) / len(lv['tokens_per_s']):.1f} tok/s"
        + (f" tau {lv['metrics']['tau']:.3f}" if lv["metrics"] else "")
        for c, lv in r["levels"].items()
    ]
    return f"start {r['startup_s']:.0f} s; " + "; ".join(parts)


def table(result: dict, args) -> list[dict]:
    """Speed-up of each drafting server over its verifier alone, at each level, beside the cost model's prediction."""
    rows, servers = [], result["servers"]
    for name, r in servers.items():
        alone_name = name.rsplit(" ", 2)[0] + " alone" if " k" in name else None
        if alone_name is None or alone_name not in servers or "error" in r or "error" in servers[alone_name]:
            continue
        alone = servers[alone_name]
        for c, lv in r["levels"].items():
            base = alone["levels"][c]
            if c == 1 and lv["outputs"] and base["outputs"]:
                ci = speedup.paired_over_prompts(base["outputs"], lv["outputs"])
            else:
                ci = speedup.over_repeats(base["tokens_per_s"], lv["tokens_per_s"])
            rows.append(
                {
                    "server": name,
                    "in flight": c,
                    "tokens/s alone": sum(base["tokens_per_s"]) / len(base["tokens_per_s"]),
                    "tokens/s": sum(lv["tokens_per_s"]) / len(lv["tokens_per_s"]),
                    "vLLM tau": (lv["metrics"] or {}).get("tau"),
                    "speed-up": ci["value"],
                    "low": ci["low"],
                    "high": ci["high"],
                }
            )
    return rows


def print_table(rows: list[dict]) -> None:
    print("| server | in flight | tokens/s alone | tokens/s | vLLM tau | speed-up (95%) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        tau = f"{r['vLLM tau']:.3f}" if r["vLLM tau"] else "-"
        print(
            f"| {r['server']} | {r['in flight']} | {r['tokens/s alone']:.1f} | {r['tokens/s']:.1f} | {tau} | "
            f"{r['speed-up']:.3f} [{r['low']:.3f}, {r['high']:.3f}] |"
        )


def near_ties(result: dict, like: str) -> dict:
    """The stand-in's greedy texts judged by the original verifier here, in bf16 as it was served: every token its
    argmax, or a near-tie (`lossless.greedy_check`, one full forward over each prompt and answer)."""
    from draftlab.acceptance.lossless import greedy_check
    from draftlab.data.verifier import load_verifier

    v = load_verifier(result["args"]["verifier"], device="cpu", dtype="bfloat16")
    outs = result["servers"][f"{like} alone"]["levels"]["1"]["outputs"]
    found = [greedy_check(v, o["prompt_token_ids"], o["token_ids"], result["args"]["max_tokens"]) for o in outs]
    return {
        "every token the original's bf16 argmax": f"{sum(c['divergences'] == 0 for c in found)} of {len(found)}",
        "every token its argmax or a bf16 near-tie": f"{sum(c['lossless'] for c in found)} of {len(found)}",
    }


def predictions(
    result: dict, calibrate: str = "original", kind: str = "eagle3", pool: list[dict] = (), spec_from: list[dict] = ()
) -> list[dict]:
    """The cost model against every measured speed-up at one request in flight. Each stand-in is predicted from its
    weight GEMMs (V, D), its own plain token (E) and the original verifier's served tau at the same k (the same
    function, so the same text and acceptance); the engine's host line comes from the `calibrate` verifier's own
    speculative runs, so no speculative run of a stand-in enters its prediction. The calibrating verifier's rows are
    a fit. `pool`: other results of the same machine whose calibrating runs join the fit; `spec_from`: results (of
    any host: the term is the device's) where a random draft was served on a stand-in (`spec_fixed`)."""
    servers, rows = result["servers"], []
    engine = host_line([result, *pool], calibrate, kind)
    spec = {v: spec_fixed([result, *pool, *spec_from], v) if v != calibrate else 0.0 for v in result["costs"]}
    for name in servers:
        m = re.fullmatch(rf"(\S+) {kind} k(\d+)", name)
        if not m or "error" in servers[name] or f"{m.group(1)} alone" not in servers:
            continue
        v, k = m.group(1), int(m.group(2))
        model, plain = verifier_costs(result, v, kind, engine, spec.get(v, 0.0))
        ver = model.verify_s
        sec, tau = one_in_flight(result, name)
        tau_from = f"{calibrate} {kind} k{k}" if f"{calibrate} {kind} k{k}" in servers else name
        pred = costs.predict({k: one_in_flight(result, tau_from)[1]}, model)[0]
        measured = plain / sec
        rows.append(
            {
                "server": name,
                "k": k,
                "vLLM tau": tau,
                "tau used": pred["tau"],
                "V(1) ms": ver[1] * 1e3,
                "V(k+1) ms": ver[k + 1] * 1e3,
                "draft ms": model.draft_s * 1e3,
                "engine ms": model.engine_s * 1e3,
                "host ms": model.host_step_s(k) * 1e3,
                "per accepted token ms": model.per_token_s * 1e3,
                "spec step ms": model.spec_s * 1e3,
                "step ms (measured)": tau * sec * 1e3,
                "step ms (model)": model.step_s(k, pred["tau"]) * 1e3,
                "predicted": pred["predicted speed-up"],
                "measured": measured,
                "error": pred["predicted speed-up"] / measured - 1,
                "break-even tau": pred["break-even tau"],
                "bound by": pred["bound by"],
                "fit": v == calibrate,
            }
        )
    return rows


def predict_k(result: dict, draft: Path, pool: list[dict] = (), kind: str = "eagle3") -> list[dict]:
    """The best k before serving it: the loop's tau at every k (`replay.tau_by_k`, one pass of the draft over the
    original verifier's greedy texts as vLLM served them, one in flight, here on this machine's CPU in fp32) put
    through the cost model of each verifier the run measured (its GEMMs, its plain token, the engine line fitted on
    the original's runs), beside each measured k."""
    from types import SimpleNamespace

    from draftlab.acceptance.cost_model import K_RANGE
    from draftlab.acceptance.proposers import load_draft
    from draftlab.acceptance.replay import tau_by_k
    from draftlab.data.verifier import load_verifier

    src = resolve_verifier(result["args"]["verifier"])
    v = load_verifier(src, device="cpu", dtype="float32")
    d = load_draft(with_embeddings(draft, src, Path(f"/tmp/draftlab-predict-k/{kind}")), v)
    outs = result["servers"]["original alone"]["levels"]["1"]["outputs"]
    gens = [SimpleNamespace(prompt_ids=o["prompt_token_ids"], tokens=o["token_ids"]) for o in outs]
    with torch.no_grad():
        taus = tau_by_k(d, gens, K_RANGE, result["args"]["max_tokens"])
    return predict_taus(result, taus, pool, kind)


def checks(result: dict, like: str, base: str = "original") -> dict:
    """The stand-in against its reference's shape (served cost, plain and with k+1 verified) and against the
    original (the same greedy text, the same tau)."""
    s = result["servers"]
    out = {}
    for c in ("1", "8", "32"):
        pairs = {
            "plain": (f"{like} alone", f"reference {like} alone"),
            "k 5 verified": (f"{like} (random weights) random eagle3 k5", f"reference {like} random eagle3 k5"),
        }
        for what, (a, b) in pairs.items():
            if a in s and b in s and "error" not in s[a] and "error" not in s[b]:
                ta, tb = (
                    sum(s[x]["levels"][c]["tokens_per_s"]) / len(s[x]["levels"][c]["tokens_per_s"]) for x in (a, b)
                )
                out[f"{what}, {c} in flight: stand-in / reference tokens/s"] = ta / tb
    if f"{like} alone" in s and f"{base} alone" in s:
        a, b = (s[f"{x} alone"]["levels"]["1"]["outputs"] for x in (like, base))
        out["greedy texts identical (one in flight)"] = (
            f"{sum(x['token_ids'] == y['token_ids'] for x, y in zip(a, b, strict=True))} of {len(a)}"
        )
    for name in s:
        m = re.fullmatch(rf"{like} (\w+) (k\d+)", name)
        if m and f"{base} {m.group(1)} {m.group(2)}" in s and "error" not in s[name]:
            out[f"tau {m.group(1)} {m.group(2)}: stand-in / {base}"] = (
                one_in_flight(result, name)[1] / one_in_flight(result, f"{base} {m.group(1)} {m.group(2)}")[1]
            )
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "slim":  # slim DRAFT_DIR OUT_DIR
        slim(Path(sys.argv[2]), Path(sys.argv[3]))
    elif (
        len(sys.argv) > 1 and sys.argv[1] == "analyse"
    ):  # analyse RESULT.json [MORE.json of the same host] [spec=R.json]
        files = [f for f in sys.argv[2:] if not f.startswith("spec=")]
        spec_from = [json.loads(Path(f[5:]).read_text()) for f in sys.argv[2:] if f.startswith("spec=")]
        res, *pool = (json.loads(Path(f).read_text()) for f in files)  # the checks, the model's predictions
        print_table(res["table"])
        for like in res["args"]["like"]:
            found = {**checks(res, like), **near_ties(res, like)}
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in found.items()}, indent=1))
        rows = predictions(res, pool=pool, spec_from=spec_from)
        keys = [
            "server",
            "vLLM tau",
            "host ms",
            "per accepted token ms",
            "spec step ms",
            "step ms (measured)",
            "step ms (model)",
            "predicted",
            "measured",
            "error",
            "bound by",
            "fit",
        ]
        print("| " + " | ".join(keys) + " |\n|" + " --- |" * len(keys))
        for r in rows:
            print("| " + " | ".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    elif len(sys.argv) > 1 and sys.argv[1] in ("predict-k", "predict-arm"):
        # predict-k RESULT.json DRAFT_DIR [MORE.json]; predict-arm RESULT.json ARM.json [MORE.json] [spec=R.json]
        res, more = json.loads(Path(sys.argv[2]).read_text()), sys.argv[4:]
        pool = [json.loads(Path(f).read_text()) for f in more if not f.startswith("spec=")]
        spec_from = [json.loads(Path(f[5:]).read_text()) for f in more if f.startswith("spec=")]
        if sys.argv[1] == "predict-k":
            rows = predict_k(res, Path(sys.argv[3]), pool)
        else:
            shares = json.loads(Path(sys.argv[3]).read_text())["bench tau"]["p"]
            rows = predict_taus(res, taus_from_shares(shares), pool, spec_from=spec_from)
        print("| verifier | k | loop tau | step ms | predicted | break-even tau | bound by | vLLM tau | measured |")
        print("|" + " --- |" * 9)
        for r in rows:
            m = "-" if r["measured"] is None else f"{r['measured']:.3f}"
            t = "-" if r["vLLM tau"] is None else f"{r['vLLM tau']:.3f}"
            print(
                f"| {r['verifier']} | {r['k']} | {r['tau']:.3f} | {r['step ms']:.2f} | {r['predicted speed-up']:.3f} |"
                f" {r['break-even tau']:.2f} | {r['bound by']} | {t} | {m} |"
            )
    else:
        main()
