"""The verifier-family matrix of docs/verifiers.md, rendered from what tests/test_families.py measured.

    python benchmarks/family_table.py            # print the table of the last run (outputs/families/results.json)
    python benchmarks/family_table.py --write    # and put it into docs/verifiers.md between the families markers

The test writes the results of every run and fails when the page's block differs from them. A cell the run
did not produce (the vLLM cell of a family `make test` does not serve: a server costs about a minute here)
keeps the page's value (a run with DRAFTLAB_FAMILIES_VLLM=one leaves most vLLM cells unmeasured).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "outputs" / "families" / "results.json"
PAGE = ROOT / "docs" / "verifiers.md"
START, END = "<!-- families:start -->", "<!-- families:end -->"
CELLS = ("extraction", "draft", "train", "loop", "vLLM")
NOT_RUN = "not run"


def block(text: str) -> str:
    """What the page holds between the markers (stripped)."""
    if START not in text or END not in text:
        raise SystemExit(f"docs/verifiers.md has no {START} ... {END} block")
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def page_cells(text: str) -> dict[str, dict[str, str]]:
    """{family label: {cell: text}} from the page's table."""
    out = {}
    for line in block(text).splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if len(parts) == len(CELLS) + 1 and parts[0] not in ("family", "---"):
            out[parts[0]] = dict(zip(CELLS, parts[1:], strict=True))
    return out


def render(results: dict, previous: dict[str, dict[str, str]] | None = None) -> str:
    """The markdown block: one row per family in the run's order; a cell the run left as None comes from `previous`."""
    previous = previous or {}
    lines = ["| family | " + " | ".join(CELLS) + " |", "| --- |" + " --- |" * len(CELLS)]
    for fam in results["families"]:
        cells = {c: fam["cells"].get(c) or previous.get(fam["label"], {}).get(c) or NOT_RUN for c in CELLS}
        lines.append(f"| {fam['label']} | " + " | ".join(cells[c].replace("|", "/") for c in CELLS) + " |")
    served = [f["label"] for f in results["families"] if f.get("served_in_make_test")]
    which = (
        "every family (`DRAFTLAB_FAMILIES_VLLM=one` serves only Qwen3, for a quicker local run)"
        if len(served) == len(results["families"])
        else f"{', '.join(served) or 'none'}, the other vLLM cells "
        "are from the last run with `DRAFTLAB_FAMILIES_VLLM=all`"
    )
    note = (
        "Tiny random verifiers (7 layers, hidden 64, fp32, CPU) built from transformers' config classes; each cell is "
        "a test in `tests/test_families.py`. vLLM: the verifier "
        f"served with an EAGLE-3 draft; `make test` serves {which}."
    )
    lines += ["", note]
    return "\n".join(lines)


def write(results: dict, page: Path = PAGE) -> bool:
    """Put the rendered block into the page; True when it changed. Refuses a run with failures."""
    if not results.get("complete"):
        raise SystemExit(
            "the run did not cover every family (pytest -k?), not writing the page: run all of tests/test_families.py"
        )
    failed = [
        (f["label"], c) for f in results["families"] for c, v in f["cells"].items() if v and v.startswith("FAILED")
    ]
    if failed:
        raise SystemExit(f"the run has failures, not writing the page: {failed}")
    text = page.read_text()
    head, rest = text.split(START, 1)
    new = f"{head}{START}\n{render(results, page_cells(text))}\n{END}{rest.split(END, 1)[1]}"
    page.write_text(new)
    return new != text


def main(argv: list[str]) -> int:
    if not RESULTS.exists():
        print(f"no {RESULTS}: run `pytest tests/test_families.py` first", file=sys.stderr)
        return 1
    results = json.loads(RESULTS.read_text())
    if "--write" in argv:
        print("docs/verifiers.md updated" if write(results) else "docs/verifiers.md already up to date")
    else:
        print(render(results, page_cells(PAGE.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
