#!/usr/bin/env bash
# Builds promql-check (hack/promql-check/main.go): it parses PromQL expressions with
# Prometheus' own parser, so the chart's alert rules and dashboard queries are checked by
# the real grammar (the PrometheusRule CRD does not validate PromQL; prometheus-operator's
# admission webhook would, and the tests have none). Built from the Go module proxy,
# cached beside the Kubernetes binaries; prints the binary's path as the last line.
set -euo pipefail

PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}
cache=${STABLETRAIN_CACHE:-$HOME/.cache/stabletrain}
out=$cache/k8s/promql-check-$PROMETHEUS_VERSION
src=$(cd "$(dirname "$0")/promql-check" && pwd)
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# Rebuilt when main.go's content changes (not its mtime: every fresh clone is newer).
stamp=$out/main.go.sha256
want=$(sha256sum "$src/main.go" | cut -d' ' -f1)
if [[ ! -x $out/promql-check || $(cat "$stamp" 2>/dev/null) != "$want" ]]; then
    printf 'promql-check: building against github.com/prometheus/prometheus %s\n' \
        "$PROMETHEUS_VERSION" >&2
    work=$cache/k8s/build/promql-check-$PROMETHEUS_VERSION
    mkdir -p "$work" "$out"
    cp "$src/main.go" "$work/main.go"
    (
        cd "$work"
        if [[ ! -f go.sum ]]; then
            rm -f go.mod
            go mod init stabletrain.local/promqlcheck >/dev/null 2>&1
            go get "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" >&2
            go mod tidy -e >&2
        fi
        go build -trimpath -ldflags "-s -w" -o "$out/promql-check.tmp" .
    )
    mv "$out/promql-check.tmp" "$out/promql-check"
    echo "$want" >"$stamp"
fi
echo "$out/promql-check"
