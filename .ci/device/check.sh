#!/usr/bin/env bash
# The device check (issue 15): one command for the lent GPU machine, which has no network.
#
#   bash .ci/device/check.sh              on the device; results under $OUT (docs/gpu.md)
#   bash .ci/device/check.sh --rehearse   here, on CPU: small models, short runs, $OUT a temp dir unless set
#
# Installs speccli from the carried bundle (.ci/device/bundle.py); builds llama.cpp once with .ci/setup.py
# --llama-cpp (CUDA on the device, every core): its libraries, which llama-cpp-python loads through
# LLAMA_CPP_LIB_PATH, and llama.cpp's own tools; meanwhile writes a memory-bound target and a related
# draft. Then: speccli env; greedy identity and the chi-square distribution check with every layer on the
# GPU; the race against llama.cpp's tools (tests/benchmarks/loop_overhead.py) and llama-server
# (serve_clients.py); speccli bench (K swept); the target's tokens/s on GPU and CPU. Each step is time-stamped
# and recorded; a failed step does not stop the rest. summary.txt and results.json are rewritten after
# every step, so a run cut short still leaves its report. Exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."

MODE=device
if [ "${1:-}" = --rehearse ]; then MODE=rehearse; elif [ $# -gt 0 ]; then
    echo "usage: bash .ci/device/check.sh [--rehearse]" >&2; exit 2
fi
BUNDLE=$PWD/.ci/device/bundle
if [ ! -f "$BUNDLE/requirements.txt" ]; then
    echo "check.sh: no bundle at $BUNDLE: run python3 .ci/device/bundle.py first (with network)" >&2; exit 2
fi
OUT=${OUT:-$(mktemp -d /tmp/speccli-device-out.XXXXXX)}
WORK=$(mktemp -d /tmp/speccli-device-work.XXXXXX)  # models and per-step parts; only the report goes to $OUT
mkdir -p "$OUT"
LOG=$OUT/log.txt
: >"$LOG"
# The Python that creates .venv: the device's, else SPECCLI_DEVICE_PYTHON (a rehearsal's), else python3.
PY=${SPECCLI_DEVICE_PYTHON:-/opt/torch/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
# cmake and ninja may live in the device's torch venv, nvcc in the toolkit: appended, never shadowing.
command -v cmake >/dev/null || PATH=$PATH:/opt/torch/.venv/bin
command -v nvcc >/dev/null || PATH=$PATH:/usr/local/cuda/bin
# PYTHONFAULTHANDLER: a crash in llama.cpp still shows the Python line that called it, in the log.
export PATH HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1

if [ "$MODE" = device ]; then
    SCALE=device NGL=99 SAMPLES=3000 BENCH_N=128 RUNS=1 K_SWEEP=1,2,4,8,16,auto GPU_TOKENS=128 CPU_TOKENS=16
    RACE_ROUNDS=3 RACE_N=128 SERVE_REQUESTS=8 THREADS=$(nproc)
    # The build is most of the run: it may use nearly all of a 600 s call, and nothing runs without it.
    LIMIT_INSTALL=570 LIMIT_STEP=180
else
    # The CPU build ignores -ngl; the same commands run, on small models.
    SCALE=rehearse NGL=99 SAMPLES=3000 BENCH_N=24 RUNS=1 K_SWEEP=1,4,auto GPU_TOKENS=24 CPU_TOKENS=8
    RACE_ROUNDS=1 RACE_N=32 SERVE_REQUESTS=4 THREADS=$(nproc)
    LIMIT_INSTALL=1800 LIMIT_STEP=300
    # A wheel built from the stripped sdist, kept apart from (and reused across) rehearsals.
    export SPECCLI_WHEEL_CACHE=${SPECCLI_WHEEL_CACHE:-/tmp/speccli-rehearse-wheels}
fi
cat >"$WORK/meta.json" <<EOF
{"mode": "$MODE", "host": "$(hostname)", "started": "$(date -u +%FT%TZ)", "python": "$PY",
 "bundle_python": "$(cat "$BUNDLE/PYTHON")", "out": "$OUT"}
EOF

# Offline: pip sees the bundle alone, whatever pip configuration the machine has.
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$BUNDLE/wheels $BUNDLE" PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
# llama.cpp's libraries and tools, built once by the install step; llama-cpp-python loads the libraries from here.
TOOLS=$PWD/.venv/llama.cpp/build/bin
export LLAMA_CPP_LIB_PATH=$TOOLS

venv() {
    [ -x .venv/bin/python ] || "$PY" -m venv .venv || return
    .venv/bin/python -m pip install -q -r "$BUNDLE/requirements.txt"
}

install() {
    # Dependencies are in place; the bundled model package is not carried, so setup.py installs speccli
    # without them (PIP_NO_DEPS), and the build uses the venv's backends (pip reads
    # PIP_NO_BUILD_ISOLATION=0 as --no-build-isolation).
    local force_cuda=()
    [ "$MODE" = device ] && force_cuda=(--cuda)
    PIP_NO_DEPS=1 PIP_NO_BUILD_ISOLATION=0 "$PY" .ci/setup.py "${force_cuda[@]}" --llama-cpp .venv/llama.cpp
}

models() {  # the models are written beside the build (one core against its many): wait for them
    while [ ! -f "$WORK/models.rc" ]; do sleep 1; done
    cat "$WORK/models.log"
    return "$(cat "$WORK/models.rc")"
}

speccli_env() {
    set -o pipefail
    if ! .venv/bin/speccli env | tee "$WORK/env.txt"; then
        # Most likely a shared library the build linked is not found at run time: name it.
        ldd "$LLAMA_CPP_LIB_PATH"/*.so | grep -E '^/|not found'
        return 1
    fi
    [ "$MODE" = rehearse ] || grep -Eq '^gpu offload +supported' "$WORK/env.txt"
}

probe() {
    nvidia-smi || true
    nvcc --version || true
    cmake --version | head -1; command -v ninja; "$PY" --version; nproc
}

FAILED=0
step() {  # step NAME LIMIT COMMAND...: run it with a time limit, log it, record it, then rewrite the report
    local name=$1 limit=$2; shift 2
    local started rc t0 ms summary_python=.venv/bin/python
    started=$(date -u +%T)
    t0=$(date +%s%N)
    echo "=== [$started] $name: $*" | tee -a "$LOG"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || FAILED=$((FAILED + 1))
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf '{"name": "%s", "started": "%s", "seconds": %d.%03d, "rc": %d}\n' \
        "$name" "$started" $((ms / 1000)) $((ms % 1000)) "$rc" >>"$WORK/steps.jsonl"
    [ -x "$summary_python" ] || summary_python=$PY
    "$summary_python" .ci/device/check.py summary --work "$WORK" --out "$OUT" >/dev/null 2>>"$LOG" \
        || echo "(summary not written: see $LOG)"
}
export -f venv install models speccli_env probe
export MODE PY BUNDLE WORK TOOLS OUT

CHECK=(.venv/bin/python .ci/device/check.py)
step probe 60 bash -c probe
step venv 120 bash -c venv
(timeout "$LIMIT_INSTALL" "${CHECK[@]}" models --scale "$SCALE" --dir "$WORK/models" >"$WORK/models.log" 2>&1
 echo $? >"$WORK/models.rc") &
step install "$LIMIT_INSTALL" bash -c install
step env 60 bash -c speccli_env
step models "$LIMIT_INSTALL" bash -c models
# bench takes the files by name: models.json has them.
TARGET=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["target"])' "$WORK/models/models.json" 2>/dev/null)
DRAFT=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["draft"])' "$WORK/models/models.json" 2>/dev/null)
step load "$LIMIT_STEP" "${CHECK[@]}" load --models "$WORK/models" --ngl "$NGL" --out "$WORK/load.json"
# Where speccli as shipped crashes on load but loads with llama_cpp imported first (check.py's load), the
# later steps import it first, through a .pth file in the venv, so that the run still yields its figures.
if .venv/bin/python -c 'import json,sys; sys.exit(not json.load(open(sys.argv[1]))["preload_llama_cpp"])' "$WORK/load.json" 2>/dev/null; then
    PRELOAD=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/00_speccli_check_preload.pth
    echo "import llama_cpp" >"$PRELOAD"
    echo "=== speccli crashed on load as shipped; the later steps import llama_cpp first ($PRELOAD)" | tee -a "$LOG"
fi
BENCH=(.venv/bin/speccli bench -m "$TARGET" -md "$DRAFT" -n "$BENCH_N" --runs "$RUNS" --warmup 1 -ngl "$NGL" -ngld "$NGL")
step greedy "$LIMIT_STEP" "${CHECK[@]}" greedy --models "$WORK/models" --ngl "$NGL" --out "$WORK/greedy.json"
step chi2 "$LIMIT_STEP" "${CHECK[@]}" chi2 --models "$WORK/models" --ngl "$NGL" --samples "$SAMPLES" --out "$WORK/chi2.json"
step speed "$LIMIT_STEP" "${CHECK[@]}" speed --models "$WORK/models" --gpu-tokens "$GPU_TOKENS" --cpu-tokens "$CPU_TOKENS" \
    --out "$WORK/speed.json"
# The race: the same files, every layer on the GPU, interleaved rounds; each table lands in $OUT as it is.
# Before bench, which the race mostly repeats: a run cut short loses the least.
step race "$LIMIT_STEP" bash -c 'set -o pipefail; .venv/bin/python tests/benchmarks/loop_overhead.py --files "$0,$1" \
    --ngl "$2" --threads "$3" --tools "$TOOLS" --rounds "$4" --n-predict "$5" --k 4,8 --draft-max 4,8,16 | tee "$OUT/race.txt"' \
    "$TARGET" "$DRAFT" "$NGL" "$THREADS" "$RACE_ROUNDS" "$RACE_N"
step race-serve "$LIMIT_STEP" bash -c 'set -o pipefail; .venv/bin/python tests/benchmarks/serve_clients.py --target "$0" \
    --draft "$1" --ngl "$2" --threads "$3" --llama-bin "$TOOLS" --clients 1,4 --requests "$4" --rounds 1 --ctx 4096 \
    --speccli default --llama draft:4,draft:8,draft:16 | tee "$OUT/race-serve.txt"' "$TARGET" "$DRAFT" "$NGL" "$THREADS" "$SERVE_REQUESTS"
step bench-model "$LIMIT_STEP" "${BENCH[@]}" --spec model --k "$K_SWEEP" --json "$OUT/bench-model.json"

if [ -n "${PRELOAD:-}" ] || ! .venv/bin/python -c 'import json,sys; sys.exit(not json.load(open(sys.argv[1]))["passed"])' "$WORK/load.json" 2>/dev/null; then
    rm -f "${PRELOAD:-}"
    # Last, as it is slow to start: llama.cpp's own stack at the crash (there is no gdb on the device).
    PROGRAM=$(.venv/bin/python -c 'import json, sys; sys.path.insert(0, ".ci/device"); import check
print(check._LOAD_AND_DECODE.format(model=json.load(open(sys.argv[1]))["chi2_target"], ngl=sys.argv[2]))' "$WORK/models/models.json" "$NGL")
    command -v cuda-gdb >/dev/null && step backtrace 120 cuda-gdb -batch -ex run -ex bt -ex quit --args .venv/bin/python -c "$PROGRAM"
fi
echo "=== report: $OUT (failed steps: $FAILED)" | tee -a "$LOG"
cat "$OUT/summary.txt" 2>/dev/null
rm -rf "$WORK/models"  # gigabytes; the rest of $WORK is small and stays for a look
exit "$FAILED"
