"""Reading back the files draftlab wrote: one that is cut, edited or corrupted is named with what is wrong
with it and what to do, before json, numpy, safetensors or torch fail on it with their own words.

draftlab writes these files whole (`manifest.write_atomic`), so a fault is damage from outside (a copy cut
short, a disk that filled, a hand edit), not an interruption: each reader says which notebook writes the
file again or which file to delete. A cache draftlab can rebuild (`read_cache`) is rebuilt with a warning
instead of stopping the run.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from draftlab import DraftlabError


def json_fault(path: Path, kind: type = dict) -> tuple[object, str | None]:
    """(the JSON value of `path`, None), or (None, what is wrong with the file)."""
    try:
        value = json.loads(Path(path).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None, "it is missing"
    except UnicodeDecodeError as e:
        return None, f"it is not UTF-8 text (byte {e.start})"
    except json.JSONDecodeError as e:
        return None, f"it is not valid JSON (cut short or edited: {e.msg} at line {e.lineno}, column {e.colno})"
    if not isinstance(value, kind):
        return None, f"it holds a JSON {type(value).__name__}, not a {kind.__name__}"
    return value, None


def read_json(path: Path, fix: str, kind: type = dict):
    """The JSON value of a file draftlab wrote; a missing, cut or edited file is a DraftlabError with `fix`."""
    value, fault = json_fault(path, kind)
    if fault:
        raise DraftlabError(f"{path} cannot be read: {fault}. {fix}")
    return value


def read_cache(path: Path) -> dict:
    """A cache draftlab rebuilds (weight digests, verified hashes): {} when it is missing, and when it is
    unreadable too, with a warning (what it remembered is computed again, then written whole)."""
    if not Path(path).exists():
        return {}
    value, fault = json_fault(path)
    if fault:
        warnings.warn(f"{path} cannot be read ({fault}): it is a cache, rebuilt from scratch.", stacklevel=2)
        return {}
    return value


def read_jsonl(path: Path, fix: str, required: tuple[str, ...] = (), skip_unreadable: bool = False) -> list[dict]:
    """The records of a JSON-lines file draftlab wrote, each checked to hold `required` keys. A line that is
    not UTF-8 or not a JSON object is an error naming its number and `fix`; `skip_unreadable`: it is left out
    (a file appended as answers finish, whose last line an interruption cuts: its prompt is redone)."""
    out = []
    for n, raw in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
            fault = None if isinstance(rec, dict) else f"it is a JSON {type(rec).__name__}, not an object"
        except UnicodeDecodeError as e:
            fault = f"it is not UTF-8 text (byte {e.start} of the line)"
        except json.JSONDecodeError as e:
            fault = f"it is not valid JSON (cut short or edited: {e.msg})"
        if fault and skip_unreadable:
            continue
        missing = [k for k in required if k not in rec] if not fault else []
        fault = fault or (f"it has no {missing[0]!r}" if missing else None)
        if fault:
            raise DraftlabError(f"{path}, line {n}, cannot be read: {fault}. {fix}")
        out.append(rec)
    return out


def safetensors_fault(path: Path) -> str | None:
    """What is wrong with a safetensors file, reading its header only (None: header and data are all there,
    which an interrupted save or a copy cut short is not)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if size < 8 or 8 + n > size:
                return f"it holds {size} bytes, less than its header says (cut short)"
            header = json.loads(fh.read(n))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except FileNotFoundError:
        return "it is missing"
    except (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError):
        return "its header is not a safetensors header (overwritten or not a safetensors file)"
    if size < 8 + n + end:
        return f"it holds {size} bytes, its header says {8 + n + end} (cut short)"
    return None


def check_safetensors(path: Path, fix: str) -> None:
    """A DraftlabError naming `path`, what is wrong and `fix` before safetensors reads a cut file."""
    fault = safetensors_fault(path)
    if fault:
        raise DraftlabError(f"{path} cannot be read: {fault}. {fix}")


def load_npy(path: Path, fix: str):
    """A numpy array draftlab saved; a cut or overwritten file is a DraftlabError with `fix`."""
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        fault = "it is missing"
    except (OSError, ValueError, EOFError) as e:
        fault = f"it is not a whole .npy array (cut short or overwritten: {str(e).splitlines()[0]})"
    raise DraftlabError(f"{path} cannot be read: {fault}. {fix}")
