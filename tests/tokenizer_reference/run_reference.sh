#!/usr/bin/env bash
# ctest driver for the tokenizer reference check (compare.mjs): installs the
# pinned npm packages (package-lock.json) into the build dir with `npm ci`,
# using an npm cache there too so later runs work offline, then compares
# pdserve_tokenize with the JS reference.
#   run_reference.sh <pdserve_tokenize> <this source dir> <build dir>
# Exit 77 (ctest SKIP) only when node or npm is not installed.
set -euo pipefail
cli=$1
src=$2
build=$3

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node and npm are needed for the tokenizer reference check"
  exit 77
fi

work="$build/npm"
# shellcheck source=../util/npm_work.sh
. "$src/../util/npm_work.sh"
npm_work_prepare "$work" "$build/npm-cache" "" "$src/package.json" "$src/package-lock.json" \
  "$src/compare.mjs" "$src/render_jinja2.py" || exit 1
cd "$work"
exec node compare.mjs "$cli" "$work/models"
