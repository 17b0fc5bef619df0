"""Stage 05: speculative decoding is lossless (greedy), exact in distribution (sampling), and measured right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftlab import DraftlabError
from draftlab.acceptance import speculative as accept
from draftlab.acceptance.eagle3 import Eagle3Proposer
from draftlab.acceptance.proposers import NGramProposer, Proposal, load_draft

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = ["hello how are you today", "def add(a, b): return a + b", "the quick brown fox jumps", "for i in range(10):"]
N_NEW = 24


_REF: dict = {}
pytestmark = pytest.mark.usefixtures("one_thread")


def _greedy(v, prompt, n=N_NEW):
    """The verifier's own greedy continuation (HF generate), cut after eos; cached per prompt."""
    key = (id(v), tuple(prompt), n)
    if key not in _REF:
        _REF[key] = _generate(v, prompt, n)
    return _REF[key]


def _generate(v, prompt, n):
    x = torch.tensor([prompt])
    out = v.model.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=v.tokenizer.eos_token_id,
        pad_token_id=v.tokenizer.pad_token_id,
    )[0, len(prompt) :].tolist()
    eos = v.tokenizer.eos_token_id
    return out[: out.index(eos) + 1] if eos in out else out


def _train_briefly(d, v, steps=60, seed=0):
    """A few quick EAGLE-3 steps on the tiny verifier's own greedy text, for non-trivial acceptance."""
    from draftlab.data.hooks import hidden_states

    torch.manual_seed(seed)
    tok = v.tokenizer
    seqs = [tok(p)["input_ids"] + _greedy(v, tok(p)["input_ids"], 48) for p in PROMPTS]
    hs = hidden_states(v, seqs, d.model.target_layer_ids)
    opt = torch.optim.AdamW([p for p in d.model.parameters() if p.requires_grad], lr=3e-3)
    d.model.train()
    for i in range(steps):
        s, h = seqs[i % len(seqs)], hs[i % len(seqs)]
        n = len(s) - 1  # speculators' shift_batch: token t+1 with the states of position t
        batch = {
            "input_ids": torch.tensor([s[1:]]),
            "hidden_states": h[:-1, :-1].flatten(1)[None],
            "verifier_last_hidden_states": h[1:, -1][None],
            "loss_mask": torch.ones(1, n),
            "document_ids": torch.zeros(1, n, dtype=torch.long),
            "position_ids": torch.arange(1, n + 1)[None],
        }
        _, loss, _ = d.model(**batch, **d.train_kwargs)
        opt.zero_grad()
        loss.backward()
        opt.step()
    d.model.eval()
    return d


@pytest.fixture(scope="module")
def eagle_path(tiny, tmp_path_factory):
    from draftlab.drafts.draft import build_eagle3

    d = _train_briefly(build_eagle3(tiny, None), tiny)
    path = tmp_path_factory.mktemp("eagle3") / "final"
    d.model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def eagle(tiny, eagle_path):
    return load_draft(eagle_path, tiny)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_with_ngram_is_the_verifiers_greedy_output(tiny, k):
    for p in PROMPTS:
        ids = tiny.tokenizer(p)["input_ids"]
        g = accept.speculative_generate(tiny, NGramProposer(), ids, k, N_NEW)
        assert g.tokens == _greedy(tiny, ids), p
        assert len(g.tokens) == len(g.labels) == 1 + sum(s.accepted + 1 for s in g.steps)


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_with_eagle3_is_the_verifiers_greedy_output_and_accepts(tiny, eagle, k):
    accepted = 0
    for p in PROMPTS:
        ids = tiny.tokenizer(p)["input_ids"]
        g = accept.speculative_generate(tiny, Eagle3Proposer(eagle.model, tiny.vocab_size), ids, k, N_NEW)
        assert g.tokens == _greedy(tiny, ids), p
        accepted += sum(s.accepted for s in g.steps)
    assert accepted > 0, "the briefly trained draft should get some tokens accepted"


def test_eagle3_proposals_match_speculators_teacher_forced_forward(tiny, eagle):
    """The proposer's cached chain equals speculators' own forward: step 0 everywhere, step 1 where
    the first draft was right (then the TTT step's teacher-forced token is the drafted one)."""
    from draftlab.data.hooks import hidden_states

    ids = tiny.tokenizer(PROMPTS[0])["input_ids"]
    prop = Eagle3Proposer(eagle.model, tiny.vocab_size)
    seen = []
    orig = prop.propose
    prop.propose = lambda c, k, t, g: seen.append((len(c), orig(c, k, t, g))) or seen[-1][1]
    g = accept.speculative_generate(tiny, prop, ids, 2, N_NEW)
    seq = ids + g.tokens
    h = hidden_states(tiny, [seq], eagle.model.target_layer_ids)[0]
    n = len(seq) - 1
    with torch.no_grad():
        steps = eagle.model(
            h[:-1, :-1].flatten(1)[None],
            torch.tensor([seq[1:]]),
            torch.zeros(1, n, dtype=torch.long),
            position_ids=torch.arange(1, n + 1)[None],
            ttt_steps=2,
        )
    d2t = prop.d2t
    checked = 0
    for m, p in seen:
        assert p.tokens[0] == int(steps[0][0, m - 2] + d2t[steps[0][0, m - 2]])
        if len(p.tokens) > 1 and seq[m] == p.tokens[0]:
            assert p.tokens[1] == int(steps[1][0, m - 2] + d2t[steps[1][0, m - 2]])
            checked += 1
    assert checked > 0


def _tv(counts, p):
    return 0.5 * (counts / counts.sum() - p).abs().sum().item()


def _first_token_counts(p, prop, n, sampler):
    """Counts of the first emitted token over n seeds; with a draft q the first draft is drawn from
    q[0] in every trial (the guarantee is over drafting and verifying together)."""
    counts = torch.zeros(p.shape[-1])
    for seed in range(n):
        gen = torch.Generator().manual_seed(seed)
        first = int(torch.multinomial(prop.q[0], 1, generator=gen)) if prop.q is not None else prop.tokens[0]
        trial = Proposal([first, *prop.tokens[1:]], prop.q)
        a, bonus = sampler(p, trial, gen)
        counts[first if a > 0 else bonus] += 1
    return counts


def _always_accept(p, prop, gen):
    return len(prop.tokens), int(torch.multinomial(p[-1], 1, generator=gen))


N_SAMPLES, TV_BOUND = 3000, 0.05  # TV noise over 8 outcomes at 3000 samples is about 0.02


def test_sampling_verification_reproduces_the_verifier_distribution_and_a_broken_sampler_does_not():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(4, 8, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(3, 8, generator=g) * 1.5, -1)
    drafted = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(3)]
    prop = Proposal(drafted, q)
    assert _tv(_first_token_counts(p, prop, N_SAMPLES, accept.verify_sampled), p[0]) < TV_BOUND
    assert _tv(_first_token_counts(p, prop, N_SAMPLES, _always_accept), p[0]) > TV_BOUND
    point = Proposal(drafted)  # deterministic proposer: q is a point mass on the draft
    assert _tv(_first_token_counts(p, point, N_SAMPLES, accept.verify_sampled), p[0]) < TV_BOUND


def test_sampling_verification_with_the_tiny_verifier_and_eagle3_draft(tiny, eagle):
    """Real p and q: the first token of a speculative step follows the verifier's softmax (top 7 + rest)."""
    ids = tiny.tokenizer(PROMPTS[1])["input_ids"]
    drafter = Eagle3Proposer(eagle.model, tiny.vocab_size)
    drafter.reset(ids)
    run = accept.Verifier1Pass(tiny, drafter.layer_ids)
    _, aux = run(ids[:-1])
    drafter.update(aux, len(ids) - 1)
    temp = 0.05  # sharp enough that the draft and the verifier disagree visibly
    prop = drafter.propose(ids, 3, temp, torch.Generator().manual_seed(0))
    logits, _ = run([ids[-1], *prop.tokens])
    # vocab-restricted: the verifier's 8 likeliest tokens, both distributions renormalised on them
    keep = logits[0].topk(8).indices
    p = accept.probs(logits[:, keep], temp)
    q = prop.q[:, keep] + 1e-4
    prop = Proposal([0, 1, 2], q / q.sum(-1, keepdim=True))
    assert _tv(_first_token_counts(p, prop, N_SAMPLES, accept.verify_sampled), p[0]) < TV_BOUND
    assert _tv(_first_token_counts(p, prop, N_SAMPLES, _always_accept), p[0]) > TV_BOUND


def test_metrics_on_hand_made_steps():
    S = accept.Step
    steps = [S(3, 3, 0), S(3, 0, 0, 9), S(3, 1, 0, 9), S(2, 2, 0), S(0, 0, 0)]
    m = accept.metrics(steps, 3)
    assert m["tau"] == pytest.approx((3 + 0 + 1 + 2 + 0 + 5) / 5)
    assert m["acceptance_rate"] == pytest.approx(6 / 11)
    # alpha_1: 3 of 4 steps that drafted position 1; alpha_2: 2 of 3 that reached it; alpha_3: 1 of 1
    assert m["alpha_n"] == pytest.approx([3 / 4, 2 / 3, 1.0])
    assert m["accepted_hist"] == [2, 1, 1, 1]
    with pytest.raises(DraftlabError, match="no decode steps"):
        accept.metrics([], 3)


def test_ngram_proposes_the_continuation_of_the_longest_then_earliest_match_as_vllm_does():
    assert NGramProposer(3).propose([1, 2, 3, 4, 1, 2, 3, 5, 1, 2], 2, 0.0, None).tokens == [3, 4]
    assert NGramProposer(3).propose([7, 2, 9, 1, 2, 8, 1, 2], 3, 0.0, None).tokens == [8, 1, 2]  # [1, 2] beats [2]
    assert NGramProposer(2).propose([5, 5, 5], 2, 0.0, None).tokens == [5]  # the window may overlap the suffix
    assert NGramProposer(3).propose([1, 2, 3], 2, 0.0, None).tokens == []


def test_load_draft_refuses_a_folder_without_a_checkpoint(tiny, tmp_path):
    with pytest.raises(DraftlabError, match="no draft checkpoint"):
        load_draft(tmp_path, tiny)


@pytest.mark.parametrize("k", [2, 7])
def test_greedy_with_dflash_is_the_verifiers_greedy_output(tiny, tmp_path, k):
    """Untrained DFlash (block 4, so k=7 is capped at 3 per step): lossless, and reloaded via load_draft."""
    from draftlab.acceptance.proposers import make_proposer
    from draftlab.drafts.draft import build_dflash

    build_dflash(tiny, None, block_size=4, num_layers=1).model.save_pretrained(tmp_path)
    d = load_draft(tmp_path, tiny)
    for p in PROMPTS[:2]:
        ids = tiny.tokenizer(p)["input_ids"]
        g = accept.speculative_generate(tiny, make_proposer(d, tiny.vocab_size), ids, k, N_NEW)
        assert g.tokens == _greedy(tiny, ids), p
        assert max(s.drafted for s in g.steps) == min(k, 3)
    s = accept.speculative_generate(tiny, make_proposer(d, tiny.vocab_size), ids, k, N_NEW, temperature=1.0, seed=3)
    assert len(s.tokens) == N_NEW or s.tokens[-1] == tiny.tokenizer.eos_token_id


def test_dflash_block_matches_speculators_anchored_block_forward(tiny, tmp_path):
    """The proposer's block equals speculators' training backbone with one anchor at the same position."""
    from draftlab.acceptance.dflash import DFlashProposer
    from draftlab.data.hooks import hidden_states
    from draftlab.drafts.draft import build_dflash

    model = build_dflash(tiny, None, block_size=4, num_layers=1).model.eval()
    prompt = tiny.tokenizer(PROMPTS[2])["input_ids"]
    seq = prompt + _greedy(tiny, prompt)
    h = hidden_states(tiny, [seq], model.target_layer_ids)[0]
    aux, a = h[:, :-1].flatten(1), len(prompt) + 2
    loss_mask = torch.zeros(1, len(seq))
    loss_mask[0, a] = 1
    with torch.no_grad():
        _, logits, *_ = model._backbone_forward(
            aux[None],
            torch.tensor([seq]),
            loss_mask,
            h[:, -1][None],
            torch.zeros(1, len(seq), dtype=torch.long),
            max_anchors=1,
        )
    prop = DFlashProposer(model, tiny.vocab_size)
    prop.reset(seq[: a + 1])
    prop.update(aux[:a], a)
    got = prop.propose(seq[: a + 1], 3, 0.0, None).tokens
    want = logits[0, 1:4].argmax(-1)
    assert got == (want + prop.d2t[want]).tolist()


def test_greedy_agreement_accepts_identical_output_and_refuses_a_clear_divergence(tiny):
    from draftlab.acceptance.lossless import greedy_agreement

    ids = tiny.tokenizer(PROMPTS[0])["input_ids"]
    ref = _greedy(tiny, ids)
    got = accept.speculative_generate(tiny, NGramProposer(), ids, 3, N_NEW).tokens
    assert greedy_agreement(tiny, ids, got, ref)["lossless"]
    # swap in the verifier's least likely token at position 2: a real divergence, far beyond float32 rounding
    logits = tiny.model(torch.tensor([ids + ref[:2]])).logits[0, -1]
    bad = greedy_agreement(tiny, ids, ref[:2] + [int(logits.argmin())] + ref[3:], ref)
    assert not bad["lossless"] and bad["first divergence"] == 2 and bad["logit gap"] > bad["tolerance"] > 0
    assert not greedy_agreement(tiny, ids, got[:2], ref)["lossless"], "a cut-short output is not the verifier's output"


def test_bfloat16_verifier_and_draft_decode_losslessly(tiny, tiny_dir, eagle_path, tmp_path):
    """The GPU profile's dtype, on CPU: every proposer runs in bf16 and stays lossless (up to near-ties)."""
    from draftlab.acceptance import replay
    from draftlab.acceptance.lossless import greedy_agreement, greedy_check
    from draftlab.acceptance.proposers import make_proposer
    from draftlab.data.verifier import load_verifier
    from draftlab.drafts.draft import build_dflash

    build_dflash(tiny, None, block_size=4, num_layers=1).model.save_pretrained(tmp_path)
    v16 = load_verifier(tiny_dir, device="cpu", dtype="bfloat16")
    drafts = [load_draft(eagle_path, v16), load_draft(tmp_path, v16)]
    assert {d.dtype for d in drafts} == {torch.bfloat16}
    for p in PROMPTS[:2]:
        ids = v16.tokenizer(p)["input_ids"]
        ref = _generate(v16, ids, N_NEW)
        for prop in (NGramProposer(), *(make_proposer(d, v16.vocab_size) for d in drafts)):
            got = accept.speculative_generate(v16, prop, ids, 4, N_NEW).tokens
            assert greedy_agreement(v16, ids, got, ref)["lossless"], (p, type(prop).__name__)
            assert greedy_check(v16, ids, got, N_NEW)["lossless"], (p, type(prop).__name__)
        # notebook 05's teacher-forced replay in bf16 too (its float32 loss mask once met a bf16 draft on the H200)
        live = accept.speculative_generate(v16, make_proposer(drafts[0], v16.vocab_size), ids, 4, N_NEW)
        hits, sums = replay.chain_hits(drafts[0], ids, live.tokens, 4)
        assert hits.shape == (4, len(ids) + len(live.tokens)) and sums["cond_acc_0_total"] == len(live.tokens) - 1
        walked = [replay.seen(s) for s in replay.replay(hits, len(ids), live.tokens, 4, N_NEW)]
        assert len(walked) >= len(live.steps) - 1 and sum(a for _, a, _ in walked) > 0


def test_the_one_forward_greedy_check_passes_the_verifiers_greedy_text_and_catches_every_kind_of_departure(tiny):
    """notebook 05's lossless check: each emitted token the argmax of one full forward over prompt + output (no
    cache), the output complete. transformers' own greedy text and the loop's output pass; a swapped token, a
    cut-short output and an output running past end-of-sequence do not."""
    from draftlab.acceptance.lossless import greedy_check, lossless_rows

    ids = tiny.tokenizer(PROMPTS[0])["input_ids"]
    ref = _greedy(tiny, ids)
    got = accept.speculative_generate(tiny, NGramProposer(), ids, 3, N_NEW)
    for out in (ref, got.tokens):
        c = greedy_check(tiny, ids, out, N_NEW)
        assert c["lossless"] and c["divergences"] == 0 and c["first divergence"] is None, c
    logits = tiny.model(torch.tensor([ids + ref[:2]])).logits[0, -1]
    bad = greedy_check(tiny, ids, ref[:2] + [int(logits.argmin())] + ref[3:], N_NEW)
    assert not bad["lossless"] and bad["first divergence"] == 2 and bad["logit gap"] > 0
    assert not greedy_check(tiny, ids, ref[:-1], N_NEW)["lossless"], "cut short of the budget, and not at eos"
    eos = tiny.tokenizer.eos_token_id
    assert not greedy_check(tiny, ids, [*ref[:2], eos, *ref[3:]], N_NEW)["lossless"], "past end-of-sequence"
    rows = lossless_rows(tiny, [{"ids": ids}], {"ngram": [got]}, N_NEW)
    assert rows[0]["identical"] == rows[0]["lossless"] == 1 and rows[0]["prompts"] == 1


def test_non_integer_k_and_a_prompt_past_the_position_limit_are_named(tiny):
    with pytest.raises(DraftlabError, match="whole numbers for k and max_new_tokens .*k=2.5"):
        accept.speculative_generate(tiny, NGramProposer(), [5, 6, 7], 2.5, 8)
    long = (tiny.tokenizer("hello how are you today")["input_ids"] * 200)[:505]  # the tiny verifier has 512 positions
    with pytest.warns(UserWarning, match="505 tokens plus 8 new ones passes the verifier's position limit \\(512\\)"):
        accept.speculative_generate(tiny, NGramProposer(), long, 2, 8)


def test_load_run_drafts_finds_the_trained_drafts_skips_the_missing_and_adds_named_ones(tiny, eagle_path, tmp_path):
    import shutil

    from draftlab.acceptance.dflash import DFlashProposer
    from draftlab.acceptance.proposers import load_run_drafts
    from draftlab.drafts.draft import build_dflash
    from draftlab.layout import RunLayout

    layout = RunLayout("tiny", "run", root=tmp_path)
    shutil.copytree(eagle_path, layout.final("eagle3"))
    loaded = load_run_drafts(layout, tiny, ngram_max=2)
    assert list(loaded.proposers) == ["ngram", "eagle3"] and loaded.proposers["ngram"].max_n == 2
    assert isinstance(loaded.proposers["eagle3"], Eagle3Proposer) and loaded.paths["eagle3"].name == "final"
    assert loaded.notes[0].startswith("eagle3: loaded") and "dflash: no checkpoint under" in loaded.notes[1]
    build_dflash(tiny, None, block_size=4, num_layers=1).model.save_pretrained(tmp_path / "other")
    named = load_run_drafts(layout, tiny, ["dflash"], {"mine": tmp_path / "other"})
    assert list(named.proposers) == ["mine"] and isinstance(named.proposers["mine"], DFlashProposer)
    assert named.notes[0].startswith("dflash: no checkpoint") and named.drafts["mine"].kind == "dflash"


def test_tau_against_k_decodes_each_k_and_takes_measured_ones_as_they_are(tiny):
    from draftlab.acceptance.evaluate import run_prompts, summarize, tau_against_k

    prompts = [{"ids": tiny.tokenizer(p)["input_ids"], "id": i, "source": "chat"} for i, p in enumerate(PROMPTS[:2])]
    props = {"ngram": NGramProposer()}
    taus = tau_against_k(tiny, props, prompts, [1, 3], 12, measured={3: {"ngram": {"all": {"tau": 9.5}}}})
    want = summarize(run_prompts(tiny, props["ngram"], prompts, 1, 12), 1)["all"]["tau"]
    assert taus == {"ngram": {1: want, 3: 9.5}} and want >= 1.0


def test_greedy_verification_keeps_the_prefix_equal_to_the_argmax_then_its_next_argmax():
    best = [3, 1, 4, 1]
    logits = torch.nn.functional.one_hot(torch.tensor(best), 6).float()
    assert accept.verify_greedy(logits, [3, 1, 4]) == (3, 1)  # all accepted: the bonus is the free next token
    assert accept.verify_greedy(logits, [3, 2, 4]) == (1, 1)  # stops at the first mismatch, a later match is not kept
    assert accept.verify_greedy(logits, [5]) == (0, 3) and accept.verify_greedy(logits[:1], []) == (0, 3)


@pytest.mark.parametrize("k", [1, 3])
def test_one_teacher_forced_pass_replays_the_loops_accepted_lengths_step_for_step(tiny, eagle, k):
    """acceptance.replay: speculators' TTT forward over the loop's own greedy text, walked chain by chain, gives
    the loop's (drafted, accepted) at every step; shifted one position it does not."""
    from draftlab.acceptance import replay

    accepted, shifted_differs, gens = 0, False, []
    for p in PROMPTS:
        ids = tiny.tokenizer(p)["input_ids"]
        g = accept.speculative_generate(tiny, Eagle3Proposer(eagle.model, tiny.vocab_size), ids, k, N_NEW)
        g.settings["source"] = "chat"
        gens.append(g)
        hits, sums = replay.chain_hits(eagle, ids, g.tokens, k)
        got = [replay.seen(s) for s in replay.replay(hits, len(ids), g.tokens, k, N_NEW)]
        live = [replay.seen(s) for s in g.steps]
        assert got == live[: len(got)] and len(got) >= len(live) - 1, p  # the last step may check past an eos
        accepted += sum(a for _, a, _ in got)
        wrong = [replay.seen(s) for s in replay.replay(torch.roll(hits, 1, 1), len(ids), g.tokens, k, N_NEW)]
        shifted_differs |= wrong != live[: len(wrong)]
        assert (
            sums["cond_acc_0_total"]
            == hits.shape[1] - len(ids) - 1
            == replay.known(hits.shape[1], 1)[0, len(ids) - 1 :].sum()
        )
        assert sums["cond_acc_0_sum"] >= hits[0, len(ids) - 1 :].sum()  # within the draft vocabulary, never fewer hits
    assert accepted > 0 and shifted_differs
    rows = replay.gap_rows(eagle, gens, k, N_NEW, offline=[0.5] * k)
    counted = [r["counted"].split(",")[0] for r in rows]
    assert counted == ["teacher-forced"] * 3 + ["replayed at the live chain's steps", "live (draftlab's loop)"]
    same, of = rows[3]["steps equal to the loop"].split(" of ")
    assert same == of and int(of) > 0
    assert rows[3]["first position"] == rows[4]["first position"] or int(of) < sum(len(g.steps) for g in gens)


def test_the_gap_is_taken_apart_by_part_and_two_drafts_compared_with_what_each_part_closed(tmp_path):
    """The `gpu` profile's EAGLE-3 of 2026-12-04 (its table brought back to this CPU, no held-out row there: 04's
    0.782 stands in): the bench text -0.088, the draft vocabulary -0.004, where chains start -0.081 (BENCHMARKS.md);
    against a notebook 05 metrics.json that has the held-out row, the parts closed are new minus old."""
    import importlib.util

    from draftlab.acceptance.replay import gap_parts

    recorded = ROOT / "benchmarks" / "results" / "h200-2026-12-04c" / "teacher-forced-gap-cpu.json"
    old = json.loads(recorded.read_text())["rows"]
    assert gap_parts(old, held_out=0.782) == {
        "the bench text": -0.0882,
        "the draft vocabulary": -0.0039,
        "where chains start": -0.0805,
        "replay against the loop": 0.0025,
    }
    assert gap_parts(old)["the bench text"] is None  # no held-out figure: that part is not made up
    held = {"counted": "teacher-forced, stage 01's eval answers (speculators' metric)", "first position": 0.8}
    new = [held, *({**r, "first position": r["first position"] + (0.05 if "live" in r["counted"] else 0)} for r in old)]
    (tmp_path / "metrics.json").write_text(json.dumps({"teacher_forced_gap": {"eagle3": new}}))
    spec = importlib.util.spec_from_file_location("tf_gap", ROOT / "benchmarks" / "teacher_forced_gap.py")
    tf_gap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tf_gap)
    table = tf_gap.compare([str(recorded), str(tmp_path / "metrics.json"), "--held-out", "0.782", "0.7"])
    assert "| teacher-forced, stage 01's eval answers (speculators' metric) | - | 0.8 |" in table  # first, as counted
    assert "| the bench text | -0.0882 | -0.0562 | +0.0320 |" in table  # 0.8 from its own row, not --held-out


def test_notebook_05_keeps_its_figures_so_far_and_a_new_run_starts_them_anew(tmp_path):
    """A run cut before its last cell (a lent GPU's 30 minutes, 2026-12-07) leaves metrics.partial.json with what it
    measured: each call adds its parts, `fresh` drops an earlier run's, and the teacher-forced comparison reads it as
    it reads metrics.json. The recorded 2026-12-07 table against 2026-12-04's gives BENCHMARKS.md's parts closed."""
    import importlib.util

    from draftlab.acceptance import reported

    path = reported.keep_so_far(tmp_path, fresh=True, settings={"k": 5})
    reported.keep_so_far(tmp_path, served={"tau": 2.9})
    assert json.loads(path.read_text()) == {"settings": {"k": 5}, "served": {"tau": 2.9}, "complete": False}
    reported.keep_so_far(tmp_path, fresh=True, settings={"k": 7})
    assert json.loads(path.read_text()) == {"settings": {"k": 7}, "complete": False}  # the earlier run's figures gone
    results = ROOT / "benchmarks" / "results"
    new = json.loads((results / "h100-2026-12-07-gpu-profile" / "teacher-forced-gap.json").read_text())["rows"]
    reported.keep_so_far(tmp_path, teacher_forced_gap={"eagle3": new})
    spec = importlib.util.spec_from_file_location("tf_gap", ROOT / "benchmarks" / "teacher_forced_gap.py")
    tf_gap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tf_gap)
    table = tf_gap.compare(
        [str(results / "h200-2026-12-04c" / "teacher-forced-gap-cpu.json"), str(path), "--held-out", "0.782", "0.7"]
    )
    assert "| the bench text | -0.0882 | -0.0608 | +0.0274 |" in table  # 0.7892, its own held-out row
    assert "| where chains start | -0.0805 | -0.0446 | +0.0359 |" in table


def test_teacher_forced_counts_pool_each_depth_over_the_chains_that_reached_it():
    from draftlab.acceptance.replay import known, replay, text_counts

    hits = torch.tensor([[1, 1, 0, 1, 1, 1, 0, 0], [1, 0, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    # depth 0 known at p < 6, depth 1 at p < 5; counted from p = 1
    assert known(8, 2).sum(1).tolist() == [6, 5]
    assert text_counts(hits, 1) == ([4, 1], [5, 3])
    # a prompt of 2 tokens: the first chain starts at p = 1 and the next a + 1 further on
    text = [10, 11, 12, 13, 14, 15]  # the generated tokens: a step's bonus is the one after its accepted run

    def walked(n_prompt, tokens, max_new):
        return [(s.drafted, s.accepted, s.bonus) for s in replay(hits, n_prompt, tokens, 2, max_new)]

    assert walked(2, text, 6) == [(2, 1, 12), (2, 2, 15)]
    assert walked(2, text, 5) == [(2, 1, 12), (1, 1, 14)]  # one token of room left: one drafted
    assert walked(6, text[:2], 10) == []  # depth 1 at p = 5 would check a token past the text
    assert walked(2, text[:5], 10) == [(2, 1, 12)]  # the next run of 2 ends on the text's last token: no bonus


def test_one_pass_gives_the_loops_tau_at_every_k(tiny, eagle):
    """replay.tau_by_k walks one TTT pass at the longest k for every shorter k: each must be the loop's own tau at
    that k (its steps up to where the replay can see, the last one past an eos aside)."""
    from draftlab.acceptance import replay

    ks, gens = (1, 2, 4), {}
    for k in ks:
        gens[k] = [
            accept.speculative_generate(
                tiny, Eagle3Proposer(eagle.model, tiny.vocab_size), tiny.tokenizer(p)["input_ids"], k, N_NEW
            )
            for p in PROMPTS
        ]
    got = replay.tau_by_k(eagle, gens[4], ks, N_NEW)
    for k in ks:
        steps = []
        for g in gens[k]:
            seen = len(
                replay.replay(
                    replay.chain_hits(eagle, g.prompt_ids, g.tokens, k)[0], len(g.prompt_ids), g.tokens, k, N_NEW
                )
            )
            steps += g.steps[:seen]
        assert got[k] == pytest.approx(sum(s.accepted + 1 for s in steps) / len(steps)), k
    assert got[4] > got[1] > 1.0, got  # the trained draft is accepted, longer chains gain
