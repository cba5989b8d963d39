#!/usr/bin/env bash
# The main command: sets everything up on a fresh clone, then runs `tape demo` (RoPE, TAPE and ALiBi on selective
# copy, about 3 minutes on a 2-core CPU; `--task addition [--quick]` for the addition demo). Extra arguments go to
# `tape demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/tape demo "$@"
