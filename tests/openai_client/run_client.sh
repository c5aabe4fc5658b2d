#!/usr/bin/env bash
# Runs client_test.mjs (or SCRIPT) with the pinned `openai` and `ajv`
# packages (package-lock.json), installed with `npm ci` into WORK_DIR (with an
# npm cache there, so later runs work offline). Runs may share WORK_DIR
# (tests/util/npm_work.sh).
#   run_client.sh SOURCE_DIR WORK_DIR CONFIG.json [SCRIPT]
# Exit 77 only when node or npm is not installed.
set -euo pipefail
src=$1
work=$2
config=$3
script=${4:-client_test.mjs}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node and npm are needed for the openai client test" >&2
  exit 77
fi
# shellcheck source=../util/npm_work.sh
. "$src/../util/npm_work.sh"
npm_work_prepare "$work" "$work/npm-cache" "" "$src/package.json" "$src/package-lock.json" "$src"/*.mjs ||
  exit 1
cd "$work"
exec node "$script" "$config"
