"""Acceptance over a prompt set: held-out prompts from stage 01, runs, metrics per set, the offline estimate.

Online numbers come from `accept.speculative_generate`; the offline estimate is the teacher-forced
acceptance speculators measures in training (`cond_acc_n`: position n right given positions
before it were right) on the held-out stage-01 data, turned into an expected tau.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

from draftlab import DraftlabError
from draftlab.acceptance.speculative import Generation, metrics, speculative_generate
from draftlab.files import read_jsonl


def load_spec_prompts(prompts: Path, tokenizer, split: str = "bench", n: int | None = None) -> list[dict]:
    """Prompts of one split of the prompt set stage 01 wrote (`RunLayout.prompts`) as chat-template ids,
    sources interleaved."""
    from draftlab.data.generate import _chat_ids

    path = Path(prompts)
    if not path.exists():
        raise DraftlabError(
            f"{path} is missing: run notebook 01 for this dataset_name first (it writes the prompt set "
            "with its train / eval / bench splits)."
        )
    fix = "Re-run notebook 01 for this dataset_name: it writes the prompt set again (and resumes the rest)."
    every = read_jsonl(path, fix, ("id", "source", "text", "split"))
    if not every:  # notebook 01 writes it whole, with train and eval prompts at least: emptied or cut since
        raise DraftlabError(f"{path} is empty: it holds no prompts at all (emptied, or cut to nothing). {fix}")
    rows = [r for r in every if r["split"] == split]
    if not rows:
        raise DraftlabError(
            f"{path} holds no {split!r} prompts; raise n_sharegpt/n_chat/n_code, or "
            f"{'bench_fraction' if split == 'bench' else 'eval_fraction'}, in notebook 01."
        )
    by_source = {s: [r for r in rows if r["source"] == s] for s in sorted({r["source"] for r in rows})}
    mixed = [r for group in zip(*by_source.values(), strict=False) for r in group]
    mixed += [r for r in rows if r not in mixed]
    return [{**r, "ids": _chat_ids(tokenizer, r)} for r in mixed[:n]]


def longest_prompts(pool: list[dict], n: int, exclude=()) -> list[dict]:
    """The `n` longest of `pool` (`load_spec_prompts` output; by chat-template tokens) not in `exclude` (ids):
    deep contexts for the depth plot, kept out of the headline, whose prompts are drawn as they come."""
    rest = [p for p in pool if p["id"] not in set(exclude)]
    return sorted(rest, key=lambda p: -len(p["ids"]))[: max(n, 0)]


def run_prompts(
    verifier, proposer, prompts: list[dict], k: int, max_new_tokens: int, temperature: float = 0.0, seed: int = 0
) -> list[Generation]:
    from draftlab.data.verifier import check_token_ids

    check_token_ids(
        verifier,
        {p["id"]: p["ids"] for p in prompts},
        "the prompts of notebook 05",
        "load them with this verifier's tokenizer (load_spec_prompts), and use the tokenizer saved with the model.",
    )
    gens = []
    for i, p in enumerate(prompts):
        g = speculative_generate(verifier, proposer, p["ids"], k, max_new_tokens, temperature, seed + i)
        g.settings.update(prompt_id=p["id"], source=p["source"])
        gens.append(g)
    return gens


def run_all(
    verifier, proposers: dict, prompts: list[dict], k: int, max_new_tokens: int, temperature: float = 0.0, seed: int = 0
) -> tuple[dict, dict]:
    """Every proposer over the same prompts: ({name: generations}, {name: wall seconds, drafting included})."""
    runs, seconds = {}, {}
    for name, prop in proposers.items():
        t0 = time.perf_counter()
        runs[name] = run_prompts(verifier, prop, prompts, k, max_new_tokens, temperature, seed)
        seconds[name] = time.perf_counter() - t0
    return runs, seconds


def tau_against_k(
    verifier,
    proposers: dict,
    prompts: list[dict],
    ks: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    measured: dict | None = None,
    tables: dict | None = None,
) -> dict:
    """{name: {k: tau}}: every proposer decoding the prompts at every chain length in `ks`. `measured`
    ({k: {name: summarize(...)}}) gives taus already measured on these prompts and settings (the headline k),
    taken as they are instead of decoding again. `tables`, where given, receives {name: {k: step table}} of
    the runs decoded here (`intervals.step_table`), for their intervals."""
    from draftlab.acceptance.intervals import step_table

    measured = measured or {}
    taus: dict = {}
    for name, prop in proposers.items():
        taus[name] = {}
        for k in ks:
            done = measured.get(k, {}).get(name)
            if done is None:
                gens = run_prompts(verifier, prop, prompts, k, max_new_tokens, temperature, seed)
                done = summarize(gens, k)
                if tables is not None:
                    tables.setdefault(name, {})[k] = step_table(gens)
            taus[name][k] = done["all"]["tau"]
    return taus


@torch.no_grad()
def verifier_greedy(verifier, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy `generate`, cut after eos: the reference every greedy output must equal."""
    x = torch.tensor([prompt_ids], device=verifier.device)
    out = verifier.model.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=verifier.tokenizer.pad_token_id,
    )[0, x.shape[1] :].tolist()
    eos = verifier.tokenizer.eos_token_id
    return out[: out.index(eos) + 1] if eos in out else out


def summarize(gens: list[Generation], k: int) -> dict:
    """Metrics over all generations and per prompt source (chat, code)."""
    out = {"all": metrics([s for g in gens for s in g.steps], k)}
    for src in sorted({g.settings["source"] for g in gens}):
        out[src] = metrics([s for g in gens if g.settings["source"] == src for s in g.steps], k)
    return out


def hardware(device) -> str:
    if str(device).startswith("cuda"):
        return f"{torch.cuda.get_device_name(0)} (cuda)"
    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.exists():
        cpu = next(
            (ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines() if ln.startswith("model name")), cpu
        )
    return f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s)"


def tau_from_alpha(alpha: list[float], k: int) -> float:
    """Expected tokens per verifier pass for a chain of k: 1 + sum_n prod_{j<=n} alpha_j."""
    tau, run = 1.0, 1.0
    for a in alpha[:k]:
        run *= a
        tau += run
    return tau


@torch.no_grad()
def offline_alpha(draft, data_dir: Path, k: int | None = None, max_rows: int = 64) -> list[float]:
    """Teacher-forced conditional acceptance per position (speculators' cond_acc_n) on stage-01 data,
    one row per forward, shifted as `speculators train` shifts EAGLE-3 data (`shift_batch`).
    `k` positions (default: the draft's configured TTT steps): the TTT forward drafts each position
    from the draft's own earlier states, as a chain of k does online, so the offline tau at the online
    k needs no second online run."""
    from draftlab.data import manifest
    from draftlab.data.packing import collate, rows

    if draft.kind != "eagle3":
        raise DraftlabError(f"offline estimate for {draft.kind} is not wired yet; only eagle3.")
    man = manifest.read(data_dir)
    if man is None or list(man["layer_ids"]) != list(draft.model.target_layer_ids):
        raise DraftlabError(
            f"{data_dir}: layer ids {man and man['layer_ids']} differ from the draft's "
            f"{draft.model.target_layer_ids}; use the stage-01 data the draft was trained on."
        )
    v = draft.verifier
    ds = rows(data_dir, 1 << 20, v.dtype)
    sums: dict[str, float] = {}
    positions = {"ttt_steps": k} if k else {}
    for i in range(min(len(ds), max_rows)):
        row = ds[i]
        n = len(row["input_ids"]) - 1
        batch = collate([row], n, v.hidden_size, len(man["layer_ids"]), v.dtype, shift=True)
        _, _, m = draft.forward(batch, **positions)
        for key, val in m.items():
            sums[key] = sums.get(key, 0.0) + float(val)
    steps = sorted(int(k.split("_")[2]) for k in sums if k.startswith("cond_acc_") and k.endswith("_sum"))
    return [sums[f"cond_acc_{s}_sum"] / max(sums[f"cond_acc_{s}_total"], 1.0) for s in steps]
