#!/usr/bin/env bash
# Runs the whole ctest suite several times in a row on a machine kept busy,
# to show that no test takes a busy machine for a failure (tests wait on
# events or poll with generous deadlines; docs/reliability.md records the
# results).
#
#   tests/stress_suite.sh beside    [RUNS] [BUILD_DIR] [-- ctest args]
#   tests/stress_suite.sh stress-ng [RUNS] [BUILD_DIR] [-- ctest args]
#
# beside: while each run (`ctest -j2`) goes, a second `ctest -j2` of the
# same build runs beside it, restarted whenever it ends; its results are
# counted too. stress-ng: `stress-ng --cpu 4` (Debian package stress-ng)
# runs for the whole series. RUNS defaults to 5, BUILD_DIR to build. Each
# suite gets its own TEST_TMPDIR. Prints one line per run (tests, failures,
# minutes, mean and highest 1-minute load average while it ran) and a
# summary; exits non-zero if any measured run failed. Logs stay in
# $STRESS_LOG_DIR (default: a fresh directory under /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
  beside | stress-ng) ;;
  *)
    sed -n '2,17p' "$0" >&2
    exit 2
    ;;
esac
shift
runs=5
build=build
if [ $# -gt 0 ] && [ "$1" != "--" ]; then runs="$1"; shift; fi
if [ $# -gt 0 ] && [ "$1" != "--" ]; then build="$1"; shift; fi
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi
ctest_args=("$@")
if [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "no ctest build in $build (build first: cmake --preset default && cmake --build build)" >&2
  exit 2
fi
logs="${STRESS_LOG_DIR:-$(mktemp -d /tmp/pdserve_stress.XXXXXX)}"
mkdir -p "$logs"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    # Each background job leads its own process group (set -m below).
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT
set -m

# The 1-minute load average every 5 s, for the per-run figures.
(while true; do
  echo "$(date +%s) $(cut -d' ' -f1 /proc/loadavg)"
  sleep 5
done) >"$logs/load.txt" &
pids+=($!)

case "$mode" in
  stress-ng)
    command -v stress-ng >/dev/null || {
      echo "stress-ng is not installed (apt-get install stress-ng)" >&2
      exit 2
    }
    stress-ng --cpu 4 --timeout 0 >"$logs/stress-ng.txt" 2>&1 &
    pids+=($!)
    hog="stress-ng --cpu 4"
    ;;
  beside)
    (i=0
    while true; do
      i=$((i + 1))
      TEST_TMPDIR="$logs/tmp_beside" ctest --test-dir "$build" -j2 --output-on-failure "${ctest_args[@]}" \
        >"$logs/beside_$i.txt" 2>&1 || true
    done) &
    pids+=($!)
    hog="a second ctest -j2 of the same build"
    ;;
esac
mkdir -p "$logs/tmp_beside" "$logs/tmp_main"

# Mean and highest load average between two epoch seconds.
load_between() {
  awk -v a="$1" -v b="$2" '$1 >= a && $1 <= b { s += $2; n++; if ($2 > m) m = $2 }
    END { if (n) printf "%.1f %.1f", s / n, m; else printf "- -" }' "$logs/load.txt"
}

echo "mode: $mode ($hog); build: $build; runs: $runs; logs: $logs"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); host: $(nproc) cores, $(uname -r)"
failed_runs=0
for run in $(seq 1 "$runs"); do
  start=$(date +%s)
  rc=0
  TEST_TMPDIR="$logs/tmp_main" ctest --test-dir "$build" -j2 --output-on-failure \
    "${ctest_args[@]}" >"$logs/run_$run.txt" 2>&1 || rc=$?
  end=$(date +%s)
  summary=$(grep -E "tests passed, [0-9]+ tests failed" "$logs/run_$run.txt" || echo "no summary")
  read -r mean peak <<<"$(load_between "$start" "$end")"
  printf 'run %d: %s; %s min; load average mean %s, highest %s\n' "$run" "$summary" \
    "$(awk -v s="$((end - start))" 'BEGIN { printf "%.1f", s / 60 }')" "$mean" "$peak"
  if [ "$rc" -ne 0 ]; then
    failed_runs=$((failed_runs + 1))
    sed -n '/The following tests FAILED/,$p' "$logs/run_$run.txt"
  fi
done
if [ "$mode" = beside ]; then
  for f in "$logs"/beside_*.txt; do
    [ -f "$f" ] || continue
    s=$(grep -E "tests passed, [0-9]+ tests failed" "$f" || echo "unfinished (stopped with the series)")
    echo "beside $(basename "$f" .txt | cut -d_ -f2): $s"
    grep -E '^[[:space:]]+[0-9]+ - ' "$f" || true
  done
fi
echo "summary: $((runs - failed_runs)) of $runs runs passed"
[ "$failed_runs" -eq 0 ]
