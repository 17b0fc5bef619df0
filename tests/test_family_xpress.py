"""XPress through every stage on the tiny verifier: build, masks, training, reload, drafting parity, the loop.

XPress is DFlash's backbone plus a causal refiner head resolved by Jacobi passes (speculators' XPressDraftModel).
Each stage's module for it is checked here with a negative control where a check could pass vacuously.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from draftlab import DraftlabError
from draftlab.drafts.draft import build_draft
from draftlab.layout import RunLayout
from draftlab.training.train import Settings, first_accuracy, position_accuracies, read_metrics, train

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("one_thread")]
IDS, BLOCK, T = [2, 4, 5], 4, 12  # aux layers, block size, parity sequence length
S = dict(train_steps=3, learning_rate=3e-3, warmup_steps=1, pack_len=96, eval_every=3, checkpoint_every=3, n_anchors=8)


@pytest.fixture(scope="module")
def data(tiny, tmp_path_factory):
    """data/runs/tiny/{train,eval} as notebook 01 writes them (hidden states, d2t/t2d-64)."""
    from draftlab.data import dataset, extract, vocab

    from conftest import random_rows

    run = RunLayout("tiny", "xpress", tmp_path_factory.mktemp("home")).data
    for split, lengths, seed in (("train", [40, 25, 33, 18, 50, 29], 0), ("eval", [30, 22], 1)):
        ds = dataset.save_split(random_rows(tiny.vocab_size, lengths, seed), tiny.tokenizer, run / split, max_length=64)
        extract.extract(tiny, ds, run / split, IDS, progress=False)
        if split == "train":
            vocab.build_mapping(vocab.token_frequencies(ds, run / split), 64, tiny.vocab_size, run / split)
    return run


def make(tiny, data, **kw):
    torch.manual_seed(0)
    return build_draft("xpress", tiny, data / "train", **{"num_layers": 1, "block_size": BLOCK, **kw})


@pytest.fixture(scope="module")
def trained(tiny, data):
    """An XPress draft before and after three CPU steps (sdpa, eager loss) with draftlab's `train`."""
    d = make(tiny, data)
    before = {n: p.detach().clone() for n, p in d.model.named_parameters() if p.requires_grad}
    run = train(d, data, Settings(**S), data.parent / "xpress-run", progress=False)
    return SimpleNamespace(draft=d, before=before, run=run, final=run / "final")


def test_build_draft_states_the_refiner_and_records_its_shape(tiny, data):
    from speculators.models.xpress import XPressDraftModel

    from draftlab.training.checkpoint import hparams

    d = make(tiny, data)
    assert isinstance(d.model, XPressDraftModel) and d.kind == "xpress" and d.model.block_size == BLOCK
    report = d.report()
    assert {"mask token", "loss", "loss terms", "refiner", "Jacobi rounds"} <= set(report)
    assert report["loss"].startswith("eager") and report["loss terms"].startswith('{"ce": 0.1, "tv": 0.9}')
    assert d.train_config.loss.loss_fn == '{"ce": 0.1, "tv": 0.9}' and d.train_kwargs["consistency_passes"] == 3
    assert not d.model.config.sample_from_anchor and d.model.config.draft_vocab_size == 64
    hp = hparams(d, {})
    assert hp["block_size"] == BLOCK and hp["xpress_rank"] == d.model.config.xpress_rank == 256


def test_masks_pass_their_checks_and_a_wrong_refiner_mask_fails():
    from draftlab.masks import xpress
    from draftlab.masks.checks import run_checks
    from draftlab.masks.common import document_lengths, synthetic_pack
    from draftlab.masks.families import checked

    pack = synthetic_pack(document_lengths(128, 3), 128)
    cfg = SimpleNamespace(n_anchors=12, dflash_block_size=BLOCK, flex_block=16, seed=0)
    made, checks = checked("xpress", pack, cfg)
    assert [name for name, _ in made] == ["xpress", "xpress_refiner"]
    assert all(c["passed"] for c in checks) and len(checks) == 15, [c for c in checks if not c["passed"]]
    doc = pack["document_ids"][0]
    starts = torch.tensor([0, *[i for i in range(1, 128) if doc[i] != doc[i - 1] and doc[i] >= 0]])
    at_start = xpress.refiner_mask(doc, starts, BLOCK, 16)  # anchors at document starts: prev[0] is the anchor
    assert all(c["passed"] for c in run_checks(at_start, 16))
    anchors, exact = made[1][1].extra["anchors"], "token mask == XPress refiner intent exactly"
    mixer = "refiner: speculators' block_bias moves slot k with prev token j only for j <= k"
    for wrong, why in (
        (torch.ones(BLOCK, BLOCK), "refiner: no drafted slot sees its own label or a later token"),  # bidirectional
        (torch.eye(BLOCK), "refiner: each drafted slot sees every block token before it"),  # no mixing at all
    ):
        got = run_checks(xpress.refiner_mask(doc, anchors, BLOCK, 16, tril=wrong), 16)
        assert {c["check"] for c in got if not c["passed"]} == {why, mixer, exact}


def test_three_cpu_steps_train_with_finite_changing_loss_and_readable_metrics(trained):
    d, rec = trained.draft, read_metrics(trained.run)
    losses = [r["loss"] for r in rec if r["split"] == "train"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and len(set(losses)) == 3, losses
    moved = {n.split(".")[0] for n, p in d.model.named_parameters() if not torch.equal(p, trained.before.get(n, p))}
    assert {"layers", "refiner_head"} <= moved, moved
    for r in rec:  # the accuracy over all drafted slots, teacher-forced: the recipe's first_key
        assert 0.0 <= first_accuracy("xpress", r) <= 1.0 and position_accuracies("xpress", r) == {}
        assert all(math.isfinite(r[k]) for k in ("tf_loss", "consistency_loss", "base_anchor_loss", "accept_rate"))
    assert [r["split"] for r in rec] == ["train"] * 3 + ["eval"]


def test_a_reload_restores_the_refiners_causal_mask_and_gives_identical_outputs(trained, data, tiny):
    """speculators' from_pretrained leaves the non-persistent causal_tril uninitialised; every load restores it."""
    from speculators.models.xpress import XPressDraftModel

    from draftlab.training.checkpoint import check_reload, load_model

    model = load_model(trained.final, XPressDraftModel, "sdpa", "cpu", torch.float32, tiny.path)
    tril = model.refiner_head.causal_tril
    assert torch.equal(tril, torch.tril(torch.ones(BLOCK, BLOCK)))
    r = check_reload(trained.draft, trained.final, data, Settings(**S))
    assert r["identical tensors"] and r["identical outputs"] and r["loss"] == r["reloaded loss"], r


def test_the_loop_with_the_saved_draft_gives_the_verifiers_greedy_output(trained, tiny):
    from draftlab.acceptance.evaluate import run_prompts, verifier_greedy
    from draftlab.acceptance.proposers import load_draft, make_proposer
    from draftlab.acceptance.xpress import XPressProposer

    from families import EVAL_TEXTS, chat_prompts

    d = load_draft(trained.final, tiny)
    prompts = chat_prompts(tiny, EVAL_TEXTS)
    refs = [verifier_greedy(tiny, p["ids"], 12) for p in prompts]
    saved = make_proposer(d, tiny.vocab_size)
    assert isinstance(saved, XPressProposer) and saved.passes == d.model.config.num_jacobi_passes == 6
    for prop in (saved, XPressProposer(d.model, tiny.vocab_size, passes=1)):  # settled, and one Jacobi pass
        gens = run_prompts(tiny, prop, prompts, 3, 12)
        assert [g.tokens for g in gens] == refs
        assert sum(s.drafted for g in gens for s in g.steps) > 0
    sampled = run_prompts(tiny, saved, prompts[:1], 3, 8, temperature=1.0)[0]
    assert len(sampled.tokens) == 8 or sampled.tokens[-1] == tiny.tokenizer.eos_token_id
    ids = prompts[0]["ids"]  # sampling: slot by slot, each q the teacher-forced one given the tokens drawn before
    saved.reset(ids)
    saved.update(torch.randn(len(ids) - 1, d.model.fc.in_features), len(ids) - 1)
    got = saved.propose(ids, 3, 1.0, torch.Generator().manual_seed(0))
    _, (tf,) = saved.refine(
        saved.block_hidden(ids[-1]), ids[-1], ids[-2], prev=torch.tensor([*ids[-2:], *got.tokens[:2]])
    )
    torch.testing.assert_close(got.q, saved._to_target(torch.softmax(tf[1:], -1)))
    assert all(got.q[i, t] > 0 for i, t in enumerate(got.tokens)), "each token drawn from its own q"


def _parity_draft(tiny, data):
    """Two layers (one sliding window 4, one full), draft vocabulary 64; weights and the refiner's mixer drawn large
    enough that every part shows in the logits."""
    from speculators.train.cli import create_transformer_layer_config

    layer = create_transformer_layer_config(str(tiny.path), 2, "qwen3", None, 4, [1])
    d = make(tiny, data, layer_config=layer, layer_ids=IDS)
    torch.manual_seed(1)
    m = d.model
    for p in [*m.layers.parameters(), m.fc.weight, m.refiner_head.mix_l]:  # the mixer starts at zero
        p.data.normal_(0, 0.3)
    for p in m.refiner_head.parameters():  # rank 256: std 0.02 would leave the bias invisible, 0.3 explode it
        p.data.mul_(3.0)
    m.eval()
    return d


def _training_logits(d, batch, monkeypatch) -> dict:
    """What speculators' XPress forward scores: base, teacher-forced and each round's logits (its compute_metrics)."""
    import speculators.models.xpress.core as core

    got, real = {}, core.compute_metrics

    def spy(tf, rounds, base, *a, **k):
        got.update(tf=tf[0], rounds=[r[0] for r in rounds], base=base[0])
        return real(tf, rounds, base, *a, **k)

    monkeypatch.setattr(core, "compute_metrics", spy)
    with torch.no_grad():
        d.model(**batch, **{**d.train_kwargs, "max_anchors": T - BLOCK})  # every anchor 0..T-B-1, in order
    return got


def test_drafting_equals_the_training_forward_and_a_wrong_prev_fails(tiny, data, monkeypatch):
    from draftlab.acceptance.xpress import XPressProposer

    d = _parity_draft(tiny, data)
    g = torch.Generator().manual_seed(0)
    aux = torch.randn(T, len(IDS) * tiny.hidden_size, generator=g)
    x = torch.randint(4, tiny.vocab_size, (T,), generator=g)
    batch = {
        "hidden_states": aux[None],
        "input_ids": x[None],
        "loss_mask": torch.ones(1, T),
        "verifier_last_hidden_states": torch.randn(1, T, tiny.hidden_size, generator=g),
        "document_ids": torch.zeros(1, T, dtype=torch.long),
    }
    want, rounds = _training_logits(d, batch, monkeypatch), d.train_kwargs["consistency_passes"]
    prop = XPressProposer(d.model, tiny.vocab_size, passes=rounds)
    gap, wrong = dict.fromkeys(("base", "teacher-forced", "rounds"), 0.0), 0.0
    with torch.no_grad():
        for a in range(1, T - BLOCK):
            prop.reset([])
            prop.update(aux[:a], a)
            hidden, at = prop.block_hidden(int(x[a])), slice(a * BLOCK, (a + 1) * BLOCK)
            base, (tf,) = prop.refine(hidden, int(x[a]), int(x[a - 1]), prev=x[a - 1 : a - 1 + BLOCK])
            _, jacobi = prop.refine(hidden, int(x[a]), int(x[a - 1]))
            gap["base"] = max(gap["base"], (base - want["base"][at]).abs().max().item())
            gap["teacher-forced"] = max(gap["teacher-forced"], (tf - want["tf"][at]).abs().max().item())
            for j, r in enumerate(jacobi):
                gap["rounds"] = max(gap["rounds"], (r - want["rounds"][j][at]).abs().max().item())
            drafted = prop.propose(x[: a + 1].tolist(), BLOCK - 1, 0.0, None).tokens  # the last round's argmax
            assert drafted == prop._target(want["rounds"][-1][at][1:].argmax(-1)).tolist()
            _, (leak,) = prop.refine(hidden, int(x[a]), int(x[a - 1]), prev=x[a : a + BLOCK])  # unshifted: sees labels
            wrong = max(wrong, (leak - want["tf"][at]).abs().max().item())
    bias = (want["tf"] - want["base"]).abs().max().item()  # what the refiner adds: it must show
    assert len(jacobi) == rounds == 3 and bias > 0.1
    assert max(gap.values()) < 1e-4, gap
    assert wrong > 0.1, "the parity check cannot tell a wrong previous token"


def test_settings_drafting_cannot_reproduce_are_refused_by_name(tiny, data):
    from draftlab.acceptance.xpress import XPressProposer

    m = make(tiny, data).model
    m.config.sample_from_anchor = True
    with pytest.raises(DraftlabError, match="sample_from_anchor=True"):
        XPressProposer(m, tiny.vocab_size)
    m.config.sample_from_anchor = False
    m.refiner_head.causal_tril.zero_()  # as from_pretrained may leave it
    with pytest.raises(DraftlabError, match="causal_tril.*load_draft"):
        XPressProposer(m, tiny.vocab_size)


def test_torchrun_flags_parse_with_speculators_own_cli_which_builds_the_same_draft(trained, tiny, data, tmp_path):
    """The flags through speculators' own parser, then its `main` up to the first step (`--dry-run`): the draft it
    builds and saves loads in draftlab with the refiner's shape and mask."""
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig
    from speculators.train.config.resolution import build_parser

    from draftlab.acceptance.proposers import load_draft
    from draftlab.training.launch import torchrun_command

    cmd = torchrun_command(trained.draft, data, Settings(**S), nproc=1, save_path=tmp_path / "save")
    args = cmd[cmd.index("speculators.train") + 1 :]
    build_parser().parse_args(args)
    cfg = TrainConfig.resolve(args)
    assert cfg.speculator_type == "xpress" and cfg.dflash.block_size == BLOCK and cfg.data.max_anchors == 8
    assert cfg.draft.mask_token_id == trained.draft.model.mask_token_id and cfg.draft.target_layer_ids == IDS
    built = trained.draft.train_config.flatten()
    assert cfg.xpress.model_dump() == {k: built[k] for k in cfg.xpress.model_dump()}
    assert cfg.loss.loss_fn == built["loss_fn"]
    main(TrainConfig.resolve([*args, "--dry-run"]))
    m = load_draft(tmp_path / "save", tiny).model
    assert m.config.xpress_rank == trained.draft.model.config.xpress_rank and m.block_size == BLOCK
    assert torch.equal(m.refiner_head.causal_tril, torch.tril(torch.ones(BLOCK, BLOCK)))
