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
# sandbox (`python -m lmeval_sandbox images`, deploy/sandbox/lmeval_sandbox/images.py) builds
# both from Debian's packages instead and passes them here, so any base works
# that has `python` (3.11) with its venv module on PATH, or busybox's `cp`.
#
# What each image says about itself is a build argument too: VERSION (the
# distributions' version, `python -m lmeval_sandbox.version`), REVISION (the
# source commit), CREATED (RFC 3339) and SOURCE (the repository) become its
# OCI labels (org.opencontainers.image.*), and REVISION also the poller's and
# the job image's LMEVAL_REVISION (`lmeval-poller --version`, the metric
# lmeval_build_info). They are declared at the end of each final stage, after
# every RUN: a new revision changes only the image's configuration, never the
# cache of the steps that install anything.

ARG PYTHON_BASE=python:3.11-slim-bookworm
ARG BUSYBOX_BASE=busybox:1.37.0
ARG VERSION=0+unknown
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
ARG SOURCE=https://github.com/lmeval-poller/lmeval-poller

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
# holds exactly what the job image installs, and the wheel's METADATA inside
# the package: the init container copies the package directory alone, and
# the driver reads its version there (driver/__init__.py).
RUN python -m venv "${VIRTUAL_ENV}" \
    && pip wheel --no-deps --wheel-dir "${WHEELS}" ./poller ./driver \
    && set -- "${WHEELS}"/lmeval_driver-*.whl \
    && python -m zipfile -e "$1" driver-wheel \
    && set -- driver-wheel/lmeval_driver-*.dist-info \
    && cp "$1/METADATA" driver-wheel/driver/METADATA

# -- driver: the driver package alone, for the job pod's init container ---------
# With the setting driver-image, the poller's init container runs
# `cp -R /opt/lmeval/driver /opt/lmeval-driver/` (poller/jobpod/podspec.py) and the
# evaluation runs `python -m driver` with PYTHONPATH=/opt/lmeval-driver, so
# any image with Python and lm-eval can be the pod image. The driver uses the
# standard library only; busybox brings `cp`.
FROM ${BUSYBOX_BASE} AS driver
COPY --from=build /src/driver-wheel/driver/ /opt/lmeval/driver/
USER 1001:0
ARG VERSION
ARG REVISION
ARG CREATED
ARG SOURCE
# buildah (1.28) keys its layer cache for LABEL and ENV by their text, not by
# the values of the arguments in them, and would reuse another build's labels;
# a RUN's key holds the arguments' values, so this empty step is where a new
# revision leaves the cache (and nowhere earlier).
RUN true
LABEL org.opencontainers.image.title="lmeval-driver" \
      org.opencontainers.image.description="The lmeval-poller driver alone, copied into job pods by an init container (setting driver-image)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"

# -- job: the evaluation container: lmeval-driver with lm-eval, nothing else ---
FROM python-base AS job
COPY --from=build ${WHEELS} ${WHEELS}
# The driver's `eval` extra pins lm-eval with its API models; its `attest` extra
# adds `cryptography` (about 18 MB with cffi), which driver.attest signs a
# suite's verdict with in the pod; its `mlflow` extra adds MLflow's client,
# mlflow-skinny (about 91 MB over lm-eval's dependencies: opentelemetry,
# databricks-sdk, fastapi, protobuf...), which driver.mlflowexport logs a run
# to a tracking server with (driver/pyproject.toml).
# (DL3013 asks for pinned names; this is a local wheel whose extras pin them.)
# hadolint ignore=DL3013
RUN python -m venv "${VIRTUAL_ENV}" \
    && set -- "${WHEELS}"/lmeval_driver-*.whl \
    && pip install "$1[eval,attest,mlflow]" \
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
ARG VERSION
ARG REVISION
ARG CREATED
ARG SOURCE
# buildah (1.28) keys its layer cache for LABEL and ENV by their text, not by
# the values of the arguments in them, and would reuse another build's labels;
# a RUN's key holds the arguments' values, so this empty step is where a new
# revision leaves the cache (and nowhere earlier).
RUN true
LABEL org.opencontainers.image.title="lmeval-job" \
      org.opencontainers.image.description="The lmeval-poller job pod: lm-evaluation-harness run by the lmeval-poller driver" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV LMEVAL_REVISION=${REVISION}

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
ARG VERSION
ARG REVISION
ARG CREATED
ARG SOURCE
# buildah (1.28) keys its layer cache for LABEL and ENV by their text, not by
# the values of the arguments in them, and would reuse another build's labels;
# a RUN's key holds the arguments' values, so this empty step is where a new
# revision leaves the cache (and nowhere earlier).
RUN true
LABEL org.opencontainers.image.title="lmeval-poller" \
      org.opencontainers.image.description="A polling Kubernetes operator that runs lm-evaluation-harness jobs declared as LMEvalJob resources" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV LMEVAL_REVISION=${REVISION}
