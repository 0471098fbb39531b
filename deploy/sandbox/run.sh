#!/usr/bin/env bash
# The product's main job on the local sandbox (README): from a fresh clone,
# prepare the environment (deploy/sandbox/setup.sh), then start a local
# control plane, the poller and a model server, run a sample LMEvalJob through
# a real lm_eval evaluation, show it progress, print its results, and stop.
# Arguments go to `python -m poller.sandbox run` (e.g. --keep, --sample NAME).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=setup.sh
source deploy/sandbox/setup.sh
exec python -m poller.sandbox run "$@"
