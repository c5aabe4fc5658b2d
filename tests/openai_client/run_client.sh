#!/usr/bin/env bash
# Runs client_test.mjs (or SCRIPT) with the pinned `openai` and `ajv`
# packages (package-lock.json), installed with `npm ci` into WORK_DIR (with an
# npm cache there, so later runs work offline).
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
mkdir -p "$work"
cp "$src/package.json" "$src/package-lock.json" "$src"/*.mjs "$work/"
stamp="$work/node_modules/.pdserve-lock"
# npm ci wipes node_modules; skip it while the installed tree matches the lock.
if ! cmp -s "$src/package-lock.json" "$stamp"; then
  (cd "$work" && npm ci --no-audit --no-fund --prefer-offline --cache "$work/npm-cache" >&2) || {
    echo "npm ci failed: the npm registry (or a warm cache in $work/npm-cache) is needed once" >&2
    exit 1
  }
  cp "$src/package-lock.json" "$stamp"
fi
cd "$work"
exec node "$script" "$config"
