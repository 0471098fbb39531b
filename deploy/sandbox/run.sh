#!/usr/bin/env bash
# The product's main job on the local sandbox (README): from a fresh clone,
# prepare what it runs and nothing more (deploy/sandbox/setup.sh's sandbox
# profile: the Python environment, the control-plane and node binaries), then
# start a local control plane, the poller and a model server, run a sample
# LMEvalJob through a real lm_eval evaluation, show its progress, print its
# results, and stop. Arguments go to `python -m lmeval_sandbox run` (e.g.
# --keep, --sample NAME; --node real builds its images and, as root, installs
# the node's Debian packages on first use).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=setup.sh
source deploy/sandbox/setup.sh sandbox
exec python -m lmeval_sandbox run "$@"
