"""Every stage's plot functions return their Figure and write nothing; the caller saves it with
figures.save, under the names the notebooks' outputs/<run>/NN/*.png have."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from draftlab import figures  # noqa: E402
from draftlab.acceptance import plots as accept_plots  # noqa: E402
from draftlab.data import plots as data_plots  # noqa: E402
from draftlab.masks import plots as mask_plots  # noqa: E402
from draftlab.masks.common import synthetic_pack  # noqa: E402
from draftlab.masks.dflash import dflash_mask  # noqa: E402
from draftlab.masks.eagle3 import eagle3_mask  # noqa: E402
from draftlab.training import plots as train_plots  # noqa: E402


def _records(kind: str) -> list[dict]:
    acc = {"full_acc_0": 0.4, "full_acc_1": 0.2} if kind == "eagle3" else {"position_1_acc": 0.3, "position_2_acc": 0.1}
    return [
        {"split": s, "step": t, "loss": 1 / t, "lr": 1e-3, "tokens_per_s": 50.0 * t, "seconds": 0.5, **acc}
        for t in (1, 2, 3)
        for s in ("train", "eval")
    ]


def _lever_rows(tokens):
    return [
        {"arm": a, "training seconds": s, "steps": n, "data": {"train tokens": t}, "bench tau": tau}
        for a, s, n, t, tau in zip(
            ("base", "more"),
            (40, 60),
            (1500, 6000),
            tokens,
            ({"value": 1.2, "lo": 1, "hi": 2}, {"value": 1.4, "lo": 1, "hi": 2}),
            strict=True,
        )
    ]


def test_levers_cost_draws_steps_on_a_log_axis_and_a_rewritten_datasets_text_as_the_same():
    """Two arms whose datasets differ by 0.05% of their text (answers written again in another lease) are drawn
    near one point of the text axis, not at its two ends; the steps axis is log 2 (the steps lever doubles)."""
    fig = train_plots.levers_cost(_lever_rows((2_833_238, 2_831_743)))
    seconds, steps, text = fig.axes
    lo, hi = text.get_xlim()
    assert hi - lo >= 0.1 * 2_832_490 and lo < 2_831_743 < 2_833_238 < hi
    assert steps.get_xscale() == "log" and steps.get_xlim()[0] < 1500 and steps.get_xlim()[1] > 6000
    plt.close(fig)


def _cases():
    pack = synthetic_pack([40, 50, 21], 128)
    g = torch.Generator().manual_seed(0)
    runs = {k: _records(k) for k in ("eagle3", "dflash")}
    served = {"eagle3": {"vLLM": [0.5], "draftlab": [0.6]}}
    return {
        "hidden_state_norms": lambda: data_plots.hidden_state_norms([torch.randn(9, 3, 4, generator=g)] * 2, [1, 2, 3]),
        "vocab_coverage": lambda: data_plots.coverage_plot(np.linspace(0.1, 1.0, 50), 20, 100, 0.7),
        "lengths": lambda: data_plots.length_histogram({"train": [5, 9, 12], "eval": [7]}, 12),
        "eagle3_ttt1": lambda: mask_plots.mask_figure(eagle3_mask(pack["document_ids"], 1)),
        "dflash": lambda: mask_plots.mask_figure(dflash_mask(pack["document_ids"], pack["loss_mask"], 4, 4)),
        "training_curves": lambda: train_plots.training_curves(runs),
        "position_accuracy": lambda: train_plots.position_curves(runs),
        "position_accuracy_arms": lambda: train_plots.arm_curves({"gpu": runs, "gpu-ttt5": runs}),
        "levers_cost": lambda: train_plots.levers_cost(_lever_rows((100, 200))),
        "accepted_length_hist": lambda: accept_plots.accepted_length_histogram({"ngram": [3, 2, 1]}, "t"),
        "alpha_n": lambda: accept_plots.alpha_plot({"ngram online": [0.8, None], "eagle3 offline": [0.9, 0.5]}, "t"),
        "tau_vs_k": lambda: accept_plots.tau_vs_k({"ngram": {1: 1.4, 3: 1.9}}, "t"),
        "served_per_position": lambda: accept_plots.served_positions(served, "t"),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_plots_return_their_figure_and_the_caller_saves_it(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fig = _cases()[name]()
    assert isinstance(fig, Figure) and fig.axes
    assert list(tmp_path.iterdir()) == [], "a plot function wrote a file"
    assert figures.save(fig, tmp_path / "run" / "NN", name) is fig
    assert [p.name for p in (tmp_path / "run" / "NN").iterdir()] == [f"{name}.png"]
    assert (tmp_path / "run" / "NN" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plt.close(fig)


def test_loss_mask_html_colours_trained_and_context_tokens(tiny):
    tok = tiny.tokenizer
    ids = tok("hello world")["input_ids"]
    html = data_plots.loss_mask_html(tok, ids, [0] + [1] * (len(ids) - 1))
    assert html.count("background:#e5e5e5;font-weight") == 1  # the legend's spans carry no font-weight
    assert html.count("background:#b7e4c7;font-weight") == len(ids) - 1
