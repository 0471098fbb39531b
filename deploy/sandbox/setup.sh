#!/usr/bin/env bash
# Source this (bash): prepares everything the tests and the sandbox need from
# the project's own files, then puts the environment on PATH.
#
# Slow things are cached outside the clone, keyed by their inputs:
#   ~/.cache/lmeval-poller/venv-<hash of pyproject.toml>   Python environment
#   ~/.cache/lmeval-poller/bin-<hash of the Go modules>    control plane (+ kwok, kubectl)
#   ~/.cache/lmeval-poller/kueue-<hash>                    Kueue (+ its CRDs and webhooks)
#   ~/.cache/lmeval-poller/prometheus-<hash>               Prometheus and promtool
#   ~/.cache/lmeval-poller/helm-<hash>                     Helm (lints and renders deploy/helm)
#   ~/.cache/lmeval-poller/images-<hash>                   our images (OCI archives),
#                                                          built when the real node needs them
# As root it also installs the Debian packages of the real node (containerd,
# runc, CNI plugins, registry, buildah...): deploy/sandbox/node-packages.sh.
# LMEVAL_CACHE moves them; LMEVAL_SANDBOX_BIN points at ready control-plane
# binaries; LMEVAL_PROMETHEUS_BIN at ready Prometheus binaries; LMEVAL_KUEUE_BIN
# at a ready Kueue; LMEVAL_HELM_BIN at a directory holding a ready helm.
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

# One line per step with its time. A step's output (pip's, go's, apt's) goes to
# a log file, named with its last lines when the step fails, so that a run
# that works prints no installer noise.
_setup_step() {  # _setup_step TITLE DETAIL COMMAND...: run COMMAND, print one line
    local title=$1 detail=$2 log started status seconds
    shift 2
    log=$(mktemp "$cache/setup-log.XXXXXX")
    started=$(date +%s%N)
    # Called with `|| exit` below, so bash ignores `set -e` in here: the steps
    # chain their commands with && themselves.
    status=0
    "$@" >"$log" 2>&1 || status=$?
    seconds=$(awk -v ns="$(($(date +%s%N) - started))" 'BEGIN { printf "%.1f", ns / 1e9 }')
    if [ "$status" -ne 0 ]; then
        echo "✗ $title failed after $seconds s; its output is in $log, ending with:" >&2
        tail -n 20 "$log" | sed 's/^/    /' >&2
        return "$status"
    fi
    echo "✓ $title${detail:+ ($detail)} $seconds s"
    rm -f "$log"
}

key=$( (cat pyproject.toml; python3 --version) | sha256sum | cut -c1-16)
venv=$cache/venv-$key
_setup_python() {
    if [ ! -f "$venv/.complete" ]; then
        rm -rf "$venv" \
            && python3 -m venv "$venv" \
            && "$venv/bin/pip" install --upgrade pip \
            && "$venv/bin/pip" install -e ".[dev]" \
            && touch "$venv/.complete" \
            || return 1
        # Each change of pyproject.toml makes an environment of about 1.2 GB:
        # keep this one and the newest other (for switching back), drop the rest.
        ls -dt "$cache"/venv-* 2>/dev/null | grep -vxF "$venv" | tail -n +2 \
            | while IFS= read -r old; do rm -rf "$old"; done || true
    fi
    # Always point the (shared) environment at this clone's code (-I: whatever
    # PYTHONPATH says, where does the environment itself find poller?).
    local found
    found=$("$venv/bin/python" -I -c 'import poller; print(poller.__path__[0])' 2>/dev/null) || true
    if [ "$found" != "$repo/poller" ]; then
        "$venv/bin/pip" install --no-deps -e . || return 1
    fi
}
if [ -f "$venv/.complete" ]; then
    detail=cached
else
    detail="created in $venv"
    echo "… python environment: creating $venv (first run: a few minutes)"
fi
_setup_step "python environment" "$detail" _setup_python || { return 1 2>/dev/null || exit 1; }
export PATH=$venv/bin:$PATH
export LMEVAL_VENV=$venv

if python -c 'import sys; from poller.sandbox import build; sys.exit(not build.needs_build())'; then
    detail=built
    echo "… control-plane and node binaries: building from their Go modules (about 8 minutes)"
else
    detail=cached
fi
_setup_step "control-plane and node binaries" "$detail" python -m poller.sandbox build \
    || { return 1 2>/dev/null || exit 1; }

# The oldest Kubernetes minor the project claims (deploy/sandbox/controlplane-floor
# says why), built like the current one into bin-floor-<hash>; tests/cluster/
# test_floor_plane.py runs the project on it. LMEVAL_SANDBOX_FLOOR_BIN points at
# ready binaries instead.
floor=$(python -c 'from poller.sandbox import build; print(build.kubernetes_version("floor"))') \
    || { return 1 2>/dev/null || exit 1; }
if python -c 'import sys; from poller.sandbox import build; sys.exit(not build.needs_build("floor"))'; then
    detail=built
    echo "… control plane, oldest supported Kubernetes ($floor): building from its Go module (about 8 minutes)"
else
    detail=cached
fi
floor_minor=${floor#v}
_setup_step "control plane, oldest supported Kubernetes (${floor_minor%.*})" "$detail" \
    python -m poller.sandbox.build floor || { return 1 2>/dev/null || exit 1; }
unset floor floor_minor

if python -c 'import sys; from poller.sandbox import kueue; sys.exit(not kueue.needs_build())'; then
    detail=built
    echo "… Kueue: building from its Go module (about 7 minutes)"
else
    detail=cached
fi
_setup_step "Kueue" "$detail" python -m poller.sandbox.kueue || { return 1 2>/dev/null || exit 1; }

if python -c 'import sys; from poller.sandbox import helm; sys.exit(not helm.needs_build())'; then
    detail=built
    echo "… Helm: building from its Go module (about 4 minutes)"
else
    detail=cached
fi
_setup_step "Helm" "$detail" python -m poller.sandbox.helm || { return 1 2>/dev/null || exit 1; }

if [ "$(id -u)" -eq 0 ]; then
    _setup_step "real node's Debian packages" "" bash deploy/sandbox/node-packages.sh \
        || { return 1 2>/dev/null || exit 1; }
else
    echo "- real node's Debian packages: skipped (not root: tests/node and run --node real cannot start here)"
fi
unset -f _setup_step _setup_python
unset detail
