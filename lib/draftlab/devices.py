"""Which device and dtype a stage runs on, picked from a profile's `device` / `dtype` ("auto" or named)."""

from __future__ import annotations

from draftlab import DraftlabError


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
