"""Live acceptance replayed from one teacher-forced pass, and the teacher-forced gap taken apart.

Held-out accuracy (speculators' `full_acc_0`, read at every stage-04 evaluation) can stand well above the
first-position acceptance a chain meets live (BENCHMARKS.md, "Teacher-forced accuracy against live acceptance"),
and a researcher cannot tell from the two numbers whether the draft, the text or the counting is to blame. Three
things differ between them, and this module measures each:

1. the text: stage 01's eval answers (sampled) against the verifier's own greedy continuation of the prompt;
2. the target: speculators scores the draft against the verifier's argmax *within the draft vocabulary*, live
   acceptance needs the verifier's argmax over the whole vocabulary (`d2t` maps the draft's pick into it);
3. the positions: a teacher-forced metric counts every position of the text once; a live chain starts only where
   the last step ended, and hard places, where chains break, start more chains than easy ones.

On the greedy text itself (the loop's output, `Generation.tokens`) one verifier forward and one EAGLE-3 TTT
forward give, for every chain start p and depth j, whether the draft's j-th token is the verifier's next one
(`chain_hits`). Counted over every position that gives (1) and (2) on the live text; walked as the loop walks,
each chain starting where the last one's accepted prefix and bonus token end (`replay`), it must give the loop's
own accepted lengths step for step: a check of the cached drafting (`Eagle3Proposer`) against speculators'
training forward at every step a user measured, and (3) as the difference between the two.
"""

from __future__ import annotations

import torch

from draftlab import DraftlabError
from draftlab.acceptance.evaluate import tau_from_alpha
from draftlab.acceptance.speculative import Step, metrics


@torch.no_grad()
def chain_hits(draft, prompt_ids: list[int], tokens: list[int], k: int) -> tuple[torch.Tensor, dict]:
    """[k, T] bool, T = len(prompt + tokens): hits[j, p] is True where the chain that pairs token p+1 with the
    verifier's aux states of position p (`shift_batch`'s alignment, the loop's chain after committing token p+1)
    drafts at depth j the token p+j+2 of the text. Depths past the text's end are False (`known` says where).
    With it, speculators' own metric sums over the generated part (cond_acc_j: targets the verifier's argmax
    within the draft vocabulary)."""
    from draftlab.data.hooks import hidden_states

    if draft.kind != "eagle3":
        raise DraftlabError(f"the replay reads EAGLE-3's TTT forward; {draft.kind} drafts another way.")
    seq = [*prompt_ids, *tokens]
    n = len(seq) - 1
    h = hidden_states(draft.verifier, [seq], list(draft.model.target_layer_ids))[0]  # [T, aux + 1, H]
    device = draft.device
    batch = {
        "input_ids": torch.tensor([seq[1:]]),
        "hidden_states": h[:-1, :-1].flatten(1)[None],
        "verifier_last_hidden_states": h[1:, -1][None],
        # the chains over the generated text whose targets lie in it (`known`): the last row's is past its end
        "loss_mask": ((torch.arange(n) >= len(prompt_ids) - 1) & (torch.arange(n) < n - 1))[None].float(),
        "document_ids": torch.zeros(1, n, dtype=torch.long),
        "position_ids": torch.arange(1, n + 1)[None],
    }
    steps, _, metric_sums = draft.forward(batch, cast=True, ttt_steps=k)  # every float in the draft's dtype
    d2t = draft.model.d2t.to(device) if draft.model.d2t is not None else None
    ids = torch.tensor(seq, device=device)
    hits = torch.zeros(k, len(seq), dtype=torch.bool, device=device)
    for j, drafted in enumerate(steps):
        d = drafted[0, :n]
        d = d + d2t[d] if d2t is not None else d
        m = n - j - 1  # chain starts p whose depth-j target p+j+2 lies in the text
        hits[j, :m] = d[:m] == ids[j + 2 : j + 2 + m]
    return hits.cpu(), {key: float(v) for key, v in metric_sums.items()}


def known(total: int, k: int) -> torch.Tensor:
    """[k, total] bool over the prompt and generated tokens: where `chain_hits` could look (a target in the text)."""
    j, p = torch.arange(k)[:, None], torch.arange(total)[None]
    return p + j + 2 < total


def replay(hits: torch.Tensor, n_prompt: int, tokens: list[int], k: int, max_new_tokens: int) -> list[Step]:
    """The loop's steps (drafted, accepted, bonus: the text's next token) walked as `speculative_generate` walks
    (greedy): after the prefill token the first chain starts at p = n_prompt - 1; each step drafts min(k, room)
    tokens, accepts the run of hits, and the next chain starts a + 1 further on. Stops where a check would fall
    past the text. The rejected draft token is not known here (`Step.rejected` None)."""
    out, emitted, p = [], 1, n_prompt - 1
    while emitted < min(max_new_tokens, len(tokens)):
        room = min(k, max_new_tokens - emitted - 1)
        a = int(hits[:room, p].int().cumprod(0).sum())
        if a < room and p + a + 2 >= hits.shape[1] or emitted + a >= len(tokens):
            break  # the draft token it rejects, or the bonus token, would lie past the text: unknown
        out.append(Step(room, a, tokens[emitted + a]))
        emitted, p = emitted + a + 1, p + a + 1
    return out


def text_counts(hits: torch.Tensor, first: int) -> tuple[list[int], list[int]]:
    """Per depth j, over every chain start p >= first where depth j is known: (hits at 0..j, hits at 0..j-1).
    Their ratio is the teacher-forced conditional acceptance alpha_j, pooled as counts over prompts."""
    k, total = hits.shape
    ok = known(total, k)
    ok[:, :first] = False
    run = hits.int().cumprod(0).bool()
    reached = torch.cat([torch.ones(1, total, dtype=torch.bool), run[:-1]])
    return [int((run[j] & ok[j]).sum()) for j in range(k)], [int((reached[j] & ok[j]).sum()) for j in range(k)]


def gap_rows(draft, gens, k: int, max_new_tokens: int, offline: list[float] | None = None) -> list[dict]:
    """One row per way of counting, from stage 01's eval answers to the live chain: first-position acceptance and
    tau at k. The replay must equal the loop at every step it can see (its row says at how many it does)."""
    hit, reach, replayed, live, same, sums = [0] * k, [0] * k, [], [], 0, {}
    for g in gens:
        hits, m = chain_hits(draft, g.prompt_ids, g.tokens, k)
        sums = {key: sums.get(key, 0.0) + v for key, v in m.items()}
        h, r = text_counts(hits, len(g.prompt_ids) - 1)
        hit, reach = [a + b for a, b in zip(hit, h, strict=True)], [a + b for a, b in zip(reach, r, strict=True)]
        got = replay(hits, len(g.prompt_ids), g.tokens, k, max_new_tokens)
        same += sum(i < len(g.steps) and seen(g.steps[i]) == seen(s) for i, s in enumerate(got))  # paths part at a miss
        replayed += got
        live += g.steps
    alpha = [a / max(b, 1) for a, b in zip(hit, reach, strict=True)]
    rows = [_alpha_row("teacher-forced, stage 01's eval answers (speculators' metric)", offline, k)] if offline else []
    vocab = [sums[f"cond_acc_{j}_sum"] / max(sums[f"cond_acc_{j}_total"], 1.0) for j in range(k)]
    rows.append(_alpha_row("teacher-forced, the live greedy text, every position (speculators' metric)", vocab, k))
    whole = "teacher-forced, the same positions, against the verifier's argmax over its whole vocabulary (as live)"
    rows.append(_alpha_row(whole, alpha, k))
    rows.append(_steps_row("replayed at the live chain's steps", replayed, k, f"{same} of {len(replayed)}"))
    rows.append(_steps_row("live (draftlab's loop)", live, k, "-"))
    return rows


# `gap_rows`' labels, in the order the gap is taken apart
HELD_OUT, LIVE_TEXT, WHOLE_VOCAB = "stage 01's eval answers", "the live greedy text, every position", "whole vocabulary"
REPLAYED, LIVE = "replayed at the live chain's steps", "live (draftlab's loop)"


def gap_parts(rows: list[dict], held_out: float | None = None) -> dict[str, float | None]:
    """First-position acceptance lost between the held-out metric and the live chain, by part (`gap_rows`' rows):
    the bench text (held-out answers against the live text, teacher-forced), the draft vocabulary (speculators'
    metric against the verifier's argmax over its whole vocabulary), where chains start (every position against the
    replayed chain's starts), and what the replay misses of the loop. `held_out` stands in for a table without the
    held-out row (a draft brought back without its eval states: 04's own figure). None where a row is missing."""

    def first(label: str) -> float | None:
        return next((r["first position"] for r in rows if label in r["counted"]), None)

    top = first(HELD_OUT)
    steps = [held_out if top is None else top, first(LIVE_TEXT), first(WHOLE_VOCAB), first(REPLAYED), first(LIVE)]
    names = ["the bench text", "the draft vocabulary", "where chains start", "replay against the loop"]
    return {
        name: None if a is None or b is None else round(b - a, 4)
        for name, a, b in zip(names, steps, steps[1:], strict=False)
    }


def _alpha_row(what: str, alpha: list[float], k: int) -> dict:
    return {
        "counted": what,
        "first position": round(alpha[0], 4),
        f"tau at k {k}": round(tau_from_alpha(alpha, k), 3),
        "steps equal to the loop": "-",
    }


def seen(step: Step) -> tuple[int, int, int]:
    """What the replay knows of a step: drafted, accepted and the bonus token."""
    return step.drafted, step.accepted, step.bonus


def _steps_row(what: str, steps: list[Step], k: int, same: str) -> dict:
    m = metrics(steps, k) if steps else {"alpha_n": [None], "tau": None}  # the loop's own definitions
    return {
        "counted": what,
        "first position": None if m["alpha_n"][0] is None else round(m["alpha_n"][0], 4),
        f"tau at k {k}": None if m["tau"] is None else round(m["tau"], 3),
        "steps equal to the loop": same,
    }


def tau_by_k(draft, gens, ks, max_new_tokens: int) -> dict[int, float]:
    """Pooled tau at every chain length in `ks` from one TTT pass over each greedy output (`chain_hits` at the
    longest k, `replay` at each): greedy verification emits the verifier's own text at any k, so one pass gives
    what the loop would measure at each k (the replay equals the loop step for step, `gap_rows`), without decoding
    the prompts again per k."""
    top, steps = max(ks), {k: [] for k in ks}
    for g in gens:
        hits, _ = chain_hits(draft, g.prompt_ids, g.tokens, top)
        for k in ks:
            steps[k] += replay(hits, len(g.prompt_ids), g.tokens, k, max_new_tokens)
    return {k: sum(s.accepted + 1 for s in st) / max(len(st), 1) for k, st in steps.items()}
