"""The pages a reader follows (README.md, docs/*.md, BENCHMARKS.md's headline table) stay true to the tree (issue 52):
every relative link and anchor resolves, every repository path and `draftlab` module name they show exists, every
`draftlab` command line parses with the real CLI parser and its `--set` keys pass the real profile checks, every
`make` target and `gpu_pipeline.sh` job they name exists, and the README stays short. The checks read files and use
the CLI's own parser and config checks; they start nothing."""

from __future__ import annotations

import argparse
import ast
import contextlib
import fnmatch
import glob
import io
import re
import shlex
import subprocess
from pathlib import Path
from unittest.mock import patch

import pytest

from draftlab import DraftlabError
from draftlab import run as cli
from draftlab.config import check_values, load_profile
from draftlab.profile import refuse_unread

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib"
README_MAX_LINES = 150
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# made by `make run` / `make test` or on a lent machine, never committed: a path under these is not checked
GENERATED = {"data", "outputs", ".venv", ".venv-vllm", ".answers", ".ckpt", ".smol", ".whl", ".vllm"}
STAGE_PACKAGES = {"data", "masks", "drafts", "training", "acceptance", "serving"}
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")


def _text(page: Path) -> str:
    """What the test reads of a page: BENCHMARKS.md only from its headline section to the first dated section."""
    text = re.sub(r"<!--.*?-->", "", page.read_text(), flags=re.S)  # notes to maintainers, e.g. where a feature goes
    if page.name == "BENCHMARKS.md":
        start = text.index("## Headline figures")
        end = text.index("\n## ", start + 1)
        return text[start:end]
    return text


def _checked() -> list[Path]:
    return [*PAGES, ROOT / "BENCHMARKS.md"]


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def _tracked() -> set[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(out.split())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on a page (a repeated heading's gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            s = slug(m.group(1))
            out.add(f"{s}-{seen[s]}" if s in seen else s)
            seen[s] = seen.get(s, 0) + 1
    return out


def spans_and_blocks(text: str) -> tuple[list[str], list[str]]:
    """(inline code spans, fenced code blocks) of a page; spans may run over a line break."""
    blocks = FENCE.findall(text)
    return SPAN.findall(FENCE.sub("", text)), blocks


def test_readme_stays_within_150_lines():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail to a page under docs/ (at most 150)"


def broken_links(page: Path, text: str) -> list[str]:
    """Each relative link of `text` (shown on `page`) whose file, or heading for its #anchor, does not exist."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file or folder")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: {dest.name} has no heading whose anchor is #{anchor}")
    return broken


@pytest.mark.parametrize("page", _checked(), ids=_ids(_checked()))
def test_every_relative_link_and_anchor_resolves(page):
    broken = broken_links(page, _text(page))
    assert not broken, f"{page.name}: broken links:\n" + "\n".join(broken)


def _path_candidates(code: str):
    """Repository paths in a code span or block: a/b tokens and bare script or page names."""
    for tok in re.findall(r"(?<![\w./:$-])((?:\.\./)?[\w.<>{}*,-]+(?:/[\w.<>{}*,-]+)*/?)", code):
        yield tok.rstrip(".,")


def _expand(path: str) -> list[str]:
    """Globs for a shown path: <placeholder>, a stage number NN and * match anything, {a,b} each alternative."""
    if m := re.search(r"\{([^{}]*)\}", path):
        return [g for alt in m.group(1).split(",") for g in _expand(path[: m.start()] + alt + path[m.end() :])]
    return [re.sub(r"<[^<>/]*>|(?<![A-Za-z])NN(?![A-Za-z])", "*", path)]


def missing_paths(code: str, tracked: set[str], names: set[str]) -> list[str]:
    top = {t.split("/")[0] for t in tracked}
    out = []
    for tok in _path_candidates(code):
        first = tok.split("/")[0]
        if "..." in tok or first in GENERATED or first.startswith(".."):
            continue
        if "/" not in tok:  # a bare name: a script, page or module of the tree (generated files are not named so)
            if re.search(r"\.(py|md|ipynb|yaml|sh|toml)$", tok) and not any(
                fnmatch.fnmatch(n, g) for g in _expand(tok) for n in names
            ):
                out.append(tok)
            continue
        if first not in top:
            continue
        if not any(glob.glob(str(ROOT / g)) for g in _expand(tok.rstrip("/"))):
            out.append(tok)
    return out


@pytest.mark.parametrize("page", _checked(), ids=_ids(_checked()))
def test_every_path_the_pages_name_exists(page):
    tracked = _tracked()
    names = {Path(t).name for t in tracked}
    spans, blocks = spans_and_blocks(_text(page))
    missing = sorted({p for code in [*spans, *blocks] for p in missing_paths(code, tracked, names)})
    assert not missing, f"{page.name} names paths the tree does not have: {missing}"


def defined(dotted: str) -> bool:
    """Whether a dotted name is a module of lib/ or a name defined in one (read with ast: nothing is imported)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = LIB.joinpath(*parts[:i])
        source = base / "__init__.py" if (base / "__init__.py").exists() else base.with_suffix(".py")
        if source.exists():
            rest = parts[i:]
            break
    else:
        return False
    body = ast.parse(source.read_text()).body
    for name in rest:
        found = None
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
                found = node
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = node
            if isinstance(node, ast.Import | ast.ImportFrom):
                if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                    return True  # defined elsewhere and imported here: its own module is checked where it is named
        if found is None:
            return False
        if not isinstance(found, ast.ClassDef):
            return True  # an attribute of a function or a value: nothing more to read statically
        body = found.body
    return True


def module_names(text: str) -> list[str]:
    """`draftlab.x.y` names, stage-relative ones (`training.jobs.train_drafts`), and `from draftlab... import a, b`."""
    spans, blocks = spans_and_blocks(text)
    names = []
    for code in spans:
        if re.search(r"\.(py|md|ipynb|yaml|sh|toml|json)$", code):  # a file name, not a module's dotted name
            continue
        if m := re.fullmatch(r"(?:python -m )?((\w+)(?:\.\w+)+)(?:\(.*\))?", code.strip(), re.S):
            if m.group(2) == "draftlab":
                names.append(m.group(1))
            elif m.group(2) in STAGE_PACKAGES:
                names.append(f"draftlab.{m.group(1)}")
    for code in blocks:
        for m in re.finditer(r"^from (draftlab[\w.]*) import ([\w, ]+)$", code, re.M):
            names += [f"{m.group(1)}.{n.strip()}" for n in m.group(2).split(",")]
    return names


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_module_name_the_pages_show_is_defined(page):
    missing = [n for n in module_names(_text(page)) if not defined(n)]
    assert not missing, f"{page.name} names what lib/ does not define: {missing}"


def command_lines(text: str) -> list[str]:
    """Shell command lines of a page: each line of a fenced block (continuations joined) and each inline span."""
    spans, blocks = spans_and_blocks(text)
    lines = [" ".join(s.split()) for s in spans]
    for block in blocks:
        lines += [" ".join(line.split()) for line in block.replace("\\\n", " ").splitlines()]
    return lines


def _shell_words(line: str) -> list[str]:
    """A line's words as the shell reads them: quotes joined, `# comments` dropped, `;`, `&&`, `|`, `>` words of
    their own."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: the span shows part of a command
        return []


def draftlab_argv(line: str) -> list[str] | None:
    """The arguments after `draftlab` in a command line (through `.venv/bin/draftlab` or `python -m draftlab`), up to
    a shell separator; None when there is none, or when it only names a subcommand (`draftlab serve`)."""
    words = _shell_words(line)
    for i, w in enumerate(words):
        if (w.endswith("/draftlab") or w == "draftlab") and words[i + 1 : i + 2] in (["run"], ["serve"]):
            argv = []
            for j, a in enumerate(words[i + 1 :], i + 1):
                if re.fullmatch(r"[;&|<>()]+", a) or (a.isdigit() and words[j + 1 : j + 2][:1] in ([">"], [">&"])):
                    break  # the shell's: a separator or a redirection (`> log`, `2>&1`)
                argv.append(a)
            return argv if len(argv) > 1 else None
    return None


def the_cli_parser() -> argparse.ArgumentParser:
    """The parser `draftlab` itself builds (draftlab.run.main), caught as main hands it a command line."""

    class Caught(Exception):
        pass

    parsers = []

    def keep(parser, *a, **kw):
        parsers.append(parser)
        raise Caught

    with patch.object(argparse.ArgumentParser, "parse_args", keep), contextlib.suppress(Caught):
        cli.main(["run"])
    return parsers[0]


def check_draftlab(argv: list[str], parser: argparse.ArgumentParser) -> str | None:
    """Why this `draftlab` command line would be refused before any work starts, or None: argparse's error, then
    what `draftlab run` checks first (the profile, the `--set` keys and types, `--only`, a key no stage run reads)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    if args.cmd != "run":
        return None
    try:
        load_profile(args.profile)
        overrides = cli.parse_overrides(args.overrides)
        check_values(overrides, "--set")
        stages = [p.name[:2] for p in cli.notebooks(args.only.split(",") if args.only else None)]
        refuse_unread(overrides, stages)
    except DraftlabError as e:
        return str(e)
    return None


def set_pairs(line: str) -> list[str]:
    """`--set key=value` pairs inside a line whose command is not `draftlab` itself (e.g. gpu_pipeline.sh's SET05);
    a pair that shows the form (`--set KEY=VALUE`, `--set KEY=...`, `--set dataset_name=<new name>`) is left out."""
    if draftlab_argv(line) is not None:
        return []  # `draftlab run` itself: check_draftlab reads its --set
    pairs = re.findall(r"--set\s+([^\s\"']+=[^\s\"']+)", line)
    return [p for p in pairs if re.fullmatch(r"[a-z_0-9]+=(?!.*(\.\.\.|<)).*", p)]


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))


def pipeline_jobs() -> set[str]:
    """The script's jobs, and those of closed issues its header says live on at a named commit (the pages quoting
    their figures name that commit)."""
    script = (ROOT / "benchmarks" / "gpu_pipeline.sh").read_text()
    cases = script[script.index('case "${1:-}" in') :]
    retired = re.search(r"Jobs of closed issues \(([^)]*)\) are in this script at\s*#?\s*commit [0-9a-f]{7}", script)
    return {j for label in re.findall(r"^([\w|-]+)\)", cases, re.M) for j in label.split("|")} | set(
        retired.group(1).replace(" ", "").split(",") if retired else ()
    )


def segments(words: list[str]) -> list[list[str]]:
    """A command line's words cut at the shell's separators, each without its leading `time` and VAR=value words."""
    out = [[]]
    for w in words:
        if w in ("&&", "||", ";", "|"):
            out.append([])
        elif out[-1] or not (w == "time" or re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w)):
            out[-1].append(w)
    return [seg for seg in out if seg]


def refused_shell(line: str, targets: set[str], jobs: set[str]) -> list[str]:
    """What is wrong in a line that is not a `draftlab` command: a `--set` key or value the profiles refuse, a `make`
    target the Makefile lacks or a PROFILE it does not ship, a gpu_pipeline.sh job the script lacks."""
    wrong = []
    try:
        check_values(cli.parse_overrides(set_pairs(line)), "--set")
    except DraftlabError as e:
        wrong.append(str(e))
    for seg in segments(_shell_words(line)):
        if seg[0] == "make":
            for w in seg[1:]:
                key, eq, value = w.partition("=")
                if eq and key == "PROFILE" and value not in cli.PROFILES:
                    wrong.append(f"PROFILE={value}: not one of {cli.PROFILES}")
                elif not eq and w not in targets:
                    wrong.append(f"the Makefile has no target {w!r}")
        for i, w in enumerate(seg[:-1]):
            if w.endswith("gpu_pipeline.sh") and seg[i + 1] not in jobs:
                wrong.append(f"gpu_pipeline.sh has no job {seg[i + 1]!r}")
    return wrong


@pytest.mark.parametrize("page", _checked(), ids=_ids(_checked()))
def test_every_command_line_the_pages_show_runs_as_written(page):
    parser, targets, jobs = the_cli_parser(), makefile_targets(), pipeline_jobs()
    wrong = []
    for line in command_lines(_text(page)):
        argv = draftlab_argv(line)
        why = ([check_draftlab(argv, parser)] if argv is not None else []) + refused_shell(line, targets, jobs)
        wrong += [f"{line}\n    -> {w}" for w in why if w]
    assert not wrong, f"{page.name}: command lines that would be refused:\n" + "\n".join(wrong)


def test_the_checks_refuse_what_a_page_could_get_wrong(tmp_path):
    """Negative controls: each check above fails on the mistake it exists for."""
    page = tmp_path / "page.md"
    page.write_text("# A heading\n\n[ok](#a-heading) [gone](nowhere.md) [bad anchor](#no-such-heading)\n")
    assert broken_links(page, page.read_text()) == [
        "nowhere.md: no such file or folder",
        "#no-such-heading: page.md has no heading whose anchor is #no-such-heading",
    ]
    tracked = _tracked()
    names = {Path(t).name for t in tracked}
    shown = (
        "bash benchmarks/gpu_pipeline.sh prepare; python benchmarks/no_such.py lib/draftlab/masks/<family>.py gone.py"
    )
    assert missing_paths(shown, tracked, names) == ["benchmarks/no_such.py", "gone.py"]
    assert defined("draftlab.masks.packing.pack_length") and defined("draftlab.layout.RunLayout.finish")
    assert not defined("draftlab.masks.packing.no_such") and not defined("draftlab.layout.RunLayout.no_such")
    assert not defined("draftlab.no_such_module")
    parser = the_cli_parser()
    assert check_draftlab(["run", "--profile", "default", "--only", "04"], parser) is None
    for argv, says in [
        (["run", "--profile", "default", "--set", "n_chatt=3"], "did you mean 'n_chat'"),
        (["run", "--set", "train_steps=ten"], "train_steps='ten'"),
        (["run", "--profile", "no_such"], "No profile 'no_such'"),
        (["run", "--only", "07"], "no such notebook"),
        (["run", "--only", "04", "--set", "draft_vocab_size=64"], "would change nothing"),
        (["run", "--no-such-flag"], "unrecognized arguments"),
        (["serve", "--k", "5"], "--draft"),
    ]:
        assert says in (check_draftlab(argv, parser) or ""), argv
    jobs, targets = pipeline_jobs(), makefile_targets()
    assert {"prepare", "stage", "served", "ckpt-back"} <= jobs and {"run", "test", "lab"} <= targets
    assert (
        refused_shell(
            'time make run PROFILE=gpu && SET05="--set spec_prompts=32" bash x/gpu_pipeline.sh served', targets, jobs
        )
        == []
    )
    wrong = refused_shell(
        'make runn PROFILE=gpux; SET05="--set spec_promts=3" bash benchmarks/gpu_pipeline.sh srved', targets, jobs
    )
    expected = ["did you mean 'spec_prompts'", "no target 'runn'", "PROFILE=gpux", "no job 'srved'"]
    assert len(wrong) == len(expected) and all(e in w for e, w in zip(expected, wrong, strict=True)), wrong
    for line in (
        ".venv/bin/draftlab run --profile ci > log.txt  # all",
        "$py -m draftlab run --profile ci 2>&1 | tail",
    ):
        assert draftlab_argv(line) == ["run", "--profile", "ci"], line
    assert draftlab_argv("`draftlab serve`") is None and draftlab_argv("python -m draftlab.masks.eagle3") is None
