#!/usr/bin/env bash
# Create .venv (once) and install tape with the pinned versions of constraints.txt. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.tape-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt torch==2.13.0
  .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
  touch "$stamp"
fi
