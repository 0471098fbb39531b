#!/usr/bin/env bash
# The project's test command (README): from a fresh clone, install what the
# tests need from the project's own files (deploy/sandbox/setup.sh's tests
# profile: Python environment, both control planes, Kueue, Helm, as root the
# real node's packages; here Prometheus and an S3 server; all cached outside
# the clone), lint, type-check, check the import contracts (pyproject.toml), and
# run the suite. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=../deploy/sandbox/setup.sh
source deploy/sandbox/setup.sh tests

echo "== Prometheus (for the metrics tests)"
python -m lmeval_sandbox.prometheus

echo "== versitygw, a real S3 server (for the offline-storage tests)"
python -m lmeval_sandbox.s3server

echo "== ruff, mypy and the import contracts"
ruff check .
mypy
lint-imports --no-cache --no-logo

if [ "$#" -eq 0 ]; then
    # The full run also runs the scale benchmark in quick mode (N=200), so
    # that the benchmark keeps working; its figures are printed, not asserted.
    echo "== scale benchmark, quick mode"
    python tests/bench/bench_cycle.py --quick
fi

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
