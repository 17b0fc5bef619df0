"""`benchmarks/gpu_pipeline.sh`'s report, the part of every lent-GPU call that waits on a background job and says how
it ended: run here on a stand-in job patched into a copy of the script (the real jobs need the device)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def pipeline(tmp_path):
    """A copy of the script with a job `NAME` (its -job: write a line, sleep FAKE_S, write another) and a call."""
    name = f"fake{uuid.uuid4().hex[:8]}"
    text = (ROOT / "benchmarks" / "gpu_pipeline.sh").read_text()
    job = (
        f'{name})\n  report {name} {name}_files "/tmp/{name}-*.log" ;;\n'
        f'{name}-job)\n  echo start > /tmp/{name}-x.log; sleep "${{FAKE_S:-1}}"; echo done >> /tmp/{name}-x.log ;;\n'
    )
    assert "served|speedup|torchrun|sweep)\n" in text
    text = text.replace("served|speedup|torchrun|sweep)\n", job + "served|speedup|torchrun|sweep)\n", 1)
    text = text.replace("torchrun_files() {", f"{name}_files() {{ echo /tmp/{name}-x.log; }}\ntorchrun_files() {{", 1)
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "gpu_pipeline.sh").write_text(text)

    def call(**env):
        e = {**os.environ, "WORK": str(tmp_path), "OUT": str(tmp_path / "out"), **{k: str(v) for k, v in env.items()}}
        return subprocess.run(
            ["bash", "benchmarks/gpu_pipeline.sh", name], cwd=tmp_path, env=e, capture_output=True, text=True
        )

    yield name, call
    for f in Path("/tmp").glob(f"*{name}*"):
        f.unlink()


def test_a_job_is_waited_on_reported_and_run_again_only_when_asked(pipeline):
    name, call = pipeline
    first = call(FAKE_S=3, WAIT_S=1)
    assert first.returncode == 3 and "still running" in first.stdout
    done = call(WAIT_S=30)
    assert done.returncode == 0 and f"job {name} ended with status 0" in done.stdout and "done" in done.stdout
    log = Path(f"/tmp/draftlab-{name}.log")
    stamp = log.stat().st_mtime_ns
    assert call(WAIT_S=30).returncode == 0 and log.stat().st_mtime_ns == stamp  # reported again, not run again
    again = call(AGAIN=1, WAIT_S=30)
    assert again.returncode == 0 and log.stat().st_mtime_ns != stamp
    assert len(list(Path("/tmp").glob(f"draftlab-{name}.log.[0-9]*"))) == 1  # the earlier run's log kept aside


def test_a_job_killed_without_a_status_is_said_to_be_gone_not_waited_on(pipeline):
    name, call = pipeline
    assert call(FAKE_S=60, WAIT_S=1).returncode == 3
    pid = int(Path(f"/tmp/draftlab-{name}.log.pid").read_text())
    os.killpg(pid, signal.SIGKILL)  # the job's own process session, as a lost machine's OOM killer or a user would
    time.sleep(0.5)
    t0 = time.monotonic()
    gone = call(WAIT_S=60)
    assert time.monotonic() - t0 < 20
    assert gone.returncode == 1 and "gone without a status" in gone.stderr and "AGAIN=1" in gone.stderr


def test_the_staging_parts_come_together_in_any_order_and_a_job_without_them_is_refused(tmp_path):
    """`prepare`'s archive, split by `pack-stage` as the header's calls carry it, put back whole by `stage` only once
    every part came (each call names the parts still missing); a job called before that names what to do."""
    work = tmp_path / "work"
    (work / "benchmarks").mkdir(parents=True)
    (work / "benchmarks" / "gpu_pipeline.sh").write_text((ROOT / "benchmarks" / "gpu_pipeline.sh").read_text())
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    payload = tmp_path / "src" / "payload"
    (payload / "whl").mkdir(parents=True)
    blob = os.urandom(70_000)
    (payload / "vllm.part.a").write_bytes(blob)
    (payload / "whl" / "x.whl").write_text("wheel")
    st = tmp_path / "device"
    st.mkdir()
    env = {**os.environ, "WORK": str(work), "ST": str(st), "SKIP_INSTALL": "1", "STAGE_BYTES": "30000"}

    def sh(*args):
        return subprocess.run(
            ["bash", "benchmarks/gpu_pipeline.sh", *args], cwd=work, env=env, capture_output=True, text=True
        )

    env.pop("SKIP_INSTALL")
    job = sh("sweep")  # nothing carried, nothing staged: refused before any install
    assert job.returncode == 2 and "nothing staged" in job.stderr and "prepare" in job.stderr
    env["SKIP_INSTALL"] = "1"
    packed = sh("pack-stage", str(tmp_path / "src"))
    assert packed.returncode == 0 and "3 parts of at most 30000 bytes" in packed.stdout, packed.stderr
    parts = {i: (work / ".stage" / str(i) / "part").read_bytes() for i in (1, 2, 3)}
    for i in (3, 1, 2):  # each call carries one part; the tree holds only that one
        for j in (1, 2, 3):
            d = work / ".stage" / str(j)
            d.mkdir(parents=True, exist_ok=True)
            if j == i:
                (d / "part").write_bytes(parts[j])
                (d / "of").write_text("3\n")
            else:
                for f in d.iterdir():
                    f.unlink()
        called = sh("stage")
        assert called.returncode == 0, called.stderr
        if i == 3:
            assert "staged 1 of 3 parts; missing: .stage/1 .stage/2" in called.stdout
            assert not (st / "payload").exists()
        if i == 1:
            assert "missing: .stage/2" in called.stdout and ".stage/1 " not in called.stdout
    assert "staged all 3 parts" in called.stdout
    # an earlier lease's answers carried to `stage` (a call of its own): unpacked where notebook 01 resumes them
    answers = tmp_path / "runs" / "smollm2-gpu"
    answers.mkdir(parents=True)
    (answers / "responses.jsonl").write_text('{"id": 1}\n')
    (work / ".answers").mkdir()
    subprocess.run(
        [
            "tar",
            "cJf",
            str(work / ".answers" / "answers-smollm2-gpu.tar.xz"),
            "-C",
            str(tmp_path / "runs"),
            "smollm2-gpu/responses.jsonl",
        ],
        check=True,
    )
    assert sh("stage").returncode == 0
    assert (work / "data" / "runs" / "smollm2-gpu" / "responses.jsonl").read_text() == '{"id": 1}\n'
    assert (st / "payload" / "vllm.part.a").read_bytes() == blob
    assert (st / "payload" / "whl" / "x.whl").read_text() == "wheel"
    assert not list(st.glob("stage.[0-9]*"))  # the parts let go once whole


def _answers_archive(files: dict[str, list[tuple[str, str, dict]]], prompts: str) -> bytes:
    """An answers archive as `answers_back` packs it: smollm2-gpu/prompts.jsonl and responses files of (id, answer,
    settings) lines."""
    import io
    import json
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        members = {"prompts.jsonl": prompts.encode()}
        for name, rows in files.items():
            lines = [json.dumps({"id": i, "response": r, "settings": s}) + "\n" for i, r, s in rows]
            members[name] = "".join(lines).encode()
        for name, data in members.items():
            info = tarfile.TarInfo(f"smollm2-gpu/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_keep_puts_what_a_call_brought_back_where_stage_carries_it_from(tmp_path):
    """`keep FILES_AT` after a device call: each dataset's answers joined with those kept before in .answers/ (fewer
    never replace more: the answers of the other prompts kept where their settings match), drafts' parts go to
    .ckpt/, and speedup's draft becomes .draft/ only once all its parts came (over two calls)."""
    work, back = tmp_path / "work", tmp_path / "back"
    (work / "benchmarks").mkdir(parents=True)
    for name in ("gpu_pipeline.sh", "keep_answers.py"):
        (work / "benchmarks" / name).write_text((ROOT / "benchmarks" / name).read_text())
    (work / ".answers").mkdir()
    s, other = {"max_new_tokens": 256}, {"max_new_tokens": 64}
    older = _answers_archive(
        {
            "responses.jsonl": [("a", "old a", s), ("b", "old b", s), ("d", "other settings", other)],
            "responses-sampled-0.jsonl": [("a", "sampled a", s)],
        },
        "all turns",
    )
    (work / ".answers" / "answers-smollm2-gpu.tar.xz.part-aa").write_bytes(older[:100])  # kept before, in parts
    (work / ".answers" / "answers-smollm2-gpu.tar.xz.part-ab").write_bytes(older[100:])
    back.mkdir()
    newest = {"responses.jsonl": [("b", "new b", s), ("c", "new c", s)]}  # a recipe on fewer prompts
    (back / "answers-smollm2-gpu.tar.xz").write_bytes(_answers_archive(newest, "first turns"))
    (back / "ckpt-gpu_eagle3.tar.xz.part-aa").write_text("ckpt")
    draft = tmp_path / "draft"
    (draft / ".draft" / "eagle3").mkdir(parents=True)
    (draft / ".draft" / "eagle3" / "config.json").write_text("{}")
    packed = subprocess.run(["tar", "cJf", "-", "-C", str(draft), ".draft"], capture_output=True, check=True).stdout
    half = len(packed) // 2
    (back / "draft.tar.xz.part-aa").write_bytes(packed[:half])

    def keep():
        called = subprocess.run(
            ["bash", "benchmarks/gpu_pipeline.sh", "keep", str(back)], cwd=work, capture_output=True, text=True
        )
        assert called.returncode == 0, called.stderr
        return called.stdout

    first = keep()
    assert sorted(p.name for p in (work / ".answers").iterdir()) == ["answers-smollm2-gpu.tar.xz"]
    assert "kept .answers/answers-smollm2-gpu: 4 answers (2 of them kept from before" in first
    unpacked = tmp_path / "unpacked"  # as `stage` unpacks it on the device
    unpacked.mkdir()
    subprocess.run(
        ["tar", "xJf", str(work / ".answers" / "answers-smollm2-gpu.tar.xz"), "-C", str(unpacked)], check=True
    )
    got = unpacked / "smollm2-gpu"
    assert [
        line.split('"response": ')[1].split(",")[0] for line in (got / "responses.jsonl").read_text().splitlines()
    ] == [
        '"new b"',
        '"new c"',
        '"old a"',
    ]  # the newest line of an id wins; the older line of other settings is not mixed in
    assert "sampled a" in (got / "responses-sampled-0.jsonl").read_text()
    assert (got / "prompts.jsonl").read_text() == "first turns"
    assert (work / ".ckpt" / "ckpt-gpu_eagle3.tar.xz.part-aa").read_text() == "ckpt"
    assert not (work / ".draft").exists() and "kept .draft" not in first  # half a stream is not a draft
    (back / "draft.tar.xz.part-aa").unlink()
    (back / "draft.tar.xz.part-ab").write_bytes(packed[half:])  # the next call's files
    second = keep()
    assert (work / ".draft" / "eagle3" / "config.json").read_text() == "{}" and "kept .draft/ (eagle3)" in second
    assert not list((work / ".ckpt").glob("draft.tar.xz.part-*"))


def test_answers_that_could_not_be_packed_are_said_and_no_cut_archive_is_left_to_come_back(pipeline, tmp_path):
    name, call = pipeline
    ds = tmp_path / "data" / "runs" / "smollm2-x"
    ds.mkdir(parents=True)
    (ds / "prompts.jsonl").write_text('{"id": "a"}\n')
    (ds / "responses.jsonl").write_text('{"id": "a", "response": "r", "settings": {}}\n')
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "xz").write_text("#!/bin/sh\ncat > /dev/null; printf 'cut'; exit 1\n")  # as on a full disk
    (shims / "df").write_text("#!/bin/sh\nprintf 'Filesystem 1M-blocks Used Available\\n/dev/x 61440 61440 0\\n'\n")
    for shim in shims.iterdir():
        shim.chmod(0o755)
    full = call(WAIT_S=30, PATH=f"{shims}:{os.environ['PATH']}")
    assert full.returncode == 0 and f"job {name} ended with status 0" in full.stdout  # the report went on
    assert "the answers of smollm2-x were not packed (0 MiB free here)" in full.stderr
    assert "the device's disk is full (0 MiB free)" in full.stderr
    assert (
        not (tmp_path / "out" / "answers-smollm2-x.tar.xz").exists() and (tmp_path / "out" / f"{name}.tar.gz").is_file()
    )
    packed = call(WAIT_S=30)
    archive = tmp_path / "out" / "answers-smollm2-x.tar.xz"
    assert packed.returncode == 0 and "not packed" not in packed.stderr and "disk is full" not in packed.stderr
    listed = subprocess.run(["tar", "tJf", str(archive)], capture_output=True, text=True, check=True).stdout.split()
    assert listed == ["smollm2-x/prompts.jsonl", "smollm2-x/responses.jsonl"]


def test_ckpt_back_brings_back_the_runs_named_in_RUNS_and_every_run_without_it(tmp_path):
    """A sweep leaves a draft per arm on the shared dataset; `RUNS` picks the one worth the calls (the winner)."""
    import sys

    from draftlab.layout import RunLayout

    work = tmp_path / "work"
    (work / "benchmarks").mkdir(parents=True)
    (work / "benchmarks" / "gpu_pipeline.sh").write_text((ROOT / "benchmarks" / "gpu_pipeline.sh").read_text())
    (work / "lib").symlink_to(ROOT / "lib")  # the job's PYTHONPATH is $WORK/lib
    one, two = (f"gpu-{n}{uuid.uuid4().hex[:8]}" for n in "ab")  # asked in turn in one lease, parts where it packs
    for run in ("gpu-base", "gpu-steps6k", one, two):
        final = RunLayout("smollm2-gpu", run, work).final("eagle3")
        final.mkdir(parents=True)
        (final / "model.safetensors").write_bytes(run.encode())
    env = {**os.environ, "WORK": str(work), "SKIP_INSTALL": "1", "PY": sys.executable, "DRAFTLAB_HOME": str(work)}

    def back(folder: str, parts: bool = True, **more) -> list[str]:
        e = {**env, "OUT": str(tmp_path / folder), **more} | (
            {"CKPT_OUT": str(tmp_path / f"{folder}-p")} if parts else {}
        )
        called = subprocess.run(
            ["bash", "benchmarks/gpu_pipeline.sh", "ckpt-back"], cwd=work, env=e, capture_output=True, text=True
        )
        assert called.returncode == 0 and "every part sent" in called.stdout, called.stderr
        return sorted(p.name for p in (tmp_path / folder).iterdir())

    assert back("one", RUNS="gpu-steps6k") == ["ckpt-gpu-steps6k_eagle3.tar.xz.part-aa"]
    every = sorted(f"ckpt-{run}_eagle3.tar.xz.part-aa" for run in ("gpu-base", "gpu-steps6k", one, two))
    assert back("every") == every
    part = tmp_path / "one" / "ckpt-gpu-steps6k_eagle3.tar.xz.part-aa"
    listed = subprocess.run(["tar", "tJf", str(part)], capture_output=True, text=True, check=True).stdout.split()
    assert listed == ["final/", "final/model.safetensors"]
    # two requests of one lease, no CKPT_OUT: the second sends its parts too (it found the first's folder packed)
    try:
        assert back("first", parts=False, RUNS=one) == [f"ckpt-{one}_eagle3.tar.xz.part-aa"]
        assert back("second", parts=False, RUNS=two) == [f"ckpt-{two}_eagle3.tar.xz.part-aa"]
    finally:
        for run in (one, two):
            key = hashlib.md5(f" runs {run}\n".encode()).hexdigest()[:8]
            shutil.rmtree(f"/tmp/ckpt-out-{key}", ignore_errors=True)


def test_ckpt_back_with_DRAFT_RUN_brings_that_draft_back_slim_with_its_prompts_and_keep_makes_draft_of_it(tmp_path):
    """A sweep's served winner, for a later lease's `speedup` without TRAIN: its EAGLE-3 without the verifier's
    embeddings, in bf16, beside the dataset's prompt set, as the draft.tar.xz parts `keep` turns into .draft/; a
    DFlash brought back by a later lease (from run <run>-dflash, where `served` trains it) joins it there."""
    import sys

    import torch
    from safetensors.torch import load_file, save_file

    from draftlab.layout import RunLayout

    work = tmp_path / "work"
    (work / "benchmarks").mkdir(parents=True)
    for name in ("gpu_pipeline.sh", "bench_speedup.py", "keep_answers.py"):
        (work / "benchmarks" / name).write_text((ROOT / "benchmarks" / name).read_text())
    (work / "lib").symlink_to(ROOT / "lib")
    run = RunLayout("smollm2-gpu", "gpu-steps6k", work)
    run.final("eagle3").mkdir(parents=True)
    weights = {"embed_tokens.weight": torch.ones(8, 4), "fc.weight": torch.full((4, 12), 0.5)}
    save_file(weights, str(run.final("eagle3") / "model.safetensors"))
    (run.final("eagle3") / "config.json").write_text('{"speculators_model_type": "eagle3"}')
    run.prompts.parent.mkdir(parents=True, exist_ok=True)
    run.prompts.write_text('{"id": "a", "split": "bench"}\n')
    env = {**os.environ, "WORK": str(work), "SKIP_INSTALL": "1", "PY": sys.executable, "DRAFTLAB_HOME": str(work)}
    env |= {"DRAFT": str(tmp_path / "draft")}

    def call(*args, **more):
        e = {**env, **more}
        return subprocess.run(
            ["bash", "benchmarks/gpu_pipeline.sh", *args], cwd=work, env=e, capture_output=True, text=True
        )

    def back_and_keep(folder: str, **more) -> str:
        called = call("ckpt-back", OUT=str(tmp_path / folder), CKPT_OUT=str(tmp_path / f"{folder}-parts"), **more)
        assert called.returncode == 0 and "every part sent" in called.stdout, called.stderr
        assert sorted(p.name for p in (tmp_path / folder).iterdir()) == ["draft.tar.xz.part-aa"]  # no ckpt-* beside it
        kept = call("keep", str(tmp_path / folder))
        assert kept.returncode == 0, kept.stderr
        return kept.stdout

    assert "kept .draft/ (dataset eagle3 prompts.jsonl)" in back_and_keep("back", DRAFT_RUN="gpu-steps6k")
    slim = load_file(str(work / ".draft" / "eagle3" / "model.safetensors"))
    assert list(slim) == ["fc.weight"] and slim["fc.weight"].dtype == torch.bfloat16
    assert (work / ".draft" / "dataset").read_text().strip() == "smollm2-gpu"
    assert (work / ".draft" / "prompts.jsonl").read_text() == run.prompts.read_text()
    missing = call("ckpt-back", DRAFT_RUN="gpu-nothing", OUT=str(tmp_path / "none"), CKPT_OUT=str(tmp_path / "parts2"))
    assert missing.returncode == 1 and "every part sent" not in missing.stdout  # no such draft: said, not sent empty
    assert "no trained eagle3 in run gpu-nothing or gpu-nothing-eagle3" in missing.stderr
    assert "gpu-steps6k/eagle3/final/model.safetensors" in missing.stderr  # the drafts there are named
    # DFlash from a later lease (`served` trains it in run <run>-dflash) joins the EAGLE-3 kept before
    dflash = RunLayout("smollm2-gpu", "gpu-steps6k-dflash", work).final("dflash")
    dflash.mkdir(parents=True)
    save_file(
        {"embed_tokens.weight": torch.ones(8, 4), "fc.weight": torch.ones(4, 8)}, str(dflash / "model.safetensors")
    )
    (dflash / "config.json").write_text('{"speculators_model_type": "dflash"}')
    kept = back_and_keep("back2", DRAFT_RUN="gpu-steps6k", KINDS="dflash")
    assert "kept .draft/ (dataset dflash eagle3 prompts.jsonl)" in kept
    assert list(load_file(str(work / ".draft" / "eagle3" / "model.safetensors"))) == ["fc.weight"]  # kept as it was


@pytest.mark.parametrize(
    "only, ran",
    [
        ("", ["01", "04 gpu [eagle3]", "05 gpu [eagle3]", "04,05 gpu-dflash [dflash]"]),
        ("dflash", ["01", "04,05 gpu-dflash [dflash]"]),
    ],
)
def test_served_trains_and_serves_eagle3_then_dflash_and_with_ONLY_dflash_dflash_alone(tmp_path, only, ran):
    """The `gpu` profile's newcomer path: lease 1 gives EAGLE-3's served tau with DFlash's 04 beside its 05; where
    DFlash's 04 did not end in that lease, lease 2 runs DFlash's 04 and 05 alone (`ONLY=dflash`), not EAGLE-3's again.
    The job's notebooks are stood in for by a `python` that writes down each `draftlab run` it is asked for."""
    work = tmp_path / "work"
    (work / "benchmarks").mkdir(parents=True)
    (work / "benchmarks" / "gpu_pipeline.sh").write_text((ROOT / "benchmarks" / "gpu_pipeline.sh").read_text())
    calls = tmp_path / "calls.txt"
    py = tmp_path / "python"
    py.write_text(
        "#!/usr/bin/env bash\n"  # `-m draftlab run --profile P [--run-name R] --only S [--set draft_kinds=[K]] ...`
        'a=" $* "; run=gpu; [[ $a == *" --run-name "* ]] && run=${a#* --run-name }; run=${run%% *}\n'
        'only=${a#* --only }; kinds=${a#*draft_kinds=}; [[ $a == *draft_kinds=* ]] || kinds=""\n'
        f'echo "${{only%% *}} $run ${{kinds%% *}}" | sed "s/ $//; s/^\\(01\\) .*/\\1/" >> {calls}\n'
        f'echo "${{DRAFTLAB_KV_CAP_GIB:-uncapped}}" >> {calls}.cap\n'
    )
    py.chmod(0o755)
    env = {**os.environ, "WORK": str(work), "SKIP_INSTALL": "1", "PY": str(py), "ONLY": only}
    done = subprocess.run(
        ["bash", "benchmarks/gpu_pipeline.sh", "served-job"], cwd=work, env=env, capture_output=True, text=True
    )
    for log in Path("/tmp").glob("served-*.log"):  # the job's logs, empty here (the stand-in prints nothing)
        if log.stat().st_size == 0:
            log.unlink()
    assert done.returncode == 0, done.stderr
    assert sorted(calls.read_text().splitlines()) == sorted(ran)  # DFlash's runs beside EAGLE-3's 05
    # 01's server is alone on the card; after it, 05's servers share it with a training beside them: their KV caches
    # capped, not sized from what is free as they start
    first, *after = Path(f"{calls}.cap").read_text().split()
    assert first == "uncapped" and set(after) == {"8"}
