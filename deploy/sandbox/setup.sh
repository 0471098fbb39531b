#!/usr/bin/env bash
# Source this (bash): prepares everything the tests and the sandbox need from
# the project's own files, then puts the environment on PATH.
#
# Slow things are cached outside the clone, keyed by their inputs:
#   ~/.cache/lmeval-poller/venv-<hash of pyproject.toml>   Python environment
#   ~/.cache/lmeval-poller/bin-<hash of the Go modules>    control plane (+ kwok, kubectl)
#   ~/.cache/lmeval-poller/prometheus-<hash>               Prometheus and promtool
#   ~/.cache/lmeval-poller/images-<hash>                   our images (OCI archives),
#                                                          built when the real node needs them
# As root it also installs the Debian packages of the real node (containerd,
# runc, CNI plugins, registry, buildah...): deploy/sandbox/node-packages.sh.
# LMEVAL_CACHE moves them; LMEVAL_SANDBOX_BIN points at ready control-plane
# binaries; LMEVAL_PROMETHEUS_BIN at ready Prometheus binaries.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"

cache=${LMEVAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lmeval-poller}
export LMEVAL_SANDBOX_CACHE=$cache
mkdir -p "$cache"

if ! command -v go >/dev/null 2>&1; then
    echo "the Go toolchain (1.24 or newer) is needed to build the control plane: install Go first" >&2
    return 2 2>/dev/null || exit 2
fi

key=$( (cat pyproject.toml; python3 --version) | sha256sum | cut -c1-16)
venv=$cache/venv-$key
if [ ! -f "$venv/.complete" ]; then
    echo "== creating the Python environment in $venv (first run: a few minutes)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
    "$venv/bin/pip" install --quiet -e ".[dev]"
    touch "$venv/.complete"
fi
# Always point the (shared) environment at this clone's code.
"$venv/bin/pip" install --quiet --no-deps -e . >/dev/null 2>&1
export PATH=$venv/bin:$PATH
export LMEVAL_VENV=$venv

echo "== control-plane and node binaries (first run: about 8 minutes of Go builds)"
python -m poller.sandbox build

if [ "$(id -u)" -eq 0 ]; then
    bash deploy/sandbox/node-packages.sh
else
    echo "== not root: the real node (tests/node, run --node real) cannot start here"
fi
