#!/usr/bin/env bash
# Cross-checks the deployment files against the C++ sources, with no tool
# beyond bash, grep, sed and awk (never skipped):
#   1. every pdserve_* metric named by the recording rules and alerts, their
#      unit tests, the Grafana dashboard and the autoscalers is registered in
#      a *_metrics.cc file (or listed in deploy/prometheus/pending_metrics.txt,
#      until it is); _bucket/_sum/_count only on histograms, and never a
#      histogram's bare name;
#   2. every binary the Dockerfiles install is an executable of the CMake
#      file of its directory (output name included), every `--target` is a
#      CMake executable target, every binary a Deployment runs is installed
#      by every Dockerfile, and each image's default CMD is an installed
#      binary with --help or --version (which exit 0: cli_test);
#   3. every flag a Deployment passes (base and overlay patches) is an
#      ABSL_FLAG of the binary it runs;
#   4. every alert has a runbook section in docs/operations.md that its
#      runbook annotation links to.
#   consistency_test.sh SOURCE_DIR
set -euo pipefail
trap 'echo "FAIL: unexpected error at line $LINENO of $0"' ERR
src=$1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# --- 1. Metric names -------------------------------------------------------
# "TYPE NAME" for every metric registered with prometheus-cpp, whether through
# a Make{Gauge,Counter,Histogram}(r, "name", ...) helper or directly with
# Build{Gauge,Counter,Histogram}().Name("name"), across line breaks.
registered=$(
  for f in "$src"/common/*_metrics.cc "$src"/frontend/*_metrics.cc "$src"/router/*_metrics.cc \
           "$src"/prefill_worker/*_metrics.cc "$src"/decode_worker/*_metrics.cc "$src"/planner/*_metrics.cc; do
    [ -f "$f" ] || continue
    tr '\n' ' ' < "$f" | sed 's/  */ /g' |
      { grep -oE 'Make(Gauge|Counter|Histogram)\( ?r, ?"pdserve_[a-z0-9_]+"|Build(Gauge|Counter|Histogram)\(\) ?\.Name\("pdserve_[a-z0-9_]+"\)' || true; } |
      sed -E 's/^(Make|Build)(Gauge|Counter|Histogram).*"(pdserve_[a-z0-9_]+)".*$/\2 \3/'
  done | tr '[:upper:]' '[:lower:]' | sort -u)
n_registered=$(grep -c . <<<"$registered" || true)
# Guards the parser: the design's core metrics must be among those found.
for want in "histogram pdserve_time_to_first_token_seconds" "histogram pdserve_inter_token_latency_seconds" \
            "counter pdserve_requests_total" "gauge pdserve_kv_cache_usage_ratio"; do
  grep -qx "$want" <<<"$registered" || fail "metric parser did not find '$want' in the *_metrics.cc files"
done
type_of() { awk -v n="$1" '$2 == n { print $1; exit }' <<<"$registered"; }
# Names that rules and panels read ahead of the change that exports them:
# accepted until then; once registered, their line must go.
pending=$(sed -e 's/#.*//' "$src/deploy/prometheus/pending_metrics.txt" | awk 'NF { print $1 }')
for name in $pending; do
  [ -z "$(type_of "$name")" ] ||
    fail "$name is registered now: remove it from deploy/prometheus/pending_metrics.txt"
done

metric_sources=(
  deploy/prometheus/pdserve.rules.yml
  deploy/prometheus/pdserve.rules.test.yml
  deploy/k8s/base/prometheusrule.yaml
  deploy/k8s/keda/scaledobject.yaml
)
for f in "$src"/deploy/grafana/dashboards/*.json; do metric_sources+=("${f#"$src"/}"); done
n_used=0
for rel in "${metric_sources[@]}"; do
  [ -f "$src/$rel" ] || { fail "$rel is missing"; continue; }
  # (not the middle part of a recording rule's name, level:metric:operations)
  for name in $(grep -oP '(?<![:\w])pdserve_[a-z0-9_]+' "$src/$rel" | sort -u || true); do
    n_used=$((n_used + 1))
    grep -qx "$name" <<<"$pending" && continue
    type=$(type_of "$name")
    if [ -n "$type" ]; then
      [ "$type" != histogram ] || fail "$rel: $name is a histogram: use ${name}_bucket, _sum or _count"
      continue
    fi
    base=$(sed -E 's/_(bucket|sum|count)$//' <<<"$name")
    if [ "$base" != "$name" ] && [ "$(type_of "$base")" = histogram ]; then continue; fi
    if [ "$base" != "$name" ] && [ -n "$(type_of "$base")" ]; then
      fail "$rel: $name: $base is a $(type_of "$base"), not a histogram"
    else
      fail "$rel: $name is not registered by any *_metrics.cc"
    fi
  done
done
echo "metrics: $n_used names used in ${#metric_sources[@]} files, $n_registered registered"

# --- 4. Every alert has a runbook section in docs/operations.md, and its runbook
# annotation links to it.
n_alerts=0
for alert in $(sed -n 's/^ *- alert: \([A-Za-z0-9]*\)$/\1/p' "$src/deploy/prometheus/pdserve.rules.yml"); do
  n_alerts=$((n_alerts + 1))
  grep -qx "### $alert" "$src/docs/operations.md" || fail "alert $alert has no '### $alert' runbook section in docs/operations.md"
  anchor=$(tr '[:upper:]' '[:lower:]' <<<"$alert")
  awk -v a="$alert" '$0 ~ "- alert: " a "$" { on = 1; next } on && /- alert: / { exit } on' \
      "$src/deploy/prometheus/pdserve.rules.yml" | grep -q "runbook: \"docs/operations.md#$anchor\"" ||
    fail "alert $alert: no runbook annotation docs/operations.md#$anchor"
done
echo "alerts: $n_alerts, each with a runbook section"

# --- 2. Binaries: CMake executables, Dockerfiles, Deployments ---------------
# "DIR TARGET OUTPUT_NAME SOURCE" for every add_executable outside tests/.
executables=$(
  find "$src" -name CMakeLists.txt -not -path "$src/build*" -not -path "$src/tests/*" \
       -not -path '*/node_modules/*' | sort | while read -r cm; do
    dir=$(dirname "${cm#"$src"/}"); [ "$cm" = "$src/CMakeLists.txt" ] && dir=.
    { grep -oE 'add_executable\( *[A-Za-z0-9_]+ +[^ )]+' "$cm" || true; } | sed -E 's/add_executable\( *//' |
      while read -r target source; do
        out=$(grep -oE "set_target_properties\( *$target +PROPERTIES +OUTPUT_NAME +[A-Za-z0-9_]+" "$cm" |
              awk '{ print $NF }' | head -1 || true)
        echo "$dir $target ${out:-$target} $source"
      done
  done)
grep -q ' pdserve_router_main pdserve_router main.cc$' <<<"$executables" ||
  fail "CMake parser did not find the router executable (pdserve_router_main, OUTPUT_NAME pdserve_router)"

deployed_binaries=$(grep -hoE '/usr/local/bin/pdserve_[a-z0-9_]+' "$src"/deploy/k8s/base/*.yaml "$src"/deploy/k8s/planner/*.yaml |
                    sed 's|/usr/local/bin/||' | sort -u || true)
[ -n "$deployed_binaries" ] || fail "no Deployment command names a /usr/local/bin/pdserve_* binary"
dockerfiles=("$src"/deploy/docker/*.Dockerfile)
[ "${#dockerfiles[@]}" -ge 2 ] || fail "want a CPU and a CUDA Dockerfile in deploy/docker"
for df in "${dockerfiles[@]}"; do
  rel=${df#"$src"/}
  # Comments dropped, continuation lines joined: each RUN is one line.
  text=$(grep -v '^ *#' "$df" | sed -e ':a' -e '/\\$/N; s/\\\n//; ta')
  targets=$({ grep -oE -- '--target +[A-Za-z0-9_ ]+' <<<"$text" || true; } | sed -E 's/--target +//' | tr ' ' '\n' | grep . || true)
  [ -n "$targets" ] || fail "$rel: builds no --target"
  for t in $targets; do
    awk -v t="$t" '$2 == t { found = 1 } END { exit !found }' <<<"$executables" ||
      fail "$rel: --target $t is not a CMake executable"
  done
  installed=$(grep -oE '\bbuild[a-z-]*/[A-Za-z0-9_/]+/pdserve_[a-z0-9_]+' <<<"$text" | sort -u || true)
  [ -n "$installed" ] || fail "$rel: installs no build*/.../pdserve_* binary"
  for path in $installed; do
    rest=${path#*/}; dir=${rest%/*}; name=${rest##*/}
    awk -v d="$dir" -v n="$name" '$1 == d && $3 == n { found = 1 } END { exit !found }' <<<"$executables" ||
      fail "$rel: $path: $dir/CMakeLists.txt has no executable named $name"
    t=$(awk -v n="$name" '$3 == n { print $2; exit }' <<<"$executables")
    if [ -n "$t" ] && ! grep -qx "$t" <<<"$targets"; then
      fail "$rel: installs $name but does not build its target $t"
    fi
  done
  for b in $deployed_binaries; do
    grep -q "/$b\$" <<<"$installed" || fail "$rel: does not install $b, which a Deployment runs"
  done
  # The default command runs: an installed binary with --help or --version,
  # which every binary answers with exit status 0 (cli_test).
  cmd=$(sed -n 's/^CMD \[\(.*\)\]$/\1/p' "$df" | tr -d '" ' | tr ',' ' ')
  set -- $cmd
  if [ $# -eq 0 ]; then
    fail "$rel: no CMD"
  else
    grep -q "/$(basename "$1")\$" <<<"$installed" || fail "$rel: CMD runs $1, which it does not install"
    shift
    for arg in "$@"; do
      [[ "$arg" =~ ^--(help|version)$ ]] || fail "$rel: CMD passes $arg; an image's default command must run without a model: --help or --version"
    done
  fi
done
echo "binaries: $(grep -c . <<<"$executables") CMake executables; Deployments run: ${deployed_binaries//$'\n'/ }"

# --- 3. Flags ------------------------------------------------------------------
# Flags of one binary: its own main's ABSL_FLAGs, common/'s and the
# service skeleton's flag groups (common/service/*_flags.cc).
flags_of() {  # binary
  local line dir source
  line=$(awk -v n="$1" '$3 == n { print; exit }' <<<"$executables")
  [ -n "$line" ] || return 0
  dir=$(cut -d' ' -f1 <<<"$line"); source=$(cut -d' ' -f4 <<<"$line")
  # A definition may wrap after "ABSL_FLAG(": lines are joined first.
  cat "$src/$dir/$source" "$src"/common/*.cc "$src"/common/service/*_flags.cc 2>/dev/null |
    tr '\n' ' ' |
    { grep -oE 'ABSL_FLAG\( *[^,]+, *[a-z0-9_]+' || true; } | sed -E 's/.*, *//' | sort -u
}
# Flags given to a Deployment: its base file's args plus the JSON patches the
# overlays apply to it (kustomization: target name, then path).
n_flags=0
for base in "$src"/deploy/k8s/base/*.yaml "$src"/deploy/k8s/planner/*.yaml; do
  binary=$(grep -oE '/usr/local/bin/pdserve_[a-z0-9_]+' "$base" | head -1 | sed 's|/usr/local/bin/||' || true)
  [ -n "$binary" ] || continue
  deployment=$(awk '/^kind: Deployment$/ { d = 1 } d && /^  name: / { print $2; exit }' "$base")
  files=("$base")
  for k in "$src"/deploy/k8s/overlays/*/kustomization.yaml; do
    while read -r name path; do
      if [ "$name" = "$deployment" ]; then files+=("$(dirname "$k")/$path"); fi
    done < <(awk '/^ *name: / { n = $2 } /^ *path: / { print n, $2 }' "$k")
  done
  defined=$(flags_of "$binary")
  [ -n "$defined" ] || { fail "no ABSL_FLAGs found for $binary"; continue; }
  for f in "${files[@]}"; do
    for flag in $({ grep -oE '^ *(- |value: )--[a-z0-9_]+' "$f" || true; } | sed -E 's/.*--//' | sort -u); do
      n_flags=$((n_flags + 1))
      grep -qx "$flag" <<<"$defined" || fail "${f#"$src"/}: --$flag is not a flag of $binary"
    done
  done
done
echo "flags: $n_flags checked against ABSL_FLAG definitions"

if [ "$failures" -gt 0 ]; then
  echo "$failures problem(s)"
  exit 1
fi
echo OK
