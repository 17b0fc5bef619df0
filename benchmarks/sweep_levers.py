"""Issue 51: a draft recipe's levers, each arm a run of its own, chosen on the eval split and reported on bench.

    python benchmarks/sweep_levers.py --profile default --prompts 32 --arm base: --arm ttt3:ttt_steps=3 \
        --arm noise:state_noise=0.1 --arm steps2x:train_steps=500 --out benchmarks/results/levers-cpu/levers.json

Each arm trains `--kind` through `draftlab run --profile P --only 04 --run-name P-<arm> --set draft_kinds=[KIND]` with
the sweep's `--set`s (the recipe every arm shares) and then its own; an arm that sets a stage-01 key
(`draft_vocab_size`, `extra_samples`, ...) gets a dataset of its own (`<dataset>-<arm>`) and runs 01 too, resuming the
base's answers unless it changes what they are (`reuse_answers`). Then draftlab's loop decodes `--prompts` eval prompts
(the split the winner is chosen on) and as many bench prompts (the split it is reported on) at k `--k`, greedy, from the
base dataset's prompt set, so every arm meets the same prompts; tau is pooled with a bootstrap interval over prompts,
and each arm's difference from the first arm (the base) on the same prompts with a paired interval (a prompt's
difficulty cancels, so a lever is told apart where two overlapping intervals would not). An arm already trained and
measured is read back, so the sweep resumes where it stopped; `--from DIR` (once or more) reads back the arms earlier
sweeps measured under the same recipe (a lease's files brought back; each arm file keeps its recipe), so a lease
trains new arms only. The table: arm, training seconds and,
for an arm with a dataset of its own, notebook 01's (what the lever cost), the draft vocabulary's eval coverage, the
train split's supervised tokens, held-out accuracy per drafted position, eval tau, bench tau and bench tau minus the
base's; the winner is the arm of highest eval tau. `levers.png` draws the bench differences, `levers_cost.png` bench tau
against those seconds, the steps and the train text; where three step counts or more of the base recipe were measured, a
line says where tau against steps levels off (`arms.steps_curve`) and whether it reaches `TARGET_TAU`. `--serve` then
serves the arm chosen on eval in vLLM (its notebook 05 on the same number of bench prompts, one in flight): the table's
last column is vLLM's own bench tau for it, and a line gives the loop's minus vLLM's, paired (an arm read back is
trained again for it, and the line gives that draft's own loop figure). The paired interval holds
the prompts' draw, not the run's: an arm that sets only `seed` (`--arm seed1:seed=1`: 01 and 04 drawn again) or only
`train_seed` (`--arm draw1:train_seed=1`: 04 alone, on the base's data) is the base drawn again, and the table says how
far such draws moved and which levers went beyond (on this CPU a draw moved bench tau +0.058, as far as any lever:
BENCHMARKS.md, "more of the verifier's text, and the base drawn again").
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from draftlab import config
from draftlab.acceptance.evaluate import load_spec_prompts, run_prompts
from draftlab.acceptance.intervals import POOLED, StepRecord, estimate, paired, step_table
from draftlab.acceptance.plots import paired_plot
from draftlab.acceptance.proposers import load_run_drafts
from draftlab.data.verifier import load_verifier
from draftlab.layout import RunLayout
from draftlab.training import arms
from draftlab.training.plots import levers_cost

SPLITS = ("eval", "bench")  # the split the choice is made on, the split reported
TARGET_TAU = 3.0  # issue 51's EAGLE-3 target (bench, k 5): the steps curve says whether steps alone reach it


def arm_run(profile: str, name: str, sets: dict, base: str) -> RunLayout:
    """The arm's run: `<profile>-<name>`, on dataset `base`, or its own where a stage-01 key is among its settings."""
    own = any("01" in config.readers(key) for key in sets)
    return RunLayout(f"{base}-{name}" if own else base, f"{profile}-{name}")


def draftlab_run(profile: str, stages: str, run_name: str, sets: list[str], wait: bool = True):
    """`draftlab run` of `stages` with the `key=value`s of `sets` that those stages read (it refuses the others);
    `wait=False` returns it running (`finish` waits on it)."""
    cmd = [sys.executable, "-m", "draftlab", "run", "--profile", profile, "--only", stages, "--run-name", run_name]
    for s in sets:
        if set(config.readers(s.split("=", 1)[0])) & set(stages.split(",")):
            cmd += ["--set", s]
    print("$", " ".join(cmd), flush=True)
    if not wait:
        return subprocess.Popen(cmd)
    subprocess.run(cmd, check=True)


def finish(proc: subprocess.Popen | None) -> None:
    """Wait on an arm's training started in the background; its failure is the sweep's."""
    if proc is not None and proc.wait():
        raise subprocess.CalledProcessError(proc.returncode, proc.args)


# the profile keys an answer's text depends on (stage 01 writes them into each answer's settings, or they pick the
# verifier, its dtype or the engine): an arm that sets one writes every answer of its own
ANSWER_KEYS = {"verifier", "max_new_tokens", "temperature", "sample_temperature", "seed", "engine", "gen_dtype"}
ANSWER_KEYS |= {"dtype", "device"}


def reuse_answers(base: RunLayout, layout: RunLayout, sets: dict) -> list[Path]:
    """The base dataset's answer files copied into an arm's dataset before its 01, where the arm sets none of
    ANSWER_KEYS (a draft vocabulary, more prompts, more sampled answers): its 01 resumes them (answers are keyed by
    prompt id and carry their settings) and writes only what the lever adds, so its 01 seconds are the lever's cost,
    not a second vLLM start and every answer again. A file the arm already has is left as it is."""
    if layout.dataset_name == base.dataset_name or set(sets) & ANSWER_KEYS:
        return []
    copied = []
    for src in sorted(base.data.glob("responses*.jsonl")):
        dest = layout.data / src.name
        if not dest.exists():
            layout.data.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            copied.append(dest)
    return copied


def arm_sets(base_sets: list[str], layout: RunLayout, base: str, kind: str, sets: dict) -> list[str]:
    """The `key=value`s of an arm's `draftlab run`: the recipe every arm shares, its dataset where it has one of its
    own (not `base`), the one family the sweep trains, then the arm's own settings."""
    own = [f"dataset_name={layout.dataset_name}"] if layout.dataset_name != base else []
    return [*base_sets, *own, f"draft_kinds=[{kind}]", *(f"{k}={v}" for k, v in sets.items())]


def train_arm(profile: str, kind: str, layout: RunLayout, sets: dict, base: str, base_sets: list[str] = ()):
    """`draftlab run` for the arm, started and returned (`finish` waits on it): 04 (and 01 first on a dataset of its
    own, resuming the base's answers where `reuse_answers` may); None where final/ is written. `base_sets`
    (`key=value`, the recipe every arm shares) before the arm's own."""
    if (layout.final(kind) / "config.json").is_file():
        return None
    own = layout.dataset_name != base
    if copied := reuse_answers(RunLayout(base, profile, layout.root), layout, sets):
        names = ", ".join(p.name for p in copied)
        print(f"{layout.dataset_name}: the base's answers copied for its 01 to resume ({names})", flush=True)
    arm = arm_sets(base_sets, layout, base, kind, sets)
    return draftlab_run(profile, "01,04" if own else "04", layout.run_name, arm, wait=False)


def free_train_states(layout: RunLayout, base: str, kind: str) -> int:
    """An arm's own train split's hidden states deleted once its draft's final/ is written (nothing after 04 reads
    them: 05 reads the prompts and the draft; `arm_data` the token counts beside them), so that arms with datasets of
    their own do not pile up on the disk: on an H100's 64 GB the base's, text2x's and vocab32k's offline states filled
    it on 2026-12-07 and the lease's report could not be read back. The shared dataset's are kept. Bytes freed."""
    states = layout.split("train") / "hidden_states"
    if layout.dataset_name == base or not states.is_dir() or not (layout.final(kind) / "config.json").is_file():
        return 0
    size = sum(p.stat().st_size for p in states.rglob("*") if p.is_file())
    shutil.rmtree(states)
    print(f"{layout.dataset_name}: train states deleted ({size / 1e9:.1f} GB; --keep-states keeps them)", flush=True)
    return size


def states_room(layout: RunLayout, base: RunLayout, sets: dict) -> str | None:
    """Why an arm with a dataset of its own is not started, or None where it may be: its 01 writes hidden states of
    at least the base's eval split's size and, offline, the base's train split's times its answers per train prompt
    over the base's (`extra_samples`; online, 01 keeps a few train rows only), and on 2026-12-07 the third such arm
    filled an H100's 64 GB mid-01: the sweep's job ended and nothing of that call came back. An arm whose states
    would not fit with a tenth to spare is skipped and said; the arms after it go on. (An arm of more prompts, e.g.
    `sharegpt_turns`, writes more than this says.)"""
    if layout.dataset_name == base.dataset_name or (layout.split("train") / "hidden_states").is_dir():
        return None  # the shared dataset, or an arm whose 01 already wrote states (it resumes them)
    size = {
        split: sum(f.stat().st_size for f in (base.split(split) / "hidden_states").rglob("*") if f.is_file())
        for split in ("train", "eval")
    }
    saved = json.loads(base.resolved_config("01").read_text()) if base.resolved_config("01").is_file() else {}
    ran = saved.get("config", {})  # the base's, as its 01 ran
    extra = int(ran.get("extra_samples", 0))
    online = sets.get("hidden_states", ran.get("hidden_states")) == "online"
    share = 0.0 if online else (1 + int(sets.get("extra_samples", extra))) / (1 + extra)
    need = share * size["train"] + size["eval"]
    free = shutil.disk_usage(base.data if base.data.is_dir() else base.root).free
    if free >= 1.1 * need:
        return None
    return (
        f"{layout.dataset_name}: not started: its 01 would write about {need / 1e9:.3g} GB of hidden states "
        f"(the base's train {size['train'] / 1e9:.3g} GB x {share:.3g} and eval {size['eval'] / 1e9:.3g} GB) and "
        f"{free / 1e9:.3g} GB are free. Free the disk (an earlier arm's data/runs/<dataset>-<arm>/) or run this arm in "
        "a sweep of its own."
    )


def own_01_seconds(layout: RunLayout, base: str) -> float | None:
    """The wall seconds of notebook 01 for an arm with a dataset of its own (`draftlab run`'s summary.json of the arm's
    run): part of what its lever costs. None for an arm on the shared dataset, or where a later run replaced that
    summary."""
    path = layout.outputs / "summary.json"
    if layout.dataset_name == base or not path.is_file():
        return None
    return next((r["seconds"] for r in json.loads(path.read_text()) if r["notebook"].startswith("01")), None)


def tau_on(verifier, layout: RunLayout, kind: str, prompts: list[dict], k: int, tokens: int) -> dict:
    """Pooled tau with its 95% bootstrap interval over prompts, per-position acceptance, and the step table (each
    prompt's [start, drafted, accepted] per verifier pass, for the paired comparisons), in draftlab's loop."""
    proposer = load_run_drafts(layout, verifier, [kind]).proposers[kind]
    table = step_table(run_prompts(verifier, proposer, prompts, k, tokens))
    est = estimate(table, k)
    pos = [round(est[f"p_{i}"][POOLED]["value"], 4) for i in range(1, k + 1)]
    tau = {x: round(est["tau"][POOLED][x], 4) for x in ("value", "lo", "hi")}
    return {**tau, "p": pos, "prompts": len(prompts), "steps": [[list(s) for s in steps] for steps in table]}


def against_base(rows: list[dict], split: str) -> list[dict]:
    """Each later arm's pooled tau minus the first arm's on `split`'s prompts, with the paired interval."""

    def table(row):
        return [[StepRecord(*s) for s in steps] for steps in row[f"{split} tau"]["steps"]]

    base = rows[0]
    return [paired(table(r), table(base), r["arm"], base["arm"]) for r in rows[1:]]


def run_arms(names: list[str], train, measure, overlap: bool) -> list[dict]:
    """Each arm trained (`train(name)`: a process started, or None where already trained), then measured, in
    order; with `overlap` the next arm trains while this one is measured (the GPU's decoding loop leaves it mostly
    idle), so its training seconds are those of a shared device."""
    rows, running = [], train(names[0])
    try:
        for i, name in enumerate(names):
            finish(running)
            later = names[i + 1 : i + 2]
            running = train(later[0]) if later and overlap else None
            rows.append(measure(name))
            if later and not overlap:
                running = train(later[0])
    finally:
        if running is not None and running.poll() is None:
            running.terminate()
    return rows


def measured(path: Path) -> dict:
    """An arm's row from its `arm-<name>.json` where a sweep measured it (with the step tables the paired comparisons
    need), {} otherwise."""
    row = json.loads(path.read_text()) if path.is_file() else {}
    return row if "steps" in row.get("bench tau", {}) else {}


def recipe_of(row: dict, folder: Path) -> dict | None:
    """The recipe (the sweep's `--set`s every arm shared) an arm's row was measured under: kept in its file since
    2026-12-07, else the arguments in its folder's levers.json; None where neither says (sweeps before arguments
    were kept)."""
    recipe = row.get("recipe")
    if recipe is None and (sweep := folder / "levers.json").is_file():
        recipe = json.loads(sweep.read_text()).get("args", {}).get("base")
    return None if recipe is None else parse_sets(recipe)


def parse_sets(pairs: list[str]) -> dict:
    """`key=value` strings as a dict, each value read as YAML (as `--set` reads it)."""
    return {k: yaml.safe_load(v) for k, _, v in (kv.partition("=") for kv in pairs if kv)}


def read_back(earlier: list[str] | None, folder: Path, names: list[str], recipe: list[str] = ()) -> list[str]:
    """`--from DIR` (once or more): the arms this sweep names that earlier ones measured (their folders, brought back
    from leases; the first folder holding an arm gives it) copied beside `--out` where it has none of its own, so they
    are read back instead of trained and measured again: a lease spends its time on new arms only. Sound where the
    earlier sweeps ran the same recipe and prompts (the base of 2026-12-07 gave the same tau and accuracies to the last
    digit in two leases): an arm whose file names another `recipe` than this sweep's is not read back, and said. The
    names read back."""
    got, ours = {}, parse_sets(recipe)  # arm: the folder it came from
    for name in names:
        dest = folder / f"arm-{name}.json"
        found = {
            s: recipe_of(row, s.parent) for d in earlier or [] if (row := measured(s := Path(d) / f"arm-{name}.json"))
        }
        src = None
        for path, theirs in found.items():  # the first of this sweep's recipe (or of none kept); those before, said
            if theirs in (None, ours):
                src = path
                break
            print(f"not read back: {path} was measured under the recipe {theirs}, this sweep's is {ours}")
        if src and not dest.exists():
            shutil.copyfile(src, dest)
            got[name] = src.parent
    if got:
        print(f"read back, not trained again: {', '.join(f'{n} ({d})' for n, d in got.items())}", flush=True)
    return list(got)


def measure_arm(args, v, split_prompts: dict, name: str, sets: dict, layout: RunLayout, base: RunLayout) -> dict:
    """The arm's row: its training record, data, eval / bench tau and own 01 seconds, read back from
    `arm-<name>.json` where the sweep measured it before (with step tables), written there otherwise."""
    out = Path(args.out)
    cached = out.parent / f"arm-{name}.json"
    row = measured(cached)
    if not row:  # not measured, or measured before step tables were kept
        trained = arms.arm_table({name: {args.kind: arms.read_metrics(layout.draft(args.kind))}})[0]
        row = {**trained, "settings": sets, "recipe": args.base, "run": f"{layout.dataset_name}/{layout.run_name}"}
        row["data"] = arms.arm_data(layout)
        row["trained beside a measurement"] = args.overlap and name != args.arm[0].partition(":")[0]
        for split, prompts in split_prompts.items():
            row[f"{split} tau"] = tau_on(v, layout, args.kind, prompts, args.k, args.max_new_tokens)
            print(f"{name} {split} tau {row[f'{split} tau']['value']}", flush=True)
    seconds = own_01_seconds(layout, base.dataset_name)
    row["01 seconds"] = row.get("01 seconds") if seconds is None else seconds  # kept for `summarise`
    cached.write_text(json.dumps(row))
    return row


def serve_chosen(args, name: str, sets: dict, layout: RunLayout, base: str) -> dict:
    """The arm chosen on eval, served by vLLM: its notebook 05 on `--prompts` bench prompts (the sweep's, from its
    dataset's prompt set) at k `--k`, one request in flight, beside the loop on the same prompts. vLLM's own pooled
    tau with its interval and the loop's minus vLLM's (paired), read from 05's metrics.json. `base`: the base
    dataset's name (the arm's own, where it has one, is named to 05)."""
    spec = [f"spec_prompts={args.prompts}", f"spec_k={args.k}", f"spec_k_values=[{args.k}]", "spec_long_prompts=0"]
    spec += [f"spec_max_new_tokens={args.max_new_tokens}", "serve_with_vllm=true", "serve_concurrency=[1]"]
    draftlab_run(args.profile, "05", layout.run_name, [*arm_sets(args.base, layout, base, args.kind, sets), *spec])
    served = json.loads((layout.stage("05") / "metrics.json").read_text())["served"]
    if not served.get("available") or args.kind not in served.get("intervals", {}):
        raise SystemExit(f"vLLM did not serve {name}'s {args.kind}: {served.get('reason') or served.get('tau')}")
    pair = next(c for c in served["loop_vs_vllm"] if c["a"].startswith(f"{args.kind} "))
    return {
        "arm": name,
        "vLLM bench tau": served["intervals"][args.kind]["tau"][POOLED],
        "loop - vLLM": {key: pair[key] for key in ("difference", "lo", "hi")},
        "loop bench tau (05)": pair["value_a"],
        "prompts": served["intervals"][args.kind]["n_prompts"],
    }


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--profile", default="default")
    a.add_argument("--kind", default="eagle3")
    a.add_argument("--arm", action="append", required=True, help="name:key=value,key=value (base: for none)")
    a.add_argument("--prompts", type=int, default=32, help="eval prompts and bench prompts each")
    a.add_argument("--k", type=int, default=5)
    a.add_argument("--max-new-tokens", type=int, default=32)
    a.add_argument("--device", default="cpu")
    a.add_argument("--dtype", default="float32")
    a.add_argument("--set", action="append", default=[], dest="base", help="key=value every arm shares (the recipe)")
    a.add_argument("--overlap", action="store_true", help="train the next arm while this one's tau is measured")
    a.add_argument("--serve", action="store_true", help="the arm chosen on eval served by vLLM (its 05) at the end")
    a.add_argument(
        "--from", dest="earlier", action="append", help="an earlier sweep's folder (once or more): its arms read back"
    )
    a.add_argument("--keep-states", action="store_true", help="keep own-dataset arms' train states once trained")
    a.add_argument("--out", required=True)
    args = a.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    parsed = {}
    for spec in args.arm:
        name, _, rest = spec.partition(":")
        parsed[name] = parse_sets(rest.split(","))
    params = config.load_profile(args.profile)
    base = RunLayout(params["dataset_name"], args.profile)
    if not base.resolved_config("01").is_file() or any("01" in config.readers(s.split("=")[0]) for s in args.base):
        draftlab_run(args.profile, "01", args.profile, args.base)  # the shared dataset (01 resumes a finished one)
    v = load_verifier(params["verifier"], device=args.device, dtype=args.dtype)
    split_prompts = {s: load_spec_prompts(base.prompts, v.tokenizer, s, args.prompts) for s in ("eval", "bench")}
    coverage = arms.vocab_coverage(base, [s["draft_vocab_size"] for s in parsed.values() if "draft_vocab_size" in s])
    print(f"{base.dataset_name}: {arms.coverage_line(coverage)}", flush=True)
    names = list(parsed)
    layouts = {n: arm_run(args.profile, n, parsed[n], base.dataset_name) for n in names}

    earlier = read_back(args.earlier, out.parent, names, args.base)

    skipped = {}

    def train(n: str):
        if measured(out.parent / f"arm-{n}.json"):
            return None
        if why := states_room(layouts[n], base, parsed[n]):
            print(why, flush=True)
            skipped[n] = why
            return None
        return train_arm(args.profile, args.kind, layouts[n], parsed[n], base.dataset_name, args.base)

    def measure(n: str):
        if n in skipped:
            return None
        if not args.keep_states:
            free_train_states(layouts[n], base.dataset_name, args.kind)
        return measure_arm(args, v, split_prompts, n, parsed[n], layouts[n], base)

    rows = [r for r in run_arms(names, train, measure, args.overlap) if r]
    beside = {"vocabulary coverage": coverage, **({"not run": skipped} if skipped else {})}
    result = summarise(rows, out, vars(args), beside)
    if skipped:  # said again under the table, and kept in levers.json
        print("\n".join(skipped.values()))
    if args.serve:
        chosen = result["chosen on eval"]
        anew = chosen in earlier and not (layouts[chosen].final(args.kind) / "config.json").is_file()
        finish(train_arm(args.profile, args.kind, layouts[chosen], parsed[chosen], base.dataset_name, args.base))
        result["served"] = serve_chosen(args, chosen, parsed[chosen], layouts[chosen], base.dataset_name)
        if anew:  # its row is an earlier lease's draft; the one served, this lease's, has its own loop figure in 05
            result["served"]["draft"] = (
                "trained again for serving: the arm was read back with --from, its draft was not"
            )
        out.write_text(json.dumps(result, indent=1))
        print(table(result))


def summarise(rows: list[dict], out: Path, args: dict, beside: dict | None = None) -> dict:
    """`out` (levers.json), levers.png and levers_cost.png from the arms' rows (the first is the base), with `beside`
    (what the sweep keeps next to the arms: the vocabulary coverage, the arms not run, a served figure); printed as the
    table. `summarise OUT.json arm-base.json arm-b.json ...` does it for arms a cut sweep measured."""
    best = max(rows, key=lambda r: r["eval tau"]["value"])
    vs = {split: against_base(rows, split) for split in SPLITS}
    # the step tables stay in each arm-<name>.json (the paired comparisons' input), not copied into the result
    taus = [{f"{s} tau": {k: v for k, v in r[f"{s} tau"].items() if k != "steps"} for s in SPLITS} for r in rows]
    brief = [{**r, **t} for r, t in zip(rows, taus, strict=True)]
    result = {"args": args, "chosen on eval": best["arm"], "arms": brief, "against the base": vs}
    if curves := [c for split in SPLITS if (c := arms.steps_curve(rows, split, TARGET_TAU))]:
        result["steps curve"] = curves
    result.update(beside or {})
    out.write_text(json.dumps(result, indent=1))
    bench = rows[0]["bench tau"]
    k, n = len(bench["p"]), bench["prompts"]
    title = f"{args.get('kind', 'eagle3')}, k {k}: bench tau minus the base's on the same {n} prompts"
    paired_plot(vs["bench"], title).savefig(out.with_name("levers.png"), dpi=120)
    levers_cost(rows).savefig(out.with_name("levers_cost.png"), dpi=120)
    print(table(result))
    return result


def resummarise(out: Path, files: list[str]) -> dict:
    """`summarise OUT.json arm-base.json ...`: the table and figures again from arm files (a cut sweep's, or arms of
    several leases). What the sweep wrote in OUT beside the arms (its arguments, the vocabulary coverage, the arms not
    run, the served figure) is kept, the arm files named under `summarised from`; an arm served but no longer among
    them has its served figure dropped, since the table would pin it on nothing."""
    before = json.loads(out.read_text()) if out.exists() else {}
    rows = [json.loads(Path(f).read_text()) for f in files]
    rows = against_recipe(rows, [recipe_of(r, Path(f).parent) for r, f in zip(rows, files, strict=True)])
    kept = {k: before[k] for k in ("vocabulary coverage", "not run", "served") if k in before}
    if kept.get("served", {}).get("arm") not in {r["arm"] for r in rows}:
        kept.pop("served", None)
    return summarise(rows, out, before.get("args", {}), {**kept, "summarised from": files})


def against_recipe(rows: list[dict], recipes: list[dict | None]) -> list[dict]:
    """Arms of several leases, whose sweeps may have shared different recipes (one lease's base 1500 steps and one
    sampled answer, another's 6000 steps and two): each arm's `settings` become what it ran with that differs from the
    first known recipe (its recipe's `--set`s and its own), so the table, the draws and the steps curve compare like
    with like. An arm whose recipe is not known keeps its own settings. A key the first recipe sets and an arm's
    leaves out reads "(profile's)"."""
    ref = next((r for r in recipes if r is not None), None)
    out = []
    for row, recipe in zip(rows, recipes, strict=True):
        if recipe is not None:
            ran = {**recipe, **row["settings"]}
            differs = {k: v for k, v in ran.items() if ref.get(k) != v}
            row = {**row, "settings": differs | {k: "(profile's)" for k in ref if k not in ran}}
        out.append(row)
    return out


def table(result: dict) -> str:
    """The levers table (markdown): the chosen arm marked; bench tau is what is reported, beside its paired
    difference from the base (marked * where the interval leaves out 0)."""
    pos = max(len([k for k in r if k.startswith("position ")]) for r in result["arms"])
    head = ["arm", "settings", "steps", "training s", "own 01 s", "vocab (eval coverage)", "train tokens"]
    head += [*[f"acc {i}" for i in range(1, pos + 1)], "eval tau", "bench tau", "bench - base"]
    served = result.get("served") or {}
    head += ["bench tau, vLLM"] if served else []
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    vs = {c["a"]: c for c in result.get("against the base", {}).get("bench", [])}
    for r in result["arms"]:
        mark = " (chosen on eval)" if r["arm"] == result["chosen on eval"] else ""
        taus = [f"{r[s]['value']:.3f} [{r[s]['lo']:.3f}, {r[s]['hi']:.3f}]" for s in ("eval tau", "bench tau")]
        d, data = vs.get(r["arm"]), r.get("data", {})
        told = d is not None and not d["lo"] <= 0 <= d["hi"]
        diff = "-" if d is None else f"{d['difference']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]" + "*" * told
        cells = [f"{r['arm']}{mark}", json.dumps(r["settings"]) if r["settings"] else "-", str(r["steps"])]
        cells += [
            f"{r['training seconds']:.0f}",
            "-" if r.get("01 seconds") is None else f"{r['01 seconds']:.0f}",
            f"{data['draft vocabulary']} ({data['eval coverage']:.1%})" if data else "-",
            f"{data['train tokens']:,}" if data else "-",
            *[f"{r[f'position {i}']:.3f}" if f"position {i}" in r else "-" for i in range(1, pos + 1)],
        ]
        v = served.get("vLLM bench tau") if served.get("arm") == r["arm"] else None
        vllm = ["-" if v is None else f"{v['value']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}]"] if served else []
        lines.append("| " + " | ".join(cells + taus + [diff] + vllm) + " |")
    names = [n for n in draws_of(result) if n in vs]
    if names:  # the base recipe drawn again (`seed`: 01 run again; `train_seed`: another initialisation and order)
        moved = [vs[n]["difference"] for n in names]
        spread = max(abs(d) for d in moved)
        beyond = [
            a + "*" * (not c["lo"] <= 0 <= c["hi"])
            for a, c in vs.items()
            if a not in names and abs(c["difference"]) > spread
        ]
        lines.append(
            f"\nThe base drawn again ({', '.join(names)}) moved bench tau by "
            f"{', '.join(f'{d:+.3f}' for d in moved)}: a lever is told apart from another draw of "
            f"the base only beyond {spread:.3f}; beyond it: {', '.join(beyond) or 'none'}"
            + (" (* its paired interval leaves out 0 too; the others' hold it)." if beyond else ".")
        )
    for curve in result.get("steps curve", []):  # three step counts or more of the base recipe
        lines.append("\n" + arms.curve_line(curve))
    if served:
        d = served["loop - vLLM"]
        lines.append(
            f"\n{served['arm']} served by vLLM ({served['prompts']} bench prompts, one in flight): loop minus vLLM "
            f"{d['difference']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}], paired"
            + (f"; 05's loop {served['loop bench tau (05)']:.3f}" if "loop bench tau (05)" in served else "")
            + (f" ({served['draft']})." if "draft" in served else ".")
        )
    return "\n".join(lines)


def draws_of(result: dict) -> list[str]:
    """The arms that only set `seed` (01 and 04 drawn again) or `train_seed` (04 alone, on the same data): the base
    recipe drawn again, the yardstick for the levers' differences."""
    return [r["arm"] for r in result["arms"] if set(r["settings"]) in ({"seed"}, {"train_seed"})]


if __name__ == "__main__":
    if sys.argv[1:2] == ["table"]:
        print(table(json.loads(Path(sys.argv[2]).read_text())))
    elif sys.argv[1:2] == ["summarise"]:
        resummarise(Path(sys.argv[2]), sys.argv[3:])
    else:
        main()
