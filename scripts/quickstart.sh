#!/usr/bin/env bash
# The README's main job: install, then capture and analyse the built-in tiny GPT.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
${PYTHON:-python3} -m shardwise inspect tiny-gpt "$@"
