"""DFlash-2 through draftlab's stages on the tiny random verifier: build (full vocabulary whatever stage 01 mapped),
masks checked against their intent, a few CPU training steps, reload, drafting equal to speculators' training
forward, lossless speculative decoding, and the `speculators train` command its own CLI takes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from draftlab import DraftlabError
from draftlab.acceptance import draft_masks
from draftlab.acceptance import speculative as accept
from draftlab.acceptance.dflash2 import DFlash2Proposer
from draftlab.drafts.draft import build_draft

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("one_thread")]
IDS, T, WINDOW, BLOCK = [2, 4, 5], 12, 4, 4  # aux layers; parity: sequence, sliding window (shorter), block
PROMPTS = ["hello how are you today", "def add(a, b): return a + b"]


@pytest.fixture(scope="module")
def data(tiny, tmp_path_factory):
    """data/{train,eval} as notebook 01 writes them, train with a reduced-vocabulary mapping (d2t-64)."""
    from draftlab.data import dataset, extract, vocab

    from conftest import random_rows

    root = tmp_path_factory.mktemp("dflash2")
    for split, lengths, seed in (("train", [40, 25, 33, 18, 50, 29], 0), ("eval", [30, 22, 41], 1)):
        ds = dataset.save_split(random_rows(tiny.vocab_size, lengths, seed), tiny.tokenizer, root / split, 64)
        extract.extract(tiny, ds, root / split, IDS, progress=False)
        if split == "train":
            vocab.build_mapping(vocab.token_frequencies(ds, root / split), 64, tiny.vocab_size, root / split)
    return root


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Anything written under DRAFTLAB_HOME goes to the test's own folder, not the checkout."""
    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path / "home"))


def make(tiny, data, **kw):
    torch.manual_seed(0)
    return build_draft("dflash2", tiny, data / "train", **{"num_layers": 1, "block_size": BLOCK, **kw})


def test_build_takes_the_full_vocabulary_whatever_stage_01_mapped_and_says_why(tiny, data):
    from speculators.losses import resolve_loss_config

    d = make(tiny, data, draft_vocab_size=64)  # notebook 04 passes 01's size: the recipe wins for dflash2
    assert d.model.config.draft_vocab_size == tiny.vocab_size and d.model.d2t is None
    size, why = d.choices["draft vocab"]
    assert size == tiny.vocab_size and "full verifier vocabulary" in why and "64 asked for is overridden" in why
    assert {"local convolution", "candidate selector", "block attention", "mask token"} <= set(d.choices)
    assert d.train_kwargs["tv_loss_fn"] is resolve_loss_config("tv", "eager")["tv"][0]  # not the Triton kernel
    # read_data: a full-vocabulary build on data holding only d2t-64 needs no mapping, for any family
    e = build_draft("eagle3", tiny, data / "train", draft_vocab_size=tiny.vocab_size)
    assert e.model.config.draft_vocab_size == tiny.vocab_size and e.model.d2t is None
    with pytest.raises(DraftlabError, match="conv_kernel_size=2 exceeds block_size=1"):
        make(tiny, data, block_size=1)


def test_masks_pass_their_checks_and_wrong_masks_fail(tiny):
    from draftlab.masks import dflash2 as m2
    from draftlab.masks.checks import run_checks
    from draftlab.masks.common import synthetic_pack
    from draftlab.masks.families import checked

    pack = synthetic_pack([40, 30, 38], 128)
    cfg = SimpleNamespace(n_anchors=4, dflash_block_size=4, flex_block=128, seed=0)
    made, results = checked("dflash2", pack, cfg)
    assert [n for n, _ in made] == ["dflash2", "dflash2_conv"] and made[0][1].extra["non_causal"]
    assert results and all(r["passed"] for r in results), [r for r in results if not r["passed"]]
    doc, loss = pack["document_ids"], pack["loss_mask"]
    for window, non_causal in ((8, True), (8, False), (None, True)):  # the window bites; causal blocks; full layer
        view = m2.dflash2_mask(doc, loss, 4, 4, window, non_causal, seed=1)
        assert all(c["passed"] for c in run_checks(view, 128, n_points=None)), (window, non_causal)
    view = m2.dflash2_mask(doc, loss, 4, 4, 8, True, seed=1)
    a = int(view.extra["anchors"][0])
    assert a - 8 > int((doc[0] == doc[0, a]).nonzero()[0]), "the window cuts this anchor's context"
    view.dense = view.dense.clone()
    view.dense[0, a - 9] = True  # a base token before the window
    failed = {c["check"] for c in run_checks(view, 128, n_points=None) if not c["passed"]}
    assert "no query sees a base token outside its window before its anchor, or in another document" in failed
    assert "token mask == DFlash-2 intent exactly" in failed
    shifted = m2.conv_mask(4, 2, 16, 3, shift=1)  # slots numbered from row 1: blocks do not start at row 0
    failed = {c["check"] for c in run_checks(shifted, 128) if not c["passed"]}
    assert {"conv: no slot reads another block", "conv: slot p reads exactly slots p-1..p of its block"} <= failed


def test_trains_reloads_and_decodes_losslessly(tiny, data, tmp_path):
    from draftlab.acceptance.proposers import load_draft, make_proposer
    from draftlab.training.checkpoint import check_reload
    from draftlab.training.train import Settings, first_accuracy, position_accuracies, read_metrics, train

    d = make(tiny, data, draft_vocab_size=64)
    s = Settings(
        train_steps=3, learning_rate=3e-3, warmup_steps=1, pack_len=96, eval_every=3, checkpoint_every=3, n_anchors=8
    )
    folder = train(d, data, s, tmp_path / "run", resume=False, progress=False)
    recs = read_metrics(folder)
    losses = [r["loss"] for r in recs if r["split"] == "train"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and len(set(losses)) > 1
    last = [r for r in recs if r["split"] == "eval"][-1]
    acc = position_accuracies("dflash2", last)
    assert sorted(acc) == list(range(1, BLOCK)) and all(math.isfinite(x) for x in acc.values())
    assert math.isfinite(first_accuracy("dflash2", last)) and first_accuracy("dflash2", last) == acc[1]
    r = check_reload(d, folder / "final", data, s)
    assert r["identical tensors"] and r["identical outputs"], r
    loaded = load_draft(folder / "final", tiny)
    assert loaded.kind == "dflash2" and loaded.model.config.conv_kernel_size == 2
    prop = make_proposer(loaded, tiny.vocab_size)
    assert isinstance(prop, DFlash2Proposer)
    for p in PROMPTS:
        ids = tiny.tokenizer(p)["input_ids"]
        g = accept.speculative_generate(tiny, prop, ids, 3, 16)
        x = torch.tensor([ids])
        want = tiny.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False)
        eos = tiny.tokenizer.eos_token_id
        want = want[0, len(ids) :].tolist()
        assert g.tokens == (want[: want.index(eos) + 1] if eos in want else want), p
        assert max(st.drafted for st in g.steps) == 3
    sampled = accept.speculative_generate(tiny, prop, ids, 3, 16, temperature=1.0, seed=3)
    assert len(sampled.tokens) == 16 or sampled.tokens[-1] == tiny.tokenizer.eos_token_id


def _parity_draft(tiny):
    """2 layers (sliding with a window shorter than the context, then full), block 4, weights drawn large
    everywhere (layers, fc, convolutions, selector), so every input path shows in the outputs."""
    from speculators.train.cli import create_transformer_layer_config

    layer = create_transformer_layer_config(str(tiny.path), 2, "qwen3", None, WINDOW, [1])
    d = build_draft("dflash2", tiny, None, layer_ids=IDS, layer_config=layer, block_size=BLOCK)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in [*d.model.layers.parameters(), d.model.fc.weight]:
            p.normal_(0, 0.3)
        for p in d.model.candidate_selector.parameters():
            p.normal_(0, 0.5)
    d.model.eval()
    return d


def _training(d, aux, x, loss_mask, max_anchors):
    """What speculators' training forward hands the selector: unary logits, states, predecessors, candidates."""
    sel, got = d.model.candidate_selector, {}
    real = sel.score_candidates

    def spy(unary, hidden, pred, cand):
        got.update(unary=unary[0], hidden=hidden[0], pred=pred[0], cand=cand[0])
        return real(unary, hidden, pred, cand)

    n = len(x)
    batch = {
        "hidden_states": aux[None, :n],
        "input_ids": x[None],
        "loss_mask": loss_mask[None],
        "verifier_last_hidden_states": torch.randn(1, n, d.verifier.hidden_size, generator=torch.Generator()),
        "document_ids": torch.zeros(1, n, dtype=torch.long),
    }
    sel.score_candidates = spy
    try:
        with torch.no_grad():
            d.model(**batch, **{**d.train_kwargs, "max_anchors": max_anchors})
    finally:
        del sel.score_candidates
    return got


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest |difference| relative to the reference's scale (selector scores reach ~40 with these weights)."""
    return (got - want).abs().max().item() / max(1.0, want.abs().max().item())


def dflash2_gaps(d, predecessor="chosen") -> tuple[float, float]:
    """(A) largest relative |diff| of unary logits, states and selector scores between every anchor of one training
    forward and the proposer's block at that anchor, fed training's predecessors; (B) per anchor, the greedy chain
    drafted (`predecessor="anchor"`: a wrong one, the anchor at every slot), then training on that chain: largest
    relative |diff| of the selector's scores on the drafted candidates, inf where training would choose otherwise."""
    g = torch.Generator().manual_seed(0)
    aux = torch.randn(T + BLOCK + 1, len(IDS) * d.verifier.hidden_size, generator=g)
    x = torch.randint(4, d.verifier.vocab_size, (T,), generator=g)
    want, sel = _training(d, aux, x, torch.ones(T), T - BLOCK), d.model.candidate_selector
    prop, gap_a, gap_b = DFlash2Proposer(d.model, d.verifier.vocab_size), 0.0, 0.0
    with torch.no_grad():
        for a in range(1, T - BLOCK):
            prop.reset([])
            prop.update(aux[:a], a)
            hidden = prop.block_hidden(int(x[a]))
            s = slice(a * BLOCK, (a + 1) * BLOCK)
            pred = want["pred"][s]
            assert pred[1:].tolist() == x[a : a + BLOCK - 1].tolist()  # slot p's predecessor: the token before it
            scores = sel.score_candidates(d.model.lm_head(hidden)[1:], hidden[1:], pred[1:], want["cand"][s][1:])
            ref = sel.score_candidates(want["unary"][s][1:], want["hidden"][s][1:], pred[1:], want["cand"][s][1:])
            pairs = [(d.model.lm_head(hidden), want["unary"][s]), (hidden, want["hidden"][s]), (scores, ref)]
            gap_a = max(gap_a, *(_rel(got, ref) for got, ref in pairs))
            forced = [int(x[a])] * (BLOCK - 1) if predecessor == "anchor" else None
            toks, cands, drafted = prop.chain(int(x[a]), BLOCK - 1, predecessors=forced)
            seq = torch.cat([x[: a + 1], torch.tensor(toks), x[:1]])  # one token after: the anchor is not the tail
            lm = torch.zeros(len(seq))
            lm[a] = 1
            got = _training(d, aux, seq, lm, 1)
            tf = sel.score_candidates(got["unary"][1:], got["hidden"][1:], got["pred"][1:], cands)
            same = cands.gather(1, tf.argmax(-1, keepdim=True))[:, 0].tolist() == toks
            gap_b = max(gap_b, _rel(drafted, tf) if same else math.inf)
    return gap_a, gap_b


def test_drafting_equals_speculators_training_forward_and_the_check_can_fail(tiny, monkeypatch):
    d = _parity_draft(tiny)
    assert d.model.sliding_window_non_causal and d.model.sliding_window == WINDOW
    gap_a, gap_b = dflash2_gaps(d)
    assert gap_a < 1e-5 and gap_b < 1e-5, (gap_a, gap_b)
    assert dflash2_gaps(d, predecessor="anchor")[1] > 1e-2  # the wrong predecessor: other scores or tokens
    monkeypatch.setattr(draft_masks, "_per_layer", lambda model, make: [make(None)] * len(model.layers))
    assert dflash2_gaps(d)[0] > 1e-2  # every layer drafted under the full mask: the window ignored
    monkeypatch.setattr(d.model.config, "sample_from_anchor", True)  # its anchor slot predicts too: refused
    with pytest.raises(DraftlabError, match="dflash2 draft trained with sample_from_anchor=True"):
        DFlash2Proposer(d.model, tiny.vocab_size)


def test_speculators_cli_takes_the_torchrun_flags_and_builds_the_same_draft(tiny, data, tmp_path):
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig
    from speculators.train.config.resolution import build_parser

    from draftlab.acceptance.proposers import load_draft
    from draftlab.training.launch import torchrun_command
    from draftlab.training.train import Settings

    s = Settings(train_steps=4, pack_len=96, n_anchors=8, eval_every=4, checkpoint_every=4)
    cmd = torchrun_command(make(tiny, data, draft_vocab_size=64), data, s, nproc=1, save_path=tmp_path / "save")
    flags = cmd[cmd.index("speculators.train") + 1 :]
    assert "--draft-vocab-size" not in flags and "--d2t-path" not in flags
    cfg = TrainConfig.resolve(flags)
    assert cfg.speculator_type == "dflash2" and cfg.dflash.block_size == BLOCK and cfg.data.max_anchors == 8
    assert (cfg.dflash2.conv_kernel_size, cfg.dflash2.selector_top_k) == (2, 16)
    with pytest.raises(SystemExit):
        build_parser().parse_args([*flags, "--selector-top-kk", "3"])
    main(TrainConfig.resolve([*flags, "--dry-run"]))
    loaded = load_draft(tmp_path / "save", tiny)
    assert loaded.kind == "dflash2" and loaded.model.config.draft_vocab_size == tiny.vocab_size
    assert sorted(p.name for p in (data / "train").glob("d2t-*.npy")) == ["d2t-64.npy"]  # nothing written into 01's
