"""The verifier's final norm as speculators' drafts rebuild it: which RMSNorm it computes, found on a probe.

speculators turns the stored final hidden state into the training targets with the draft's frozen
`verifier_norm` and `verifier_lm_head`. That is only the verifier's own logits when `verifier_norm`
computes what the verifier's final norm does: x/rms(x) times w (Llama, Qwen, Mistral, DeepSeek) or
times 1+w (Gemma, Qwen3.5). A LayerNorm (GPT-2, GPT-NeoX) is neither, and is refused.
"""

from __future__ import annotations

import torch

from draftlab import DraftlabError


def _eps(norm) -> float:
    return next(
        (float(getattr(norm, a)) for a in ("variance_epsilon", "eps") if isinstance(getattr(norm, a, None), float)),
        1e-6,
    )


def _tol(dtype: torch.dtype) -> dict:
    """fp32 agrees to rounding; bf16 / fp16 norms round their output (and Gemma's computes 1+w in fp32 first)."""
    return {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}


def _rms_probe(norm: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed probe x [4, H] in the norm's dtype and x / rms(x) in fp32."""
    w = norm.weight
    x = torch.randn(4, w.shape[-1], generator=torch.Generator().manual_seed(0)).to(w.device, w.dtype)
    xf = x.float()
    return x, xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + _eps(norm))


@torch.no_grad()
def norm_gain(norm: torch.nn.Module) -> str | None:
    """Which RMSNorm a final norm computes on a probe: 'x*w' (Llama, Qwen, ...), 'x*(1+w)' (Gemma, Qwen3.5), or None
    (no weight, a bias, or mean-centred, as a LayerNorm is)."""
    if not torch.is_tensor(getattr(norm, "weight", None)) or getattr(norm, "bias", None) is not None:
        return None
    x, base = _rms_probe(norm)
    y, w = norm(x).float(), norm.weight.float()
    return next(
        (g for g, gain in (("x*w", w), ("x*(1+w)", 1 + w)) if torch.allclose(y, base * gain, **_tol(x.dtype))), None
    )


def refuse_unsupported_norm(v) -> None:
    if norm_gain(v.norm) is None:
        raise DraftlabError(
            f"verifier {v.path}: its final norm is a {type(v.norm).__name__}, not an RMSNorm (x/rms(x) times w or "
            "1+w); a LayerNorm (mean-centred, with a bias) is not supported: speculators' drafts rebuild the "
            "verifier's logits from its final hidden state through an RMSNorm of the norm's weight, so their training "
            "targets would be other logits than the verifier's."
        )


def match_verifier_norm(model: torch.nn.Module, v) -> str | None:
    """speculators' EAGLE-3 always rebuilds the verifier's logits with x*w (DFlash picks by model_type); a Gemma-style
    verifier norm x*(1+w) with its weight w would give other targets. Its frozen `verifier_norm` is then swapped
    for transformers' Gemma3RMSNorm holding the same w, so the saved weight stays the verifier's. Idempotent;
    returns the reason when it swapped."""
    want, have = norm_gain(v.norm), norm_gain(model.verifier_norm)
    if want == have or want != "x*(1+w)":
        return None
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    old = model.verifier_norm
    new = Gemma3RMSNorm(old.weight.shape[-1], eps=_eps(old)).to(old.weight.device, old.weight.dtype)
    new.weight.data.copy_(old.weight.data)
    new.weight.requires_grad_(False)
    model.verifier_norm = new
    return (
        f"the verifier's final norm is x*(1+w) ({type(v.norm).__name__}); "
        f"speculators' {type(old).__name__} computes x*w"
    )


@torch.no_grad()
def same_norm(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether two norms compute the same function on the probe (in a's dtype)."""
    x, _ = _rms_probe(a)
    ya, yb = a(x).float(), b(x.to(b.weight.device, b.weight.dtype)).float().to(x.device)
    return torch.allclose(ya, yb, **_tol(x.dtype))


def check_verifier_norm(model: torch.nn.Module, v) -> None:
    """Refuse a draft whose frozen verifier_norm holds the verifier's weight but computes another function."""
    if not same_norm(model.verifier_norm, v.norm):
        raise DraftlabError(
            f"the draft's verifier_norm ({type(model.verifier_norm).__name__}) holds verifier {v.path}'s weight "
            f"but computes another function than its final norm ({type(v.norm).__name__}, {norm_gain(v.norm)}): "
            "its training targets would not be the verifier's logits. Load it through draftlab (build_draft, "
            "load_draft, checkpoint.reload), which matches them."
        )
