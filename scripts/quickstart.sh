#!/usr/bin/env bash
# The README's main job: install, then train the built-in TinyGPT on 4 CPU processes
# (torchrun, Gloo) with a searched plan, printing the plan and each step's loss next to
# the single-device loss. Extra arguments go to `shardwise train` (e.g. --mesh 2,2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY=${PYTHON:-python3}
NPROC=${NPROC:-4}
exec "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" -m shardwise train "$@"
