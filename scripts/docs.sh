#!/usr/bin/env bash
# The docs check of scripts/test.sh: build the site with `mkdocs build --strict` and fail on any warning (a dead link,
# a missing anchor, a nav entry naming no page). Usage: bash scripts/docs.sh [MKDOCS_YML]; MKDOCS names the mkdocs
# executable (default .venv/bin/mkdocs). The site goes to a temporary directory, removed afterwards.
# mkdocs 1.6's --quiet hides the warnings that --strict counts and then exits 0, so the output is read here as well.
set -euo pipefail
config=${1:-mkdocs.yml}
mkdocs=${MKDOCS:-.venv/bin/mkdocs}
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
status=0
log=$(NO_MKDOCS_2_WARNING=1 "$mkdocs" build --strict --config-file "$config" --site-dir "$site" 2>&1) || status=$?
warnings=$(grep -E '^(WARNING|ERROR)' <<<"$log" || true)
if [ "$status" -ne 0 ] || [ -n "$warnings" ]; then
  printf '%s\n' "${warnings:-$log}" >&2
  echo "docs: mkdocs build --strict failed ($config); fix the lines above" >&2
  exit 1
fi
