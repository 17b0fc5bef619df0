"""P-EAGLE through every stage on the tiny verifier: its draft's choices and refusals (03), its masks against the
paper's intent (02), a few training steps, checkpoint and reload (04), `speculators train`'s flags, and drafting (05):
the proposer's logits equal speculators' training forward at every sampled (anchor, depth), and the speculative loop
gives the verifier's own greedy text."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from draftlab import DraftlabError
from draftlab.drafts.draft import build_draft, build_from_profile

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("one_thread")]
IDS, T, WINDOW = [2, 4, 5], 14, 4  # aux layers; parity context length and a sliding window shorter than it
S = dict(train_steps=3, learning_rate=3e-3, warmup_steps=0, pack_len=96, eval_every=3, checkpoint_every=3, n_anchors=16)


@pytest.fixture(scope="module")
def data(tiny, tmp_path_factory):
    """A stage-01 dataset folder ({train,eval}: rows, hidden states, manifest; d2t/t2d-64 for train)."""
    from draftlab.data import dataset, extract, vocab

    from conftest import random_rows

    root = tmp_path_factory.mktemp("peagle_data")
    for split, lengths, seed in (("train", [40, 25, 33, 18, 50, 29], 0), ("eval", [30, 22], 1)):
        ds = dataset.save_split(random_rows(tiny.vocab_size, lengths, seed), tiny.tokenizer, root / split, 64)
        extract.extract(tiny, ds, root / split, IDS, progress=False)
        if split == "train":
            vocab.build_mapping(vocab.token_frequencies(ds, root / split), 64, tiny.vocab_size, root / split)
    return root


@pytest.fixture(scope="module")
def trained(tiny, data, tmp_path_factory):
    """Three training steps of a one-layer P-EAGLE draft with draftlab's loop: (draft, run folder, settings)."""
    from draftlab.training.train import Settings, train

    torch.manual_seed(0)
    d = build_draft("peagle", tiny, data / "train", num_layers=1)
    s = Settings(**S)
    return d, train(d, data, s, tmp_path_factory.mktemp("peagle_run"), progress=False), s


def test_build_says_its_choices_and_refuses_eager_attention(tiny, data, trained):
    d = trained[0]
    assert d.kind == "peagle" and d.attention == "sdpa" and list(d.model.target_layer_ids) == IDS
    assert {"mask token", "parallel depths", "embeddings"} <= set(d.choices)
    tok = d.model.config.mask_token_id
    assert tok is not None and d.choices["mask token"][0].startswith(str(tok))
    assert d.model.config.embed_requires_grad and d.model.embed_tokens.weight.requires_grad
    assert d.train_kwargs["num_depths"] == d.choices["parallel depths"][0] == 8 and d.train_kwargs["max_anchors"]
    with pytest.raises(DraftlabError, match="attention='eager' for a peagle draft.*NaN.*sdpa"):
        build_draft("peagle", tiny, data / "train", num_layers=1, attention="eager")
    bare = build_draft("peagle", tiny, None, num_layers=1)  # no data: the chain layout's default aux layers
    assert list(bare.model.target_layer_ids) == [2, 4, 5] and bare.model.config.draft_vocab_size == tiny.vocab_size
    cfg = SimpleNamespace(draft_layers=1, mask_token_id=3)  # notebook 03's profile keys
    given = build_from_profile("peagle", tiny, data / "train", cfg)
    assert given.model.config.mask_token_id == 3 and given.choices["mask token"][1] == "given"


def test_masks_follow_the_papers_intent_and_a_wrong_mask_fails(data):
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    from draftlab.masks.checks import run_checks
    from draftlab.masks.common import MaskView, real_pack
    from draftlab.masks.families import checked
    from draftlab.masks.peagle import intent_checks, peagle_mask

    pack = real_pack(data / "train", 200)  # the six rows (195 tokens) and padding
    assert (pack["document_ids"] == -1).any(), "the pack needs padding rows (which see nothing)"
    cfg = SimpleNamespace(n_anchors=16, flex_block=32, seed=0)
    views, results = checked("peagle", pack, cfg)
    assert [name for name, _ in views] == ["peagle"] and all(r["passed"] for r in results), results
    view = views[0][1]
    assert int((view.extra["depth"] > 0).sum()) > 0 and not view.dense[~view.extra["real_rows"]].any()
    assert "no real query row is empty" in {r["check"] for r in results}
    # a mask letting every row see each earlier row (EAGLE-3's causal first pass over all COD rows) is not P-EAGLE's
    n, causal = view.q_len, lambda b, h, q, kv: q >= kv
    wrong = MaskView(
        "causal",
        causal,
        create_mask(causal, None, None, n, n, device="cpu")[0, 0],
        create_block_mask(causal, None, None, n, n, device="cpu", BLOCK_SIZE=32),
        "",
        extra=view.extra,
    )
    failed = {r["check"] for r in run_checks(wrong, 32) if not r["passed"]}
    assert {"no row sees another chain's mask rows", "token mask == P-EAGLE intent exactly"} <= failed
    # speculators' mask built without the window, held to an intent with one: the window is checked too
    full = peagle_mask(pack["document_ids"], pack["loss_mask"], 16, 32, sliding_window=None)
    full.extra["intent"] = intent_checks(*(full.extra[k].cpu() for k in ("document_ids", "anchor_pos", "depth")), 4)
    assert not next(r for r in run_checks(full, 32) if r["check"] == "token mask == P-EAGLE intent exactly")["passed"]


def test_training_steps_metrics_and_reload(tiny, data, trained):
    from draftlab.training.checkpoint import check_reload
    from draftlab.training.train import first_accuracy, position_accuracies, read_metrics

    d, run, s = trained
    rec = read_metrics(run)
    losses = [r["loss"] for r in rec if r["split"] == "train"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and len(set(losses)) > 1, losses
    for r in rec:  # train steps and the evaluation
        assert math.isfinite(first_accuracy("peagle", r)) and r["position_0_acc"] == first_accuracy("peagle", r)
        acc = position_accuracies("peagle", r)
        assert min(acc) == 1 and max(acc) == 8 and math.isfinite(acc[1]) and math.isfinite(acc[2]), acc
    # the embeddings trained (so `verify` must not hold them to the verifier's), the reload is exact
    assert not torch.equal(d.model.embed_tokens.weight.detach(), tiny.embed.weight)
    r = check_reload(d, run / "final", data, s)
    assert r["identical tensors"] and r["identical outputs"] and r["loss"] == r["reloaded loss"], r


def test_a_resumed_run_samples_and_trains_exactly_as_the_straight_one(tiny, data, trained, tmp_path):
    """COD sampling draws from torch's global RNG inside the forward: a checkpoint's RNG state makes a resumed run
    draw the same rows, so its losses are the straight run's."""
    from draftlab.training.train import read_metrics, train

    _, straight, s = trained
    for resume in (None, True):
        torch.manual_seed(0)
        d = build_draft("peagle", tiny, data / "train", num_layers=1)
        train(d, data, s, tmp_path, resume=resume, stop_after=None if resume else 1, progress=False)
    a, b = read_metrics(straight), read_metrics(tmp_path)
    assert len(a) == 4 and [(r["split"], r["loss"]) for r in a] == [(r["split"], r["loss"]) for r in b]


def test_verify_still_holds_frozen_embeddings_to_the_verifier(tiny, data):
    """Skipping trained embeddings does not let an EAGLE-3 draft (frozen embeddings) pass with others."""
    from draftlab.drafts.validate import verify

    d = build_draft("eagle3", tiny, data / "train")
    with torch.no_grad():
        d.model.embed_tokens.weight.add_(1.0)
    with pytest.raises(DraftlabError, match="embed_tokens"):
        verify(d)


def test_speculators_cli_takes_the_torchrun_flags_and_draftlab_loads_what_it_builds(tiny, data, trained, tmp_path):
    """The flags through speculators' own parser, then its `main` up to its first step (`--dry-run`: the draft
    built from the flags and saved by speculators), loaded the way notebook 05 loads a draft."""
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    from draftlab.acceptance.proposers import load_draft
    from draftlab.training.launch import torchrun_command

    d, _, s = trained
    cmd = torchrun_command(d, data, s, nproc=2, save_path=tmp_path / "save")
    cfg = TrainConfig.resolve(cmd[cmd.index("speculators.train") + 1 :])
    assert cfg.speculator_type == "peagle" and cfg.draft.target_layer_ids == IDS
    assert cfg.draft.mask_token_id == d.model.config.mask_token_id and cfg.data.max_anchors == s.n_anchors
    assert (cfg.peagle.num_depths, cfg.peagle.down_sample_ratio, cfg.peagle.down_sample_ratio_min) == (
        d.train_kwargs["num_depths"],
        d.train_kwargs["down_sample_ratio"],
        d.train_kwargs["down_sample_ratio_min"],
    )
    main(TrainConfig.resolve([*cmd[cmd.index("speculators.train") + 1 :], "--dry-run"]))
    got = load_draft(tmp_path / "save", tiny)
    assert got.kind == "peagle" and got.model.config.mask_token_id == d.model.config.mask_token_id
    assert got.train_kwargs["num_depths"] == 8 and list(got.model.target_layer_ids) == IDS


def test_the_speculative_loop_with_the_saved_draft_is_the_verifiers_greedy_output(tiny, trained):
    from draftlab.acceptance.evaluate import run_prompts, verifier_greedy
    from draftlab.acceptance.peagle import PEagleProposer
    from draftlab.acceptance.proposers import load_draft, make_proposer

    d, run, _ = trained
    loaded = load_draft(run / "final", tiny)
    assert loaded.train_kwargs["num_depths"] == 8 and loaded.model.config.mask_token_id == d.model.config.mask_token_id
    prop = make_proposer(loaded, tiny.vocab_size)
    assert isinstance(prop, PEagleProposer) and prop.layer_ids == IDS
    prompts = [
        {"id": f"p{i}", "source": "chat", "ids": tiny.tokenizer(t)["input_ids"]}
        for i, t in enumerate(["hello how are you today", "def add(a, b): return a + b"])
    ]
    for k in (1, 3):
        gens = run_prompts(tiny, prop, prompts, k, 12)
        assert [g.tokens for g in gens] == [verifier_greedy(tiny, p["ids"], 12) for p in prompts], k
        assert sum(st.drafted for g in gens for st in g.steps) > 0
    sampled = run_prompts(tiny, prop, prompts[:1], 4, 8, temperature=1.0)[0]
    assert all(st.drafted <= 4 for st in sampled.steps) and len(sampled.tokens) == 8


def _random_draft(tiny, data, layers, full, n_vocab):
    """A P-EAGLE draft as `build_draft` makes one with speculators' layer config for these attention kinds and
    a window shorter than the context; weights drawn large enough that what each row attends shows in the logits."""
    from speculators.train.cli import create_transformer_layer_config

    layer = create_transformer_layer_config(str(tiny.path), layers, "qwen3", None, WINDOW, full)
    d = build_draft("peagle", tiny, data / "train", draft_vocab_size=n_vocab, layer_config=layer)
    torch.manual_seed(1)
    for p in [*d.model.layers.parameters(), d.model.fc.weight, d.model.mask_hidden]:
        p.data.normal_(0, 0.3)
    return d.model.eval()


def parity_gap(tiny, model, monkeypatch, seeds=(0, 1)) -> tuple[float, int]:
    """(largest |logit| difference, rows compared) between speculators' training forward at every COD row it samples
    (captured from `generate_cod_sample_indices` and lm_head) and the proposer's drafting from that row's anchor."""
    import speculators.models.peagle.core as core
    from speculators.losses import resolve_loss_config

    from draftlab.acceptance.peagle import PEagleProposer

    g = torch.Generator().manual_seed(0)
    aux = torch.randn(T, len(IDS) * tiny.hidden_size, generator=g)
    x = torch.randint(4, tiny.vocab_size, (T + 1,), generator=g)
    loss = torch.ones(1, T)
    loss[0, 0] = 0  # no chain seeded at position 0 (anchor -1: never supervised with stage-01 rows, prompt first)
    batch = dict(
        hidden_states=aux[None],
        input_ids=x[None, 1:],  # shift_batch: row t is token x[t+1] with the aux states of position t
        document_ids=torch.zeros(1, T, dtype=torch.long),
        loss_mask=loss,
        verifier_last_hidden_states=torch.randn(1, T, tiny.hidden_size, generator=g),
    )
    seen, orig = {}, core.generate_cod_sample_indices
    monkeypatch.setattr(core, "generate_cod_sample_indices", lambda **kw: seen.setdefault("rows", orig(**kw)))
    depths = model.config.speculators_config.proposal_methods[0].speculative_tokens
    gap, rows = 0.0, 0
    for s in seeds:
        seen.clear()
        got = []
        hook = model.lm_head.register_forward_hook(lambda _m, _i, out, got=got: got.append(out[0].detach()))
        torch.manual_seed(s)
        with torch.no_grad():
            model(**batch, loss_config=resolve_loss_config("kl_div", "eager"), num_depths=depths, down_sample_ratio=0.9)
        hook.remove()
        prop, drafted = PEagleProposer(model, tiny.vocab_size), {}
        with torch.no_grad():
            for i, (a, dep) in enumerate(zip(*(t.tolist() for t in seen["rows"]), strict=True)):
                if a not in drafted:  # a fresh proposer: context rows 0..a in one pass, the chain anchored at a
                    prop.reset([])
                    drafted[a] = prop.slot_logits(x[1 : a + 2], aux[: a + 1], depths)
                gap, rows = max(gap, (drafted[a][dep] - got[0][i]).abs().max().item()), rows + 1
    return gap, rows


@pytest.mark.parametrize("layers,full,n_vocab", [(1, [], None), (2, [1], 64)])
def test_drafting_equals_speculators_training_forward(tiny, data, monkeypatch, layers, full, n_vocab):
    model = _random_draft(tiny, data, layers, full, n_vocab)
    gap, rows = parity_gap(tiny, model, monkeypatch)
    assert rows > 2 * T and gap < 1e-4, (gap, rows)


def test_drafting_incrementally_equals_one_pass_and_a_wrong_mask_fails_the_parity_check(tiny, data, monkeypatch):
    from draftlab.acceptance import peagle

    model = _random_draft(tiny, data, 1, [], None)
    g = torch.Generator().manual_seed(5)
    aux = torch.randn(T, len(IDS) * tiny.hidden_size, generator=g)
    x = torch.randint(4, tiny.vocab_size, (T + 1,), generator=g)
    step, whole = (peagle.PEagleProposer(model, tiny.vocab_size) for _ in range(2))
    done, gap = 0, 0.0
    step.reset([])
    with torch.no_grad():
        for stop in (5, 6, 9, T):  # the cache grown call by call, mask rows cropped in between
            got = step.slot_logits(x[done + 1 : stop + 1], aux[done:stop], 4)
            whole.reset([])
            gap, done = max(gap, (got - whole.slot_logits(x[1 : stop + 1], aux[:stop], 4)).abs().max().item()), stop
    assert gap < 1e-4
    # drafting every layer without its sliding window: the parity check sees it
    monkeypatch.setattr(peagle, "_per_layer", lambda m, make: [make(None)] * len(m.layers))
    assert parity_gap(tiny, model, monkeypatch, seeds=(0,))[0] > 1e-2
