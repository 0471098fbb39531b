"""The signing pod of a suite's verdict (``spec.attestation``), and its ConfigMaps.

Why a pod: the signing key is a Secret of the suite's namespace, named by
its author (the admission policy checked that they may read it), and the
poller reads no Secret of a job namespace: its RBAC has no such right, and
a key in the poller's memory would be one more place to steal it from. So,
once a run's verdict is recorded, the poller writes the in-toto statement
into a ConfigMap and starts a short-lived pod of the job image that mounts
the statement and the key, signs (``python -m driver.attest``), optionally
pushes the attestation beside the model in its registry, and prints the
DSSE envelope, which the poller reads from its log and keeps in the run's
attestation ConfigMap. The pod is a job pod in all but its command: the
restricted profile, the job ServiceAccount without token or rights, the
template's placement, the poller's proof.

Pure: manifests only.
"""

from __future__ import annotations

import hashlib
from typing import Any

from driver import protocol
from poller import api
from poller.api.settings import Settings
from poller.jobpod import podspec

__all__ = [
    "ATTESTATION_KEY",
    "SIGNER_CONTAINER",
    "STATEMENT_KEY",
    "attestation_configmap",
    "attestation_configmap_name",
    "signer_name",
    "signer_pod",
    "statement_configmap",
    "statement_configmap_name",
]

SIGNER_CONTAINER = "sign"
STATEMENT_KEY = "statement.json"
ATTESTATION_KEY = "envelope.json"
_STATEMENT_DIR = "/opt/lmeval/statement"
_KEY_DIR = "/opt/lmeval/signing-key"
_REGISTRY_DIR = "/opt/lmeval/registry"
# A run is named <suite (<= 40)>-<8 hex>: each name below stays within 63.
_SIGNER_SUFFIX = "-sign"


def signer_name(run_name: str) -> str:
    return f"{run_name}{_SIGNER_SUFFIX}"


def statement_configmap_name(run_name: str) -> str:
    return f"{run_name}-statement"


def attestation_configmap_name(run_name: str) -> str:
    return f"{run_name}-attestation"


def _owned(
    namespace: str, name: str, suite_name: str, run_name: str, run_uid: str
) -> dict[str, Any]:
    """Metadata of an object of the run's: it goes with the run (deleted with it by
    the garbage collector when the history limits drop the run), so the poller
    never deletes a ConfigMap."""
    return {
        "name": name,
        "namespace": namespace,
        "labels": {podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY, api.SUITE_LABEL: suite_name},
        "ownerReferences": [api.job_owner_reference(run_name, run_uid)],
    }


def statement_configmap(
    namespace: str, run_name: str, run_uid: str, suite_name: str, statement_json: str
) -> dict[str, Any]:
    name = statement_configmap_name(run_name)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _owned(namespace, name, suite_name, run_name, run_uid),
        "data": {STATEMENT_KEY: statement_json},
        "immutable": True,
    }


def attestation_configmap(
    namespace: str, run_name: str, run_uid: str, suite_name: str, envelope_json: str
) -> dict[str, Any]:
    """Where the signed verdict stays in the cluster (`lmeval verify` reads it)."""
    name = attestation_configmap_name(run_name)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _owned(namespace, name, suite_name, run_name, run_uid),
        "data": {ATTESTATION_KEY: envelope_json},
        "immutable": True,
    }


def signer_pod(
    *,
    namespace: str,
    run_name: str,
    run_uid: str,
    suite_name: str,
    attestation: api.Attestation,
    template: api.LMEvalJobSpec,
    settings: Settings,
    statement_json: str,
) -> dict[str, Any]:
    """The signing pod: the job image running ``python -m driver.attest``. The
    statement's digest is in its command: the ConfigMap it reads the statement
    from is the namespace's, and the pod signs nothing else."""
    key = attestation.signing_key
    items = [{"key": key.key, "path": "key"}]
    if attestation.password_key is not None:
        items.append({"key": attestation.password_key, "path": "password"})
    volumes: list[dict[str, Any]] = [
        {
            "name": "statement",
            "configMap": {"name": statement_configmap_name(run_name), "defaultMode": 0o444},
        },
        {
            "name": "signing-key",
            "secret": {"secretName": key.name, "items": items, "defaultMode": 0o444},
        },
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "statement", "mountPath": _STATEMENT_DIR, "readOnly": True},
        {"name": "signing-key", "mountPath": _KEY_DIR, "readOnly": True},
    ]
    push = attestation.push
    credentials: str | None = None
    if push is not None and push.credentials_secret is not None:
        volumes.append(
            {
                "name": "registry",
                "secret": {
                    "secretName": push.credentials_secret,
                    "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
                    "defaultMode": 0o444,
                },
            }
        )
        mounts.append({"name": "registry", "mountPath": _REGISTRY_DIR, "readOnly": True})
        credentials = f"{_REGISTRY_DIR}/config.json"
    command = protocol.attest_argv(
        statement=f"{_STATEMENT_DIR}/{STATEMENT_KEY}",
        key=f"{_KEY_DIR}/key",
        statement_sha256=hashlib.sha256(statement_json.encode()).hexdigest(),
        password_file=f"{_KEY_DIR}/password" if attestation.password_key else None,
        push=push.reference if push is not None else None,
        registry_credentials=credentials,
        plain_http=bool(push.plain_http) if push is not None else False,
    )
    env: list[dict[str, Any]] = []
    init: list[dict[str, Any]] = []
    if settings.driver_image:  # the driver copied in, as for the job pod
        volumes.append({"name": "driver", "emptyDir": {}})
        mounts.append({"name": "driver", "mountPath": podspec.DRIVER_MOUNT, "readOnly": True})
        env.append({"name": "PYTHONPATH", "value": podspec.DRIVER_MOUNT})
        init.append(podspec.driver_init_container(settings))
    container: dict[str, Any] = {
        "name": SIGNER_CONTAINER,
        "image": settings.pod_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": command,
        "env": env,
        "securityContext": podspec.restricted_container_context(),
        "volumeMounts": mounts,
        "workingDir": podspec.POD_TMP,
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    volumes.append({"name": "tmp", "emptyDir": {}})
    mounts.append({"name": "tmp", "mountPath": podspec.POD_TMP})
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": settings.job_service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "activeDeadlineSeconds": 600,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [podspec.kubelet_literal_container(container)],
        "volumes": volumes,
        **podspec.placement(template),
    }
    if init:
        pod_spec["initContainers"] = init
    metadata = _owned(namespace, signer_name(run_name), suite_name, run_name, run_uid)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
