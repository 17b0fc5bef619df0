"""Extraction throughput (hidden-state files written included) against a plain forward of the same verifier.

Same batches, same process, alternating order, several repeats; medians and per-repeat ratios.
    python benchmarks/bench_extract.py                       # embedded SmolLM2 on this CPU
    python benchmarks/bench_extract.py --device cuda --dtype bfloat16 --rows 256 --length 1024
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from draftlab.data.dataset import save_split
from draftlab.data.extract import default_layer_ids, extract
from draftlab.data.verifier import load_verifier


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


@torch.no_grad()
def forward_tps(v, rows, batch_size, decoder_only: bool) -> float:
    fn = v.model.get_decoder() if decoder_only else v.model
    t0 = time.perf_counter()
    for s in range(0, len(rows), batch_size):
        batch = rows[s : s + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([r + [0] * (width - len(r)) for r in batch], device=v.device)
        attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in batch], device=v.device)
        fn(input_ids=ids, attention_mask=attn, use_cache=False)
    sync(v.device)
    return sum(map(len, rows)) / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--verifier", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    v = load_verifier(args.verifier, device=args.device, dtype=args.dtype)
    g = torch.Generator().manual_seed(0)
    # Realistic spread of lengths (half to full), so padding and sorting matter as in real data.
    lengths = torch.randint(args.length // 2, args.length + 1, (args.rows,), generator=g).tolist()
    rows = [torch.randint(10, v.vocab_size, (n,), generator=g).tolist() for n in lengths]
    by_len = sorted(rows, key=len)  # extraction batches by length; the plain forward gets the same batches
    layer_ids = default_layer_ids(v.num_layers)
    res = {"plain": [], "decoder": [], "extract": []}
    with tempfile.TemporaryDirectory() as tmp:
        ds = save_split(
            {"input_ids": rows, "loss_mask": [[1] * len(r) for r in rows]}, v.tokenizer, Path(tmp) / "ds", args.length
        )
        forward_tps(v, rows[: args.batch_size], args.batch_size, False)  # warm-up
        for r in range(args.repeats):
            res["plain"].append(forward_tps(v, by_len, args.batch_size, False))
            res["decoder"].append(forward_tps(v, by_len, args.batch_size, True))
            out = Path(tmp) / f"run{r}"
            st = extract(v, ds, out, layer_ids, batch_size=args.batch_size, progress=False)
            sync(v.device)
            assert st.written == args.rows
            res["extract"].append(st.tokens_per_s)
    med = {k: statistics.median(x) for k, x in res.items()}
    ratio_plain = statistics.median(e / p for e, p in zip(res["extract"], res["plain"], strict=True))
    ratio_dec = statistics.median(e / p for e, p in zip(res["extract"], res["decoder"], strict=True))
    dev = (
        torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else f"{platform.processor() or 'cpu'} x{torch.get_num_threads()} threads"
    )
    print(
        f"\nverifier {v.path.name}, {v.dtype}, {dev}; {args.rows} rows of {args.length // 2}-{args.length} tokens, "
        f"batch {args.batch_size}, layers {layer_ids}+final, {args.repeats} repeats"
    )
    print("| measure | median tokens/s |")
    print("| --- | --- |")
    print(f"| plain forward (causal LM, logits) | {med['plain']:.0f} |")
    print(f"| plain forward (decoder only, no lm_head) | {med['decoder']:.0f} |")
    print(f"| extraction, files written | {med['extract']:.0f} |")
    print(f"| ratio extraction / plain LM forward (median of per-repeat ratios) | {ratio_plain:.2f} |")
    print(f"| ratio extraction / decoder-only forward | {ratio_dec:.2f} |")


if __name__ == "__main__":
    main()
