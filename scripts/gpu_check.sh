#!/usr/bin/env bash
# The CUDA and NCCL path, proven in one command on a machine with a GPU (docs/build.md).
#
#   scripts/gpu_check.sh [REPORT_DIR]          default REPORT_DIR: $OUT if set, else build/gpu_check
#   scripts/gpu_check.sh --no-build [DIR]      use the shardwise already importable (CI's CPU run)
#   scripts/gpu_check.sh --smoke [DIR]         the benchmark at its smoke size (any device)
#   scripts/gpu_check.sh --no-tests [DIR]      the build and the benchmark only (a short device lease)
#
# 1. Installs what is missing against the torch already there (torch itself is never
#    installed or replaced): cmake and ninja from PyPI; on a machine without a network,
#    HiGHS's source from .deps/ (see docs/build.md).
# 2. Builds the C++ core and the extension with every core (pip install --no-build-isolation -e .).
# 3. Runs the GPU tests (pytest -m gpu: NCCL collectives, ranks sharing one GPU over Gloo,
#    pipelines, ZeRO, the bf16 policy, Cluster.detect on CUDA); skipped with the reason
#    where there is no CUDA.
# 4. Runs benchmarks/gpu.py for each model of GPU_CHECK_MODELS (default "gpt2 llama": GPT-2 124M
#    and Llama 3.2 1B's shape, bf16, one GPU: step time against eager, MFU, step time and peak
#    memory against the plan's prediction; on CUDA with --compile too: ours compiled against the
#    eager model under torch.compile; --profiled: the plan priced with its ops timed on the
#    GPU), then each again with --precision fp8 (the linears in float8, the eager model under
#    runtime.fp8.one_device()) where the GPU has FP8 units.
#    Figures in REPORT_DIR/gpu.json (gpt2), gpu_llama.json, gpu_fp8.json, gpu_llama_fp8.json.
# 5. Writes REPORT_DIR/gpu_check.md (the card, the versions, the test summary and the
#    figures), with the logs beside it. Exit status: non-zero when the build or a test failed.
#    (The extension needs no library beyond torch's: nothing to source before a later command.)
set -uo pipefail
cd "$(dirname "$0")/.."

build=1
smoke=0
tests=1
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --no-build) build=0 ;;
    --smoke) smoke=1 ;;
    --no-tests) tests=0 ;;
    *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
report=${1:-${OUT:-build/gpu_check}}
mkdir -p "$report"
PY=${PYTHON:-python3}
status=0
note() { echo "[gpu_check] $*"; }

# ---- 1. what the build needs -------------------------------------------------------------
# No system library: fmt and nlohmann-json are vendored, HiGHS is built from highspy's source
# release (cmake/HiGHS.cmake). A machine without a network takes that tarball from .deps/
# (ignored by git; copy it from build/_deps/ of a machine that configured once) instead of
# downloading it.
if ((build)); then
  carried=$(ls .deps/highspy-*.tar.gz 2>/dev/null | head -1)
  if [[ -n $carried && -z ${SHARDWISE_HIGHS_SOURCE:-} ]]; then
    export SHARDWISE_HIGHS_SOURCE=$PWD/$carried
    note "HiGHS from the carried $carried"
  fi
  for tool in cmake ninja; do
    command -v $tool >/dev/null || $PY -m pip install -q $tool || note "could not install $tool"
  done
fi

for module in pytest transformers rich; do
  $PY -c "import $module" 2>/dev/null || $PY -m pip install -q "$module" || note "could not install $module"
done

# ---- 2. build ----------------------------------------------------------------------------------
{
  echo "# date: $(date -u +%FT%TZ)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'gpus', torch.cuda.device_count(), 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)"
} >"$report/machine.txt" 2>&1
cat "$report/machine.txt"
if ((build)); then
  note "building with $(nproc) jobs"
  start=$(date +%s)
  if SHARDWISE_JOBS=$(nproc) $PY -m pip install -q --no-build-isolation --no-deps -e . >"$report/build.log" 2>&1; then
    note "built in $(($(date +%s) - start)) s"
  else
    note "BUILD FAILED (tail of $report/build.log):"; tail -30 "$report/build.log"; status=1
  fi
fi

built=$status

# ---- 3. the GPU tests ----------------------------------------------------------------------------
if ((status == 0 && tests)); then
  note "pytest -m gpu"
  # GPU_CHECK_TESTS: a pytest -k expression, to run some of them (a short device lease).
  select=(); [[ -n ${GPU_CHECK_TESTS:-} ]] && select=(-k "$GPU_CHECK_TESTS")
  timeout "${GPU_CHECK_TEST_TIMEOUT:-1800}" $PY -m pytest -m gpu tests/python -v -rs -p no:cacheprovider -s "${select[@]}" \
    >"$report/tests.log" 2>&1
  rc=$?
  tail -25 "$report/tests.log"
  # 5: nothing collected, which means the marker or the files went missing: a failure.
  if ((rc != 0)); then status=1; note "GPU tests: pytest exit $rc"; fi
fi

# ---- 4. the benchmark ------------------------------------------------------------------------------
# One benchmarks/gpu.py run: its name (the JSON and log file stem), then its arguments.
bench() {
  local stem=$1; shift
  local args=(--json "$report/$stem.json" "$@")
  ((smoke)) && args+=(--smoke)
  note "benchmarks/gpu.py ${*}"
  timeout "${GPU_CHECK_BENCH_TIMEOUT:-900}" $PY -u benchmarks/gpu.py "${args[@]}" "${extra[@]}" >"$report/$stem.log" 2>&1 ||
    { status=1; note "$stem failed"; tail -30 "$report/$stem.log"; }
  grep -v "^\[transformers\]\|Warning\|warn" "$report/$stem.log" | tail -40
}
if ((built == 0)); then
  # GPU_CHECK_BENCH_ARGS: more arguments for benchmarks/gpu.py (--profile FILE, --steps N).
  read -r -a extra <<<"${GPU_CHECK_BENCH_ARGS:-}"
  cuda=0
  $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" && cuda=1
  # FP8 (runtime/fp8.py) where the GPU has FP8 units (compute capability 8.9+: Ada, Hopper).
  fp8=0
  $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9) else 1)" && fp8=1
  [[ ${GPU_CHECK_FP8:-1} == 0 ]] && fp8=0  # GPU_CHECK_FP8=0: not the FP8 runs (a short lease)
  read -r -a models <<<"${GPU_CHECK_MODELS:-gpt2 llama}"
  for model in "${models[@]}"; do
    stem=gpu; [[ $model != gpt2 ]] && stem=gpu_$model
    # Compiling a CPU toy and timing its ops would only slow CI's run. GPU_CHECK_COMPILE=0: not
    # the compiled sides (a short lease).
    cuda_only=(); ((cuda)) && cuda_only=(--profiled) && [[ ${GPU_CHECK_COMPILE:-1} != 0 ]] && cuda_only+=(--compile)
    bench "$stem" --model "$model" "${cuda_only[@]}"
  done
  if ((fp8)); then
    for model in "${models[@]}"; do
      stem=gpu_fp8; [[ $model != gpt2 ]] && stem=gpu_${model}_fp8
      bench "$stem" --model "$model" --precision fp8 --profiled
    done
  fi
fi

# ---- 5. the report ---------------------------------------------------------------------------------
{
  echo "# shardwise gpu_check"
  echo
  echo '```'
  cat "$report/machine.txt"
  echo '```'
  echo
  echo "## GPU tests (pytest -m gpu)"
  echo '```'
  grep -E "passed|failed|skipped|error|PASSED|FAILED|SKIPPED|^cuda|^cpu" "$report/tests.log" 2>/dev/null | tail -40
  echo '```'
  echo
  for stem in gpu gpu_llama gpu_fp8 gpu_llama_fp8; do
    [[ -f "$report/$stem.log" ]] || continue
    echo "## benchmarks/gpu.py: $stem"
    echo '```'
    cat "$report/$stem.json" 2>/dev/null || echo "no figures (see $stem.log)"
    echo '```'
    echo
  done
  echo
  echo "status: $([[ $status == 0 ]] && echo ok || echo FAILED)"
} >"$report/gpu_check.md"
note "report: $report/gpu_check.md (status $status)"
exit $status
