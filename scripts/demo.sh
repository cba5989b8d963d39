#!/usr/bin/env bash
# The main command: sets everything up on a fresh clone, then runs `tape demo` (RoPE vs TAPE on addition,
# about 10 minutes on a 2-core CPU; pass --quick for a 2-minute look). Extra arguments go to `tape demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/tape demo "$@"
