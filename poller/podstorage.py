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

A job with offline storage always runs offline: the claim is read-only, so
nothing could be downloaded into it anyway.
"""

from __future__ import annotations

from typing import Any

from poller import api

__all__ = [
    "HUB_CACHE",
    "STORAGE_ROOT",
    "STORAGE_VOLUME",
    "forces_offline",
    "hub_datasets",
    "storage_env",
    "storage_volumes",
]

STORAGE_ROOT = "/cache/storage"
HUB_CACHE = f"{STORAGE_ROOT}/hub"
STORAGE_VOLUME = "offline-storage"


def _claim(spec: api.LMEvalJobSpec) -> str | None:
    return spec.offline.storage.pvc_name if spec.offline else None


def storage_volumes(spec: api.LMEvalJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The storage's volumes and the evaluation container's mounts of them."""
    claim = _claim(spec)
    if claim is None:
        return [], []
    volume = {
        "name": STORAGE_VOLUME,
        "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
    }
    mount = {"name": STORAGE_VOLUME, "mountPath": STORAGE_ROOT, "readOnly": True}
    return [volume], [mount]


def storage_env(spec: api.LMEvalJobSpec) -> list[dict[str, Any]]:
    """Variables of the evaluation container: where the hub cache is."""
    if _claim(spec) is None:
        return []
    return [{"name": "HF_HUB_CACHE", "value": HUB_CACHE}]


def forces_offline(spec: api.LMEvalJobSpec) -> bool:
    """Whether the job runs offline whatever allowOnline says."""
    return _claim(spec) is not None


def hub_datasets(spec: api.LMEvalJobSpec) -> str | None:
    """The hub cache whose datasets the driver exposes to lm_eval (--hub-datasets)."""
    return HUB_CACHE if _claim(spec) is not None else None
