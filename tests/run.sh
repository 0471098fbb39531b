#!/usr/bin/env bash
# The project's test command (README): from a fresh clone, install what the
# tests need from the project's own files, build or reuse the control-plane
# binaries, lint, type-check, and run the suite. Arguments go to pytest.
#
# Slow things are cached outside the clone, keyed by their inputs:
#   ~/.cache/lmeval-poller/venv-<hash of pyproject.toml>   Python environment
#   ~/.cache/lmeval-poller/bin-<hash of the Go modules>    control-plane binaries
# (LMEVAL_CACHE moves both; LMEVAL_SANDBOX_BIN points at ready binaries.)
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${LMEVAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lmeval-poller}
export LMEVAL_SANDBOX_CACHE=$cache
mkdir -p "$cache"

if ! command -v go >/dev/null 2>&1; then
    echo "the Go toolchain (1.24 or newer) is needed to build the control plane: install Go first" >&2
    exit 2
fi

key=$( (cat pyproject.toml; python3 --version) | sha256sum | cut -c1-16)
venv=$cache/venv-$key
if [ ! -f "$venv/.complete" ]; then
    echo "== creating the Python environment in $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
    "$venv/bin/pip" install --quiet -e ".[dev]"
    touch "$venv/.complete"
fi
# Always point the (shared) environment at this clone's code.
"$venv/bin/pip" install --quiet --no-deps -e . 2>/dev/null
export PATH=$venv/bin:$PATH

echo "== control-plane binaries"
python -m poller.sandbox build
python -m poller.sandbox.prometheus

echo "== ruff and mypy"
ruff check .
mypy

echo "== pytest"
set +e
python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure" >&2
    exit 1
fi
exit "$status"
