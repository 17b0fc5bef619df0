"""Response generation throughput of the embedded verifier on this machine: what stage 01 pays per
token of training text, by batch size and torch thread count (BENCHMARKS.md, "Generation").

Greedy `generate` of `--new` tokens for the first train prompts of the default prompt set, batched
as stage 01 batches them (left-padded chat-template prompts). Prints one markdown row per setting.

    python benchmarks/bench_generate.py --batch 60 120 --threads 2 1
    python benchmarks/bench_generate.py --batch 60 --threads 2 --attention sdpa sdpa_gqa   # draftlab/gqa.py
    python3 benchmarks/bench_generate.py --device cuda --batch 768 2304 --threads 16 --new 256 --sample 0.8 --prompts 740 164
        # the H200 after the gpu profile's 01: one sampled pass (768 train prompts) against the three merged;
        # prompts repeat to fill a batch larger than the prompt set

`--attention` compares transformers' sdpa (key/value heads copied per query head under a mask) with
draftlab's `sdpa_gqa` (heads handed grouped to the kernel), alternating in one process, and checks the
tokens are the same.

`--engines` measures stage 01's own path instead (`draftlab.generate.generate_responses`, a fresh
responses file per engine), side by side in one run, on the first `--prompts N` prompts of a profile's
prompt set (all splits), at the profile's gen_batch_size (hf: rows per batch; vllm: requests in flight):

    python benchmarks/bench_generate.py --engines hf:float32 vllm:float32 vllm:bfloat16 --prompts 240 --max-new-tokens 96
    python3 benchmarks/bench_generate.py --profile gpu --device cuda --verifier-dtype bfloat16 --engines hf:bfloat16 \
        vllm:bfloat16 --prompts 1024 --max-new-tokens 256      # the H200 (benchmarks/gpu_pipeline.sh h200)

One row per engine: new tokens, generation seconds (the vLLM server's start-up apart), tokens/s, how
many answers are the same text as the first engine's, and how on-policy the text is for the fp32
verifier that writes the hidden states: the share of answer tokens (as stage 01 tokenises them for
training) that are its own greedy choice, teacher-forced.
"""  # noqa: E501

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--batch", type=int, nargs="+", help="batch sizes (default 60 120; with --engines the profile's gen_batch_size)"
    )
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--new", "--max-new-tokens", type=int, default=96, help="new tokens per prompt")
    ap.add_argument(
        "--attention", nargs="+", default=[None], help="attention implementations to compare (default: as loaded)"
    )
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--device", default="auto")
    ap.add_argument(
        "--sample", type=float, default=0.0, help="sampling temperature (stage 01's extra answers); 0: greedy"
    )
    ap.add_argument(
        "--prompts",
        type=int,
        nargs="+",
        default=[200, 0],
        metavar="N",
        help="prompt set: n_chat n_code; with --engines one number, the first N prompts of --profile's set",
    )
    ap.add_argument(
        "--engines", nargs="+", metavar="ENGINE:DTYPE", help="stage 01's path per engine, e.g. hf:float32 vllm:bfloat16"
    )
    ap.add_argument("--profile", default="default", help="with --engines: whose prompts and gen_batch_size")
    ap.add_argument(
        "--verifier-dtype",
        default="float32",
        help="with --engines: the dtype of the verifier whose greedy choice the answers are checked against "
        "(the one that writes the hidden states: float32 on CPU, bfloat16 on the GPU profile)",
    )
    ap.add_argument("--json", default=None, help="with --engines or --against: write the rows here too")
    ap.add_argument(
        "--against",
        default=None,
        metavar="DATASET",
        help="transformers on the first --prompts greedy prompts a stage-01 dataset's engine answered, against those "
        "answers and that run's own figures (outputs/<run>/01/summary.json; --run-name, default the profile)",
    )
    ap.add_argument("--run-name", default=None)
    args = ap.parse_args()
    if args.against:
        return against_stage01(args)
    if args.engines:
        return compare_engines(args)
    args.batch = args.batch or [60, 120]

    from draftlab.data import prompts
    from draftlab.data.generate import _chat_ids
    from draftlab.data.verifier import load_verifier

    v = load_verifier("smollm2", device=args.device)
    tok = v.tokenizer
    train = [p for p in prompts.load_prompts(*args.prompts[:2], 0.15) if p.split == "train"]
    seqs = [_chat_ids(tok, p) for p in train]
    seqs = [seqs[i % len(seqs)] for i in range(max(max(args.batch), len(seqs)))]
    print(
        "| torch threads | attention | batch | prompt tokens (mean / max) | "
        "wall (s) | ms per decode step | generated tokens / s | row-steps / s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    first: dict = {}
    for threads, b, _, impl in itertools.product(args.threads, args.batch, range(args.repeats), args.attention):
        torch.set_num_threads(threads)
        if impl:
            v.model.set_attn_implementation(impl)
        batch = seqs[:b]
        padded = tok.pad({"input_ids": batch}, padding_side="left", return_tensors="pt").to(
            v.device
        )  # as generate_hf.hf_answers
        width = padded["input_ids"].shape[1]
        sample = (
            dict(do_sample=True, temperature=args.sample, top_p=None, top_k=None)
            if args.sample
            else dict(do_sample=False)
        )
        torch.manual_seed(0)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = v.model.generate(**padded, max_new_tokens=args.new, pad_token_id=tok.pad_token_id, **sample)[
                :, width:
            ]
        if v.device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        if not args.sample and not torch.equal(first.setdefault((threads, b), out), out):
            print(f"attention {impl} generated other tokens than {args.attention[0]} at batch {b}")
        real = int((out != tok.pad_token_id).sum())
        mean = sum(map(len, batch)) / len(batch)
        print(
            f"| {threads} | {v.model.config._attn_implementation} | {len(batch)} | {mean:.0f} / {width} | {wall:.1f} | "
            f"{wall / out.shape[1] * 1000:.0f} | {real / wall:.0f} | {len(batch) * out.shape[1] / wall:.0f} |",
            flush=True,
        )


def compare_engines(args) -> None:
    from draftlab import config
    from draftlab.data import prompts
    from draftlab.data.generate import Engine, generate_responses
    from draftlab.data.verifier import load_verifier

    prof = config.load_profile(args.profile)
    v = load_verifier(prof["verifier"], device=args.device, dtype=args.verifier_dtype)
    ps = prompts.load_prompts(
        prof["n_chat"],
        prof["n_code"],
        prof["eval_fraction"],
        prof["n_sharegpt"],
        prof["bench_fraction"],
        prof["max_prompt_chars"],
        sharegpt_turns=prof["sharegpt_turns"],
    )[: args.prompts[0]]
    batch = args.batch[0] if args.batch else prof["gen_batch_size"]
    print(
        f"{len(ps)} prompts of the {args.profile} profile, {args.new} new tokens, "
        f"{'T=' + str(args.sample) if args.sample else 'greedy'}, "
        f"batch / requests in flight {batch}, torch threads {torch.get_num_threads()}"
    )
    print(
        "| engine | answers dtype | new tokens | generation (s) | tokens "
        "/ s | server start-up (s) | answers identical to the first row | "
        f"answer tokens = {args.verifier_dtype} verifier's greedy choice |"
    )
    found = []
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    first = None
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        for spec in args.engines:
            name, _, dtype = spec.partition(":")
            with Engine(v, name, dtype or "auto", log_path=Path(tmp) / f"{name}-{dtype}.log") as eng:
                got = generate_responses(
                    v, ps, Path(tmp) / f"{name}-{dtype}.jsonl", args.new, args.sample, batch, engine=eng
                )
            s = eng.summary()
            first = first or got
            same = sum(got[p.id] == first[p.id] for p in ps)
            share = on_policy(v, ps, got)
            found.append({**s, "identical to the first row": same, "prompts": len(ps), "on-policy share": share})
            print(
                f"| {s['engine']} | {s['answers dtype']} | {s['new tokens']} "
                f"| {s['generation s']:.1f} | {s['tokens/s']:.0f} | "
                f"{s['server start-up s']:.1f} | {same}/{len(ps)} | {share:.2%} |",
                flush=True,
            )
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"batch": batch, "new tokens": args.new, "rows": found}, indent=1))


def against_stage01(args) -> None:
    """Stage 01's own engine (vLLM on the GPU profile) against transformers on the same prompts: its answers and
    generation figures as notebook 01 wrote them, transformers' answers written here in the same dtype and batch.
    The two tokens/s figures are of different prompt counts (01's every answer, sampled ones included, and the
    first N greedy prompts here), each at the same batch / requests in flight."""
    import json

    from draftlab import config
    from draftlab.data.generate import Engine, generate_responses
    from draftlab.data.prompts import Prompt
    from draftlab.data.verifier import load_verifier
    from draftlab.layout import RunLayout

    prof = config.load_profile(args.profile)
    lay = RunLayout(args.against, args.run_name or args.profile)
    lines = [json.loads(ln) for ln in lay.responses.read_text().splitlines() if ln.strip()]
    greedy = [ln for ln in lines if ln["settings"]["temperature"] == 0.0][: args.prompts[0]]
    ps = [Prompt(**ln["prompt"]) for ln in greedy]
    theirs, how = {ln["id"]: ln["response"] for ln in greedy}, greedy[0]["settings"]
    stage01 = json.loads((lay.stage("01") / "summary.json").read_text())["generation"]
    v = load_verifier(prof["verifier"], device=args.device, dtype=args.verifier_dtype)
    batch = args.batch[0] if args.batch else prof["gen_batch_size"]
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        with Engine(v, "hf", how["gen_dtype"]) as eng:
            mine = generate_responses(v, ps, Path(tmp) / "hf.jsonl", how["max_new_tokens"], 0.0, batch, engine=eng)
    hf = eng.summary()
    same = sum(mine[p.id] == theirs[p.id] for p in ps)
    rows = [
        {**stage01, "prompts": f"stage 01: {stage01['prompts generated']} answers", "identical": "-"},
        {**hf, "prompts": f"first {len(ps)} greedy prompts", "identical": f"{same}/{len(ps)} to stage 01's"},
    ]
    rows[0]["on-policy share"] = on_policy(v, ps, theirs)
    rows[1]["on-policy share"] = on_policy(v, ps, mine)
    print(f"{len(ps)} greedy prompts of {args.against}, {how['max_new_tokens']} new tokens, batch / in flight {batch}")
    print(
        "| engine | answers dtype | prompts | new tokens | generation (s) | tokens/s | server start-up (s) | "
        f"answers identical | answer tokens = {args.verifier_dtype} verifier's greedy choice (these {len(ps)}) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        cells = [r["engine"], r["answers dtype"], r["prompts"], r["new tokens"], r["generation s"], r["tokens/s"]]
        cells += [r["server start-up s"], r["identical"], f"{r['on-policy share']:.2%}"]
        print("| " + " | ".join(map(str, cells)) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"batch": batch, "rows": rows}, indent=1, default=str))


@torch.no_grad()
def on_policy(v, ps, answers: dict[str, str]) -> float:
    """Share of the answers' tokens (as stage 01 tokenises them for training, the template's end of turn left out) that are
    the verifier's argmax in context, teacher-forced."""  # noqa: E501
    from draftlab.data.dataset import tokenize_conversation

    hit = total = 0
    for p in ps:
        ids, mask = tokenize_conversation(v.tokenizer, p, answers[p.id])
        closing = sum(tokenize_conversation(v.tokenizer, p, "")[1])  # the template's end of turn: not the answer's text
        x = torch.tensor([ids], device=v.device)
        pred = v.model(input_ids=x).logits[0, :-1].argmax(-1)
        sup = torch.tensor(mask[1:], device=v.device).bool()
        sup[len(sup) - closing :] = False
        hit += int((pred == x[0, 1:])[sup].sum())
        total += int(sup.sum())
    return hit / total


if __name__ == "__main__":
    main()
