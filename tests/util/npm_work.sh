# shellcheck shell=bash
# Sourced by the test scripts that run node from a shared work directory in
# the build tree (pinned npm packages installed with `npm ci`). Two test runs
# of one build may use the same directory at once (two ctest runs side by
# side, or one test's steps in parallel), so:
#   - files are copied in by an atomic rename, and only where they differ, so
#     a running node never reads a half-written script;
#   - `npm ci` (which wipes node_modules) runs under an exclusive lock, and
#     only while the installed tree does not match the package lock;
#   - afterwards the caller holds a shared lock on file descriptor 9 for as
#     long as it runs node (an `exec node ...` keeps it), so no other run can
#     reinstall under it.
#
#   npm_work_prepare WORK CACHE_DIR NPM_CI_ARGS FILE...
# WORK gets FILE... (package.json and package-lock.json among them);
# CACHE_DIR is npm's cache ("" for npm's default); NPM_CI_ARGS are extra
# `npm ci` arguments (one word list, may be ""). Returns non-zero with a
# message on stderr where `npm ci` fails.
npm_work_prepare() {
  local work=$1 cache=$2 ci_args=$3
  shift 3
  mkdir -p "$work"
  exec 9>"$work/.pdserve-npm.lock"
  flock -x 9
  local f name
  for f in "$@"; do
    name=$(basename "$f")
    if ! cmp -s "$f" "$work/$name"; then
      cp "$f" "$work/.$name.$$.tmp" && mv -f "$work/.$name.$$.tmp" "$work/$name"
    fi
  done
  local stamp="$work/node_modules/.pdserve-lock"
  if ! cmp -s "$work/package-lock.json" "$stamp"; then
    local cache_args=()
    [ -z "$cache" ] || cache_args=(--cache "$cache")
    # shellcheck disable=SC2086  # NPM_CI_ARGS is a word list on purpose
    if ! (cd "$work" && npm ci --no-audit --no-fund --prefer-offline "${cache_args[@]}" $ci_args >&2); then
      rm -f "$stamp"
      flock -u 9
      echo "npm ci in $work failed: the npm registry (or a warm npm cache${cache:+ in $cache}) is needed once" >&2
      return 1
    fi
    cp "$work/package-lock.json" "$stamp"
  fi
  # Not atomic (flock(2) drops the exclusive lock first), which is harmless:
  # whoever takes the exclusive lock in between finds the tree installed.
  flock -s 9
}
