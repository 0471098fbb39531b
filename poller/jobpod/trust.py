"""Whom the job pod's TLS clients trust: the cluster's CA bundles and each endpoint's own.

A pure module (no I/O), called by the modules of the fields that talk TLS
(``modeltls``, ``offline``, ``ocioutput``, ``gittasks``) and by
``podspec.build_pod``. The union itself (the image's authorities, the
cluster's, the endpoint's) is made in the pod by ``driver.trust``; this
module gives it the files:

* **The cluster's bundles**, picked up by choice: the poller setting
  ``trusted-ca-bundles`` names ConfigMap keys (OpenShift's
  ``odh-trusted-ca-bundle/ca-bundle.crt`` and
  ``openshift-service-ca.crt/service-ca.crt``, say). Every job pod mounts
  them, from its own namespace, in one projected volume at `CLUSTER_CA_DIR`
  (``<ConfigMap>/<key>`` below it), each source *optional*: a namespace
  without one still runs, and the driver notes the absence. The container
  of each TLS client (the evaluation, the S3 fetch, the Git trust step)
  mounts it read-only and finds the files in ``$LMEVAL_CLUSTER_CA_BUNDLES``.
  They are the admin's choice, not the job author's, so the admission
  policy does not judge them; whoever may write those ConfigMaps in a
  namespace adds CAs that its jobs trust (on OpenShift their operators own
  and re-sync them).
* **An endpoint's own** ``caBundle`` (`api.CABundle`: one key of a
  ConfigMap or Secret the requester may read): `ca_volume` mounts it as one
  file, for that endpoint's client only.
* **Verification off** for storage endpoints (``verifySSL: false`` of
  ``offline.storage.s3`` and ``outputs.oci``) only when the setting
  ``allow-insecure-storage-endpoints`` allows it (`insecure_storage_problem`,
  checked with the other refusals before any pod exists), as
  ``allow-insecure-model-endpoints`` does for the model endpoint.
"""

from __future__ import annotations

from typing import Any

from driver import protocol
from poller import api
from poller.api.settings import Settings

__all__ = [
    "CA_FILE",
    "CLUSTER_CA_DIR",
    "CLUSTER_VOLUME",
    "ca_volume",
    "cluster_env",
    "cluster_files",
    "cluster_mounts",
    "cluster_volumes",
    "insecure_storage_problem",
]

CLUSTER_CA_DIR = "/opt/lmeval/cluster-ca"
CLUSTER_VOLUME = "cluster-ca"
# The one file an endpoint's caBundle becomes, in the directory it is mounted at.
CA_FILE = "ca.crt"


def _sources(settings: Settings) -> list[tuple[str, str]]:
    """(ConfigMap, key) of each entry of trusted-ca-bundles (validated as NAME/KEY)."""
    pairs = [entry.partition("/") for entry in settings.trusted_ca_bundles]
    return [(name, key) for name, _slash, key in pairs]


def cluster_files(settings: Settings) -> list[str]:
    """Where each picked-up bundle is in the pod (whether or not the namespace has it)."""
    return [f"{CLUSTER_CA_DIR}/{name}/{key}" for name, key in _sources(settings)]


def cluster_volumes(settings: Settings) -> list[dict[str, Any]]:
    """The pod's projected volume of the picked-up bundles (none when the setting is empty)."""
    keys: dict[str, list[str]] = {}
    for name, key in _sources(settings):
        keys.setdefault(name, []).append(key)
    if not keys:
        return []
    sources = [
        {
            "configMap": {
                "name": name,
                "items": [{"key": key, "path": f"{name}/{key}"} for key in names],
                # The namespace may lack it: the pod runs, the driver notes it.
                "optional": True,
            }
        }
        for name, names in keys.items()
    ]
    return [{"name": CLUSTER_VOLUME, "projected": {"sources": sources, "defaultMode": 0o444}}]


def cluster_mounts(settings: Settings) -> list[dict[str, Any]]:
    """A TLS client's read-only mount of the picked-up bundles."""
    if not settings.trusted_ca_bundles:
        return []
    return [{"name": CLUSTER_VOLUME, "mountPath": CLUSTER_CA_DIR, "readOnly": True}]


def cluster_env(settings: Settings) -> list[dict[str, Any]]:
    """The variable that lists the picked-up bundles' files for the driver."""
    if not settings.trusted_ca_bundles:
        return []
    return [{"name": protocol.ENV_CLUSTER_CA_BUNDLES, "value": ":".join(cluster_files(settings))}]


def ca_volume(name: str, bundle: api.CABundle) -> dict[str, Any]:
    """Volume `name`: the one key `bundle` names, as the file `CA_FILE`."""
    if bundle.config_map_key_ref is not None:
        ref = bundle.config_map_key_ref
        return {
            "name": name,
            "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": CA_FILE}]},
        }
    secret = bundle.secret_key_ref
    assert secret is not None  # the schema asks for exactly one
    return {
        "name": name,
        "secret": {"secretName": secret.name, "items": [{"key": secret.key, "path": CA_FILE}]},
    }


def _insecure(where: str, what: str) -> str:
    return (
        f"{where}.verifySSL: false turns TLS verification of {what} off, and the poller "
        "settings do not allow that (allow-insecure-storage-endpoints: false in ConfigMap "
        f"lmeval-poller-config); give its CA in {where}.caBundle instead"
    )


def insecure_storage_problem(spec: api.LMEvalJobSpec, settings: Settings) -> str | None:
    """Why the job may not turn verification of a storage endpoint off, or None."""
    if settings.allow_insecure_storage_endpoints:
        return None
    s3 = spec.offline.storage.s3 if spec.offline else None
    if s3 is not None and s3.verify_ssl is False:
        return _insecure("spec.offline.storage.s3", "the S3 endpoint")
    oci = spec.outputs.oci if spec.outputs else None
    if oci is not None and oci.verify_ssl is False and not oci.plain_http:
        return _insecure("spec.outputs.oci", "the registry")
    return None
