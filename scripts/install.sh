#!/usr/bin/env bash
# Installs shardwise, without root: Python packages from PyPI, then the build
# (pip install --no-build-isolation -e .). Safe to run again (each step is skipped when done).
#   python:  torch==2.13.0 (the CPU wheel; pinned so pip never pulls a CUDA build), rich,
#            cmake (always: setup.py builds with it; see below), ninja when not on PATH
#   C++:     nothing from the system but a C++20 compiler: fmt and nlohmann-json are vendored
#            (third_party/), HiGHS is built from highspy's source release on PyPI (cmake/HiGHS.cmake)
#
#   scripts/install.sh --test   also what the test suite needs (scripts/test.sh): pytest and pytest-xdist,
#            transformers and accelerate (PyPI; the Trainer needs accelerate); GoogleTest, ccache and clang-19 with its sanitizer and
#            libFuzzer runtime (apt, for the C++ tests and scripts/harden.sh; sudo when not root)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# torch first: transformers and accelerate below require torch, and pip would take for them the
# newest it may (on a fresh machine a CUDA build of several GB, which the build then rejects:
# "Caffe2 uses CUDA but I cannot find the CUDA libraries").
if ! $PY -c "import torch, sys; sys.exit(0 if torch.__version__.startswith(('2.11', '2.12', '2.13', '2.14', '2.15')) else 1)" 2>/dev/null; then
  echo "[install] torch==2.13.0"
  $PY -m pip install -q torch==2.13.0
fi
TORCH_PIN="torch==$($PY -c 'import torch; print(torch.__version__)')"

if [[ ${1:-} == --test ]]; then
  apt_packages=(cmake ninja-build g++ libgtest-dev ccache clang-19 libclang-rt-19-dev)
  missing=()
  for p in "${apt_packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "[install] apt packages for the C++ tests: ${missing[*]}"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  $PY -m pip install -q "transformers>=4.45" "accelerate>=1.1" pytest pytest-xdist "$TORCH_PIN"
fi

# CMake from PyPI even where the system has one: setup.py builds with it, and
# check_pip_install.sh's fresh venv with the same version (one flag order, so ccache serves
# the venv's build from this one's objects: setup.py, _cmake).
tools=(rich setuptools wheel cmake)
command -v ninja >/dev/null || tools+=(ninja)
$PY -m pip install -q "${tools[@]}"
echo "[install] building shardwise (C++ core + extension)"
$PY -m pip install -q --no-build-isolation -e .
$PY -c "import shardwise; print('[install] shardwise', shardwise.__version__, 'with torch', __import__('torch').__version__)"
