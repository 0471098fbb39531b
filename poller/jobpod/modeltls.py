"""TLS to the model endpoint: the job pod's share of ``spec.modelTLS``.

A pure module (no I/O), called by ``podspec.build_pod``. It does three things:

* mounts the one key of the ConfigMap or Secret that ``spec.modelTLS.caBundle``
  names, read-only, as ``MODEL_CA_DIR/ca.crt`` (under ``/opt``, where no
  fileSecret may be mounted; `poller.jobpod.trust.ca_volume`);
* names that file in ``$LMEVAL_CA_BUNDLE`` for the driver, which adds it and
  the cluster's CA bundles (the setting ``trusted-ca-bundles``, which every
  job pod gets, with or without ``spec.modelTLS``: `poller.jobpod.trust`) to
  the image's own authorities and points ``SSL_CERT_FILE`` (aiohttp, through
  OpenSSL) and ``REQUESTS_CA_BUNDLE`` (requests, lm_eval's remote tokenizer)
  at the combined file for lm_eval only (``driver.trust`` says why combined);
* refuses a job that turns verification off (``verify_certificate`` in
  ``modelArgs`` anything but ``true``) unless the poller setting
  ``allow-insecure-model-endpoints`` allows it, and a job that sets the trust
  variables itself in ``spec.pod.env`` while naming a bundle (one or the
  other, never a silent override).
"""

from __future__ import annotations

from typing import Any

from driver import protocol
from poller import api
from poller.api.settings import Settings
from poller.jobpod import trust

__all__ = [
    "MODEL_CA_DIR",
    "MODEL_CA_FILE",
    "TRUST_ENV",
    "tls_env",
    "tls_problem",
    "tls_volumes",
]

MODEL_CA_DIR = "/opt/lmeval/model-ca"
MODEL_CA_FILE = f"{MODEL_CA_DIR}/{trust.CA_FILE}"
VOLUME = "model-ca"
# What the driver sets for lm_eval; a job naming a bundle may not set them too.
TRUST_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_DIR")
VERIFY_ARG = "verify_certificate"


def tls_problem(spec: api.LMEvalJobSpec, settings: Settings) -> str | None:
    """Why the job may not run as it is (TLS verification, trust variables), or None."""
    if not settings.allow_insecure_model_endpoints:
        for index, pair in enumerate(spec.model_args or []):
            # lm_eval reads "true"/"false" in any case as booleans, and any other
            # value as a falsy or truthy non-boolean: only "true" keeps the check.
            if pair.name == VERIFY_ARG and pair.value.strip().lower() != "true":
                return (
                    f"spec.modelArgs[{index}]: {VERIFY_ARG}={pair.value} turns TLS verification "
                    "of the model endpoint off, and the poller settings do not allow that "
                    "(allow-insecure-model-endpoints: false in ConfigMap lmeval-poller-config); "
                    "give the job the endpoint's CA with spec.modelTLS.caBundle instead"
                )
    if spec.model_tls is not None:
        for item in (spec.pod.env if spec.pod else None) or []:
            if item.name in TRUST_ENV:
                return (
                    f"spec.pod.env: {item.name} cannot be set with spec.modelTLS.caBundle, which "
                    "sets the evaluation's CA bundle itself; use one or the other"
                )
    return None


def tls_volumes(spec: api.LMEvalJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The CA bundle's volume and its read-only mount (none without spec.modelTLS)."""
    if spec.model_tls is None:
        return [], []
    mount = {"name": VOLUME, "mountPath": MODEL_CA_DIR, "readOnly": True}
    return [trust.ca_volume(VOLUME, spec.model_tls.ca_bundle)], [mount]


def tls_env(spec: api.LMEvalJobSpec) -> list[dict[str, Any]]:
    """The variable that tells the driver where the job's CA bundle is."""
    if spec.model_tls is None:
        return []
    return [{"name": protocol.ENV_CA_BUNDLE, "value": MODEL_CA_FILE}]
