"""Where things live and how profiles are read: one flat dict of parameters per profile."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from draftlab import DraftlabError


def repo_root() -> Path:
    """The checkout root (DRAFTLAB_HOME overrides it, e.g. for a non-editable install)."""
    if os.environ.get("DRAFTLAB_HOME"):
        return Path(os.environ["DRAFTLAB_HOME"]).resolve()
    return Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    return repo_root() / "data"


def outputs_dir() -> Path:
    return repo_root() / "outputs"


def notebooks_dir() -> Path:
    return repo_root() / "notebooks"


PROFILES = ("ci", "default", "gpu")


def load_profile(name: str) -> dict:
    """Parameters for every notebook under one profile (`notebooks/params/<name>.yaml`)."""
    path = notebooks_dir() / "params" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise DraftlabError(f"No profile {name!r} at {path}; pick one of {known}.")
    params = yaml.safe_load(path.read_text()) or {}
    if not isinstance(params, dict):
        raise DraftlabError(f"{path} must hold a mapping of parameter: value.")
    check_parameters(params, path)
    return params


def notebook_parameters() -> dict:
    """Every notebook's parameters (the first code cell, tagged `parameters`): name -> default value."""
    import ast
    import json

    out: dict = {}
    for nb in sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb")):
        cell = next(c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        for node in ast.parse("".join(cell["source"])).body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                out.setdefault(node.targets[0].id, ast.literal_eval(node.value))
    return out


def check_parameters(params: dict, where) -> None:
    """Refuse, before any notebook runs, a key no notebook declares (papermill would only log it) and a
    value whose type differs from the notebook's default (it would fail deep inside a stage)."""
    import difflib

    known = notebook_parameters()
    for key, value in params.items():
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}?" if near else f"the notebooks declare {sorted(known)}"
            raise DraftlabError(f"{where}: no notebook has a parameter {key!r}; {hint}")
        default = known[key]
        if default is None or value is None:
            continue
        same = type(value) is type(default) or (type(default) is float and type(value) is int)
        if not same:
            raise DraftlabError(
                f"{where}: {key}={value!r} is a {type(value).__name__}, but the notebooks expect a "
                f"{type(default).__name__} (default {default!r})."
            )


def pick_device(device: str = "auto") -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DraftlabError(f"device={device!r} but no CUDA device is visible; use device='cpu'.")
    return device


def pick_dtype(dtype: str, device: str):
    """bf16 on GPU, fp32 on CPU unless told otherwise: one dtype for weights and stored states."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if not hasattr(torch, dtype) or not isinstance(getattr(torch, dtype), torch.dtype):
        raise DraftlabError(f"dtype={dtype!r} is not a torch dtype; use auto, float32 or bfloat16.")
    return getattr(torch, dtype)
