#!/usr/bin/env bash
# The CUDA and NCCL path, proven in one command on a machine with a GPU (docs/build.md).
#
#   scripts/gpu_check.sh [REPORT_DIR]          default REPORT_DIR: $OUT if set, else build/gpu_check
#   scripts/gpu_check.sh --no-build [DIR]      use the shardwise already importable (CI's CPU run)
#   scripts/gpu_check.sh --smoke [DIR]         the benchmark at its smoke size (any device)
#
# 1. Installs what is missing against the torch already there (torch itself is never
#    installed or replaced): the C++ build's libraries from apt, or, on a machine without a
#    network, from the Debian packages in .deps/ (unpacked into a private prefix; see
#    docs/build.md for how to fill .deps/).
# 2. Builds the C++ core and the extension with every core (pip install --no-build-isolation -e .).
# 3. Runs the GPU tests (pytest -m gpu: NCCL collectives, ranks sharing one GPU over Gloo,
#    pipelines, ZeRO, the bf16 policy, Cluster.detect on CUDA); skipped with the reason
#    where there is no CUDA.
# 4. Runs benchmarks/gpu.py (GPT-2 124M in bf16 on one GPU: step time against eager, MFU,
#    peak memory against the plan's prediction).
# 5. Writes REPORT_DIR/gpu_check.md (the card, the versions, the test summary and the
#    figures), with the logs beside it, and REPORT_DIR/env.sh: `source` it before running
#    anything else against this build (the carried libraries' paths). Exit status: non-zero
#    when the build or a test failed.
set -uo pipefail
cd "$(dirname "$0")/.."

build=1
smoke=0
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --no-build) build=0 ;;
    --smoke) smoke=1 ;;
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
have_build_deps() {
  command -v pkg-config >/dev/null && pkg-config --exists cbc 2>/dev/null &&
    [[ -f /usr/include/nlohmann/json.hpp || -n ${SHARDWISE_DEPS_PREFIX:-} ]] &&
    { [[ -d /usr/include/fmt ]] || [[ -n ${SHARDWISE_DEPS_PREFIX:-} ]]; }
}
# SHARDWISE_CARRIED_DEPS=1 takes .deps/ even where the system has the libraries (to try it).
if ((build)) && { ! have_build_deps || [[ ${SHARDWISE_CARRIED_DEPS:-0} == 1 ]]; }; then
  if ls .deps/*.deb >/dev/null 2>&1; then
    # No network: unpack the carried packages into a prefix of our own (never into /).
    prefix=/tmp/shardwise-deps
    note "unpacking $(ls .deps/*.deb | wc -l) packages from .deps/ into $prefix"
    mkdir -p "$prefix"
    for deb in .deps/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
    lib=$prefix/usr/lib/x86_64-linux-gnu
    # The .pc files name /usr (prefix=, libdir=); point them at the private prefix.
    sed -i "s|=/usr|=$prefix/usr|g" "$lib"/pkgconfig/*.pc
    # cbc.pc links -llapack -lblas -lbz2 -lz: the unversioned names come with -dev packages
    # a bare machine may lack; name the runtime libraries (carried, or the system's) instead.
    for name in lapack/liblapack.so.3 blas/libblas.so.3 libbz2.so.1.0 libz.so.1; do
      base=$(basename "$name"); dev=${base%%.so*}.so
      found=$(ls "$lib/$name" "$prefix/lib/x86_64-linux-gnu/$name" 2>/dev/null | head -1)
      [[ -n $found ]] || found=$(ldconfig -p | awk -v b="$base" '$1 == b {print $NF; exit}')
      [[ -n $found && ! -e $lib/$dev ]] && ln -s "$found" "$lib/$dev"
    done
    export SHARDWISE_DEPS_PREFIX=$prefix
    export PATH=$prefix/usr/bin:$PATH
    export PKG_CONFIG=$prefix/usr/bin/pkgconf
    export PKG_CONFIG_PATH=$lib/pkgconfig:$prefix/usr/share/pkgconfig
    export CMAKE_PREFIX_PATH=$prefix/usr
    export CPATH=$prefix/usr/include${CPATH:+:$CPATH}
    # BLAS / LAPACK live in Debian's alternatives folders (no symlinks without dpkg -i).
    export LD_LIBRARY_PATH=$lib:$lib/blas:$lib/lapack:$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LIBRARY_PATH=$lib${LIBRARY_PATH:+:$LIBRARY_PATH}
  elif command -v apt-get >/dev/null; then
    note "apt-get install the build's libraries"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      cmake ninja-build g++ pkg-config libfmt-dev nlohmann-json3-dev coinor-libcbc-dev >/dev/null
  fi
fi
# What a later command on this machine needs to import this build: the carried libraries'
# paths (the extension's RUNPATH names torch's folder, not theirs). Without it, a benchmark
# run after this script fails on `import shardwise` ("libCbcSolver.so.3: cannot open shared
# object file", 2026-11-27 on an H200): `source REPORT_DIR/env.sh` first.
{
  echo "# source this before running anything against gpu_check's build (scripts/gpu_check.sh)"
  if [[ -n ${SHARDWISE_DEPS_PREFIX:-} ]]; then
    for var in SHARDWISE_DEPS_PREFIX PATH LD_LIBRARY_PATH LIBRARY_PATH; do
      printf 'export %s=%q\n' "$var" "${!var:-}"
    done
  else
    echo "# (the system's libraries: nothing to set)"
  fi
} >"$report/env.sh"

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
if ((status == 0)); then
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
if ((built == 0)); then
  note "benchmarks/gpu.py"
  bench_args=(--json "$report/gpu.json")
  ((smoke)) && bench_args+=(--smoke)
  # GPU_CHECK_BENCH_ARGS: more arguments for benchmarks/gpu.py (--profile FILE, --steps N).
  read -r -a extra <<<"${GPU_CHECK_BENCH_ARGS:-}"
  bench_args+=("${extra[@]}")
  timeout "${GPU_CHECK_BENCH_TIMEOUT:-900}" $PY -u benchmarks/gpu.py "${bench_args[@]}" >"$report/benchmark.log" 2>&1 ||
    { status=1; note "benchmark failed"; tail -30 "$report/benchmark.log"; }
  grep -v "^\[transformers\]\|Warning\|warn" "$report/benchmark.log" | tail -30
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
  echo "## benchmarks/gpu.py"
  echo '```'
  cat "$report/gpu.json" 2>/dev/null || echo "no figures (see benchmark.log)"
  echo '```'
  echo
  echo "status: $([[ $status == 0 ]] && echo ok || echo FAILED)"
} >"$report/gpu_check.md"
note "report: $report/gpu_check.md (status $status)"
exit $status
