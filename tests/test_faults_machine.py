"""Faults of the machine (a full disk, a file-size limit, a read-only folder, a killed runner) and bad
input records: each named with its path and fix, nothing lost."""

from __future__ import annotations

import contextlib
import errno
import resource
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from draftlab import DraftlabError

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("one_thread")]


@contextlib.contextmanager
def file_size_limit(n_bytes: int):
    """A real RLIMIT_FSIZE on this process (Python ignores SIGXFSZ, so a write past it fails with EFBIG)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _trainer(seed: int = 0):
    """A stand-in for a draft (what `checkpoint.save` and `final.write_final` read: `.model`, the verifier's path and
    fingerprint) with its optimizer and schedule."""
    from conftest import make_model

    model = make_model(64, layers=1, seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    verifier = SimpleNamespace(path="stand-in", fingerprint="stand-in")
    return SimpleNamespace(model=model, verifier=verifier), opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)


def test_a_checkpoint_past_the_file_size_limit_is_named_and_the_last_one_kept(tmp_path):
    from draftlab.training import checkpoint

    draft, opt, sched = _trainer()
    first = checkpoint.save(tmp_path, draft, 1, opt, sched, (0, 0), {})
    before = load_file(first / "model.safetensors")
    with file_size_limit(4096), pytest.raises(DraftlabError) as err:
        checkpoint.save(tmp_path, draft, 2, opt, sched, (0, 0), {})
    msg = str(err.value)
    assert str(tmp_path / "checkpoints" / "step-2") in msg and "the checkpoint of step 2" in msg
    assert "file-size limit" in msg and "ulimit -f" in msg and f"{first}, is kept" in msg
    assert checkpoint.checkpoints(tmp_path) == [first]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]  # no temporary folder left
    after = load_file(first / "model.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_new_checkpoint_replaces_the_last_only_once_it_is_whole_and_keep_keeps_more(tmp_path):
    """A full disk in CI came from every family keeping two checkpoints of three times the draft each."""
    from draftlab.training import checkpoint

    draft, opt, sched = _trainer()
    for step in (1, 2):
        checkpoint.save(tmp_path / "one", draft, step, opt, sched, (0, step), {})
        checkpoint.save(tmp_path / "two", draft, step, opt, sched, (0, step), {}, keep=2)
    checkpoint.save(tmp_path / "two", draft, 3, opt, sched, (0, 3), {}, keep=2)
    assert [p.name for p in checkpoint.checkpoints(tmp_path / "one")] == ["step-2"]
    assert [p.name for p in checkpoint.checkpoints(tmp_path / "two")] == ["step-2", "step-3"]
    assert sorted(p.name for p in (tmp_path / "one" / "checkpoints").iterdir()) == ["step-2"]


def test_final_past_the_file_size_limit_is_named_and_keeps_the_earlier_final(tmp_path):
    from draftlab.training import final

    draft, _, _ = _trainer()
    final.write_final(tmp_path, draft)
    before = (tmp_path / "final" / "model.safetensors").read_bytes()
    with file_size_limit(4096), pytest.raises(DraftlabError, match=r"final.*\(the trained draft, final/\)"):
        final.write_final(tmp_path, _trainer(seed=1)[0])
    assert (tmp_path / "final" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_hidden_states_past_the_file_size_limit_are_named_and_a_rerun_resumes(tiny, tmp_path):
    from draftlab.data import dataset, extract, manifest

    from conftest import random_rows

    ds = dataset.save_split(random_rows(tiny.vocab_size, [30, 20, 25]), tiny.tokenizer, tmp_path, max_length=64)
    with file_size_limit(4096), pytest.raises(DraftlabError) as err:
        extract.extract(tiny, ds, tmp_path, [2, 4, 5], progress=False)
    msg = str(err.value)
    assert "hidden_states/hs_" in msg and "one sample's hidden states" in msg and "file-size limit" in msg
    assert not list((tmp_path / "hidden_states").glob("*.tmp"))  # no half-written file under any name
    stats = extract.extract(tiny, ds, tmp_path, [2, 4, 5], progress=False)
    assert stats.written + stats.reused == 3 and manifest.read(tmp_path)["complete"]
    manifest.verify_files(tmp_path)


@pytest.mark.parametrize(
    ("err", "fix"),
    [
        (errno.ENOSPC, "the disk is full: free space on it, or set DRAFTLAB_HOME"),
        (errno.EFBIG, "a file-size limit stopped it"),
        (errno.EACCES, "is not writable: make it writable (chmod u+w)"),
        (errno.EROFS, "is not writable"),
    ],
)
def test_a_refused_write_names_the_file_the_operation_and_the_fix(tmp_path, monkeypatch, err, fix):
    """Read-only folders cannot be made here (the tests may run as root), so the OS's refusal is stood in for."""
    from draftlab import writes
    from draftlab.data.prompts import Prompt, write_prompt_set

    target = tmp_path / "prompts.jsonl"
    target.write_text("earlier\n")

    def refuse(*a, **kw):
        raise OSError(err, "refused", str(tmp_path / ".prompts.jsonl.x.tmp"))

    monkeypatch.setattr(writes.tempfile, "mkstemp", refuse)
    with pytest.raises(DraftlabError) as got:
        write_prompt_set([Prompt("a", "chat", "hi", "train")], target)
    assert f"could not write {target}" in str(got.value) and fix in str(got.value)
    assert target.read_text() == "earlier\n"


def test_a_read_only_outputs_folder_is_refused_before_any_notebook(tmp_path, monkeypatch):
    import tempfile

    from draftlab import run
    from draftlab.writes import writable_folder

    def refuse(*a, **kw):
        raise PermissionError(errno.EACCES, "Permission denied", kw.get("dir"))

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    with pytest.raises(DraftlabError, match=r"outputs.*not writable.*--run-name"):
        writable_folder(tmp_path / "outputs" / "x", "the run's outputs folder", run.OUTPUTS_ELSEWHERE)


def test_errors_that_are_not_the_machines_pass_through(tmp_path):
    from draftlab.writes import writing

    with pytest.raises(KeyError), writing(tmp_path, "a test"):
        raise KeyError("not a write")
    with pytest.raises(RuntimeError, match="other"), writing(tmp_path, "a test"):
        raise RuntimeError("other")


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its new parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _home_with_notebook(tmp_path, code: str):
    """A DRAFTLAB_HOME whose only notebook, 01_probe.ipynb, runs `code` (the ci profile's parameters)."""
    import shutil

    import nbformat

    from draftlab.config import notebooks_dir

    params = tmp_path / "notebooks" / "params"
    params.mkdir(parents=True)
    shutil.copy(notebooks_dir() / "params" / "ci.yaml", params)
    nb = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    )
    nb.cells = [nbformat.v4.new_code_cell(code)]
    nbformat.write(nb, tmp_path / "notebooks" / "01_probe.ipynb")
    return tmp_path


def test_a_killed_runner_takes_its_kernel_with_it_even_mid_cell(tmp_path):
    """The cell holds the GIL (one long C call), so ipykernel's own parent check, a Python thread, never runs."""
    import os
    import signal
    import subprocess
    import sys
    import time

    home = _home_with_notebook(
        tmp_path, f"import os\nopen({str(tmp_path / 'kernel.pid')!r}, 'w').write(str(os.getpid()))\nsum(range(10**13))"
    )
    env = {**os.environ, "DRAFTLAB_HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}
    runner = subprocess.Popen(
        [sys.executable, "-m", "draftlab", "run", "--profile", "ci", "--only", "01"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pid_file, kernel = tmp_path / "kernel.pid", None
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and not (pid_file.exists() and pid_file.read_text()):
            assert runner.poll() is None, "the runner ended before its kernel ran the cell"
            time.sleep(0.1)
        kernel = int(pid_file.read_text())
        time.sleep(0.5)  # well into sum(), holding the GIL
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        end = time.monotonic() + 5
        while time.monotonic() < end and _alive(kernel):
            time.sleep(0.1)
        assert not _alive(kernel), "the kernel outlived its killed runner"
    finally:
        runner.kill()
        if kernel and _alive(kernel):
            os.kill(kernel, signal.SIGKILL)


def test_a_kernel_that_dies_with_its_runner_still_runs_every_notebook_to_the_end(tmp_path, monkeypatch):
    from draftlab import run

    monkeypatch.setenv("DRAFTLAB_HOME", str(_home_with_notebook(tmp_path, "x = 6 * 7\nprint(x)")))
    summary = run.run("ci", ["01"], cell_timeout=60)
    assert [r["status"] for r in summary] == ["ok"]
    assert "42" in (tmp_path / "outputs" / "ci" / "01_probe.ipynb").read_text()


def test_sharegpt_records_that_are_not_text_are_dropped_and_counted(sharegpt_file, tiny):
    from draftlab.data.generate import _chat_ids
    from draftlab.data.sources import sharegpt_texts

    def rec(rid: bytes, value: bytes, answer: bytes = b"ok") -> bytes:
        turns = b'[{"from": "human", "value": "%s"}, {"from": "gpt", "value": "%s"}]' % (value, answer)
        return b'{"id": "%s", "conversations": %s}' % (rid, turns)

    records = [
        rec(b"good_0", b"hello there"),
        rec(b"escaped_0", b"a lone \\ud800 surrogate"),  # valid JSON, not valid text
        rec(b"latin1_0", b"caf\xe9 au lait"),  # a byte that is not UTF-8
        rec(b"bad\xff_0", b"fine text, bad id"),
        rec(b"answer_0", b"fine question", b"an answer with \xff"),  # only the first human turn is read
    ]
    sharegpt_file.write_bytes(b"[\n" + b",\n".join(records) + b"\n]")
    texts, counts = sharegpt_texts(2000)
    counts = dict(counts)
    assert [t.id for t in texts] == ["sharegpt/good_0", "sharegpt/answer_0"]
    assert counts["records read"] == 5 and counts["kept"] == 2
    assert counts["dropped: not valid text (bytes that are not UTF-8, or a lone surrogate)"] == 3
    assert all(_chat_ids(tiny.tokenizer, t) for t in texts)  # what the tokenizer refused before


@pytest.fixture(scope="module")
def overgrown(tmp_path_factory):
    """A verifier whose tokenizer has one token more than its model embeds ("<extra>", id = the model's size)."""
    from draftlab.data.verifier import load_verifier

    from conftest import make_model, make_tokenizer

    path = tmp_path_factory.mktemp("overgrown")
    tok = make_tokenizer()
    make_model(len(tok), layers=2).save_pretrained(path)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(path)
    return load_verifier(path, device="cpu", dtype="float32")


def test_a_prompt_with_a_token_past_the_vocabulary_is_named_before_generation(overgrown, tmp_path):
    from draftlab.data.generate import generate_responses
    from draftlab.data.prompts import Prompt

    prompts = [Prompt("chat/ok", "chat", "hello", "train"), Prompt("chat/over", "chat", "hello <extra>", "train")]
    n = overgrown.embed.weight.shape[0]
    with pytest.raises(DraftlabError, match=rf"record chat/over holds token id {n}, .* embeds ids 0 to {n - 1} only"):
        generate_responses(overgrown, prompts, tmp_path / "responses.jsonl", max_new_tokens=2, engine="hf")


def test_a_row_with_a_token_past_the_vocabulary_is_named_before_extraction(tiny, tmp_path):
    from draftlab.data import dataset, extract

    from conftest import random_rows

    rows = random_rows(tiny.vocab_size, [20, 25])
    rows["input_ids"][1][3] = tiny.vocab_size + 5
    ds = dataset.save_split(rows, tiny.tokenizer, tmp_path, max_length=64)
    with pytest.raises(
        DraftlabError, match=rf"rows of {tmp_path}: record 1 holds token id {tiny.vocab_size + 5}.*notebook 01"
    ):
        extract.extract(tiny, ds, tmp_path, [2, 4, 5], progress=False)
    assert not list((tmp_path / "hidden_states").glob("hs_*"))


def test_a_notebook_05_prompt_past_the_vocabulary_is_named_before_decoding(overgrown):
    from draftlab.acceptance.evaluate import run_prompts
    from draftlab.acceptance.proposers import NGramProposer

    ids = overgrown.tokenizer("hi <extra>")["input_ids"]
    prompts = [{"id": "bench/1", "source": "chat", "ids": ids}]
    with pytest.raises(DraftlabError, match="prompts of notebook 05: record bench/1 holds token id"):
        run_prompts(overgrown, NGramProposer(), prompts, k=2, max_new_tokens=2)


@pytest.mark.parametrize("bad", [-1, "vocab", 2.0, True])
def test_speculative_generate_refuses_a_token_id_outside_the_verifiers_vocabulary_by_name(tiny, bad):
    from draftlab.acceptance.proposers import NGramProposer
    from draftlab.acceptance.speculative import speculative_generate

    n = tiny.embed.weight.shape[0]
    bad = n if bad == "vocab" else bad
    says = f"record prompt_ids holds token id {bad}, but the verifier .* embeds ids 0 to {n - 1} only"
    says = says if isinstance(bad, int) and not isinstance(bad, bool) else f"prompt_ids holds {bad!r}, not a token id"
    with pytest.raises(DraftlabError, match=f"speculative_generate: {says}"):
        speculative_generate(tiny, NGramProposer(), [5, 6, bad], k=2, max_new_tokens=2)
    assert speculative_generate(tiny, NGramProposer(), [5, 6, 7], k=2, max_new_tokens=2).tokens
