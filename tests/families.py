"""The family matrix: one tiny random verifier per model family, and draftlab's public pipeline run on each.

Every verifier is built offline from transformers' own config class (7 layers, hidden 64, the shared
test tokenizer's vocabulary) and saved with save_pretrained + tokenizer: a local HF causal-LM
directory, as a researcher brings one. `run_family` goes through what notebooks 01, 03, 04 and 05
call and returns one cell per stage; tests/test_families.py asserts them and renders the table of docs/verifiers.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftlab.layout import RunLayout

CELLS = ("extraction", "draft", "train", "loop", "vLLM")
OK = "✓"
K, N_NEW = 3, 16
TRAIN_TEXTS = [
    "hello how are you today",
    "what is the capital of france",
    "def add(a, b): return a + b",
    "the quick brown fox jumps over the lazy dog",
    "print('hello world')",
    "i am fine thank you",
]
EVAL_TEXTS = ["for i in range(10): print(i)", "speculative decoding drafts tokens that a verifier accepts"]


@dataclass(frozen=True)
class Family:
    label: str  # the first column of docs/verifiers.md's table
    config: Callable | None = None  # (tokenizer) -> a transformers config; None for a wrapper
    wraps: str | None = None  # a wrapper (text_config + `language_model.` prefix) around this family
    refused: dict[str, str] = field(default_factory=dict)  # cell -> regex of the DraftlabError expected there
    serve: bool = False  # served by vLLM in `make test` (each server costs about a minute here)
    vllm: str | None = None  # regex of vLLM's reason when it cannot serve the family (None: it must serve it)


def _base(tok, **kw) -> dict:
    ids = dict(eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    return {
        **dict(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=7,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=512,
            tie_word_embeddings=False,
        ),
        **ids,
        **kw,
    }


def _cfg(name: str, **kw):
    def make(tok):
        import transformers

        return getattr(transformers, name)(**_base(tok, **kw))

    return make


def _gpt2(tok):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=len(tok),
        n_embd=64,
        n_layer=7,
        n_head=2,
        n_positions=512,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id,
    )


LAYERNORM = "final norm is a LayerNorm"
UNKNOWN_WRAPPER = (
    "model type `acme_vl` but Transformers does not recognize this architecture"  # vLLM loads the wrapper as it is
)
FAMILIES: dict[str, Family] = {
    "llama": Family("Llama", _cfg("LlamaConfig")),
    "qwen2": Family("Qwen2 (qkv bias)", _cfg("Qwen2Config")),
    "qwen3": Family("Qwen3 (head_dim 64 ≠ hidden/heads)", _cfg("Qwen3Config", head_dim=64), serve=True),
    "mistral": Family("Mistral (sliding window 8)", _cfg("MistralConfig", sliding_window=8)),
    "gemma3": Family(
        "Gemma-3 (sliding 8, tied, 1+w norm, scaled embeddings)",
        _cfg(
            "Gemma3TextConfig",
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            sliding_window=8,
            tie_word_embeddings=True,
        ),
        vllm=r"Model does not support EAGLE3 interface",
    ),
    "qwen3_moe": Family(
        "Qwen3-MoE (4 experts, top 2)",
        _cfg("Qwen3MoeConfig", head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    ),
    "deepseek_v3": Family(
        "DeepSeek-V3 (MLA, MoE after 1 dense layer)",
        _cfg(
            "DeepseekV3Config",
            num_key_value_heads=2,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_rope_head_dim=32,
            qk_nope_head_dim=32,
            v_head_dim=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            topk_method="noaux_tc",
        ),  # as real checkpoints say; vLLM reads it, transformers 5.19 omits it
        vllm=r"expect weight to be bfloat16, float16, int8",
    ),  # vLLM's CPU MLA backend (amx_mla) takes bf16 only; the matrix runs fp32
    "phi3": Family("Phi-3 (partial rotary 0.5)", _cfg("Phi3Config", partial_rotary_factor=0.5)),
    "gpt2": Family("GPT-2 (learned positions, LayerNorm)", _gpt2, refused={"draft": LAYERNORM}),
    "nested_qwen3": Family("wrapper around Qwen3", wraps="qwen3", vllm=UNKNOWN_WRAPPER),
    "nested_gemma3": Family("wrapper around Gemma-3", wraps="gemma3", vllm=UNKNOWN_WRAPPER),
}


def build_dir(name: str, root: Path) -> Path:
    """Save family `name`'s tiny random verifier (seed 0) under root/name; a wrapper repackages its family's."""
    from transformers import AutoModelForCausalLM

    from conftest import make_tokenizer

    fam, path = FAMILIES[name], Path(root) / name
    if (path / "config.json").exists():
        return path
    if fam.wraps:
        return wrap(build_dir(fam.wraps, root), path)
    tok = make_tokenizer()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(fam.config(tok)).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path


def wrap(inner: Path, path: Path) -> Path:
    """A multimodal-style wrapper: the text config under text_config, weights under `language_model.`, a vision part."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    path.mkdir(parents=True)
    cfg = {
        "architectures": ["AcmeVLForConditionalGeneration"],
        "model_type": "acme_vl",
        "text_config": json.loads((inner / "config.json").read_text()),
        "vision_config": {"hidden_size": 8},
    }
    (path / "config.json").write_text(json.dumps(cfg))
    state = {f"language_model.{k}": v for k, v in load_file(inner / "model.safetensors").items()}
    state["vision_tower.norm.weight"] = torch.ones(8)  # a second "norm.weight" suffix for speculators to trip on
    save_file(state, path / "model.safetensors")
    AutoTokenizer.from_pretrained(inner).save_pretrained(path)
    return path


def text_of(name: str) -> str:
    """The wrapped family's name, or the family's own."""
    return FAMILIES[name].wraps or name


def refusal(name: str, cell: str, err: Exception) -> str:
    """'refused: <reason>' for the DraftlabError expected in this cell (vLLM's: 'not served: <its cause>');
    anything else is re-raised."""
    from draftlab import DraftlabError

    fam = FAMILIES[name]
    want = fam.vllm if cell == "vLLM" else fam.refused.get(cell)
    if not (isinstance(err, DraftlabError) and want and re.search(want, str(err))):
        raise err
    return f"not served: {re.search(want, str(err)).group(0)}" if cell == "vLLM" else f"refused: {want}"


# ---- the pipeline, stage by stage, through the functions the notebooks call ----------------------------------


def chat_prompts(v, texts: list[str]) -> list[dict]:
    from draftlab.data.generate import _chat_ids

    rows = [{"id": f"p{i}", "source": "chat", "text": t} for i, t in enumerate(texts)]
    return [{**r, "ids": _chat_ids(v.tokenizer, r)} for r in rows]


@torch.no_grad()
def check_slots(v, ids: list[int], layer_ids: list[int], got: torch.Tensor) -> None:
    """Each slot of `got` [T, n+1, H] is the verifier's own hidden state at that id (HF's output_hidden_states:
    entry i enters layer i, entry L is after the final norm), and the last slot gives the verifier's logits."""
    out = v.model(torch.tensor([ids], device=v.device), output_hidden_states=True)
    ref = out.hidden_states
    assert len(ref) == v.num_layers + 1, f"{len(ref)} hidden states for {v.num_layers} layers"
    for k, i in enumerate(layer_ids):
        torch.testing.assert_close(got[:, k], ref[i][0], msg=lambda m, i=i: f"slot of layer id {i}: {m}")
    torch.testing.assert_close(v.norm(got[:, -1]), ref[-1][0], msg=lambda m: f"final slot, normed: {m}")
    torch.testing.assert_close(v.lm_head(v.norm(got[:, -1])), out.logits[0], msg=lambda m: f"final slot -> logits: {m}")


def extraction(v, run: Path) -> list[int]:
    """Stage 01: every layer id read right; then data/runs/<name>/{train,eval} as notebook 01 writes them, from the
    chat-template prompts and the verifier's own greedy answers (as token ids: a random model's byte tokens do not
    survive decoding to text and back)."""
    from draftlab.acceptance.evaluate import verifier_greedy
    from draftlab.data import dataset, extract, hooks, vocab

    probe = chat_prompts(v, TRAIN_TEXTS[3:4])[0]["ids"]
    every = list(range(v.num_layers))
    check_slots(v, probe, every, hooks.hidden_states(v, [probe], every)[0])
    rows = {}
    for split, texts in (("train", TRAIN_TEXTS), ("eval", EVAL_TEXTS)):
        pairs = [(p["ids"], verifier_greedy(v, p["ids"], N_NEW)) for p in chat_prompts(v, texts)]
        rows[split] = {
            "input_ids": [q + a for q, a in pairs],
            "loss_mask": [[0] * len(q) + [1] * len(a) for q, a in pairs],
        }
    ids = extract.default_layer_ids(v.num_layers)
    for split in ("train", "eval"):
        ds = dataset.save_split(rows[split], v.tokenizer, run / split, 64)
        extract.extract(v, ds, run / split, ids, progress=False)
        if split == "train":
            vocab.build_mapping(vocab.token_frequencies(ds, run / split), 128, v.vocab_size, run / split)
    sample = extract.load_sample(run / "train", 0)
    check_slots(v, sample["token_ids"].tolist(), ids, sample["hidden_states"])
    return ids


@torch.no_grad()
def check_targets(d, run: Path) -> None:
    """The draft rebuilds the verifier's logits from the final slot (speculators' training targets): its frozen
    verifier_norm and verifier_lm_head compute what the verifier's norm and lm_head do, on the draft's vocabulary."""
    from draftlab.data import extract

    v, m = d.verifier, d.model
    last = extract.load_sample(run / "train", 0)["hidden_states"][:, -1].to(v.device, v.dtype)
    rows = torch.arange(m.draft_vocab_size, device=v.device) + (m.d2t.to(v.device) if m.d2t is not None else 0)
    torch.testing.assert_close(
        m.verifier_lm_head(m.verifier_norm(last)),
        v.lm_head(v.norm(last))[:, rows],
        msg=lambda e: f"{d.kind}: the draft's verifier logits differ from the verifier's: {e}",
    )


def drafts(v, run: Path) -> dict:
    """Stage 03: EAGLE-3 and DFlash built through speculators and draftlab's checks, for this verifier's data."""
    from draftlab.drafts.draft import build_dflash, build_eagle3

    torch.manual_seed(0)
    out = {
        "eagle3": build_eagle3(v, run / "train", num_layers=1),
        "dflash": build_dflash(v, run / "train", num_layers=1, block_size=4),
    }
    for d in out.values():
        check_targets(d, run)
    return out


def training(built: dict, run: Path, run_name: str = "families") -> dict[str, Path]:
    """Stage 04: two optimizer steps each (finite loss, weights moved), then final/ reloaded with identical outputs."""
    import math

    from draftlab.training.checkpoint import check_reload
    from draftlab.training.train import Settings, read_metrics, train

    s = Settings(
        train_steps=2, learning_rate=1e-3, warmup_steps=1, pack_len=128, eval_every=2, checkpoint_every=2, n_anchors=8
    )
    finals = {}
    for kind, d in built.items():
        before = {n: p.detach().clone() for n, p in d.model.named_parameters() if p.requires_grad}
        folder = train(d, RunLayout(run.name, run_name, run.parents[2]), s, progress=False)  # run: data/runs/<name>
        losses = [r["loss"] for r in read_metrics(folder)]
        assert len(losses) == 3 and all(math.isfinite(x) for x in losses), f"{kind}: losses {losses}"
        moved = [n for n, p in d.model.named_parameters() if n in before and not torch.equal(p, before[n])]
        assert moved, f"{kind}: two steps changed no trainable weight"
        r = check_reload(d, folder / "final", run, s)
        assert r["identical tensors"] and r["identical outputs"], f"{kind}: reload {r}"
        finals[kind] = folder / "final"
    return finals


def loop(v, finals: dict[str, Path]) -> dict:
    """Stage 05: each reloaded draft in draftlab's speculative loop gives the verifier's own greedy `generate`."""
    from draftlab.acceptance.evaluate import run_prompts, summarize, verifier_greedy
    from draftlab.acceptance.proposers import load_draft, make_proposer

    prompts = chat_prompts(v, EVAL_TEXTS)
    refs = [verifier_greedy(v, p["ids"], N_NEW) for p in prompts]
    out = {"prompts": prompts, "refs": refs}
    for kind, path in finals.items():
        gens = run_prompts(v, make_proposer(load_draft(path, v), v.vocab_size), prompts, K, N_NEW)
        assert [g.tokens for g in gens] == refs, f"{kind}: the speculative loop's greedy output differs from generate"
        assert sum(s.drafted for g in gens for s in g.steps) > 0, f"{kind}: nothing was drafted"
        out[kind] = summarize(gens, K)["all"]
    return out


def served(v, run: Path) -> str:
    """vLLM serving the verifier with an EAGLE-3 draft trained on its own answers (so that drafts are accepted):
    the verifier's greedy text, the checkpoint's aux layers, and a tau within compare.GAP_WARN of draftlab's loop
    on the same prompts and k. A family vLLM cannot serve raises DraftlabError with vLLM's root cause."""
    from draftlab.acceptance import compare
    from draftlab.acceptance import served as sv
    from draftlab.acceptance.evaluate import run_prompts, summarize, verifier_greedy
    from draftlab.acceptance.proposers import load_draft, make_proposer
    from draftlab.drafts.draft import build_eagle3
    from draftlab.serving import counters
    from draftlab.serving.server import Server
    from draftlab.training.train import Settings, train

    torch.manual_seed(0)
    s = Settings(train_steps=60, learning_rate=3e-3, warmup_steps=5, pack_len=128, eval_every=60, checkpoint_every=60)
    served_run = RunLayout(run.name, "families-served", run.parents[2])  # run: data/runs/<name>
    final = train(build_eagle3(v, run / "train", num_layers=1), served_run, s, progress=False) / "final"
    prompts = chat_prompts(v, TRAIN_TEXTS[:3])
    refs = [verifier_greedy(v, p["ids"], N_NEW) for p in prompts]
    mine = summarize(run_prompts(v, make_proposer(load_draft(final, v), v.vocab_size), prompts, K, N_NEW), K)["all"]
    assert mine["tau"] > 1.2, f"the served check needs accepted drafts: draftlab's tau is {mine['tau']:.2f}"
    with Server(v.path, final, K, log_path=run / "vllm.log", max_model_len=256) as srv:
        assert srv.logged_aux_layers() == srv.draft_cfg["eagle_aux_hidden_state_layer_ids"]
        got = sv.workload(srv, prompts, N_NEW)
    assert [o["token_ids"] for o in got["outputs"]] == refs, (
        "vLLM's greedy output with the draft differs from the verifier's"
    )
    tau = counters.served_metrics(got["counts"])["tau"]
    assert abs(tau / mine["tau"] - 1) <= compare.GAP_WARN, f"vLLM tau {tau:.3f}, draftlab {mine['tau']:.3f}"
    return f"{OK} greedy identical, tau within {compare.GAP_WARN:.0%}"


def draft_family(v, run: Path, kind: str) -> dict[str, str]:
    """Issue 32: draft family `kind` on this verifier's stage-01 data through stages 03-05 (build, two steps and
    reload, draftlab's loop equal to `generate`), then vLLM: served (greedy identical to the verifier's, drafts
    counted) or refused before any server starts, in vLLM's words. Returns {stage: cell}; a refusal by name is a
    cell, anything else raises."""
    from draftlab import DraftlabError
    from draftlab.acceptance import served as sv
    from draftlab.acceptance.evaluate import verifier_greedy
    from draftlab.drafts.draft import build_draft
    from draftlab.families import family
    from draftlab.serving.command import unavailable
    from draftlab.serving.server import Server

    torch.manual_seed(0)
    try:
        d = build_draft(kind, v, run / "train", num_layers=1, block_size=4)
    except DraftlabError as e:
        assert family(kind, take=False).refused and kind in str(e), e
        return {"draft": f"refused: {family(kind, take=False).title}", "vLLM": "–"}
    check_targets(d, run)
    final = training({kind: d}, run, "draft-families")[kind]
    loop(v, {kind: final})
    cells = {"draft": OK, "train": OK, "loop": OK}
    if unavailable():
        return {**cells, "vLLM": f"no vLLM here: {unavailable()}"}
    prompts = chat_prompts(v, TRAIN_TEXTS[:2])
    try:
        with Server(v.path, final, K, log_path=run / f"vllm-{kind}.log", max_model_len=256) as srv:
            got = sv.workload(srv, prompts, N_NEW)
    except DraftlabError as e:
        why = family(kind).vllm_refused
        assert why and why in str(e), e
        return {**cells, "vLLM": "not served: " + why.split(" says ")[-1][:60]}
    assert [o["token_ids"] for o in got["outputs"]] == [verifier_greedy(v, p["ids"], N_NEW) for p in prompts]
    assert got["counts"]["drafts"] > 0, f"vLLM drafted nothing with the {kind} draft"
    return {**cells, "vLLM": f"{OK} greedy identical"}
