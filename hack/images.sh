#!/usr/bin/env bash
# Builds the container images the real-node tests run, without a registry or a Docker
# daemon (neither is reachable here), as OCI archives that `ctr images import` loads into
# the test node's containerd:
#
#   base      Debian bookworm (minbase) with python3 3.11, venv, pip and CA certificates,
#             from debootstrap and the Debian mirror apt uses; packed with umoci. It stands
#             in for python:3.11-slim-bookworm, the Dockerfile's PYTHON_IMAGE.
#   pause     the pod sandbox: hack/pause/main.go built static, packed with umoci.
#   operator  the repository's own Dockerfile built by buildah (daemonless, as root, overlay
#             storage in a throwaway directory) with --build-arg PYTHON_IMAGE=<base>.
#
# Each image is keyed by a hash of its inputs (the operator's: the base image, the
# Dockerfile and the build context) and cached in $STABLETRAIN_CACHE/images, so it is
# rebuilt exactly when an input changes. Arguments name the images wanted (default: all
# three; the operator's brings the base). Prints one line per image, tab-separated:
#   name  reference  archive  size-in-bytes
# Build times are appended to $cache/images/build-times.log.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${STABLETRAIN_CACHE:-$HOME/.cache/stabletrain}/images
timelog=$cache/build-times.log
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
RECIPE_VERSION=1 # bump when a recipe below changes what it produces
mkdir -p "$cache"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

log() { printf 'images: %s\n' "$*" >&2; }

# Without root or the tools (see hack/node-runtime.sh) nothing is built, and the real-node
# tests skip with the reason.
if [[ $(id -u) != 0 ]]; then
    log "skipped: building images (debootstrap, buildah) needs root"
    exit 0
fi
for tool in debootstrap umoci buildah go; do
    if ! command -v "$tool" >/dev/null; then
        log "skipped: $tool is missing (\`make node-runtime\` installs it)"
        exit 0
    fi
done

mirror() { # the Debian mirror apt already uses (deb822 or one-line sources)
    local found
    found=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' |
        grep -v security | head -1 || true)
    [[ -n $found ]] || found=$(grep -hsE '^deb ' /etc/apt/sources.list | awk '{print $2}' | head -1 || true)
    echo "${found:-http://deb.debian.org/debian}"
}

key_of() { sha256sum | cut -c1-16; }

context_key() { # the files the Dockerfile's build context holds (see .dockerignore)
    (
        cd "$repo"
        find pyproject.toml README.md contract operator trainer-agent -type f \
            -not -path '*/__pycache__/*' -not -name '*.pyc' -not -path '*/.mypy_cache/*' \
            -not -path '*/.ruff_cache/*' -print0 | sort -z | xargs -0 sha256sum
        sha256sum Dockerfile .dockerignore
    ) | key_of
}

cleanup_work() { # dir: unmount whatever a build left mounted under it, then remove it
    local dir=$1
    if [[ -d $dir ]]; then
        awk -v d="$dir" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
            while read -r point; do umount -l "$point" 2>/dev/null || true; done
        rm -rf "$dir"
    fi
}

# Work directories of builds killed half-way (their owner pid is gone).
for stale in "$cache"/work.*; do
    [[ -d $stale ]] || continue
    owner=$(cat "$stale/owner.pid" 2>/dev/null || echo 0)
    [[ $owner != 0 ]] && kill -0 "$owner" 2>/dev/null && continue
    cleanup_work "$stale"
done
work=$(mktemp -d "$cache/work.XXXXXX")
echo $$ >"$work/owner.pid"
trap 'cleanup_work "$work"' EXIT

timed() { # name, command...
    local name=$1 start; shift
    start=$(date +%s)
    "$@"
    log "built $name in $(($(date +%s) - start)) s"
    printf '%s %s %ss\n' "$(date -u +%FT%TZ)" "$name" "$(($(date +%s) - start))" >>"$timelog"
}

oci_archive() { # layout-dir, archive: an OCI image layout as one tar
    tar -C "$1" -cf "$2.tmp" . && mv "$2.tmp" "$2"
}

build_base() { # tag, archive
    local tag=$1 archive=$2 rootfs=$work/base-rootfs layout=$work/base-oci
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$(mirror)" \
        >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; return 1; }
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/*.log
    umoci init --layout "$layout"
    umoci new --image "$layout:$tag"
    umoci insert --rootless=false --image "$layout:$tag" "$rootfs" /
    umoci config --image "$layout:$tag" --config.cmd python3 \
        --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --config.env LANG=C.UTF-8
    oci_archive "$layout" "$archive"
}

build_pause() { # tag, archive
    local tag=$1 archive=$2 src=$work/pause-src layout=$work/pause-oci bundle=$work/pause-bundle
    mkdir -p "$src"
    cp "$repo/hack/pause/main.go" "$src/"
    (cd "$src" && go mod init stabletrain.local/pause >/dev/null 2>&1 &&
        go build -trimpath -ldflags "-s -w" -o "$work/pause" .)
    umoci init --layout "$layout"
    umoci new --image "$layout:$tag"
    umoci unpack --image "$layout:$tag" "$bundle" >/dev/null
    install -m 0755 "$work/pause" "$bundle/rootfs/pause"
    umoci repack --image "$layout:$tag" "$bundle"
    umoci config --image "$layout:$tag" --config.entrypoint /pause --config.user 65535:65535
    oci_archive "$layout" "$archive"
}

build_operator() { # reference, archive, base-reference, base-archive
    local ref=$1 archive=$2 base_ref=$3 base_archive=$4 id
    local b=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver overlay)
    id=$("${b[@]}" pull --quiet "oci-archive:$base_archive")
    "${b[@]}" tag "$id" "$base_ref"
    # The egress of this machine passes a TLS-inspecting proxy that only the host's CA
    # bundle trusts, so RUN steps (pip reaching the package index) see the host's bundle
    # and pip config; bind mounts of RUN steps never land in the image.
    local mounts=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
    [[ -f /etc/pip.conf ]] && mounts+=(-v /etc/pip.conf:/etc/pip.conf:ro)
    "${b[@]}" bud --quiet --isolation chroot --network host --pull=never --layers=false \
        "${mounts[@]}" --build-arg "PYTHON_IMAGE=$base_ref" -f "$repo/Dockerfile" \
        -t "$ref" "$repo" >"$work/buildah.log" 2>&1 || { tail -30 "$work/buildah.log" >&2; return 1; }
    "${b[@]}" push --quiet "$ref" "oci-archive:$archive.tmp:$ref"
    mv "$archive.tmp" "$archive"
    "${b[@]}" rmi --all --force >/dev/null 2>&1 || true
}

emit() { # name, reference, archive: and drop the archives of older inputs
    local old
    for old in "$cache/$1"-*.tar; do [[ $old == "$3" ]] || rm -f "$old"; done
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(stat -c %s "$3")"
}

wanted=" ${*:-base pause operator} "
wants() { [[ $wanted == *" $1 "* ]]; }
for name in $wanted; do
    [[ " base pause operator " == *" $name "* ]] || { log "no image named $name"; exit 1; }
done

base_key=$(printf '%s\n' "$RECIPE_VERSION" "$SUITE" "$BASE_PACKAGES" | key_of)
base_ref=localhost/stabletrain/base:$base_key
base_archive=$cache/base-$base_key.tar
if { wants base || wants operator; } && [[ ! -f $base_archive ]]; then
    log "building the base image (debootstrap $SUITE: about 2 minutes)"
    timed base build_base "$base_key" "$base_archive"
fi

pause_key=$( (echo "$RECIPE_VERSION"; go version; cat "$repo/hack/pause/main.go") | key_of)
pause_ref=localhost/stabletrain/pause:$pause_key
pause_archive=$cache/pause-$pause_key.tar
if wants pause && [[ ! -f $pause_archive ]]; then
    log "building the pause image"
    timed pause build_pause "$pause_key" "$pause_archive"
fi

operator_key=$( (echo "$RECIPE_VERSION $base_key"; context_key) | key_of)
operator_ref=localhost/stabletrain/operator:$operator_key
operator_archive=$cache/operator-$operator_key.tar
if wants operator && [[ ! -f $operator_archive ]]; then
    log "building the operator image from the Dockerfile (buildah)"
    timed operator build_operator "$operator_ref" "$operator_archive" "$base_ref" "$base_archive"
fi

if wants base; then emit base "$base_ref" "$base_archive"; fi
if wants pause; then emit pause "$pause_ref" "$pause_archive"; fi
if wants operator; then emit operator "$operator_ref" "$operator_archive"; fi
