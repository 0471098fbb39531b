#!/usr/bin/env bash
# Installs, from Debian's packages, what the real node (deploy/sandbox/lmeval_sandbox/realnode.py)
# and the image builds (deploy/sandbox/lmeval_sandbox/images.py) run but the project does not
# build: containerd and runc, the CNI plugins, a registry server, image tools
# (and the compiler images.py builds the driver's static binary with), iptables
# for kube-proxy, and the shells whose completion scripts the CLI tests load
# (zsh, fish; bash is always there). Needs root; does nothing when all are there.
# setup.sh runs it when it can; run it by hand (as root) otherwise.
set -euo pipefail
packages=(
    containerd runc containernetworking-plugins docker-registry dnsmasq-base
    buildah skopeo mmdebstrap busybox-static gcc libc6-dev
    iptables conntrack
    zsh fish
)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$package")
done
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "the real node needs these Debian packages (install them as root): ${missing[*]}" >&2
    exit 2
fi
echo "== installing Debian packages for the real node: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
