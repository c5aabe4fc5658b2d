#!/usr/bin/env bash
# Writes base/prometheusrule.yaml: deploy/prometheus/pdserve.rules.yml
# wrapped in a prometheus-operator PrometheusRule. tests/deploy fails when
# the two differ.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
{
  cat <<'HEAD'
# The recording rules and alerts of deploy/prometheus/pdserve.rules.yml for
# prometheus-operator. Generated; tests/deploy checks that `spec` equals that
# file. Regenerate after editing it:
#   deploy/k8s/gen_prometheusrule.sh
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: pdserve
  labels:
    app.kubernetes.io/part-of: pdserve
spec:
HEAD
  sed -n '/^groups:/,$p' "$here/../prometheus/pdserve.rules.yml" | sed -e 's/^/  /' -e 's/^ *$//'
} > "$here/base/prometheusrule.yaml"
