#!/usr/bin/env bash
# Development loop: rebuild shardwise._C incrementally after `pip install -e .` and
# put it where the editable package imports it from.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build/python --target _C -j "${SHARDWISE_JOBS:-2}"
cp build/python/lib/_C*.so python/shardwise/
