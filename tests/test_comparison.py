"""Notebook 05's every-family table (issue 32): each row from the figures it is handed, a refusal stated."""

from types import SimpleNamespace

import torch

from draftlab.acceptance.comparison import family_rows
from draftlab.acceptance.intervals import POOLED


def _est(tau, p):
    return {"k": len(p), "tau": {POOLED: {"value": tau, "lo": tau - 0.1, "hi": tau + 0.1}}} | {
        f"p_{i + 1}": {POOLED: {"value": v}} for i, v in enumerate(p)
    }


def test_every_family_is_a_row_with_its_served_figure_or_vllms_reason():
    estimates = {"ngram": _est(1.2, [0.1, 0.05]), "eagle3": _est(2.0, [0.6, 0.4]), "dspark": _est(1.5, [0.3, 0.2])}
    frozen = torch.nn.Linear(2, 2)
    frozen.weight.requires_grad_(False)  # 2 trainable parameters left: the bias
    drafts = {"eagle3": SimpleNamespace(model=torch.nn.Linear(3, 3)), "dspark": SimpleNamespace(model=frozen)}
    served_report = {
        "tau": [{"proposer": "eagle3", "vLLM tau (95%)": "1.990 [1.890, 2.090]"}],
        "speed": [
            {"server": "verifier alone", "tokens/s": 100.0, "speed-up": 1.0},
            {"server": "with eagle3", "tokens/s": 150.0, "speed-up": 1.5},
            {"server": "with eagle3", "tokens/s": 90.0, "speed-up": 0.9},  # a later level of requests in flight
        ],
    }
    trained = {"eagle3": {"train tokens/s (whole run)": 1000.0, "wall seconds": 12.0}}
    served_run = {"runs": {"eagle3": {"draft_model": True}}}  # what measure recorded beside the report
    rows = {
        r["proposer"]: r for r in family_rows(estimates, drafts, served_report, trained, {"mtp": "no MTP"}, served_run)
    }
    assert list(rows) == ["ngram", "eagle3", "dspark", "mtp"]
    e3, ds = rows["eagle3"], rows["dspark"]
    assert e3["tau, draftlab loop (95%)"] == "2.000 [1.900, 2.100]" and e3["tau, vLLM (95%)"].startswith("1.990")
    assert (e3["p_1"], e3["p_2"], e3["served tokens/s"], e3["speed-up"]) == (0.6, 0.4, 150.0, 1.5)
    assert (e3["trainable parameters"], e3["train tokens/s"], e3["train seconds"]) == (12, 1000.0, 12.0)
    assert ds["tau, vLLM (95%)"].startswith("not served: vLLM 0.32 (CPU) says") and ds["trainable parameters"] == 2
    assert rows["ngram"]["tau, vLLM (95%)"] == "-" and rows["ngram"]["trainable parameters"] == 0
    assert rows["mtp"]["tau, draftlab loop (95%)"] == "refused: no MTP"
