"""Every draft family and the n-gram baseline side by side (issue 32): one row per proposer with what a researcher
choosing a family weighs, measured on the same bench prompts and k, trained on the same stage-01 data for the same
steps: tau in draftlab's loop and in vLLM (each with its interval), acceptance per position, tokens/s served and
the speed-up over the verifier alone at the first level of requests in flight, trainable parameters, and stage 04's
training tokens/s and seconds. A family a stage could not take is a row that says why."""

from __future__ import annotations

from draftlab.acceptance.intervals import POOLED
from draftlab.acceptance.reported import ci
from draftlab.families import FAMILIES


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def served_tau(name: str, vllm: dict, runs: dict) -> str:
    """vLLM's tau with its interval, or why there is none: the family's refusal in vLLM's words, the server's
    error, or '-' (vLLM not run). vLLM counts only steps with a proposal: for the n-gram, which has none where its
    context has no match, the loop's figure on that rule stands beside it (the loop's own column counts every step)."""
    fam = FAMILIES.get(name)
    if fam is not None and not fam.vllm:
        return f"not served: {fam.vllm_refused}"
    if "error" in runs.get(name, {}):
        return f"not served: {runs[name]['error']}"
    row = vllm.get(name, {})
    got = row.get("vLLM tau (95%)") or (f"{row['vLLM tau']:.3f}" if row.get("vLLM tau") is not None else "-")
    if got != "-" and not runs[name]["draft_model"]:  # the n-gram
        got += f" (steps with a proposal; the loop on that rule: {row.get('draftlab tau (95%)')})"
    return got


def family_rows(
    estimates: dict, drafts: dict, served_report: dict, trained: dict | None, refused: dict, served_run: dict
) -> list[dict]:
    """`estimates`: the loop's `reported.headline` estimates per proposer; `drafts`: the loaded drafts; `trained`: 04's
    summary.json ({family: its row}, None where 04 has none); `refused`: {family: why a stage refused it}."""
    vllm = {r["proposer"]: r for r in served_report.get("tau", [])}
    first = {}
    for r in served_report.get("speed", []):
        first.setdefault(r["server"].removeprefix("with "), r)  # the first level of requests in flight
    runs = served_run.get("runs", {}) if served_run else {}
    rows = []
    for name, e in estimates.items():
        kind = name if name in drafts else None
        row = {"proposer": name, "tau, draftlab loop (95%)": ci(e["tau"][POOLED])}
        row["tau, vLLM (95%)"] = served_tau(name, vllm, runs)
        row.update({f"p_{i}": round(e[f"p_{i}"][POOLED]["value"], 3) for i in range(1, e["k"] + 1)})
        speed = first.get(name)
        row["served tokens/s"] = round(speed["tokens/s"], 1) if speed else None
        row["speed-up"] = round(speed["speed-up"], 3) if speed else None
        row["trainable parameters"] = trainable(drafts[kind].model) if kind else 0
        t = (trained or {}).get(kind, {}) if kind else {}
        row["train tokens/s"] = t.get("train tokens/s (whole run)")
        row["train seconds"] = t.get("wall seconds")
        rows.append(row)
    rows += [{"proposer": kind, "tau, draftlab loop (95%)": f"refused: {why}"} for kind, why in refused.items()]
    return rows
