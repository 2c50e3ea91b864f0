#!/usr/bin/env bash
# Hardening checks of the C++ core (issue 7), run by scripts/test.sh (its one run of the core's
# GoogleTest suite):
#   1. build/asan: the core and its GoogleTest suite built with Clang, AddressSanitizer and
#      UndefinedBehaviorSanitizer (UBSan fatal: -fno-sanitize-recover), then ctest there (no
#      -Werror here: libstdc++ 12's stable_sort calls get_temporary_buffer, which Clang reports
#      deprecated in C++20; the extension's g++ build compiles every core file with -Werror);
#   2. the libFuzzer targets of tests/fuzz (plan, cluster, profile and graph JSON readers, the
#      IR text parser), built in the same tree (the core compiled once, with libFuzzer's
#      coverage instrumentation as well: SHARDWISE_FUZZ), each run for SHARDWISE_FUZZ_SECONDS
#      (default 20) over a scratch copy of its seed corpus tests/fuzz/corpus/<target> (the
#      checked-in corpus is never grown); their runs and findings go to build/fuzz.
# Exits non-zero on any failing test or fuzz finding (crash, sanitizer report, uncaught
# exception, broken round trip, timeout > 10 s per input, memory > 2 GB). A finding's input
# is kept as build/fuzz/findings/<target>/crash-* (or timeout-*, oom-*, leak-*); replay it
# with: build/asan/fuzz_<target> build/fuzz/findings/<target>/crash-...
#
# Environment: CLANG (default clang++-19), SHARDWISE_FUZZ_SECONDS (per target),
# SHARDWISE_JOBS (build and ctest jobs, default 2), SHARDWISE_HARDEN_SKIP_ASAN=1 or
# SHARDWISE_HARDEN_SKIP_FUZZ=1 to run one half only.
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG=${CLANG:-clang++-19}
JOBS=${SHARDWISE_JOBS:-2}
FUZZ_SECONDS=${SHARDWISE_FUZZ_SECONDS:-20}
TARGETS=(plan_json cluster_json profile_json graph_json ir_text)

if ! command -v "$CLANG" >/dev/null 2>&1; then
  echo "[harden] $CLANG not found. Sanitizer and fuzz builds need Clang 19 with its runtime (libFuzzer):" >&2
  echo "[harden]   apt-get install -y clang-19 libclang-rt-19-dev   (scripts/install.sh does this)" >&2
  exit 1
fi
# -O1 -gline-tables-only: sanitizer reports with file, line and column in every frame (what
# they print; full -g's variable info they never read costs a fifth more compile time: 460 s
# against 362 s for build/asan here), and run times far below -O0. The sanitizer flags come
# from SHARDWISE_SANITIZE / SHARDWISE_FUZZ.
common=(-G Ninja -DSHARDWISE_BUILD_PYTHON=OFF "-DCMAKE_CXX_COMPILER=$CLANG" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG")
# Every report fails, leaks included; UBSan prints a stack (its fatality is compiled in).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# ccache and the precompiled headers (SHARDWISE_PCH, CMakeLists.txt): a compile that reads one is
# cached only when ccache may ignore the header's defines and timestamps, and the file times of
# a fresh clone's headers.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}

start=$SECONDS
# One tree: the core compiled once with ASan, UBSan and libFuzzer's coverage instrumentation,
# for the tests and the fuzz targets alike.
echo "[harden] core, tests and fuzz targets with ASan + UBSan ($CLANG): configure, build"
t0=$SECONDS
# SHARDWISE_PCH: the headers every file includes parsed once per target (CMakeLists.txt): the
# build 302 -> 230 s on a 2-core Xeon (2026-12-05, same checkout, the ctest passing in both).
cmake -S . -B build/asan "${common[@]}" -DSHARDWISE_SANITIZE=ON -DSHARDWISE_FUZZ=ON -DSHARDWISE_PCH=ON >/dev/null
if [ "${SHARDWISE_HARDEN_SKIP_ASAN:-0}" != 1 ]; then
  cmake --build build/asan -j "$JOBS"
else
  cmake --build build/asan -j "$JOBS" --target "${TARGETS[@]/#/fuzz_}"
fi
echo "[harden] build $((SECONDS - t0)) s"

if [ "${SHARDWISE_HARDEN_SKIP_ASAN:-0}" != 1 ]; then
  t1=$SECONDS
  ctest --test-dir build/asan --output-on-failure -j "$JOBS"
  echo "[harden] asan ctest $((SECONDS - t1)) s"
fi

if [ "${SHARDWISE_HARDEN_SKIP_FUZZ:-0}" != 1 ]; then
  # One libFuzzer process per target, SHARDWISE_JOBS targets at a time (each gets the
  # full time; two at once on two cores halve the wall time of this step).
  fuzz_one() {
    local t=$1 work=build/fuzz/run/$1 findings=build/fuzz/findings/$1 rc=0
    rm -rf "$work" "$findings" && mkdir -p "$work" "$findings"
    cp tests/fuzz/corpus/"$t"/* "$work"/
    build/asan/fuzz_"$t" "$work" -dict=tests/fuzz/"$t".dict -max_total_time="$FUZZ_SECONDS" \
      -timeout=10 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
      -artifact_prefix="$findings"/ >build/fuzz/run/"$t".log 2>&1 || rc=$?
    echo "$rc" >build/fuzz/run/"$t".rc
  }
  mkdir -p build/fuzz/run
  echo "[harden] fuzzing ${#TARGETS[@]} targets for ${FUZZ_SECONDS} s each, $JOBS at a time"
  running=0
  for t in "${TARGETS[@]}"; do
    fuzz_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then
      wait -n
      running=$((running - 1))
    fi
  done
  wait

  failed=()
  for t in "${TARGETS[@]}"; do
    log=build/fuzz/run/$t.log
    rc=$(cat build/fuzz/run/"$t".rc)
    if [ "$rc" -ne 0 ]; then
      failed+=("$t")
      echo "[harden] fuzz_$t: FINDING (exit $rc); log $log, input in build/fuzz/findings/$t/" >&2
      grep -E 'ERROR: |runtime error|FUZZ|SUMMARY|terminate called|what\(\)' "$log" | head -20 >&2 || true
    else
      done_line=$(grep -E '^Done [0-9]+ runs' "$log" | tail -1 || true)
      echo "[harden] fuzz_$t: ${done_line:-no 'Done' line, see $log}; $(ls tests/fuzz/corpus/"$t" | wc -l) seeds -> $(ls build/fuzz/run/"$t" | wc -l) inputs"
    fi
  done
  if ((${#failed[@]})); then
    echo "[harden] FAILED: fuzz findings in ${failed[*]}" >&2
    exit 1
  fi
fi
echo "[harden] all clean in $((SECONDS - start)) s"
