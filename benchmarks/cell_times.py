"""The slowest cells of executed notebooks (papermill records each cell's duration).

    python benchmarks/cell_times.py outputs/gpu/0[1-4]_*.ipynb
"""  # fmt: skip

from __future__ import annotations

import json
import sys


def main(paths: list[str], top: int = 6) -> None:
    for path in paths:
        cells = json.load(open(path))["cells"]
        timed = [
            (
                c.get("metadata", {}).get("papermill", {}).get("duration") or 0.0,
                i,
                "".join(c["source"]).split("\n")[0][:72],
            )
            for i, c in enumerate(cells)
            if c["cell_type"] == "code"
        ]
        print(f"{path}: {sum(t for t, _, _ in timed):.1f} s in cells")
        for t, i, first in sorted(timed, reverse=True)[:top]:
            print(f"  {t:7.1f} s  cell {i:2d}  {first}")


if __name__ == "__main__":
    main(sys.argv[1:])
