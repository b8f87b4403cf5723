#!/usr/bin/env bash
# Builds the upstream Kubernetes binaries the tests and the demo run (etcd,
# kube-apiserver, kube-controller-manager, kubectl, helm, and the node's
# kubelet, kube-scheduler, kube-proxy) from the Go module proxy, because release
# downloads and container registries are unreachable here, and Kueue's manager
# with its CRDs (kueue-<version>/kueue and kueue-<version>/crds/ in the same
# directory). Output: one directory holding all of them, printed as the last line.
#
# Resolution order per binary, so only the first build on a machine pays:
#   1. $KUBEBUILDER_ASSETS/<name> (envtest assets; they carry no
#      kube-controller-manager or helm, so those may still be built),
#   2. the cache ($STABLETRAIN_CACHE, default ~/.cache/stabletrain),
#   3. a binary on PATH whose version matches the pin,
#   4. a build from the module proxy (GOCACHE/GOMODCACHE are kept).
# Per-phase timings are appended to $cache/k8s/build-times.log.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.5.35}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}

cache=${STABLETRAIN_CACHE:-$HOME/.cache/stabletrain}
bindir=$cache/k8s/$K8S_VERSION
work=$cache/k8s/build
timelog=$cache/k8s/build-times.log
mkdir -p "$bindir" "$work"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

log() { printf 'k8s-bins: %s\n' "$*" >&2; }

timed() { # name, command...
    local name=$1 start end; shift
    start=$(date +%s)
    "$@"
    end=$(date +%s)
    log "built $name in $((end - start)) s"
    printf '%s %s %ss\n' "$(date -u +%FT%TZ)" "$name" "$((end - start))" >>"$timelog"
}

adopt() { # name: link an existing binary into $bindir; returns 1 if none fits
    local name=$1 candidate
    [[ -x $bindir/$name ]] && return 0
    if [[ -n ${KUBEBUILDER_ASSETS:-} && -x $KUBEBUILDER_ASSETS/$name ]]; then
        ln -sf "$KUBEBUILDER_ASSETS/$name" "$bindir/$name"
        log "using $name from KUBEBUILDER_ASSETS"
        return 0
    fi
    candidate=$(command -v "$name" || true)
    if [[ -n $candidate ]] && version_matches "$name" "$candidate"; then
        ln -sf "$candidate" "$bindir/$name"
        log "using $name from PATH ($candidate)"
        return 0
    fi
    return 1
}

version_matches() { # name, path: only adopt a PATH binary of the pinned version
    local name=$1 path=$2 out
    case $name in
        etcd) out=$("$path" --version 2>/dev/null | head -1) ; [[ $out == *"${ETCD_VERSION#v}"* ]] ;;
        helm) out=$("$path" version --short 2>/dev/null) ; [[ $out == "$HELM_VERSION"* ]] ;;
        kubectl) out=$("$path" version --client 2>/dev/null | head -1) ; [[ $out == "Client Version: $K8S_VERSION" ]] ;;
        *) out=$("$path" --version 2>/dev/null) ; [[ $out == "Kubernetes $K8S_VERSION" ]] ;;
    esac
}

kube_module() { # a wrapper module: replace directives only apply in the main module
    local dir=$work/kubernetes-$K8S_VERSION
    if [[ ! -f $dir/go.sum ]]; then
        (timed kubernetes-module prepare_kube_module "$dir") >&2
    elif [[ $(kube_tools_go) != "$(cat "$dir/tools.go")" ]]; then
        # A module prepared before a command joined the list: add the new one's dependencies.
        (cd "$dir" && timed kubernetes-module-update write_kube_tools) >&2
    fi
    echo "$dir"
}

prepare_kube_module() { # dir
    local dir=$1 gomod
    log "preparing the kubernetes $K8S_VERSION wrapper module"
    rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
    go mod init stabletrain.local/k8sbins >/dev/null 2>&1
    go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >mod.json
    gomod=$(python3 -c 'import json; print(json.load(open("mod.json"))["GoMod"])')
    sed -i '/^go [0-9]/d' go.mod
    {
        grep -E '^go [0-9]' "$gomod"
        grep -E '^godebug' "$gomod" || true
        echo "require k8s.io/kubernetes $K8S_VERSION"
        # Every staging module is required at v0.0.0 upstream; pin its published tag.
        awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod" | sort -u |
            while read -r m; do echo "replace $m => $m v0${K8S_VERSION#v1}"; done
    } >>go.mod
    write_kube_tools
}

KUBE_COMMANDS=(kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler kube-proxy)

kube_tools_go() {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    local name
    for name in "${KUBE_COMMANDS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$name"; done
    printf ')\n'
}

write_kube_tools() { # in the module dir: the commands to build, then their dependencies
    kube_tools_go >tools.go
    # -e: test-only dependencies of far-away packages may be unavailable; builds need none.
    go mod tidy -e >&2
}

build_kube() { # name
    local name=$1 dir minor
    dir=$(kube_module)
    minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
    local ldflags="-s -w"
    local pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    (cd "$dir" && timed "$name" go build -tags tools -trimpath -ldflags "$ldflags" \
        -o "$bindir/$name.tmp" "k8s.io/kubernetes/cmd/$name")
    mv "$bindir/$name.tmp" "$bindir/$name"
}

build_etcd() {
    local dir=$work/etcd-$ETCD_VERSION
    mkdir -p "$dir"
    (
        cd "$dir"
        if [[ ! -f go.sum ]]; then
            rm -f go.mod
            go mod init stabletrain.local/etcd >/dev/null 2>&1
            cat >main.go <<'GO'
// Command etcd is upstream etcd's server main, built outside its repository.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
            go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
            go mod tidy >&2
        fi
        timed etcd go build -trimpath -ldflags "-s -w" -o "$bindir/etcd.tmp" .
    )
    mv "$bindir/etcd.tmp" "$bindir/etcd"
}

build_helm() {
    local dir=$work/helm-$HELM_VERSION
    mkdir -p "$dir"
    (
        cd "$dir"
        if [[ ! -f go.sum ]]; then
            rm -f go.mod
            go mod init stabletrain.local/helm >/dev/null 2>&1
            cat >tools.go <<'GO'
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
GO
            go get "helm.sh/helm/v3@$HELM_VERSION" >&2
            go mod tidy -e >/dev/null 2>&1 || true
        fi
        # As helm's own Makefile does: the Kubernetes version `helm template` and
        # `helm lint` assume without a cluster is the one of its client-go (unset: v1.20).
        local client_go minor ldflags major=1  # client-go v0.N goes with Kubernetes v1.N
        client_go=$(go list -m -f '{{.Version}}' k8s.io/client-go)
        minor=${client_go#v0.}; minor=${minor%%.*}
        ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
        for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
            ldflags+=" -X $pkg.k8sVersionMajor=$major -X $pkg.k8sVersionMinor=$minor"
        done
        timed helm go build -tags tools -trimpath -ldflags "$ldflags" \
            -o "$bindir/helm.tmp" helm.sh/helm/v3/cmd/helm
    )
    mv "$bindir/helm.tmp" "$bindir/helm"
}

build_kueue() { # cmd/kueue and the CRDs its module ships (config/components/crd/bases)
    local dest=$bindir/kueue-$KUEUE_VERSION dir
    # Kueue's go.mod has no replace directives, so `go install module@version` builds it
    # as released, with the dependency versions Kueue itself pins; no wrapper module.
    mkdir -p "$dest/crds"
    GOBIN=$dest/.gobin timed "kueue-$KUEUE_VERSION" go install -trimpath \
        -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
        "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
    dir=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
    cp "$dir"/config/components/crd/bases/*.yaml "$dir/config/components/webhook/manifests.yaml" \
        "$dest/crds/"
    chmod u+w "$dest"/crds/*.yaml
    mv "$dest/crds/manifests.yaml" "$dest/webhooks.yaml"
    mv "$dest/.gobin/kueue" "$dest/kueue" && rmdir "$dest/.gobin"
}

for name in etcd kube-apiserver kube-controller-manager kubectl helm kubelet kube-scheduler kube-proxy; do
    if adopt "$name"; then continue; fi
    log "building $name (first time on this machine; cached in $bindir)"
    case $name in
        etcd) build_etcd ;;
        helm) build_helm ;;
        *) build_kube "$name" ;;
    esac
done
if [[ ! -x $bindir/kueue-$KUEUE_VERSION/kueue ]]; then
    log "building kueue $KUEUE_VERSION (first time on this machine; cached in $bindir)"
    build_kueue
fi
echo "$bindir"
