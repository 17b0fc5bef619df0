"""The expanded verifier and draft (issue 48): a large model's shapes, the original's function, refused where not."""

from __future__ import annotations

import json

import pytest
import torch

from draftlab import DraftlabError
from draftlab.data import stand_in
from draftlab.data.expand import MARKER, expand
from draftlab.drafts.expand import expand_draft, never_accepted

from conftest import make_model, make_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = stand_in.Reference("Tiny-Ref", 64, 160, 9, 8, 4, 8, 1000, False)  # the tiny verifier's x2 wide, +1 layer
FP32 = 2e-6  # fp32: the padded sums round differently only at the last bits


@pytest.fixture
def tiny_ref(monkeypatch):
    monkeypatch.setitem(stand_in.REFERENCES, "tiny", TINY)


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("expand_src")
    tok = make_tokenizer()
    make_model(len(tok), layers=8, seed=3).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_the_expansion_keeps_every_logit_and_hidden_state_and_has_the_planned_size(verifier_dir, tiny_ref, tmp_path):
    from transformers import AutoModelForCausalLM

    p = stand_in.plan(verifier_dir, "tiny")
    assert (p.hidden_size, p.num_attention_heads, p.num_key_value_heads, p.intermediate_size) == (64, 8, 4, 160)
    assert p.num_hidden_layers == 9 and "expanded to Tiny-Ref's shape" in p.name
    out = expand(verifier_dir, "tiny", tmp_path / "x", dtype=torch.float32, device="cpu")
    assert json.loads((out / MARKER).read_text())["plan"]["parameters"] == p.parameters
    src = AutoModelForCausalLM.from_pretrained(verifier_dir, dtype=torch.float32).eval()
    big, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info  # no tensor missing, unexpected or mismatched
    assert sum(t.numel() for t in big.parameters()) == p.parameters
    ids = torch.randint(4, 300, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = src(ids, output_hidden_states=True), big.eval()(ids, output_hidden_states=True)
    assert torch.allclose(a.logits, b.logits, rtol=0, atol=FP32 * a.logits.abs().max())
    for i in range(8):  # the state entering each original layer: vLLM's aux layer ids
        real, pad = b.hidden_states[i][..., :32], b.hidden_states[i][..., 32:]
        assert torch.allclose(a.hidden_states[i], real, rtol=0, atol=FP32 * a.hidden_states[i].abs().max())
        assert torch.count_nonzero(pad) == 0, f"padded coordinates of state {i} are not exactly zero"
    assert expand(verifier_dir, "tiny", tmp_path / "x", dtype=torch.float32, device="cpu") == out  # reused


class Recording:
    """A proposer that keeps every proposal it makes."""

    def __init__(self, inner):
        self.inner, self.made = inner, []
        self.layer_ids, self.name = inner.layer_ids, inner.name

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, *a, **kw):
        p = self.inner.propose(*a, **kw)
        self.made.append(list(p.tokens))
        return p


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_the_expanded_draft_proposes_what_the_original_does(verifier_dir, tiny_ref, tmp_path, kind):
    from draftlab.acceptance.proposers import load_draft, make_proposer
    from draftlab.acceptance.speculative import speculative_generate
    from draftlab.data.verifier import load_verifier
    from draftlab.drafts.draft import build_draft

    torch.manual_seed(1)
    draft = tmp_path / "run" / "final"
    build_draft(kind, verifier_dir).model.save_pretrained(draft)
    big = expand(verifier_dir, "tiny", tmp_path / "x", dtype=torch.float32, device="cpu")
    big_draft = expand_draft(draft, big)
    cfg = json.loads((big_draft / "config.json").read_text())
    key = "eagle_aux_hidden_state_layer_ids" if kind == "eagle3" else "aux_hidden_state_layer_ids"
    assert cfg["transformer_layer_config"]["hidden_size"] == 64
    assert cfg[key] == json.loads((draft / "config.json").read_text())[key]  # the original's aux layers
    ids = make_tokenizer()("hello how are you today")["input_ids"]
    made = []
    for vdir, ddir in ((verifier_dir, draft), (big, big_draft)):
        v = load_verifier(vdir, device="cpu", dtype="float32")
        prop = Recording(make_proposer(load_draft(ddir, v), v.vocab_size))
        g = speculative_generate(v, prop, ids, 3, 24, eos_id=None)
        made.append((g.tokens, g.steps, prop.made))
    assert made[0] == made[1] and len(made[0][2]) > 5, "same text, steps and every proposed token"


@pytest.mark.parametrize(
    "model_type,why", [("gemma3_text", r"x\*\(1\+w\)"), ("qwen3", "q/k norms"), ("bert", "only the families")]
)
def test_a_family_the_rule_cannot_keep_is_refused_by_name(tmp_path, model_type, why):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(
        DraftlabError, match=f"model_type '{model_type}' cannot be expanded.*{why}.*llama, mistral, qwen2"
    ):
        stand_in.plan(tmp_path, "8b")


def test_bad_requests_are_refused_before_anything_is_written(verifier_dir, tiny_ref, tmp_path, monkeypatch):
    small = stand_in.Reference("Smaller", 16, 32, 2, 2, 1, 8, 1000, False)
    monkeypatch.setitem(stand_in.REFERENCES, "small", small)
    with pytest.raises(DraftlabError, match="is smaller than the verifier.*Choose a larger one"):
        stand_in.plan(verifier_dir, "small")
    with pytest.raises(DraftlabError, match="like='70b': choose one of"):
        stand_in.plan(verifier_dir, "70b")
    import collections
    import shutil

    full = collections.namedtuple("u", "total used free")(10**9, 10**9, 1000)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: full)
    with pytest.raises(
        DraftlabError, match="the expansion's weights need about .* GiB on disk and .* has 0.00 GiB free"
    ):
        expand(verifier_dir, "tiny", tmp_path / "x", dtype=torch.float32, device="cpu")
    assert list(tmp_path.iterdir()) == [], "nothing written"
    (tmp_path / "half").mkdir()
    with pytest.raises(DraftlabError, match="has no expansion.json: it is not a whole expansion"):
        expand(verifier_dir, "tiny", tmp_path / "half", dtype=torch.float32, device="cpu")


def test_smollm2_plans_name_what_they_stand_in_for():
    from draftlab.data.verifier_dir import resolve_verifier

    smol = resolve_verifier("smollm2")
    big, one = stand_in.plan(smol, "8b"), stand_in.plan(smol, "1b")
    assert (big.hidden_size, big.num_attention_heads, big.num_key_value_heads, big.intermediate_size) == (
        4032,
        63,
        21,
        14336,
    )
    assert big.num_hidden_layers == 32 and big.name.startswith("SmolLM2-135M-Instruct expanded to Llama-3.1-8B's shape")
    assert one.num_hidden_layers == 30 and one.num_attention_heads % 3 == 0 and one.hidden_size >= 576
    assert 0.8 < big.parameters / big.reference_parameters < 1.0  # SmolLM2's smaller vocabulary: fewer lm_head weights


def test_vllm_serves_the_expansion_with_its_draft_and_writes_the_originals_greedy_text(
    serve_verifier, tmp_path, monkeypatch
):
    """vLLM CPU, fp32: the tiny expansion alone and with its widened EAGLE-3 writes the original's greedy text."""
    from draftlab.acceptance import served
    from draftlab.acceptance.evaluate import verifier_greedy
    from draftlab.data.generate import _chat_ids
    from draftlab.data.verifier import load_verifier
    from draftlab.drafts.draft import build_eagle3

    # serve_dir's shape (hidden 64, 2 heads of 32) twice as wide, one more layer: vLLM CPU's attention takes head_dim 32
    monkeypatch.setitem(
        stand_in.REFERENCES, "served", stand_in.Reference("Served-Ref", 128, 256, 9, 4, 4, 32, 1000, False)
    )
    draft = tmp_path / "eagle3" / "final"
    build_eagle3(serve_verifier.path).model.save_pretrained(draft)
    big = expand(serve_verifier.path, "served", tmp_path / "x", dtype=torch.float32, device="cpu")
    big_draft = expand_draft(draft, big)
    v = load_verifier(big, device="cpu", dtype="float32")
    rows = [
        {"id": f"p{i}", "source": "chat", "text": t} for i, t in enumerate(["hello how are you today", "print('hi')"])
    ]
    prompts = [{**r, "ids": _chat_ids(v.tokenizer, r)} for r in rows]
    refs = [verifier_greedy(serve_verifier, p["ids"], 12) for p in prompts]  # the original's own greedy text
    got = served.measure(v, {"eagle3": big_draft}, prompts, 3, 12, tmp_path, concurrency=(1,))
    assert got["available"], got
    for kind in ("verifier alone", "eagle3"):
        assert [o["token_ids"] for o in got["runs"][kind]["outputs"]] == refs, kind
    assert (
        got["runs"]["eagle3"]["drafts"] > 0
        and got["runs"]["eagle3"]["aux_layers_logged"] == got["runs"]["eagle3"]["aux_layers_checkpoint"]
    )
    # the same draft never accepted (its d2t moved by one id), the speculative step's fixed cost check: vLLM serves
    # it, nothing it proposes is accepted, and the text is still the original's
    never = never_accepted(big_draft, tmp_path / "never")
    got = served.measure(v, {"eagle3": never}, prompts, 3, 12, tmp_path / "served-never", concurrency=(1,))
    run = got["runs"]["eagle3"]
    assert [o["token_ids"] for o in run["outputs"]] == refs and run["drafts"] > 0, sorted(run)
    assert run["accepted"] == 0, {k: run[k] for k in run if not isinstance(run[k], list)}
