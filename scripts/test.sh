#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is needed (the extension's build
# compiles every core file with g++ -Werror), builds the torch-free core with its GoogleTest
# suite under Clang, ASan + UBSan, runs it (CTest) and fuzzes the core's readers for
# a bounded time (scripts/harden.sh), installs the package into a fresh virtual environment as
# a user without root would and trains there (scripts/check_pip_install.sh), then runs the
# Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall seconds, printed when it ends and again at the close (issue 47: where the
# suite's time goes, in CI's output). pytest prints its slowest tests (--durations).
started=$SECONDS
phase_name="install"
phase_start=$SECONDS
times=""
phase() {
  local took=$((SECONDS - phase_start))
  echo "[test] ${phase_name}: ${took} s"
  times="${times}  ${phase_name}: ${took} s"$'\n'
  phase_name="$1"
  phase_start=$SECONDS
  echo "[test] $1"
}
# One compile of the core's files for the two g++ builds (the extension's here, the fresh venv's
# in check_pip_install.sh): the same flags (-Werror in each) and paths taken relative to the
# checkout, so ccache answers the second (docs/build.md, "Where the time goes").
export SHARDWISE_WERROR=1 CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
bash scripts/install.sh --test

# The core's GoogleTest suite runs once, in the sanitizer tree: a g++ tree (build/core) ran the
# same tests again, unsanitized, for 127 s of a CI run (docs/build.md, "Where the time goes").
phase "core (no torch): Clang, ASan + UBSan: build, ctest, bounded libFuzzer runs (scripts/harden.sh)"
bash scripts/harden.sh

phase "pip install without root: a fresh venv, the package, the main job (scripts/check_pip_install.sh)"
bash scripts/check_pip_install.sh

phase "python (pytest)"
# Two test files at a time (pytest-xdist, SHARDWISE_JOBS workers; a file's tests stay on one
# worker, so its module fixtures are made once): most of a test is one process capturing,
# planning and lowering, which leaves the second core idle.
workers=()
if ${PYTHON:-python3} -c "import xdist" 2>/dev/null; then
  workers=(-n "${SHARDWISE_JOBS:-2}" --dist loadfile)
fi
set +e
${PYTHON:-python3} -m pytest tests/python -q -p no:cacheprovider --durations=25 "${workers[@]}" "$@"
rc=$?
set -e
phase "done"
printf "[test] phases (wall seconds, %d in all):\n%s" $((SECONDS - started)) "$times"
if [ "$rc" -eq 5 ]; then
  echo "[test] FAILED: pytest collected no tests (exit code 5)" >&2
  exit 1
fi
exit "$rc"
