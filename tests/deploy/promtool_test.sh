#!/usr/bin/env bash
# Checks the Prometheus files with promtool: rule syntax (`check rules`), the
# rules' unit tests (`test rules`), both scrape configurations
# (`check config`), and the PromQL of every Grafana dashboard query (as
# recording rules of a scratch file). Exit 77 (skipped) where promtool is absent.
#   promtool_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
command -v promtool >/dev/null || { echo "SKIP: promtool not found (Debian: apt-get install prometheus)"; exit 77; }
dir="$src/deploy/prometheus"
promtool check rules "$dir/pdserve.rules.yml"
(cd "$dir" && promtool test rules pdserve.rules.test.yml)

# prometheus.yml reads targets/*.json next to itself, as cluster.sh lays it out.
# A directory of this run's own: two runs of one build may go at once.
mkdir -p "$work"
work=$(mktemp -d "$work/run.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/targets"
cp "$dir/prometheus.yml" "$dir/prometheus-k8s.yml" "$dir/pdserve.rules.yml" "$work/"
for job in router prefill decode; do echo '[{"targets": ["127.0.0.1:9400"]}]' > "$work/targets/$job.json"; done
(cd "$work" && promtool check config prometheus.yml)
# Debian builds Prometheus without Kubernetes service discovery: there the
# discovery block is swapped for a static target, so everything else (relabel
# rules, rule files) is still checked.
if ! out=$(cd "$work" && promtool check config prometheus-k8s.yml 2>&1); then
  if grep -q 'field kubernetes_sd_configs not found' <<<"$out"; then
    echo "prometheus-k8s.yml: this promtool has no Kubernetes discovery (Debian build); checking it with a static target instead"
    awk '/^  kubernetes_sd_configs:/ { print "  static_configs:"; print "  - targets: [\"127.0.0.1:9400\"]"; skip = 1; next }
         skip && /^  [a-z_]+:/ { skip = 0 }
         !skip' "$work/prometheus-k8s.yml" > "$work/prometheus-k8s-static.yml"
    grep -q '^  relabel_configs:' "$work/prometheus-k8s-static.yml" || { echo "FAIL: rewriting prometheus-k8s.yml lost its relabel_configs"; exit 1; }
    (cd "$work" && promtool check config prometheus-k8s-static.yml)
  else
    echo "$out"; exit 1
  fi
fi

# Every dashboard query parses, with Grafana's variables substituted as a
# Prometheus data source would ($__rate_interval, the All value of $namespace).
dashboard="$src/deploy/grafana/dashboards/pdserve.json"
want=$(grep -c '"expr":' "$dashboard")
grep -oE '"expr": *"([^"\\]|\\.)*"' "$dashboard" |
  sed -E -e 's/^"expr": *"//' -e 's/"$//' -e 's/\\"/"/g' -e 's/\\\\/\\/g' \
         -e 's/\$__rate_interval/1m/g' -e 's/\$namespace/.*/g' |
  awk 'BEGIN { print "groups:\n- name: dashboard\n  rules:" }
       { printf "  - record: dashboard:query:%d\n    expr: |\n      %s\n", NR, $0 }' > "$work/dashboard.rules.yml"
got=$(grep -c '^  - record:' "$work/dashboard.rules.yml" || true)
[ "$want" -gt 0 ] && [ "$got" = "$want" ] || { echo "FAIL: extracted $got of $want dashboard queries"; exit 1; }
echo "dashboard: $got queries"
promtool check rules "$work/dashboard.rules.yml"
echo OK
