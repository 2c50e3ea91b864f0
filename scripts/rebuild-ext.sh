#!/usr/bin/env bash
# Development loop: rebuild shardwise._C incrementally after `pip install -e .` and
# put it where the editable package imports it from.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build/python --target _C -j "${SHARDWISE_JOBS:-2}"
# Copy, then rename over the old file: a new inode, so processes that loaded the old module
# (a test run, a benchmark) keep their mapping instead of reading a half-written file.
for so in build/python/lib/_C*.so; do
  cp "$so" "python/shardwise/.$(basename "$so").new"
  mv -f "python/shardwise/.$(basename "$so").new" "python/shardwise/$(basename "$so")"
done
