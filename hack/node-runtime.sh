#!/usr/bin/env bash
# Installs what a real Kubernetes node needs besides the kubelet, from Debian packages:
# containerd and runc (the container runtime), the CNI plugins (pod networking), nftables
# and iptables (kube-proxy's and kubelet's rules), and the image tools that build the test
# images without a registry or a daemon (debootstrap, umoci, buildah).
#
# Only what is missing is installed, so a prepared machine pays nothing. Without root or
# apt-get it installs nothing and says so: the real-node tests then skip with that reason.
set -euo pipefail

packages=(containerd runc containernetworking-plugins nftables iptables debootstrap umoci buildah)
log() { printf 'node-runtime: %s\n' "$*" >&2; }

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' ||
        missing+=("$package")
done
if ((${#missing[@]} == 0)); then
    exit 0
fi
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    log "not installing ${missing[*]}: needs root and apt-get (the real-node tests will skip)"
    exit 0
fi
start=$(date +%s)
log "installing ${missing[*]}"
apt-get update -q >&2
# policy-rc.d (if the machine has one) keeps the packages from starting services: the
# tests run their own containerd with its own root, state and socket.
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
log "installed in $(($(date +%s) - start)) s"
