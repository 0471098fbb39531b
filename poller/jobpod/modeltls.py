"""TLS to the model endpoint: the job pod's share of ``spec.modelTLS``.

A pure module (no I/O), called by ``podspec.build_pod``. It does three things:

* mounts the one key of the ConfigMap or Secret that ``spec.modelTLS.caBundle``
  names, read-only, as ``MODEL_CA_DIR/ca.crt`` (under ``/opt``, where no
  fileSecret may be mounted);
* names that file in ``$LMEVAL_CA_BUNDLE`` for the driver, which adds it to the
  image's own authorities and points ``SSL_CERT_FILE`` (aiohttp, through
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

__all__ = [
    "MODEL_CA_DIR",
    "MODEL_CA_FILE",
    "TRUST_ENV",
    "tls_env",
    "tls_problem",
    "tls_volumes",
]

MODEL_CA_DIR = "/opt/lmeval/model-ca"
MODEL_CA_FILE = f"{MODEL_CA_DIR}/ca.crt"
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
    bundle = spec.model_tls.ca_bundle
    if bundle.config_map_key_ref is not None:
        ref = bundle.config_map_key_ref
        source: dict[str, Any] = {
            "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": "ca.crt"}]}
        }
    else:
        assert bundle.secret_key_ref is not None  # the schema asks for exactly one
        secret = bundle.secret_key_ref
        source = {
            "secret": {
                "secretName": secret.name,
                "items": [{"key": secret.key, "path": "ca.crt"}],
            }
        }
    volume = {"name": VOLUME, **source}
    mount = {"name": VOLUME, "mountPath": MODEL_CA_DIR, "readOnly": True}
    return [volume], [mount]


def tls_env(spec: api.LMEvalJobSpec) -> list[dict[str, Any]]:
    """The variable that tells the driver where the job's CA bundle is."""
    if spec.model_tls is None:
        return []
    return [{"name": protocol.ENV_CA_BUNDLE, "value": MODEL_CA_FILE}]
