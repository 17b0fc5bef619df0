"""DSpark through draftlab's stages on the tiny random verifier: build, masks, training, reload, drafting.

DSpark is DFlash plus a Markov logit-bias head (each slot reads the token before the one it drafts) and a
confidence head, drafting from the anchor's own slot by default. Drafting resolves the slots in order; its logits
must equal speculators' training forward, captured at `compute_metrics` (the Markov bias is added after the
lm_head, so an lm_head hook would miss it).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from draftlab import DraftlabError
from draftlab.drafts.draft import build_draft
from draftlab.layout import RunLayout

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("one_thread")]
IDS, B, T, WINDOW = [2, 4, 5], 4, 12, 4  # aux layers, block size, parity sequence length, sliding window


@pytest.fixture(scope="module")
def home(tmp_path_factory, tiny):
    """Stage-01 data (rows, hidden states, d2t/t2d-64) made the way notebook 01 makes them."""
    from draftlab.data import dataset, extract, vocab

    from conftest import random_rows

    root = tmp_path_factory.mktemp("home")
    run = RunLayout("tiny", "test", root).data
    for split, lengths, seed in (("train", [40, 25, 33, 18, 50, 29], 0), ("eval", [30, 41], 1)):
        ds = dataset.save_split(random_rows(tiny.vocab_size, lengths, seed), tiny.tokenizer, run / split, max_length=64)
        extract.extract(tiny, ds, run / split, IDS, progress=False)
        if split == "train":
            vocab.build_mapping(vocab.token_frequencies(ds, run / split), 64, tiny.vocab_size, run / split)
    return root


@pytest.fixture
def data(home, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_HOME", str(home))
    return RunLayout("tiny", "test", home).data


def as_recipe(monkeypatch, **fields):
    """The dspark recipe with these fields (markov_rank, markov_head_type, sample_from_anchor) for this test."""
    from draftlab.drafts import dspark

    monkeypatch.setattr(dspark, "RECIPE", replace(dspark.RECIPE, **fields))


def make(tiny, data, seed=0, **kw):
    torch.manual_seed(seed)
    return build_draft("dspark", tiny, data / "train", **{"num_layers": 1, "block_size": B, **kw})


def test_build_says_its_choices_and_a_recipe_sets_the_heads(tiny, data, monkeypatch):
    from draftlab.drafts.recipe import recipe
    from draftlab.training.checkpoint import hparams

    d = make(tiny, data)
    c = d.model.config
    assert c.sample_from_anchor and c.speculators_config.proposal_methods[0].speculative_tokens == B
    assert d.choices["markov head"][0] == "vanilla, rank 256" and d.choices["sample from anchor"][0] is True
    assert "mask token" in d.choices and d.model.config.draft_vocab_size == 64
    assert d.model.markov_head.markov_w1.num_embeddings == tiny.vocab_size  # the verifier's vocabulary
    assert recipe("dspark").first_key == "position_0_acc"
    assert recipe("dspark").position_accuracies({"position_0_acc": 0.5, "position_3_acc": 0.1}) == {1: 0.5, 4: 0.1}
    as_recipe(monkeypatch, markov_rank=8, markov_head_type="rnn", sample_from_anchor=False)
    e = make(tiny, data)
    assert (e.model.config.markov_rank, e.model.config.markov_head_type, e.model.config.sample_from_anchor) == (
        8,
        "rnn",
        False,
    )
    assert "set by the recipe" in e.choices["markov head"][1] and recipe("dspark").first_key == "position_1_acc"
    diff = {k for k, v in hparams(d, {}).items() if hparams(e, {})[k] != v}
    assert diff == {"markov_rank", "markov_head_type", "sample_from_anchor"}


def test_masks_pass_their_checks_and_a_wrong_mask_fails():
    from types import SimpleNamespace

    from draftlab.masks import families
    from draftlab.masks.attention import FLEX
    from draftlab.masks.checks import run_checks
    from draftlab.masks.common import synthetic_pack
    from draftlab.masks.dspark import teaching_mask
    from draftlab.masks.packing import pack_length

    pack = synthetic_pack([40, 50, 21], 128)
    cfg = SimpleNamespace(n_anchors=6, dflash_block_size=B, flex_block=128, seed=1)
    made, checks = families.checked("dspark", pack, cfg)
    assert [n for n, _ in made] == ["dspark", "dspark_slots"]
    assert all(c["passed"] for c in checks), [c for c in checks if not c["passed"]]
    assert len(checks) == 7 + 7  # DFlash's attention checks, then the slots' own
    off = teaching_mask(pack["document_ids"], pack["loss_mask"], 6, B, False, 128, 1)
    assert all(c["passed"] for c in run_checks(off, 128))
    assert not off.dense[::B].any(), "without sample_from_anchor slot 0 (the anchor) is taught nothing"
    slots = made[1][1]
    slots.dense = torch.roll(slots.dense, -1, dims=1)  # each slot taught the token before its own: DFlash's shift
    failed = {c["check"] for c in run_checks(slots, 128) if not c["passed"]}
    assert "each scored slot is taught the token the rule names, no other slot" in failed
    att = made[0][1]
    att.dense = att.dense.clone()
    att.dense[0, int(att.extra["anchors"][0])] = True  # a block seeing its own anchor's base position
    assert not all(c["passed"] for c in run_checks(att, 128))
    assert pack_length(100, "dspark", FLEX)[0] == 100


def test_three_steps_reload_resume_refusal_and_lossless_drafting(tiny, data, tmp_path, monkeypatch):
    from draftlab.acceptance import speculative
    from draftlab.acceptance.dspark import DSparkProposer
    from draftlab.acceptance.evaluate import verifier_greedy
    from draftlab.acceptance.proposers import load_draft, make_proposer
    from draftlab.training.checkpoint import check_reload
    from draftlab.training.train import Settings, first_accuracy, position_accuracies, read_metrics, train

    s = Settings(
        train_steps=3, learning_rate=3e-3, warmup_steps=1, pack_len=96, eval_every=3, checkpoint_every=3, n_anchors=8
    )
    d = make(tiny, data)
    run = train(d, data, s, tmp_path / "run", progress=False)
    rec = read_metrics(run)
    losses = [r["loss"] for r in rec if r["split"] == "train"]
    assert len(losses) == 3 and all(map(math.isfinite, losses)) and len(set(losses)) == 3
    for r in rec:
        assert math.isfinite(first_accuracy("dspark", r)) and math.isfinite(r["confidence_loss"])
        acc = position_accuracies("dspark", r)
        assert sorted(acc) == [1, 2, 3, 4] and all(map(math.isfinite, acc.values()))
    r = check_reload(d, run / "final", data, s)
    assert r["identical tensors"] and r["identical outputs"] and r["loss"] == r["reloaded loss"]
    as_recipe(monkeypatch, markov_head_type="gated")
    with pytest.raises(DraftlabError, match="markov_head_type="):
        train(make(tiny, data), data, s, tmp_path / "run", resume=True, progress=False)

    loaded = load_draft(run / "final", tiny)
    prop = make_proposer(loaded, tiny.vocab_size)
    assert isinstance(prop, DSparkProposer) and loaded.model.config.markov_rank == 256
    for text in ("hello how are you today", "def add(a, b): return a + b"):
        ids = tiny.tokenizer(text)["input_ids"]
        g = speculative.speculative_generate(tiny, prop, ids, 6, 16)
        assert g.tokens == verifier_greedy(tiny, ids, 16), text
        assert max(st.drafted for st in g.steps) == B  # k=6 capped at the block: B drafts with the anchor's slot
    sampled = speculative.speculative_generate(tiny, prop, ids, 3, 16, temperature=1.0, seed=3)
    assert len(sampled.tokens) == 16 or sampled.tokens[-1] == tiny.tokenizer.eos_token_id


def _variant(tiny, data, monkeypatch, head, layers, full, n_vocab, sfa):
    """A dspark draft with these heads and attention kinds, its weights drawn large enough that what each slot
    reads shows in the logits."""
    from speculators.train.cli import create_transformer_layer_config

    as_recipe(monkeypatch, markov_rank=8, markov_head_type=head, sample_from_anchor=sfa)
    layer = create_transformer_layer_config(str(tiny.path), layers, "qwen3", None, WINDOW, full)
    d = build_draft(
        "dspark", tiny, data / "train" if n_vocab else None, layer_ids=IDS, block_size=B, layer_config=layer
    )
    m = d.model.eval()
    torch.manual_seed(1)
    for p in [*m.layers.parameters(), m.fc.weight, *m.markov_head.parameters()]:
        p.data.normal_(0, 0.3)
    return m


def training_logits(model, aux, x, v_last):
    """speculators' DSpark training forward over every anchor 0..T-B-1 (as many anchors as valid positions: it
    takes each, in order): its Markov-corrected logits [anchors * B, draft vocab], captured at compute_metrics."""
    import speculators.models.dspark.core as core
    from speculators.losses import resolve_loss_config

    got, real = {}, core.compute_metrics

    def spy(logits, *args, **kw):
        got["logits"] = logits[0].detach()
        return real(logits, *args, **kw)

    core.compute_metrics = spy
    try:
        with torch.no_grad():
            model(
                hidden_states=aux[None],
                input_ids=x[None],
                loss_mask=torch.ones(1, T),
                verifier_last_hidden_states=v_last[None],
                document_ids=torch.zeros(1, T, dtype=torch.long),
                loss_config=resolve_loss_config("kl_div", "eager"),
                tv_loss_fn=resolve_loss_config("tv", "eager")["tv"][0],
                max_anchors=T - B,
            )
    finally:
        core.compute_metrics = real
    return got["logits"]


def parity_gap(tiny, model, proposer_cls=None, greedy=False) -> tuple[float, bool]:
    """(largest |logit| difference between teacher-forced drafting and the training forward over every anchor
    a >= 1, whether each greedy block equals the training forward's argmax when fed the drafted tokens)."""
    from draftlab.acceptance.dspark import DSparkProposer

    g = torch.Generator().manual_seed(0)
    aux = torch.randn(T, len(IDS) * tiny.hidden_size, generator=g)
    x = torch.randint(4, tiny.vocab_size, (T,), generator=g)
    v_last = torch.randn(T, tiny.hidden_size, generator=g)
    want = training_logits(model, aux, x, v_last)
    prop, gap, same = (proposer_cls or DSparkProposer)(model, tiny.vocab_size), 0.0, True
    first = 0 if model.config.sample_from_anchor else 1
    with torch.no_grad():
        for a in range(1, T - B):
            prop.reset([])
            prop.update(aux[:a], a)
            _, got, _ = prop.draft_block(int(x[a]), B, forced=x[a + 1 :].tolist())
            gap = max(gap, (got - want[a * B : (a + 1) * B]).abs().max().item())
            if greedy:
                toks, _, _ = prop.draft_block(int(x[a]), B)
                x2 = x.clone()
                x2[a + 1 : a + 1 + len(toks)] = torch.tensor(toks)[: T - a - 1]
                idx = training_logits(model, aux, x2, v_last)[a * B : (a + 1) * B].argmax(-1)[first:]
                same &= (idx + prop.d2t[idx]).tolist()[: len(toks)] == toks
    return gap, same


@pytest.mark.parametrize(
    "head,layers,full,n_vocab,sfa",
    [("vanilla", 1, [], None, True), ("rnn", 2, [1], 64, True), ("gated", 2, [0, 1], None, False)],
)
def test_drafting_equals_the_training_forward(tiny, data, monkeypatch, head, layers, full, n_vocab, sfa):
    model = _variant(tiny, data, monkeypatch, head, layers, full, n_vocab, sfa)
    assert model.config.draft_vocab_size == (n_vocab or tiny.vocab_size)
    gap, greedy_ok = parity_gap(tiny, model, greedy=head == "vanilla")
    assert gap < 1e-4 and greedy_ok


def test_the_parity_check_fails_for_a_wrong_previous_token_or_no_markov_head(tiny, data, monkeypatch):
    from draftlab.acceptance.dspark import DSparkProposer

    class WrongShift(DSparkProposer):  # DFlash's shift under sample_from_anchor: slot k reads anchor+k-1
        def prev_slot(self, slot):
            return max(slot - 1, 0)

    class NoMarkov(DSparkProposer):  # the block's lm_head logits alone
        def draft_block(self, anchor, k, temperature=0.0, generator=None, forced=None):
            return [], self.block_logits(anchor), []

    model = _variant(tiny, data, monkeypatch, "vanilla", 1, [], None, True)
    assert parity_gap(tiny, model, WrongShift)[0] > 1e-2
    assert parity_gap(tiny, model, NoMarkov)[0] > 1e-2
    model.config.transformer_layer_config._attn_implementation = "simple_flex_attention"
    with pytest.raises(DraftlabError, match="attention 'simple_flex_attention'"):
        DSparkProposer(model, tiny.vocab_size)


def test_torchrun_flags_parse_with_speculators_own_cli_and_build_the_same_draft(tiny, data, tmp_path, monkeypatch):
    """Boolean options go as speculators' --x / --no-x flags; speculators' own `main` (--dry-run) builds the draft
    from them, and draftlab loads it with the heads the recipe set."""
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    from draftlab.acceptance.proposers import load_draft
    from draftlab.training.launch import torchrun_command
    from draftlab.training.train import Settings

    s = Settings(train_steps=4, pack_len=96, n_anchors=8)
    default = torchrun_command(make(tiny, data), data, s, nproc=2, save_path=tmp_path / "a")
    assert "--enable-confidence-head" in default and "--sample-from-anchor" not in default  # None: dspark's True
    as_recipe(monkeypatch, markov_rank=8, markov_head_type="rnn", sample_from_anchor=False)
    cmd = torchrun_command(make(tiny, data), data, s, nproc=1, save_path=tmp_path / "save")
    args = cmd[cmd.index("speculators.train") + 1 :]
    cfg = TrainConfig.resolve(args)
    assert cfg.speculator_type == "dspark" and cfg.dflash.block_size == B and cfg.data.max_anchors == 8
    assert (cfg.dspark.markov_rank, cfg.dspark.markov_head_type, cfg.dflash.sample_from_anchor) == (8, "rnn", False)
    assert cfg.dspark.enable_confidence_head and cfg.dspark.confidence_head_with_markov
    main(TrainConfig.resolve([*args, "--dry-run"]))
    d = load_draft(tmp_path / "save", tiny)
    c = d.model.config
    assert d.kind == "dspark" and (c.markov_rank, c.markov_head_type, c.sample_from_anchor) == (8, "rnn", False)
