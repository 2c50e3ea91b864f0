#!/usr/bin/env bash
# Installs everything shardwise needs on a fresh Debian machine, then builds and
# installs the package. Safe to run again (each step is skipped when already done).
#   system: cmake, ninja, g++, pkg-config, GoogleTest, fmt, nlohmann-json, ccache, COIN-OR CBC,
#           clang-19 with its sanitizer and libFuzzer runtime (scripts/harden.sh) (apt)
#   python: torch==2.13.0 (the CPU wheel; pinned so pip never pulls a CUDA build),
#           transformers, pytest, rich
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(cmake ninja-build g++ pkg-config libgtest-dev libfmt-dev nlohmann-json3-dev ccache coinor-libcbc-dev
              clang-19 libclang-rt-19-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[install] apt packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if ! $PY -c "import torch, sys; sys.exit(0 if torch.__version__.startswith(('2.11', '2.12', '2.13', '2.14', '2.15')) else 1)" 2>/dev/null; then
  echo "[install] torch==2.13.0"
  $PY -m pip install -q torch==2.13.0
fi
$PY -m pip install -q "transformers>=4.45" pytest rich
echo "[install] building shardwise (C++ core + extension)"
$PY -m pip install -q --no-build-isolation -e .
$PY -c "import shardwise; print('[install] shardwise', shardwise.__version__, 'with torch', __import__('torch').__version__)"
