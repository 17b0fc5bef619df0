"""Drafting forward against speculators' own forward: every layer drafts under the mask it trained with.

Tiny random drafts over the tiny verifier, in the variants a training run can produce: a sliding window
shorter than the context, one layer and two (one sliding, one full), the full and a reduced draft
vocabulary; per variant the drafting logits at every position and chain step equal speculators'.
"""

from __future__ import annotations

import pytest
import torch

from draftlab import DraftlabError
from draftlab.acceptance import draft_masks
from draftlab.acceptance.dflash import DFlashProposer
from draftlab.acceptance.eagle3 import Eagle3Proposer

pytestmark = pytest.mark.usefixtures("one_thread")
T, WINDOW, STEPS, BLOCK = 12, 4, 3, 4  # sequence length, sliding window (shorter), TTT steps, DFlash block
VARIANTS = [  # (layers, full-attention layer indices, window, draft vocab: None for the verifier's)
    (1, [], WINDOW, None),
    (2, [1], WINDOW, 64),
    (2, [0, 1], WINDOW, None),  # all full attention: no window anywhere
]


@pytest.fixture(scope="module")
def vocab_dir(tiny, tmp_path_factory):
    """A stage-01 train folder with just what a reduced-vocabulary build reads: rows, manifest, d2t/t2d-64."""
    from draftlab.data import dataset, manifest, vocab

    from conftest import random_rows

    out = tmp_path_factory.mktemp("vocab") / "train"
    ds = dataset.save_split(random_rows(tiny.vocab_size, [40, 25]), tiny.tokenizer, out, max_length=64)
    ident = {"verifier_fingerprint": tiny.fingerprint, "hidden_size": tiny.hidden_size, "layer_ids": [2, 4, 5]}
    manifest.write(out, {**ident, "dtype": "float32"})
    vocab.build_mapping(vocab.token_frequencies(ds, out), 64, tiny.vocab_size, out)
    return out


def _draft(tiny, kind, layers, full, window, n_vocab, vocab_dir, **kw):
    """A draft built as `draftlab.drafts` builds one, with speculators' layer config for these attention kinds;
    its weights drawn large enough that what each position attends shows in the logits."""
    from speculators.train.cli import create_transformer_layer_config

    from draftlab.drafts.draft import build_draft

    arch = "llama" if kind == "eagle3" else "qwen3"
    layer = create_transformer_layer_config(str(tiny.path), layers, arch, None, window, full)
    data = vocab_dir if n_vocab else None
    d = build_draft(kind, tiny, data, layer_ids=[2, 4, 5], draft_vocab_size=n_vocab, layer_config=layer, **kw)
    torch.manual_seed(1)
    for p in [*d.model.layers.parameters(), d.model.fc.weight]:
        p.data.normal_(0, 0.3)
    return d.model.eval()


def _inputs(tiny, n_aux=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T + 1, n_aux * tiny.hidden_size, generator=g), torch.randint(
        4, tiny.vocab_size, (T + 1,), generator=g
    )


def _logits_of(model, call):
    """Every lm_head output during speculators' forward `call()`, in order (its forward returns no logits)."""
    got = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: got.append(out[0].detach()))
    try:
        with torch.no_grad():
            call()
    finally:
        hook.remove()
    return got


def eagle3_gap(tiny, model) -> float:
    """Largest |logit| difference between speculators' TTT forward (teacher-forced, as `shift_batch` aligns it)
    and the proposer's cached drafting of each row q and its chain steps fed the same tokens."""
    aux, x = _inputs(tiny)
    ids = x[1:]  # row t: token x[t+1] with the aux states of position t, position id t+1
    steps = _logits_of(
        model, lambda: model(aux[None, :T], ids[None], torch.zeros(1, T, dtype=torch.long), ttt_steps=STEPS)
    )
    prop, gap = Eagle3Proposer(model, tiny.vocab_size), 0.0
    with torch.no_grad():
        for q in range(T):
            prop.reset([])
            h = prop._rows(ids[: q + 1], prop._prep(aux[: q + 1]), 0, 0)[-1:]
            prop.n_real = q + 1
            for j in range(STEPS):
                logits, h = prop._head(h)
                gap = max(gap, (logits[0] - steps[j][q]).abs().max().item())
                tok = ids[q + j + 1 : q + j + 2] if q + j + 1 < T else torch.zeros(1, dtype=torch.long)
                h = prop._rows(tok, h, q + j + 1, j + 1)  # TTT step j+1 is fed training's shifted token
    return gap


def dflash_gap(tiny, model) -> float:
    """Largest |logit| difference between speculators' anchored-block forward (every anchor 0..T-B-1) and the
    proposer's block at each anchor a >= 1 over the context states before it."""
    aux, x = _inputs(tiny)
    batch = {
        "hidden_states": aux[None, :T],
        "input_ids": x[None, :T],
        "loss_mask": torch.ones(1, T),
        "verifier_last_hidden_states": torch.randn(1, T, tiny.hidden_size),
        "document_ids": torch.zeros(1, T, dtype=torch.long),
    }
    from speculators.losses import resolve_loss_config

    loss = resolve_loss_config("ce", "eager")
    # as many anchors as valid positions: speculators then takes every one, in order
    (want,) = _logits_of(model, lambda: model(**batch, loss_config=loss, max_anchors=T - BLOCK))
    prop, gap = DFlashProposer(model, tiny.vocab_size), 0.0
    with torch.no_grad():
        for a in range(1, T - BLOCK):
            prop.reset([])
            prop.update(aux[:a], a)
            got = prop.block_logits(int(x[a]))
            gap = max(gap, (got - want[a * BLOCK : (a + 1) * BLOCK]).abs().max().item())
    return gap


@pytest.mark.parametrize("layers,full,window,n_vocab", VARIANTS)
def test_eagle3_drafting_equals_speculators_forward(tiny, vocab_dir, layers, full, window, n_vocab):
    model = _draft(tiny, "eagle3", layers, full, window, n_vocab, vocab_dir)
    assert model.config.draft_vocab_size == (n_vocab or tiny.vocab_size)
    assert eagle3_gap(tiny, model) < 1e-4


@pytest.mark.parametrize("non_causal", [False, True])
@pytest.mark.parametrize("layers,full,window,n_vocab", VARIANTS)
def test_dflash_drafting_equals_speculators_forward(tiny, vocab_dir, layers, full, window, n_vocab, non_causal):
    model = _draft(tiny, "dflash", layers, full, window, n_vocab, vocab_dir, block_size=BLOCK)
    model.sliding_window_non_causal = non_causal  # speculators' DFlash2 default; a layer-config field of DFlash
    assert dflash_gap(tiny, model) < 1e-4


def test_a_drafting_forward_that_drops_the_window_fails_the_parity_check(tiny, vocab_dir, monkeypatch):
    """The parity checks above see the layer kinds: drafting every layer under the full-attention mask (what
    draftlab did before) leaves logits far from speculators' on a context longer than the window, and for
    DFlash even within speculators' default window (2048), as its sliding layers attend their block causally."""
    eagle3 = _draft(tiny, "eagle3", 1, [], WINDOW, None, vocab_dir)
    dflash = [_draft(tiny, "dflash", 1, [], w, None, vocab_dir, block_size=BLOCK) for w in (WINDOW, 2048)]
    monkeypatch.setattr(draft_masks, "_per_layer", lambda model, make: [make(None)] * len(model.layers))
    assert eagle3_gap(tiny, eagle3) > 1e-2
    assert min(dflash_gap(tiny, d) for d in dflash) > 1e-2


def test_settings_drafting_cannot_reproduce_are_refused_by_name(tiny, vocab_dir):
    model = _draft(tiny, "dflash", 1, [], WINDOW, None, vocab_dir, block_size=BLOCK)
    model.config.sample_from_anchor = True
    with pytest.raises(DraftlabError, match="sample_from_anchor=True"):
        DFlashProposer(model, tiny.vocab_size)
    model.config.sample_from_anchor = False
    model.config.transformer_layer_config._attn_implementation = "simple_flex_attention"
    with pytest.raises(DraftlabError, match="attention 'simple_flex_attention'.*load_draft"):
        DFlashProposer(model, tiny.vocab_size)
