#!/usr/bin/env bash
# Every pdserve binary answers --help with its own flags and --version with
# the project version, both with exit status 0 (common/base/cli.h).
#   cli_test.sh VERSION BINARY:FLAG...   (FLAG: one flag the binary defines)
set -euo pipefail
version=$1
shift
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
for spec in "$@"; do
  binary=${spec%%:*} flag=${spec##*:} name=$(basename "${spec%%:*}")
  if out=$("$binary" --help 2>&1); then
    grep -q -- "^  --$flag=" <<<"$out" || fail "$name --help does not list --$flag: $out"
    ! grep -q "No flags matched" <<<"$out" || fail "$name --help: $out"
    grep -q -- "^$name $version " <<<"$out" || fail "$name --help does not name the version: $(head -1 <<<"$out")"
  else
    fail "$name --help exits $?: $out"
  fi
  if out=$("$binary" --version 2>&1); then
    grep -qx -- "$name $version (.*)" <<<"$out" || fail "$name --version prints '$out', want '$name $version (BUILD TYPE)'"
  else
    fail "$name --version exits $?: $out"
  fi
  echo "$name: --help and --version OK"
done
[ "$failures" -eq 0 ] || { echo "$failures problem(s)"; exit 1; }
echo "OK: $# binaries"
