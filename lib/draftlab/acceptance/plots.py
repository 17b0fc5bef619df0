"""Stage 05's pictures: a response coloured by what the verifier did with each draft token, and the
acceptance figures (accepted lengths, alpha_n, tau against k; intervals, paired differences and depth
from `intervals` / `depth`); each returns its Figure."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullLocator, ScalarFormatter

SPEC_COLOURS = {"prefill": "#d0d7e1", "accepted": "#b7e4c7", "bonus": "#ffd59e", "rejected": "#f4a6a6"}


def speculative_html(tok, gen, max_tokens: int = 300) -> str:
    """A response token by token: accepted drafts green, the verifier's bonus token orange, the draft
    token it replaced struck through in red, the prefill token grey."""

    def span(tid, kind, strike=False):
        text = html.escape(tok.decode([tid])).replace("\n", "⏎<br>") or "∅"
        deco = "text-decoration:line-through;font-size:80%;" if strike else ""
        return (
            f'<span title="{kind} {tid}" '
            f'style="background:{SPEC_COLOURS[kind]};{deco}border-radius:3px;margin:1px;padding:0 1px">{text}</span>'
        )

    spans, pos = [span(gen.tokens[0], "prefill")], 1
    for step in gen.steps:
        for _ in range(step.accepted):
            if pos < len(gen.tokens):
                spans.append(span(gen.tokens[pos], "accepted"))
                pos += 1
        if step.rejected is not None:
            spans.append(span(step.rejected, "rejected", strike=True))
        if pos < len(gen.tokens):
            spans.append(span(gen.tokens[pos], "bonus"))
            pos += 1
        if len(spans) > max_tokens:
            break
    legend = (
        "<p>"
        + " ".join(f'<span style="background:{c};padding:0 4px">{k}</span>' for k, c in SPEC_COLOURS.items())
        + "</p>"
    )
    return legend + '<div style="font-family:monospace;line-height:1.9">' + "".join(spans) + "</div>"


def accepted_length_histogram(hists: dict[str, list[int]], title: str):
    """Share of verifier passes that accepted 0..k draft tokens, one bar group per proposer."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    width = 0.8 / max(1, len(hists))
    for i, (name, h) in enumerate(hists.items()):
        h = np.asarray(h, dtype=float)
        ax.bar(np.arange(len(h)) + i * width, h / max(h.sum(), 1), width, label=name)
    ax.set_xlabel("draft tokens accepted in one verifier pass")
    ax.set_ylabel("share of passes")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def alpha_plot(alphas: dict[str, list], title: str):
    """Conditional acceptance alpha_n against draft position n; names with 'offline' dashed."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for name, a in alphas.items():
        y = [np.nan if x is None else x for x in a]
        ax.plot(range(1, len(y) + 1), y, "o--" if "offline" in name else "o-", label=name)
    ax.set_ylim(-0.02, 1.02)
    return _finish(fig, ax, "draft position n", "alpha_n = P(accept n | 1..n-1 accepted)", title)


def tau_vs_k(taus: dict[str, dict[int, float]], title: str, intervals: dict | None = None):
    """Tokens per verifier pass against chain length k, one line per proposer; `intervals` ({name: {k: {"lo",
    "hi"}}}, pooled) draws each point's interval over prompts."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for i, (name, by_k) in enumerate(taus.items()):
        ks = sorted(by_k)
        ax.plot(ks, [by_k[k] for k in ks], "o-", color=f"C{i}", label=name)
        ci = [(k, (intervals or {}).get(name, {}).get(k)) for k in ks]
        ci = [(k, e) for k, e in ci if e and e.get("lo") is not None]
        if ci:
            err = [[by_k[k] - e["lo"] for k, e in ci], [e["hi"] - by_k[k] for k, e in ci]]
            ax.errorbar([k for k, _ in ci], [by_k[k] for k, _ in ci], yerr=err, fmt="none", color=f"C{i}", capsize=3)
    ax.axhline(1.0, color="k", lw=0.6, ls=":")
    ax.set_xticks(sorted(set().union(*map(set, taus.values()))))
    return _finish(fig, ax, "draft length k (chain)", "tau (tokens per verifier pass)", title)


def served_positions(positions: dict[str, dict[str, list[float]]], title: str):
    """Per-position acceptance of each draft, draftlab's loop against vLLM, on vLLM's (unconditional)
    definition: the share of verifier passes whose draft positions 1..i were all accepted."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for i, (kind, by_engine) in enumerate(positions.items()):
        for engine, ys in by_engine.items():
            ax.plot(
                range(1, len(ys) + 1), ys, "o-" if engine == "vLLM" else "s--", color=f"C{i}", label=f"{kind}, {engine}"
            )
    ax.set_xticks(range(1, 1 + max((len(ys) for e in positions.values() for ys in e.values()), default=1)))
    ax.set_ylim(-0.02, 1.02)
    return _finish(fig, ax, "draft position i", "P(positions 1..i accepted)", title)


def served_speed(rows: list[dict], title: str):
    """vLLM's wall-clock tokens/s against requests in flight, the verifier alone and with each draft
    (`compare.speed_rows`), and each draft's speed-up over the verifier alone: where speculation stops paying."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    servers = list(dict.fromkeys(r["server"] for r in rows))
    for i, name in enumerate(servers):
        mine = sorted((r for r in rows if r["server"] == name), key=lambda r: r["requests in flight"])
        xs = [r["requests in flight"] for r in mine]
        axes[0].plot(xs, [r["tokens/s"] for r in mine], "o-", color=f"C{i}", label=name)
        if name != "verifier alone":
            axes[1].plot(xs, [r["speed-up"] for r in mine], "o-", color=f"C{i}", label=name)
    axes[1].axhline(1.0, color="k", lw=0.8, ls=":")
    levels = sorted({r["requests in flight"] for r in rows})
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])  # the levels measured, as whole numbers
        ax.xaxis.set_minor_locator(NullLocator())
    _finish(fig, axes[0], "requests in flight", "tokens/s (wall clock)", title)
    return _finish(fig, axes[1], "requests in flight", "speed-up over the verifier alone", title)


def speedup_plot(predicted: dict[str, list[dict]], measured: dict[str, list[dict]], title: str):
    """The cost model's speed-up against k, one line per proposer (`costs.predict` rows), and vLLM's measured speed-ups
    at one request in flight with their intervals (`speedup.served_at_k`) as points of the same colour."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for i, (name, rows) in enumerate(predicted.items()):
        ax.plot(
            [r["k"] for r in rows],
            [r["predicted speed-up"] for r in rows],
            "-",
            color=f"C{i}",
            label=f"{name}, predicted",
        )
        got = [m for m in measured.get(name, []) if m.get("speed-up") is not None]
        if got:
            y = [m["speed-up"] for m in got]
            err = [[m["speed-up"] - m["low"] for m in got], [m["high"] - m["speed-up"] for m in got]]
            ax.errorbar([m["k"] for m in got], y, yerr=err, fmt="o", color=f"C{i}", capsize=3, label=f"{name}, vLLM")
    ax.axhline(1.0, color="k", lw=0.6, ls=":")
    return _finish(fig, ax, "draft length k (chain)", "speed-up, one request in flight", title)


def interval_plot(estimates: dict[str, dict], stat: str = "tau", title: str = ""):
    """Forest chart of `stat` per proposer (`intervals.estimate` outputs): the pooled figure and the
    per-request mean, each with its interval, side by side, since the two rules can disagree."""
    from draftlab.acceptance.intervals import PER_REQUEST, POOLED

    fig, ax = plt.subplots(figsize=(6.5, 0.9 + 0.55 * len(estimates)))
    rules = {POOLED: ("o", "C0", "pooled (vLLM's rule)"), PER_REQUEST: ("s", "C1", "per-request mean (SpecForge's)")}
    for shift, (rule, (marker, colour, label)) in zip((-0.12, 0.12), rules.items(), strict=True):
        for i, est in enumerate(estimates.values()):
            e = est[stat][rule]
            if e["value"] is not None:
                _hbar(ax, i + shift, e, marker, colour, label if i == 0 else None)
    ax.set_yticks(range(len(estimates)), [f"{n} ({e['n_prompts']} prompts)" for n, e in estimates.items()])
    ax.set_ylim(len(estimates) - 0.5, -0.5)
    level = next(iter(estimates.values()), {}).get("level", 0.95)
    return _finish(fig, ax, f"{stat}, {level:.0%} bootstrap interval over prompts", "", title)


def paired_plot(comparisons: list[dict], title: str = ""):
    """Paired differences a - b (`intervals.paired` outputs) with their intervals and a zero line; grey
    where the interval covers zero."""
    fig, ax = plt.subplots(figsize=(6.5, 0.9 + 0.55 * len(comparisons)))
    for i, c in enumerate(comparisons):
        e = {"value": c["difference"], "lo": c["lo"], "hi": c["hi"]}
        _hbar(ax, i, e, "o", "grey" if c["lo"] <= 0 <= c["hi"] else "C0", None)
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_yticks(range(len(comparisons)), [f"{c['a']} - {c['b']} ({c['stat']})" for c in comparisons])
    ax.set_ylim(len(comparisons) - 0.5, -0.5)
    ax.set_xlabel("difference a - b, pooled, with its paired bootstrap interval")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def depth_plot(depth_by_proposer: dict[str, dict], pack_len: int | None = None, title: str = "", row_len=None):
    """tau and p_1 against the context depth where a verifier pass begins (`depth.by_depth` outputs), one
    line per proposer (or engine), error bars where a bucket has an interval, the training pack length dashed
    and, where given, the longest training row dotted (packs hold several rows, each attending to itself)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, stat in zip(axes, ("tau", "p_1"), strict=True):
        for i, (name, d) in enumerate(depth_by_proposer.items()):
            rows = [b for b in d["buckets"] if b[stat]["value"] is not None and b["x"] is not None]
            style = "s--" if "vLLM" in name else "o-"  # an engine's line over the loop's: both stay visible
            ax.plot([b["x"] for b in rows], [b[stat]["value"] for b in rows], style, color=f"C{i}", label=name)
            ci = [b for b in rows if b[stat]["lo"] is not None]
            err = [[b[stat]["value"] - b[stat]["lo"] for b in ci], [b[stat]["hi"] - b[stat]["value"] for b in ci]]
            ax.errorbar([b["x"] for b in ci], [b[stat]["value"] for b in ci], yerr=err, fmt="none", color=f"C{i}")
        if pack_len:
            ax.axvline(pack_len, color="k", ls="--", lw=0.8, label="training pack length")
        if row_len:
            ax.axvline(row_len, color="k", ls=":", lw=0.8, label="longest training row")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        _finish(fig, ax, "context length where the verifier pass begins", stat, title)
    return fig


def _hbar(ax, y: float, e: dict, marker: str, colour: str, label: str | None):
    """One point with its horizontal interval, where it has one."""
    xerr = None if e["lo"] is None else [[e["value"] - e["lo"]], [e["hi"] - e["value"]]]
    ax.errorbar([e["value"]], [y], xerr=xerr, fmt=marker, color=colour, capsize=3, label=label)


def _finish(fig, ax, xlabel: str, ylabel: str, title: str):
    """Labels, title, legend and grid of a line plot; returns its Figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
