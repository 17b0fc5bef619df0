"""What notebook 05 reports, every figure with its interval: headline rows per proposer and prompt source,
the paired comparisons, acceptance against context depth, and the sample size each profile reached.

The loop's generations and vLLM's per-request figures both become step tables (`intervals.step_table`,
`acceptance.workload.step_table`), so the two engines are tabled by the same code, and a comparison is made
on the same prompts in the same order (`intervals.paired`).
"""

from __future__ import annotations

import json
from pathlib import Path

from draftlab.acceptance.depth import by_depth, depth_edges
from draftlab.acceptance.intervals import PER_REQUEST, POOLED, SAME, estimate, paired, sample_size, step_table
from draftlab.families import taken
from draftlab.writes import write_atomic

# what each draft is weighed against, on the same prompts: EAGLE-3 against prompt lookup, every other family against it
PAIRS = (("eagle3", "ngram"), *((k, "eagle3") for k in taken() if k != "eagle3"))


def ci(e: dict, digits: int = 3) -> str:
    """'1.296 [1.251, 1.342]': a value with its interval, as every table of notebook 05 prints it."""
    if e.get("value") is None:
        return "-"
    if e.get("lo") is None:
        return f"{e['value']:.{digits}f}"
    return f"{e['value']:.{digits}f} [{e['lo']:.{digits}f}, {e['hi']:.{digits}f}]"


def tables(runs: dict, by_source: bool = False) -> dict:
    """{proposer: step table} of the loop's runs ({proposer: generations}); with `by_source`,
    {proposer: {source: table}} over the prompts of each source too ("all" first)."""
    if not by_source:
        return {name: step_table(gens) for name, gens in runs.items()}
    out = {}
    for name, gens in runs.items():
        sources = sorted({g.settings["source"] for g in gens})
        out[name] = {"all": step_table(gens)} | {
            s: step_table([g for g in gens if g.settings["source"] == s]) for s in sources
        }
    return out


def headline(runs: dict, k: int) -> tuple[list[dict], dict, dict]:
    """Rows of tau and acceptance rate per proposer and prompt source, each pooled (the headline) and as the
    per-request mean, with intervals; {proposer: estimate} over all prompts (metrics.json keeps it whole); and
    {proposer: step table} over all prompts (what the comparisons, depth and sample size read)."""
    rows, whole, by_proposer = [], {}, {}
    for name, by_src in tables(runs, by_source=True).items():
        by_proposer[name] = by_src["all"]
        for src, table in by_src.items():
            e = estimate(table, k)
            whole.setdefault(name, e)
            rows.append(
                {
                    "proposer": name,
                    "prompt set": src,
                    "prompts": e["n_prompts"],
                    "tau (pooled)": ci(e["tau"][POOLED]),
                    "tau (per-request mean)": ci(e["tau"][PER_REQUEST]),
                    "acceptance rate (pooled)": ci(e["acceptance_rate"][POOLED]),
                    "steps": e["n_steps"],
                }
            )
    return rows, whole, by_proposer


def positions(estimates: dict) -> dict:
    """{proposer: [p_1 .. p_k with interval]} on the pooled rule (vLLM's unconditional definition)."""
    return {name: {f"p_{i}": ci(e[f"p_{i}"][POOLED]) for i in range(1, e["k"] + 1)} for name, e in estimates.items()}


def k_intervals(k_tables: dict) -> dict:
    """{proposer: {k: pooled tau with interval}} of the step tables at each chain length (tau against k)."""
    return {name: {k: estimate(t, k)["tau"][POOLED] for k, t in by_k.items()} for name, by_k in k_tables.items()}


def comparisons(step_tables: dict, pairs=PAIRS, stat: str = "tau") -> list[dict]:
    """Each pair present, as a paired difference on the same prompts (a pair with a missing proposer is left out)."""
    return [
        paired(step_tables[a], step_tables[b], a, b, stat) for a, b in pairs if a in step_tables and b in step_tables
    ]


def comparison_rows(found: list[dict]) -> list[dict]:
    """The paired differences as notebook rows: the verdict says "not distinguishable" where the interval covers 0."""
    return [
        {
            "comparison": f"{c['a']} - {c['b']}",
            "stat": c["stat"],
            "difference (paired interval)": ci({"value": c["difference"], "lo": c["lo"], "hi": c["hi"]}),
            "unpaired interval": f"[{c['unpaired']['lo']:.3f}, {c['unpaired']['hi']:.3f}]",
            "prompts": c["n_prompts"],
            "verdict": c["verdict"],
        }
        for c in found
    ]


def depth(step_tables: dict, edges=None) -> dict:
    """{proposer: by_depth} on shared buckets (powers of two over every proposer's steps unless given)."""
    if edges is None:
        edges = depth_edges([steps for table in step_tables.values() for steps in table])
    return {name: by_depth(table, edges) for name, table in step_tables.items()}


def sizes(step_tables: dict, half_width: float = 0.05) -> dict:
    """{proposer: sample_size}: the tau interval this many prompts reached, and the prompts +-half_width needs."""
    return {name: sample_size(table, half_width) for name, table in step_tables.items()}


def verdict_text(found: list[dict]) -> str:
    """One line per comparison for the notebook's prose: a ranking only where the interval excludes 0."""
    lines = []
    for c in found:
        diff = f"{c['a']} - {c['b']} = {c['difference']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}]"
        lines.append(f"{diff}: {SAME if c['verdict'] == SAME else c['verdict']} ({c['n_prompts']} prompts)")
    return "\n".join(lines)


PARTIAL = "metrics.partial.json"  # the figures so far, until the last cell writes metrics.json whole


def keep_so_far(out_dir, fresh: bool = False, **parts) -> Path:
    """Adds `parts` to `out_dir/metrics.partial.json` (`fresh`: starts it anew, dropping an earlier run's), so a run cut
    before its last cell keeps what it measured: on 2026-12-07 a lent GPU's 30 minutes ended while 05 started its
    last vLLM server, after its served figures, and metrics.json was never written (BENCHMARKS.md). The last cell
    writes metrics.json whole and removes this file; `"complete": false` says what it is to anyone who finds it."""
    path = Path(out_dir) / PARTIAL
    got = json.loads(path.read_text()) if path.is_file() and not fresh else {}
    write_atomic(path, json.dumps({**got, **parts, "complete": False}, indent=1), "notebook 05's figures so far")
    return path
