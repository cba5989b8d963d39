#!/usr/bin/env bash
# The test command: sets everything up on a fresh clone, then runs the whole suite offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
HF_HOME=$(mktemp -d); export HF_HOME
trap 'rm -rf "$HF_HOME"' EXIT
.venv/bin/ruff check tapecli tests
.venv/bin/python -m pytest -q "$@"
