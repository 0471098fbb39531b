# syntax=docker/dockerfile:1
#
# The images of lmeval-poller, one target each:
#
#   docker build --target poller -t quay.io/lmeval-poller/lmeval-poller .  the operator (default)
#   docker build --target job    -t quay.io/lmeval-poller/lmeval-job .     the job pod: lm-eval + driver
#   docker build --target driver -t quay.io/lmeval-poller/lmeval-driver .  the driver alone
#
# Every image runs as UID 1001 in group 0 and works as well with any other
# UID in group 0 (OpenShift assigns one), with a read-only root filesystem:
# the job pod mounts emptyDirs at /tmp, HF_HOME and /outputs, the only paths
# anything writes to.
#
# No container engine runs in CI: tests/deploy/test_dockerfile.py lints this
# file with hadolint and runs its COPY and RUN steps in throwaway
# directories and virtual environments. For that, RUN steps name absolute
# paths only through the variables declared here (the test maps them).
#
# The base images are build arguments. The defaults are Docker Hub's; the
# sandbox (`python -m poller.sandbox images`, poller/sandbox/images.py) builds
# both from Debian's packages instead and passes them here, so any base works
# that has `python` (3.11) with its venv module on PATH, or busybox's `cp`.

ARG PYTHON_BASE=python:3.11-slim-bookworm
ARG BUSYBOX_BASE=busybox:1.37.0

# -- python-base: what every Python stage shares --------------------------------
FROM ${PYTHON_BASE} AS python-base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    WHEELS=/wheels \
    VIRTUAL_ENV=/opt/lmeval
ENV PATH=${VIRTUAL_ENV}/bin:${PATH}

# -- build: the operator's wheel and the driver's -------------------------------
# Each image installs one distribution of its own (poller/pyproject.toml:
# lmeval-operator; driver/pyproject.toml: lmeval-driver). The user CLI and the
# sandbox are not in the context at all (.dockerignore).
FROM python-base AS build
WORKDIR /src
COPY . .
# pip from a venv of its own: a distribution's Python (Debian's) may come
# without it. The driver image takes the driver from its wheel, so that it
# holds exactly what the job image installs.
RUN python -m venv "${VIRTUAL_ENV}" \
    && pip wheel --no-deps --wheel-dir "${WHEELS}" ./poller ./driver \
    && set -- "${WHEELS}"/lmeval_driver-*.whl \
    && python -m zipfile -e "$1" driver-wheel

# -- driver: the driver package alone, for the job pod's init container ---------
# With the setting driver-image, the poller's init container runs
# `cp -R /opt/lmeval/driver /opt/lmeval-driver/` (poller/podspec.py) and the
# evaluation runs `python -m driver` with PYTHONPATH=/opt/lmeval-driver, so
# any image with Python and lm-eval can be the pod image. The driver uses the
# standard library only; busybox brings `cp`.
FROM ${BUSYBOX_BASE} AS driver
COPY --from=build /src/driver-wheel/driver/ /opt/lmeval/driver/
USER 1001:0

# -- job: the evaluation container: lmeval-driver with lm-eval, nothing else ---
FROM python-base AS job
COPY --from=build ${WHEELS} ${WHEELS}
# The driver's `eval` extra pins lm-eval with its API models (driver/pyproject.toml).
# (DL3013 asks for pinned names; this is a local wheel whose extra pins lm-eval.)
# hadolint ignore=DL3013
RUN python -m venv "${VIRTUAL_ENV}" \
    && set -- "${WHEELS}"/lmeval_driver-*.whl \
    && pip install "$1[eval]" \
    && rm -rf "${WHEELS}"
# The only writable paths; group 0 may write them whatever the UID.
ENV HOME=/tmp \
    HF_HOME=/cache/huggingface \
    LMEVAL_OUTPUT_ROOT=/outputs
RUN mkdir -p "${HF_HOME}" "${LMEVAL_OUTPUT_ROOT}" \
    && chmod 0775 "${HF_HOME}" "${LMEVAL_OUTPUT_ROOT}"
VOLUME ["/cache/huggingface", "/outputs"]
WORKDIR /tmp
USER 1001:0
CMD ["lmeval-driver", "--help"]

# -- poller: the operator (the default target) ----------------------------------
FROM python-base AS poller
COPY --from=build ${WHEELS} ${WHEELS}
# The operator's distribution with its dependencies; among them the driver's,
# for the driver-poller contract (driver/protocol.py): standard library only.
# hadolint ignore=DL3013
RUN python -m venv "${VIRTUAL_ENV}" \
    && pip install --find-links "${WHEELS}" lmeval-operator \
    && rm -rf "${WHEELS}"
USER 1001:0
EXPOSE 8080
ENTRYPOINT ["lmeval-poller"]
CMD ["--json-logs", "--metrics-port=8080"]
