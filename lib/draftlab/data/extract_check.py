"""vLLM's extracted hidden states (`extract_vllm.py`) against draftlab's transformers hooks, slot by slot.

The engine that hands out the states is the one a draft is served by, so its slots are the ones to
check draftlab's extraction against: `check` gives the relative error of each slot and the verifier
layer each vLLM slot is nearest to (with the runner-up), so wrong layers, or one layer copied into
several slots, show in the engine itself. Both sides number layers the same way (extract.py), so a
match is slot for slot, with no off-by-one.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from draftlab import DraftlabError
from draftlab.data.extract import validate_layer_ids
from draftlab.data.hooks import hidden_states


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@torch.no_grad()
def check(
    verifier,
    rows: list[list[int]],
    vllm_dir,
    layer_ids,
    reference_dir=None,
    nearest_row: int = 0,
    tol: float = 1e-4,
    batch_size: int = 8,
) -> dict:
    """vLLM's files against draftlab's transformers extraction of the same rows.

    Per slot: the largest relative error ||vLLM - draftlab|| / ||draftlab|| over the rows (against `reference_dir`'s files
    when given, else a forward here), and, for row `nearest_row`, the verifier state (ids 0..L, all of them computed) each
    vLLM slot is nearest to, with the runner-up, so a slot holding another layer is named. `problems` lists each breach."""  # noqa: E501
    layer_ids = validate_layer_ids(layer_ids, verifier.num_layers)
    slots, hs_dir = [*layer_ids, verifier.num_layers], Path(vllm_dir) / "hidden_states"
    rows = [list(map(int, r)) for r in rows]
    got = [load_file(hs_dir / f"hs_{i}.safetensors") for i in range(len(rows))]
    problems = [
        f"row {i}: vLLM's file has token ids other than the row's"
        for i, g in enumerate(got)
        if g["token_ids"].tolist() != rows[i]
    ]
    if reference_dir is not None:
        ref = [
            load_file(Path(reference_dir) / "hidden_states" / f"hs_{i}.safetensors")["hidden_states"]
            for i in range(len(rows))
        ]
    else:
        ref = [
            h
            for s in range(0, len(rows), batch_size)
            for h in hidden_states(verifier, rows[s : s + batch_size], layer_ids)
        ]
    worst = [0.0] * len(slots)
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        h = g["hidden_states"]
        if tuple(h.shape) != tuple(r.shape):
            problems.append(f"row {i}: vLLM's states are {tuple(h.shape)}, draftlab's {tuple(r.shape)} (slots {slots})")
            continue
        worst = [max(w, _rel(h[:, s], r[:, s].to(h.device))) for s, w in enumerate(worst)]
    every = hidden_states(verifier, [rows[nearest_row]], list(range(verifier.num_layers)))[
        0
    ].cpu()  # [T, L+1, H]: ids 0..L
    h = got[nearest_row]["hidden_states"]
    nearest, runner_up = [], []
    for s in range(min(h.shape[1], len(slots))):
        errs = sorted((_rel(h[:, s], every[:, j]), j) for j in range(every.shape[1]))
        nearest.append({"layer": errs[0][1], "relative_error": errs[0][0]})
        runner_up.append({"layer": errs[1][1], "relative_error": errs[1][0]})
    problems += [
        f"slot {s} (id {want}): vLLM's state is nearest to id {n['layer']} (relative error {n['relative_error']:.2e})"
        for s, (want, n) in enumerate(zip(slots, nearest, strict=False))
        if n["layer"] != want
    ]
    problems += [f"slot {s} (id {slots[s]}): relative error {w:.2e} > {tol:g}" for s, w in enumerate(worst) if w > tol]
    return {
        "slots": slots,
        "rows": len(rows),
        "max_relative_error": worst,
        "nearest": nearest,
        "runner_up": runner_up,
        "nearest_row": nearest_row,
        "layers_match": [n["layer"] for n in nearest] == slots,
        "problems": problems,
    }


@torch.no_grad()
def against_verifier(verifier, sample: dict, layer_ids) -> dict:
    """A written row (`extract.load_sample`) against the verifier's own forward with `output_hidden_states`
    (entry i enters decoder layer i, the last is after the final norm): each aux slot's relative error, the final
    slot's once normed, and whether the final slot gives the verifier's own greedy tokens through its norm and
    lm_head (the targets speculators trains on). Hooks that read the wrong module would show here."""
    ids = sample["token_ids"].to(verifier.device)[None]
    out = verifier.model(ids, output_hidden_states=True)
    got, ref = sample["hidden_states"].to(verifier.device, verifier.dtype), out.hidden_states
    errors = {f"id {i}": _rel(got[:, k], ref[i][0]) for k, i in enumerate(layer_ids)}
    errors[f"id {verifier.num_layers} (final, normed)"] = _rel(verifier.norm(got[:, -1]), ref[-1][0])
    same = (verifier.lm_head(verifier.norm(got[:, -1])).argmax(-1) == out.logits[0].argmax(-1)).float().mean().item()
    tol, share = (1e-3, 1.0) if verifier.dtype == torch.float32 else (5e-2, 0.98)  # bf16: batch shapes round apart
    if max(errors.values()) > tol or same < share:
        raise DraftlabError(
            f"The written hidden states differ from the verifier's own (relative errors {errors}, tolerance {tol:g}; "
            f"greedy tokens from the final slot {same:.1%} the verifier's): the hooks read other modules than the "
            "decoder layers; report the verifier's architecture."
        )
    return {"relative error per slot": errors, "greedy tokens from the final slot equal the verifier's": same}
