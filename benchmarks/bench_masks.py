"""Time to build the training masks, and to render a token-level heatmap.

DFlash: 8192-token pack, 512 anchors, block 16. EAGLE-3: 8192 tokens, 3 TTT steps (base mask plus
two extensions, as training builds them). Each with torch's create_block_mask eager and compiled
(speculators compiles it for DFlash). Medians over repeats, after warm-up (compilation excluded).
    python benchmarks/bench_masks.py                 # this CPU
    python benchmarks/bench_masks.py --device cuda   # the H200
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask  # noqa: E402

from draftlab.masks.common import document_lengths, synthetic_pack  # noqa: E402
from draftlab.masks.dflash import dflash_block_mask  # noqa: E402
from draftlab.masks.eagle3 import eagle3_block_mask, eagle3_mask  # noqa: E402
from draftlab.masks.plots import mask_heatmap  # noqa: E402


def timed(fn, device, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()

    pack = synthetic_pack(document_lengths(args.seq_len, 12, fill=0.97), args.seq_len)
    doc, loss = pack["document_ids"][0].to(args.device), pack["loss_mask"][0].to(args.device)
    rows = []
    cases = {
        f"DFlash block mask ({args.seq_len} tokens, {args.anchors} anchors, block {args.block_size})": lambda b: (
            dflash_block_mask(doc, loss, args.anchors, args.block_size, device=args.device, builder=b)
        ),
        f"EAGLE-3 TTT masks ({args.seq_len} tokens, {args.ttt_steps} steps)": lambda b: eagle3_block_mask(
            doc, args.ttt_steps - 1, device=args.device, builder=b
        ),
    }
    for label, builder in (("eager", create_block_mask), ("compiled", torch.compile(create_block_mask))):
        for name, build in cases.items():
            try:
                rows.append((f"{name}, {label}", f"{timed(lambda: build(builder), args.device, args.repeats):.1f}"))  # noqa: B023 (called at once)
            except Exception as e:  # noqa: BLE001 (a builder that fails here is a result too)
                rows.append((f"{name}, {label}", f"fails: {type(e).__name__}"))

    def render(view, max_cells=(1024, 2048)):
        fig, ax = plt.subplots(figsize=(7, 5))
        mask_heatmap(view, ax, max_cells=max_cells)
        fig.canvas.draw()
        plt.close(fig)

    small = eagle3_mask(synthetic_pack(document_lengths(1024, 5), 1024)["document_ids"], 0)
    rows.append(
        ("token-level heatmap 1024 x 1024, rendered (CPU)", f"{timed(lambda: render(small), 'cpu', 5, warmup=1):.1f}")
    )
    # A training-size mask, drawn as notebook 02 draws it (averaged over screen cells) and token by token.
    large = eagle3_mask(doc.cpu(), args.ttt_steps - 1)
    name = (
        f"token-level heatmap {large.q_len} x {large.kv_len} (EAGLE-3, TTT step {args.ttt_steps - 1}), rendered (CPU)"
    )
    rows.append((f"{name}, screen cells", f"{timed(lambda: render(large), 'cpu', 3, warmup=1):.1f}"))
    rows.append((f"{name}, every token", f"{timed(lambda: render(large, None), 'cpu', 3, warmup=1):.1f}"))
    dev = (
        torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    )
    print(f"\n{dev}, torch {torch.__version__}")
    print("| measure | median ms |")
    print("| --- | --- |")
    for name, ms in rows:
        print(f"| {name} | {ms} |")


if __name__ == "__main__":
    main()
