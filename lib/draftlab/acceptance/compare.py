"""vLLM's served figures beside draftlab's loop: the tables of notebook 05 and the checks behind a gap.

Per draft: tau and acceptance rate both ways, the wall-clock speed-up over the verifier served
alone, whether the greedy outputs agree token for token, and, where the two taus differ by more
than GAP_WARN, the checks that can explain it (chat template, aux layers, vocabulary, dtype),
raised as a ServedGapWarning.
"""

from __future__ import annotations

GAP_WARN = 0.10  # relative tau difference past which the served and the loop figures need explaining


class ServedGapWarning(UserWarning):
    """vLLM's tau and draftlab's differ by more than GAP_WARN for one checkpoint."""


def first_difference(a: list[int], b: list[int]) -> int | None:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return n if n is not None or len(a) == len(b) else min(len(a), len(b))


def tau_rows(served: dict, loop_estimates: dict) -> list[dict]:
    """draftlab's loop against vLLM, per draft, on vLLM's definitions (the bonus token counted in tau; steps with a
    proposal only): `loop_estimates` are `intervals.estimate`s of the loop's steps on that rule (`served.report`)."""
    from draftlab.acceptance.intervals import POOLED

    rows = []
    for kind, run in served["runs"].items():
        if kind == "verifier alone":
            continue
        if "error" in run:
            rows.append({"proposer": kind, "vLLM": f"not served: {run['error']}"})
            continue
        loop = loop_estimates[kind]
        tau = loop["tau"][POOLED]["value"]
        rows.append(
            {
                "proposer": kind,
                "draftlab tau": tau,
                "vLLM tau": run["tau"],
                "relative difference": run["tau"] / tau - 1,
                "draftlab acceptance rate": loop["acceptance_rate"][POOLED]["value"],
                "vLLM acceptance rate": run["acceptance_rate"],
                "draftlab steps": loop["n_steps"],
                "vLLM drafts": int(run["drafts"]),
            }
        )
    return rows


def speed_rows(served: dict) -> list[dict]:
    """Wall-clock tokens/s of the same workload, the verifier alone and with each draft, at each number of requests in
    flight: the speed-up a user of the checkpoint gets from this engine on this hardware, and where it stops paying."""
    alone = served["runs"]["verifier alone"]
    rows = []
    for i, base in enumerate(alone["levels"]):
        for kind, run in served["runs"].items():
            if "error" in run:
                continue
            w = run["levels"][i]
            n = w["counts"]["drafts"]
            rows.append(
                {
                    "requests in flight": base["concurrency"],
                    "server": kind if kind == "verifier alone" else f"with {kind}",
                    "prompts": w["prompts"],
                    "tokens": w["tokens"],
                    "seconds": w["wall_s"],
                    "tokens/s": w["tokens_per_s"],
                    "speed-up": w["tokens_per_s"] / base["tokens_per_s"],
                    "vLLM tau": 1 + w["counts"]["accepted"] / n if n else None,
                    "start-up s": run["startup_s"],
                }
            )
    return rows


def greedy_rows(verifier, max_new_tokens: int, served: dict) -> list[dict]:
    """Greedy outputs over all prompts: vLLM alone against the verifier's own greedy text (every token its argmax in
    one full forward, `lossless.greedy_check`), and vLLM with each draft against vLLM alone, token for token; in
    bf16 a divergence at a near-tie is counted apart. (The loop's outputs are checked the same way in the lossless
    table of notebook 05.)"""
    from draftlab.acceptance.lossless import greedy_agreement, greedy_check

    exact = verifier.dtype.itemsize >= 4
    base = served["runs"]["verifier alone"]
    ids, alone = base["vllm_prompt_ids"], [o["token_ids"] for o in base["outputs"]]
    found = [greedy_check(verifier, p, out, max_new_tokens) for p, out in zip(ids, alone, strict=True)]
    same = sum(c["divergences"] == 0 and c["lossless"] for c in found)
    ties = sum(c["lossless"] for c in found) - same
    rows = [_row("vLLM alone vs the verifier's greedy text (one full forward)", len(found), same, ties)]
    for kind, run in served["runs"].items():
        if kind == "verifier alone" or "error" in run:
            continue
        got = [o["token_ids"] for o in run["outputs"]]
        same = sum(g == w for g, w in zip(got, alone, strict=True))
        ties = (
            0
            if exact
            else sum(
                g != w and greedy_agreement(verifier, p, g, w)["lossless"]
                for p, g, w in zip(ids, got, alone, strict=True)
            )
        )
        rows.append(_row(f"vLLM + {kind} vs vLLM alone", len(got), same, ties))
    return rows


def _row(name: str, prompts: int, same: int, ties: int) -> dict:
    return {
        "comparison": name,
        "prompts": prompts,
        "identical": same,
        "near-tie (bf16)": ties,
        "different": prompts - same - ties,
    }


def checks(verifier, prompts: list[dict], served: dict, kind: str) -> dict:
    """What can make vLLM's acceptance differ from draftlab's, for one served draft, each run and shown."""
    run = served["runs"][kind]
    vllm_ids = served["runs"]["verifier alone"]["vllm_prompt_ids"]
    diffs = [(p["id"], first_difference(p["ids"], v)) for p, v in zip(prompts, vllm_ids, strict=True)]
    differing = [(pid, n) for pid, n in diffs if n is not None]
    return {
        "chat template (HF apply_chat_template vs vLLM /tokenize)": "same tokens on every prompt"
        if not differing
        else f"{len(differing)}/{len(prompts)} prompts differ, first at token {differing[0][1]} of {differing[0][0]}",
        "aux layers (vLLM log / checkpoint)": f"{run['aux_layers_logged']} / {run['aux_layers_checkpoint']}"
        if run["draft_model"]
        else "none (no draft model)",
        "draft vocabulary size": run["draft_vocab_size"] if run["draft_model"] else "none (no draft model)",
        "dtype (vLLM / draftlab)": f"{served['dtype']} / {str(verifier.dtype).removeprefix('torch.')}",
    }


def warn_on_gaps(verifier, prompts, served: dict, rows: list[dict]) -> list[str]:
    """A ServedGapWarning, with the checks, for each draft whose two taus differ by more than GAP_WARN."""
    import warnings

    flagged = []
    for r in rows:
        if "vLLM tau" in r and abs(r["relative difference"]) > GAP_WARN:
            found = checks(verifier, prompts, served, r["proposer"])
            warnings.warn(
                ServedGapWarning(
                    f"{r['proposer']}: vLLM tau {r['vLLM tau']:.3f} vs draftlab {r['draftlab tau']:.3f} "
                    f"({r['relative difference']:+.0%}); checks: {found}"
                ),
                stacklevel=2,
            )
            flagged.append(r["proposer"])
    return flagged


def command_text(verifier, kind: str, path, served_run: dict, k: int, dtype: str, max_len: int) -> str:
    """The `vllm serve` command notebook 05 ran for draft `kind` (or would run, where vLLM did not), to serve it by
    hand; for a family vLLM does not serve, why not, in vLLM's words (`families.Family.vllm_refused`)."""
    import shlex

    from draftlab import DraftlabError
    from draftlab.serving.command import serve_command

    ran = (served_run or {}).get("runs", {}).get(kind, {}).get("command")
    if ran:
        return shlex.join(ran)
    try:
        return shlex.join(serve_command(verifier.path, path, k, dtype, str(verifier.device), max_len))
    except DraftlabError as e:
        return f"not served: {e}"
