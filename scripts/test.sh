#!/usr/bin/env bash
# The test command: sets everything up on a fresh clone, then runs ruff, the docs build and the whole suite offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
HF_HOME=$(mktemp -d); export HF_HOME
trap 'rm -rf "$HF_HOME"' EXIT
.venv/bin/ruff check tapecli tests
# The documentation site: any mkdocs warning fails (a broken link, anchor or nav entry; offline, no network plugins).
bash scripts/docs.sh
# One worker per core (pytest-xdist; -n 0 runs in this process), the longest tests spread over the workers as they go;
# the 25 slowest tests are listed at the end (what to look at when the suite's time grows).
.venv/bin/python -m pytest -q -n auto --dist worksteal --durations=25 "$@"
