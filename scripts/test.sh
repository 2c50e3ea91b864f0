#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is needed, builds the
# torch-free core with its GoogleTest suite (CTest), runs it again under ASan + UBSan and
# fuzzes the core's readers for a bounded time (scripts/harden.sh), installs the package into a
# fresh virtual environment as a user without root would and trains there
# (scripts/check_pip_install.sh), then runs the Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test

echo "[test] core (no torch): configure, build, ctest"
cmake -S . -B build/core -G Ninja -DSHARDWISE_BUILD_PYTHON=OFF -DSHARDWISE_WERROR=ON >/dev/null
cmake --build build/core -j 2
ctest --test-dir build/core --output-on-failure -j 2

echo "[test] core hardening: ASan + UBSan ctest, bounded libFuzzer runs (scripts/harden.sh)"
bash scripts/harden.sh

echo "[test] pip install without root: a fresh venv, the package, the main job (scripts/check_pip_install.sh)"
bash scripts/check_pip_install.sh

echo "[test] python (pytest)"
set +e
${PYTHON:-python3} -m pytest tests/python -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[test] FAILED: pytest collected no tests (exit code 5)" >&2
  exit 1
fi
exit "$rc"
