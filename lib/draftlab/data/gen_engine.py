"""Which engine writes stage 01's answers, in which dtype, and what it cost (`generate.Engine`).

`engine`: "hf" (transformers' generate), "vllm" (a `vllm serve` of the verifier that draftlab starts
and stops; `draftlab.generate_vllm`), or "auto": vllm where the vLLM environment works
(`serve.unavailable()` is None) and can serve this verifier, else hf with the reason printed.
`gen_dtype`: "auto" is the dtype the verifier is loaded in, the one that writes the hidden states.
"""

from __future__ import annotations

from typing import Self

from draftlab import DraftlabError

ENGINES = ("auto", "hf", "vllm")
GEN_DTYPES = ("auto", "float32", "bfloat16")


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def eos_ids(verifier) -> set[int]:
    eos = getattr(verifier.model.generation_config, "eos_token_id", None)
    eos = eos if isinstance(eos, list) else [eos]
    return {int(e) for e in [*eos, verifier.tokenizer.eos_token_id] if e is not None}


def new_tokens(ids: list[int], eos: set[int]) -> int:
    """Tokens an answer generated: up to and with the first end-of-sequence token (padding after it is not)."""
    return next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))


class Engine:
    """Which engine writes the answers, in which dtype, and what it cost. Owns the vLLM server: started
    on first use (a run that resumes everything starts none), stopped by `close()` / the `with` block
    on every path, errors and interrupts included."""

    def __init__(self, verifier, engine: str = "auto", gen_dtype: str = "auto", log_path=None):
        if engine not in ENGINES:
            raise DraftlabError(f"engine={engine!r}: pick one of {list(ENGINES)}.")
        if gen_dtype not in GEN_DTYPES:
            raise DraftlabError(f"gen_dtype={gen_dtype!r}: pick one of {list(GEN_DTYPES)}.")
        self.verifier, self.requested, self.log_path = verifier, engine, log_path
        self.dtype = dtype_name(verifier.dtype) if gen_dtype == "auto" else gen_dtype
        self.name, self.reason = engine, None
        if engine == "auto":
            from draftlab.serving.command import unavailable, vllm_version

            why = unavailable()
            if not why and verifier.device.type == "cuda" and (vllm_version() or "").endswith("+cpu"):
                why = f"the vLLM environment is a CPU build ({vllm_version()}) and the verifier is on {verifier.device}"
            self.name = "hf" if why else "vllm"
            if why:
                self.reason = f"vLLM is unavailable: {why}"
                print(f"engine auto -> hf: {self.reason}", flush=True)
        self.server, self._hf = None, None
        self.stats = {
            "prompts generated": 0,
            "prompts resumed": 0,
            "new tokens": 0,
            "generation s": 0.0,
            "server start-up s": 0.0,
        }

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def fall_back(self, why: str) -> None:
        """engine="auto" only: the answers come from transformers after all."""
        self.close()
        self.name, self.reason = "hf", why
        print(f"engine auto -> hf: {why}", flush=True)

    def describe(self) -> str:
        how = "a vllm serve of the verifier" if self.name == "vllm" else "transformers generate"
        text = (
            f"answers: engine {self.name} ({how}) in {self.dtype}; hidden states: the verifier as loaded, "
            f"{dtype_name(self.verifier.dtype)}"
        )
        return text + (f"\nengine {self.requested} -> {self.name}: {self.reason}" if self.reason else "")

    def summary(self) -> dict:
        s = self.stats
        return {
            "engine": self.name,
            "engine requested": self.requested,
            "engine reason": self.reason,
            "answers dtype": self.dtype,
            "hidden states dtype": dtype_name(self.verifier.dtype),
            **s,
            "generation s": round(s["generation s"], 2),
            "server start-up s": round(s["server start-up s"], 2),
            "tokens/s": round(s["new tokens"] / s["generation s"], 1) if s["generation s"] else None,
        }

    def vllm_server(self, max_len: int):
        """The running server, (re)started when it is not up or its max_model_len is shorter than `max_len`."""
        from draftlab.serving.server import Server

        if self.server is not None and self.server.max_model_len >= max_len:
            return self.server
        self.close()
        v = self.verifier
        gpu = None
        if v.device.type == "cuda":  # one server beside this kernel on the GPU: its share, said in the summary
            from draftlab.serving.gpu_memory import cuda_share, weights_bytes

            gpu = cuda_share(v.device, 1, weights_bytes(v.path))
            self.stats["server GPU share"] = gpu.why
            print(gpu.why, flush=True)
        # vLLM's CPU build cannot step a seeded request's generator back where it drops the token of a prefill it cut
        # in two ('CPU Generator does not use offset': its engine died on sampled answers to 120 long prompts at once,
        # 2026-12-06), so there no prefill is cut: each is scheduled whole, within a budget that holds the longest.
        whole = ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(max_len, 8192))]
        s = Server(
            v.path,
            dtype=self.dtype,
            device=str(v.device),
            max_model_len=max_len,
            log_path=self.log_path,
            gpu=gpu,
            extra_args=whole if v.device.type == "cpu" else (),
        )
        s.start()
        self.server = s
        self.stats["server start-up s"] += s.startup_s
        return s

    def hf_verifier(self):
        """The verifier itself, or a copy of it in gen_dtype when that differs from its own."""
        v = self.verifier
        if self.dtype == dtype_name(v.dtype):
            return v
        if self._hf is None:
            from draftlab.data.verifier import load_verifier

            self._hf = load_verifier(v.path, device=str(v.device), dtype=self.dtype)
        return self._hf
