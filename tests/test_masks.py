import pytest
import torch

from draftlab import DraftlabError
from draftlab.masks.attention import FLEX, attend, check_mask, mask_builder, pick_attention, require_impl
from draftlab.masks.checks import block_states, expected_block_states, pointwise, run_checks
from draftlab.masks.common import synthetic_pack
from draftlab.masks.dflash import dflash_mask
from draftlab.masks.eagle3 import eagle3_mask


@pytest.fixture(scope="module")
def pack():
    return synthetic_pack([40, 50, 21], 128)  # three documents and 17 padding tokens


def _all_pass(checks):
    failed = [c["check"] for c in checks if not c["passed"]]
    assert not failed, failed
    return {c["check"] for c in checks}


@pytest.mark.parametrize("step", [0, 1, 2])
def test_eagle3_mask_is_causal_same_document_and_diagonal_per_ttt_step(pack, step):
    view = eagle3_mask(pack["document_ids"], step)
    assert view.dense.shape == (128, 128 * (step + 1))
    names = _all_pass(run_checks(view, 128, n_points=None if step == 0 else 4000))
    assert "token mask == EAGLE-3 intent exactly" in names
    assert sum(n.startswith("TTT step") for n in names) == step
    doc = pack["document_ids"][0]
    q = 45  # in document 1 (positions 40..89)
    assert view.dense[q, :128].nonzero().flatten().tolist() == list(range(40, 46))
    for s in range(1, step + 1):
        assert view.dense[q, s * 128 : (s + 1) * 128].nonzero().flatten().tolist() == [q]
    pad = int((doc == -1).nonzero()[0])
    assert view.dense[pad].nonzero().flatten().tolist() == [pad + s * 128 for s in range(step + 1)], (
        "padding sees itself only"
    )


def test_dflash_mask_blocks_see_their_prefix_and_whole_own_block(pack):
    view = dflash_mask(pack["document_ids"], pack["loss_mask"], n_anchors=6, block_size=4, seed=1)
    assert view.dense.shape == (24, 128 + 24)
    _all_pass(run_checks(view, 128, n_points=None))
    anchors, doc = view.extra["anchors"], pack["document_ids"][0]
    assert torch.equal(anchors, anchors.sort().values) and bool(view.extra["anchor_valid"].all())
    assert all(pack["loss_mask"][0, a] == 1 for a in anchors.tolist()), "anchors sit on supervised tokens"
    j, a = 3, int(anchors[3])
    row = view.dense[j * 4]
    start = int((doc == doc[a]).nonzero()[0])
    assert row[:128].nonzero().flatten().tolist() == list(range(start, a))
    assert row[128:].nonzero().flatten().tolist() == [12, 13, 14, 15]


def test_the_checks_fail_on_a_wrong_mask(pack):
    view = eagle3_mask(pack["document_ids"], 1)
    view.dense = view.dense.clone()
    view.dense[45, 10] = True  # document 1 peeking into document 0
    failed = {c["check"] for c in run_checks(view, 128) if not c["passed"]}
    assert {"no query sees another document", "token mask == EAGLE-3 intent exactly"} <= failed
    df = dflash_mask(pack["document_ids"], pack["loss_mask"], 4, 4)
    df.dense = df.dense.clone()
    a = int(df.extra["anchors"][0])
    df.dense[0, a] = True  # the anchor itself is not context
    failed = {c["check"] for c in run_checks(df, 128, n_points=None) if not c["passed"]}
    assert "no query sees a base token at or after its anchor, or in another document" in failed
    assert "dense mask == mask function evaluated point by point" in failed


def test_block_states_match_the_token_mask_at_small_blocks():
    p = synthetic_pack([70, 90, 64], 256)
    view = eagle3_mask(p["document_ids"], 0, flex_block=32)
    states = block_states(view.block)
    assert torch.equal(states, expected_block_states(view.dense, 32))
    assert {0, 1, 2} <= set(states.unique().tolist()), "skipped, partial and full blocks all present"
    assert torch.equal(pointwise(view.mask_mod, 4, 4), view.dense[:4, :4].flatten())


def test_ttt_extension_with_a_pack_not_a_multiple_of_128_is_caught_before_flex(pack):
    short = synthetic_pack([40, 50, 21], 127)
    with pytest.raises(DraftlabError, match="multiple of 128"):
        eagle3_mask(short["document_ids"], 1)
    with pytest.raises(DraftlabError, match="flex_block=128"):
        eagle3_mask(pack["document_ids"], 1, flex_block=16)


def test_attention_choice_is_explicit_and_explained():
    assert pick_attention("cpu")[0] == "sdpa" and "no backward" in pick_attention("cpu")[1]
    assert pick_attention("cuda")[0] == FLEX
    with pytest.raises(
        DraftlabError,
        match="attention='flex' on cpu: torch's flex attention has no backward on CPU.*Use attention='sdpa'",
    ):
        pick_attention("cpu", force="flex")  # refused when the draft is built, not when training fails in torch
    assert pick_attention("cpu", force="sdpa") == ("sdpa", "forced by parameter (sdpa)")
    with pytest.raises(DraftlabError, match="unknown"):
        pick_attention("cpu", force="flash")
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    assert mask_builder("sdpa") is create_mask and mask_builder(FLEX) is create_block_mask


def test_blockmask_into_sdpa_and_unset_implementation_raise_our_error_first(pack):
    view = eagle3_mask(pack["document_ids"], 1)
    q, k, v = torch.randn(1, 2, 128, 8), torch.randn(1, 2, 256, 8), torch.randn(1, 2, 256, 8)
    with pytest.raises(DraftlabError, match="BlockMask was handed to sdpa"):
        attend(q, k, v, view.block, "sdpa")
    with pytest.raises(DraftlabError, match="_attn_implementation is unset"):
        attend(q, k, v, view.dense, None)
    with pytest.raises(DraftlabError, match="needs a BlockMask"):
        check_mask(FLEX, view.dense)
    with pytest.raises(DraftlabError, match="not one draftlab supports"):
        require_impl("flash_attention_2")
    # And the two legal pairings compute the same attention.
    torch.testing.assert_close(
        attend(q, k, v, view.block, FLEX), attend(q, k, v, view.dense, "sdpa"), atol=1e-5, rtol=1e-4
    )


def test_mask_explorer_builds_sliders_only_outside_headless_runs(monkeypatch, capsys):
    from draftlab.masks import explore
    from draftlab.progress import HEADLESS

    monkeypatch.delenv(HEADLESS, raising=False)
    box = explore.mask_explorer(seq_len=128, docs=2, block_size=4, n_anchors=2, ttt_step=1)
    sliders = [s.description for row in box.children[:2] for s in row.children]
    assert sliders == ["seq length", "docs / pack", "block size", "anchors", "TTT step"]
    monkeypatch.setenv(HEADLESS, "1")
    assert explore.mask_explorer(seq_len=128, docs=2, block_size=4, n_anchors=2, ttt_step=1) is None
    assert "no live sliders" in capsys.readouterr().out


def test_large_masks_are_drawn_as_the_share_of_visible_keys_per_screen_cell():
    from draftlab.masks.plots import mask_heatmap, screen_cells

    g = torch.Generator().manual_seed(0)
    dense = torch.rand(301, 703, generator=g) < 0.3
    img, fq, fk = screen_cells(dense, max_rows=100, max_cols=200)
    assert (fq, fk) == (4, 4) and img.shape == (76, 176)
    for r, c in [(0, 0), (37, 91), (75, 175), (75, 0), (0, 175)]:  # inner cells and the short edge cells
        cell = dense[r * fq : (r + 1) * fq, c * fk : (c + 1) * fk]
        assert img[r, c] == pytest.approx(cell.float().mean().item())
    small, one, also_one = screen_cells(dense)  # fits a figure: drawn token by token
    assert (one, also_one) == (1, 1) and (small == dense.numpy()).all()

    view = eagle3_mask(synthetic_pack([3000, 1500], 4608)["document_ids"], 1)  # 4608 x 9216 tokens
    ax = mask_heatmap(view)
    assert ax.images[0].get_array().shape == (922, 1844)  # cells of 5 x 5 tokens
    assert ax.get_xlim() == (-0.5, view.kv_len - 0.5) and ax.get_ylim() == (view.q_len - 0.5, -0.5)  # token coordinates


def test_deliberate_eager_flex_calls_do_not_warn(pack, monkeypatch):
    """Notebook 02's comparison and 03's one-off forwards run flex eagerly on purpose: no warning about
    the unfused kernel there (torch shows it once per process; the set is emptied as in a fresh one)."""
    import warnings

    import torch.nn.attention.flex_attention as fa

    from draftlab.drafts.inspection import one_off

    monkeypatch.setattr(fa, "_WARNINGS_SHOWN", set())
    view = eagle3_mask(pack["document_ids"], 1)
    q, k, v = torch.randn(1, 2, 128, 8), torch.randn(1, 2, 256, 8), torch.randn(1, 2, 256, 8)
    unfused = "flex_attention called without torch.compile"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        attend(q, k, v, view.block, FLEX)
        fa._WARNINGS_SHOWN.clear()
        with one_off():
            fa.flex_attention(q, k, v, block_mask=view.block)
        assert not [w for w in seen if unfused in str(w.message)]
        fa._WARNINGS_SHOWN.clear()
        fa.flex_attention(q, k, v, block_mask=view.block)  # the same call outside: torch warns
    assert [w for w in seen if unfused in str(w.message)]


@pytest.mark.parametrize(
    ("module", "argv", "png"),
    [
        ("eagle3", ["--seq-len", "128", "--ttt-step", "1"], "eagle3_ttt1.png"),
        ("dflash", ["--anchors", "4"], "dflash.png"),
    ],
)
def test_each_family_main_draws_its_mask(module, argv, png, tmp_path, capsys):
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    importlib.import_module(f"draftlab.masks.{module}").main([*argv, "--out", str(tmp_path)])
    assert [p.name for p in tmp_path.iterdir()] == [png]
    assert "kv_len" in capsys.readouterr().out  # the mask's arithmetic is printed beside the picture
