"""Hidden states through vLLM's extract_hidden_states engine (speculators' path) on a tiny random verifier, checked slot
by slot against draftlab's transformers extraction; skipped where there is no working vLLM environment."""

from __future__ import annotations

import pytest

from draftlab import DraftlabError
from draftlab.data import extract_check, extract_vllm
from draftlab.serving.command import unavailable, vllm_version
from draftlab.serving.process import group_members

from conftest import random_rows

LAYER_IDS = [1, 4, 6]  # of the serve verifier's 8 layers; the final state, id 8, is the last slot
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _needs_vllm():
    if unavailable() is not None:
        pytest.skip(f"no working vLLM environment: {unavailable()}")


def test_vllm_hands_out_draftlabs_layers_slot_for_slot(serve_dir, serve_verifier, tmp_path):
    v = serve_verifier
    rows = random_rows(v.vocab_size, [37, 5, 64, 21])["input_ids"]
    rows.append(
        rows[2][:40] + rows[0][:9]
    )  # shares 40 tokens with row 2: with prefix caching, states may come from its blocks
    s = extract_vllm.extraction_server(
        serve_dir, LAYER_IDS, tmp_path / "store", log_path=tmp_path / "vllm.log", max_model_len=256
    )
    assert s.slots == [*LAYER_IDS, 8]
    with s:
        pgid = s.proc.pid
        assert s.logged_aux_layers() == s.slots, (
            "vLLM took the ids as given: no shift between its numbering and draftlab's"
        )
        info = extract_vllm.extract(s, rows, tmp_path / "vllm", concurrency=3)
    assert s.proc.poll() is not None and group_members(pgid) == [], "the server and its engine processes are gone"
    assert info["rows"] == len(rows) and info["tokens"] == sum(map(len, rows)) and info["tokens_per_s"] > 0
    got = extract_check.check(v, rows, tmp_path / "vllm", LAYER_IDS)
    assert got["problems"] == [], got
    assert got["layers_match"] and [n["layer"] for n in got["nearest"]] == [*LAYER_IDS, 8]
    assert max(got["max_relative_error"]) < 1e-5, "fp32 both ways"
    assert all(
        u["relative_error"] > 100 * n["relative_error"] for n, u in zip(got["nearest"], got["runner_up"], strict=True)
    )


def test_the_check_names_a_slot_that_holds_another_layer(serve_dir, serve_verifier, tmp_path):
    """The seeds' failure, faked on disk: a file whose slots are shifted by one layer, or the first layer copied over all."""  # noqa: E501
    import torch
    from safetensors.torch import save_file

    from draftlab.data.hooks import hidden_states

    v, rows = serve_verifier, random_rows(serve_verifier.vocab_size, [30, 12])["input_ids"]
    for name, ids in (("shifted", [i + 1 for i in LAYER_IDS]), ("first only", [LAYER_IDS[0]] * 3)):
        hs_dir = tmp_path / name / "hidden_states"
        hs_dir.mkdir(parents=True)
        for i, r in enumerate(rows):
            every = hidden_states(v, [r], list(range(v.num_layers)))[0]
            save_file(
                {"token_ids": torch.tensor(r), "hidden_states": every[:, [*ids, 8]].contiguous()},
                hs_dir / f"hs_{i}.safetensors",
            )
        got = extract_check.check(v, rows, tmp_path / name, LAYER_IDS)
        assert not got["layers_match"]
        assert [n["layer"] for n in got["nearest"]] == [*ids, 8]
        assert any(p.startswith(f"slot 1 (id 4): vLLM's state is nearest to id {ids[1]}") for p in got["problems"]), (
            got["problems"]
        )


def test_the_probe_gives_the_stock_connectors_error_on_a_cpu_build():
    problem = extract_vllm.connector_problem()
    if (vllm_version() or "").endswith("+cpu"):
        assert problem is not None and "pin_memory=True requires a CUDA or other accelerator backend" in problem
        assert "draftlab's DraftlabCPUHiddenStatesConnector" in extract_vllm.status_line()
    else:
        assert problem is None and "available (vLLM's ExampleHiddenStatesConnector)" in extract_vllm.status_line()


def test_bad_layer_ids_and_connectors_are_refused_before_any_process(serve_dir, tmp_path):
    with pytest.raises(DraftlabError, match=r"aux layer ids \[1, 9\] are invalid for a verifier with 8 layers"):
        extract_vllm.extraction_server(serve_dir, [1, 9], tmp_path)
    with pytest.raises(DraftlabError, match="connector='gpu'"):
        extract_vllm.extraction_server(serve_dir, [1, 2], tmp_path, connector="gpu")
