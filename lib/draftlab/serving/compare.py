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


def tau_rows(served: dict, loop_summary: dict) -> list[dict]:
    """draftlab's loop against vLLM, per draft, on vLLM's definitions (the bonus token counted in tau)."""
    rows = []
    for kind, run in served["runs"].items():
        if kind == "verifier alone":
            continue
        if "error" in run:
            rows.append({"proposer": kind, "vLLM": f"not served: {run['error']}"})
            continue
        loop = loop_summary[kind]["all"]
        rows.append(
            {
                "proposer": kind,
                "draftlab tau": loop["tau"],
                "vLLM tau": run["tau"],
                "relative difference": run["tau"] / loop["tau"] - 1,
                "draftlab acceptance rate": loop["acceptance_rate"],
                "vLLM acceptance rate": run["acceptance_rate"],
                "draftlab steps": loop["steps"],
                "vLLM drafts": int(run["drafts"]),
            }
        )
    return rows


def speed_rows(served: dict) -> list[dict]:
    """Wall-clock tokens/s of the same workload, the verifier alone and with each draft: the speed-up a user gets."""
    alone = served["runs"]["verifier alone"]
    rows = [
        {
            "server": "verifier alone",
            "tokens": alone["tokens"],
            "seconds": alone["wall_s"],
            "tokens/s": alone["tokens_per_s"],
            "speed-up": 1.0,
            "start-up s": alone["startup_s"],
        }
    ]
    for kind, run in served["runs"].items():
        if kind != "verifier alone" and "error" not in run:
            rows.append(
                {
                    "server": f"with {kind}",
                    "tokens": run["tokens"],
                    "seconds": run["wall_s"],
                    "tokens/s": run["tokens_per_s"],
                    "speed-up": run["tokens_per_s"] / alone["tokens_per_s"],
                    "start-up s": run["startup_s"],
                }
            )
    return rows


def greedy_rows(verifier, prompts: list[dict], refs: list[list[int]], served: dict, loop_runs: dict) -> list[dict]:
    """Greedy outputs over all prompts: identical token for token, or (bf16 only) a near-tie at the first
    divergence (`accept_eval.greedy_agreement`), or different."""
    from draftlab.acceptance.evaluate import greedy_agreement

    exact = verifier.dtype.itemsize >= 4
    alone = [o["token_ids"] for o in served["runs"]["verifier alone"]["outputs"]]
    pairs = {"vLLM alone vs transformers greedy": (alone, refs)}
    for kind, run in served["runs"].items():
        if kind != "verifier alone" and "error" not in run:
            pairs[f"vLLM + {kind} vs vLLM alone"] = ([o["token_ids"] for o in run["outputs"]], alone)
    for name, gens in loop_runs.items():
        pairs[f"draftlab loop ({name}) vs transformers greedy"] = ([g.tokens for g in gens], refs)
    rows = []
    for name, (got, want) in pairs.items():
        same = sum(g == w for g, w in zip(got, want, strict=True))
        ties = (
            0
            if exact
            else sum(
                g != w and greedy_agreement(verifier, p["ids"], g, w)["lossless"]
                for p, g, w in zip(prompts, got, want, strict=True)
            )
        )
        rows.append(
            {
                "comparison": name,
                "prompts": len(want),
                "identical": same,
                "near-tie (bf16)": ties,
                "different": len(want) - same - ties,
            }
        )
    return rows


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
        "aux layers (vLLM log / checkpoint)": f"{run['aux_layers_logged']} / {run['aux_layers_checkpoint']}",
        "draft vocabulary size": run["draft_vocab_size"],
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
