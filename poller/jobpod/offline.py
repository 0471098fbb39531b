"""Models and datasets from storage: what ``spec.offline`` adds to the job pod.

Pure (no I/O): podspec.build_pod calls these functions and adds what they
return.

``offline.storage.pvcName`` names a claim that the pod mounts read-only at
``/cache/storage``. Its ``hub/`` directory is the Hugging Face hub cache,
laid out as huggingface_hub lays out downloaded repositories
(``models--ORG--NAME`` and ``datasets--ORG--NAME``, each with ``refs/``,
``snapshots/<commit>/`` and ``blobs/``): ``HF_HUB_CACHE`` points there, so
``pretrained=ORG/NAME`` (transformers, huggingface_hub) loads from it with
``HF_HUB_OFFLINE=1``. Any other directory of the claim is named by path
(``pretrained=/cache/storage/models/NAME``). HF_HOME stays the writable
emptyDir it always is: the ``datasets`` library writes its Arrow cache
(HF_DATASETS_CACHE, HF_HOME/datasets) and lock files there, never on the
claim.

Datasets need one more step. ``datasets`` (5.x, as in the job image) does not
read the hub cache when offline: a Hub name such as ``allenai/ai2_arc`` only
loads from an Arrow cache made by an earlier online run. It does load a local
directory given by a relative path, and lm_eval passes a task's
``dataset_path`` unchanged. So the driver (``--hub-datasets``) makes a
directory of symlinks ``ORG/NAME -> hub/datasets--ORG--NAME/snapshots/<the
commit refs/main names>`` and starts lm_eval in it: an unchanged standard task
(``arc_easy``, ``dataset_path: allenai/ai2_arc``) then reads the snapshot's
files with the repository's own dataset card, exactly as online.

``offline.storage.s3`` names an S3-compatible prefix instead: the
``fetch-storage`` init container (the driver's ``fetch-s3``, under the same
restricted profile as every container of the pod, with the credentials from
the job's Secrets in its environment only) copies it into an emptyDir, which
the evaluation mounts read-only at the same place. The prefix is laid out
like a claim (``hub/...``); S3 has no symlinks, so a hub cache synced there
holds file copies in ``snapshots/``, which loads the same. The copy trusts
the image's authorities, the cluster's CA bundles (`poller.jobpod.trust`)
and the endpoint's own ``s3.caBundle``, mounted for it alone at
``S3_CA_DIR``; ``verifySSL: false`` needs the poller's leave
(`trust.insecure_storage_problem`).

A job with offline storage always runs offline: the storage is read-only, so
nothing could be downloaded into it anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from driver import protocol
from poller import api
from poller.api.settings import Settings
from poller.jobpod import trust

__all__ = [
    "FETCH_CONTAINER",
    "HUB_CACHE",
    "STORAGE_ROOT",
    "STORAGE_VOLUME",
    "config_map_volumes",
    "fetch_container",
    "forces_offline",
    "foreign_object_message",
    "hub_datasets",
    "kept_claim",
    "managed_claim",
    "managed_claim_name",
    "outputs_claim",
    "owner_reference",
    "storage_env",
    "storage_volumes",
]

STORAGE_ROOT = "/cache/storage"
HUB_CACHE = f"{STORAGE_ROOT}/hub"
STORAGE_VOLUME = "offline-storage"
FETCH_CONTAINER = "fetch-storage"
S3_CA_VOLUME = "s3-ca"
S3_CA_DIR = "/opt/lmeval/s3-ca"


def _storage(spec: api.LMEvalJobSpec) -> api.OfflineStorage | None:
    return spec.offline.storage if spec.offline else None


def storage_volumes(spec: api.LMEvalJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The storage's volumes (with the S3 endpoint's own CAs, for the fetch
    container) and the evaluation container's mounts of them."""
    storage = _storage(spec)
    if storage is None:
        return [], []
    volume: dict[str, Any] = {"name": STORAGE_VOLUME}
    if storage.pvc_name is not None:
        volume["persistentVolumeClaim"] = {"claimName": storage.pvc_name, "readOnly": True}
    else:
        volume["emptyDir"] = {}  # filled by the fetch-storage init container
    mount = {"name": STORAGE_VOLUME, "mountPath": STORAGE_ROOT, "readOnly": True}
    volumes = [volume]
    if storage.s3 is not None and storage.s3.ca_bundle is not None:
        volumes.append(trust.ca_volume(S3_CA_VOLUME, storage.s3.ca_bundle))
    return volumes, [mount]


def storage_env(spec: api.LMEvalJobSpec) -> list[dict[str, Any]]:
    """Variables of the evaluation container: where the hub cache is."""
    if _storage(spec) is None:
        return []
    return [{"name": "HF_HUB_CACHE", "value": HUB_CACHE}]


def forces_offline(spec: api.LMEvalJobSpec) -> bool:
    """Whether the job runs offline whatever allowOnline says."""
    return _storage(spec) is not None


def hub_datasets(spec: api.LMEvalJobSpec) -> str | None:
    """The hub cache whose datasets the driver exposes to lm_eval (--hub-datasets)."""
    return HUB_CACHE if _storage(spec) is not None else None


def _secret_env(name: str, ref: api.SecretKeyRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def fetch_container(
    spec: api.LMEvalJobSpec, driver: list[str], settings: Settings
) -> dict[str, Any] | None:
    """The init container that copies spec.offline.storage.s3 into the storage volume
    (`driver`: the words that start the driver), trusting the cluster's CA bundles
    and the endpoint's own, without image, security context and resources, which
    the pod's builder gives every init container alike."""
    storage = _storage(spec)
    s3 = storage.s3 if storage else None
    if s3 is None:
        return None
    env = [
        _secret_env("AWS_ACCESS_KEY_ID", s3.access_key_id),
        _secret_env("AWS_SECRET_ACCESS_KEY", s3.secret_access_key),
        _secret_env("S3_BUCKET", s3.bucket),
        _secret_env("S3_ENDPOINT", s3.endpoint),
    ]
    if s3.region is not None:
        env.append(_secret_env("S3_REGION", s3.region))
    mounts: list[dict[str, Any]] = [{"name": STORAGE_VOLUME, "mountPath": STORAGE_ROOT}]
    ca_bundle = None
    if s3.ca_bundle is not None:
        mounts.append({"name": S3_CA_VOLUME, "mountPath": S3_CA_DIR, "readOnly": True})
        ca_bundle = f"{S3_CA_DIR}/{trust.CA_FILE}"
    return {
        "name": FETCH_CONTAINER,
        "command": protocol.fetch_s3_argv(
            driver,
            STORAGE_ROOT,
            s3.path,
            verify_ssl=s3.verify_ssl is not False,
            ca_bundle=ca_bundle,
        ),
        "env": env + trust.cluster_env(settings),
        "volumeMounts": mounts + trust.cluster_mounts(settings),
    }


def config_map_volumes(
    spec: api.LMEvalJobSpec,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """spec.fileConfigMaps: read-only configMap volumes and their mounts."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for index, item in enumerate(spec.file_config_maps or []):
        source: dict[str, Any] = {"name": item.config_map_ref.name}
        if item.config_map_ref.items:
            source["items"] = [{"key": i.key, "path": i.path} for i in item.config_map_ref.items]
        volumes.append({"name": f"configmap-{index}", "configMap": source})
        mounts.append(
            {"name": f"configmap-{index}", "mountPath": item.mount_path, "readOnly": True}
        )
    return volumes, mounts


def managed_claim_name(job_name: str, job_uid: str) -> str:
    """The claim the poller makes for a job's outputs (outputs.pvcManaged): the job's
    name (cut) plus 6 hex of its UID, so a later job of the same name never gets it."""
    suffix = hashlib.sha256(f"{job_uid}/outputs".encode()).hexdigest()[:6]
    stem = job_name[: 253 - len(suffix) - len("-outputs-")].rstrip("-.")
    return f"{stem}-outputs-{suffix}"


def outputs_claim(spec: api.LMEvalJobSpec, job_name: str, job_uid: str) -> str | None:
    """The claim that receives the job's outputs: named, or made by the poller."""
    if spec.outputs is None:
        return None
    if spec.outputs.pvc_managed is not None:
        return managed_claim_name(job_name, job_uid)
    return spec.outputs.pvc_name


# The job as controller (one implementation, `api.job_owner_reference`).
owner_reference = api.job_owner_reference


def managed_claim(
    spec: api.LMEvalJobSpec, job_name: str, namespace: str, job_uid: str, labels: dict[str, str]
) -> dict[str, Any] | None:
    """The claim manifest for outputs.pvcManaged (None without it).

    Controlled by the job, always: that is how the poller knows its own claim
    (`ownership.not_the_jobs`), since the claims admission policy lets nobody else give
    a claim an owner reference to an LMEvalJob. With `keep` the poller
    releases it when the job finishes (`kept_claim`), so the garbage
    collector leaves it when the job is deleted.
    """
    managed = spec.outputs.pvc_managed if spec.outputs else None
    if managed is None:
        return None
    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": managed.size}},
    }
    if managed.storage_class_name is not None:
        claim_spec["storageClassName"] = managed.storage_class_name
    metadata: dict[str, Any] = {
        "name": managed_claim_name(job_name, job_uid),
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(job_name, job_uid)],
    }
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": claim_spec,
    }


def kept_claim(raw_spec: Mapping[str, Any], job_name: str, job_uid: str) -> str | None:
    """The managed claim to release from the job when it finishes (outputs.pvcManaged
    with keep: true), or None. Read from the raw spec: a finishing job's spec was
    validated when its pod was made, and its end must not wait on validation."""
    outputs = raw_spec.get("outputs")
    managed = outputs.get("pvcManaged") if isinstance(outputs, Mapping) else None
    if isinstance(managed, Mapping) and managed.get("keep") is True:
        return managed_claim_name(job_name, job_uid)
    return None


def foreign_object_message(kind: str, name: str, namespace: str, role: str, why: str) -> str:
    """What a job's status says when `kind` `name`, where the poller puts the job's
    `role` (e.g. "outputs claim"), is not the poller's (`why`, from `ownership.not_the_jobs`)."""
    return (
        f"{kind} {name} in namespace {namespace} exists and is not this job's {role} ({why}): "
        "the poller did not make it for this job, so it was neither used, written nor "
        "deleted, and no pod was made; delete it, or rename the job"
    )
