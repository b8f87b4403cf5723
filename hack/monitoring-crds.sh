#!/usr/bin/env bash
# Fetches the monitoring.coreos.com CRDs (ServiceMonitor, PodMonitor, PrometheusRule) that
# the chart's optional objects need, so the chart tests install the real definitions into
# the test control plane and the API server validates those objects instead of skipping
# them. They come from the prometheus-operator Go module (the module proxy is reachable;
# release downloads are not): its zip carries example/prometheus-operator-crd/*.yaml.
# Output: one directory holding the three CRD files, printed as the last line; cached
# beside the Kubernetes binaries, never committed.
set -euo pipefail

PROMETHEUS_OPERATOR_VERSION=${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}
module=github.com/prometheus-operator/prometheus-operator
cache=${STABLETRAIN_CACHE:-$HOME/.cache/stabletrain}
out=$cache/k8s/monitoring-crds/$PROMETHEUS_OPERATOR_VERSION
kinds=(servicemonitors podmonitors prometheusrules)

log() { printf 'monitoring-crds: %s\n' "$*" >&2; }

complete() {
    local kind
    for kind in "${kinds[@]}"; do
        [[ -s $out/monitoring.coreos.com_$kind.yaml ]] || return 1
    done
}

if ! complete; then
    log "downloading $module@$PROMETHEUS_OPERATOR_VERSION from the module proxy"
    # `go mod download` needs no main module; it verifies the zip against the checksum DB.
    dir=$(cd "${TMPDIR:-/tmp}" && GOFLAGS=-mod=mod go mod download -json \
        "$module@$PROMETHEUS_OPERATOR_VERSION" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
    mkdir -p "$out"
    for kind in "${kinds[@]}"; do
        src=$dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml
        [[ -s $src ]] || { log "missing $src in the module"; exit 1; }
        install -m 0644 "$src" "$out/monitoring.coreos.com_$kind.yaml.tmp"
        mv "$out/monitoring.coreos.com_$kind.yaml.tmp" "$out/monitoring.coreos.com_$kind.yaml"
    done
    log "cached in $out"
fi
echo "$out"
