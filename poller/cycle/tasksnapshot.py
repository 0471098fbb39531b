"""Custom-task ConfigMaps: check them for code, then freeze what was checked.

Task files are code as much as data (see `poller.decisions.taskcode`): whoever can write
a ConfigMap that a job lists under ``spec.customTasks`` would run Python in
that job's pod, beside its Secrets. So before a job's pod is made, the poller
reads each ConfigMap whole and scans it; one that names code lets the job run
only when both switches for code execution are on, ``spec.allowCodeExecution``
and the ``allow-code-execution`` setting (the pair that already guards
model-written code: "code execution" means any Python that is not in the
image). Otherwise the job ends Failed before any pod exists, with a message
naming the entry, the ConfigMap, the key and what was found.

What was checked is then what runs: the pod does not mount the ConfigMap
(the kubelet would sync later edits into a running pod) but an immutable copy
owned by the job (garbage-collected with it), named by
`podspec.task_snapshot_name` and annotated with the source's name,
resourceVersion and a digest of its content. A copy of that name that
already exists is adopted only when this job controls it, it is immutable
and its content is exactly what was just checked; anything else is a
squatter (or the source changed since the copy was made) and the job fails
naming it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from poller import api
from poller.api.settings import CONFIGMAP_NAME, Settings
from poller.decisions import taskcode
from poller.decisions.ownership import not_the_jobs
from poller.decisions.views import JobView
from poller.jobpod import offline, podspec
from poller.kube.client import ApiError, Kube

__all__ = [
    "ANNOTATION_DIGEST",
    "ANNOTATION_SOURCE",
    "ANNOTATION_SOURCE_VERSION",
    "content_digest",
    "prepare_custom_tasks",
    "snapshot_manifest",
]

ANNOTATION_SOURCE = f"{api.API_GROUP}/source-configmap"
ANNOTATION_SOURCE_VERSION = f"{api.API_GROUP}/source-resource-version"
ANNOTATION_DIGEST = f"{api.API_GROUP}/content-digest"
# Findings quoted in a job's failure message (the rest are counted).
MESSAGE_FINDINGS = 3
# Scans remembered by ConfigMap UID and resourceVersion (which change with
# every write): many jobs naming one big ConfigMap cost one scan (up to about
# a second, see poller.decisions.taskcode's limits), not one each.
SCAN_CACHE_ENTRIES = 256

_scans: OrderedDict[tuple[str, str], tuple[taskcode.Finding, ...]] = OrderedDict()
_scans_lock = threading.Lock()


def content_digest(configmap: dict[str, Any]) -> str:
    """sha256 of a ConfigMap's data and binaryData (keys sorted, compact JSON)."""
    content = {"data": configmap.get("data") or {}, "binaryData": configmap.get("binaryData") or {}}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def snapshot_manifest(job: JobView, source: dict[str, Any]) -> dict[str, Any]:
    """The immutable copy of ConfigMap `source` for `job`. Pure."""
    meta = source.get("metadata") or {}
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": podspec.task_snapshot_name(job.name, job.uid, meta.get("name", "")),
            "namespace": job.namespace,
            "labels": {
                podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY,
                podspec.LABEL_JOB_UID: job.uid,
            },
            "annotations": {
                ANNOTATION_SOURCE: meta.get("name", ""),
                ANNOTATION_SOURCE_VERSION: meta.get("resourceVersion", ""),
                ANNOTATION_DIGEST: content_digest(source),
            },
            "ownerReferences": [offline.owner_reference(job.name, job.uid)],
        },
        "immutable": True,
        "data": dict(source.get("data") or {}),
    }
    if source.get("binaryData"):
        manifest["binaryData"] = dict(source["binaryData"])
    return manifest


@dataclass(frozen=True)
class _Source:
    where: str  # spec.customTasks[i]
    name: str
    obj: dict[str, Any]


def prepare_custom_tasks(kube: Kube, job: JobView, settings: Settings) -> str | None:
    """Check `job`'s custom-task ConfigMaps and make their snapshots.

    Returns None when the pod may be made, else why the job fails. Transient
    API errors propagate (the next cycle tries again).
    """
    spec = api.LMEvalJobSpec.model_validate(job.spec)
    sources: list[_Source] = []
    for index, entry in enumerate(spec.custom_tasks or []):
        if entry.config_map is None:
            continue  # a Git source: cloned in the pod (poller.jobpod.gittasks)
        where = f"spec.customTasks[{index}]"
        obj = kube.read_configmap(job.namespace, entry.config_map)
        if obj is None:
            return f"{where}: ConfigMap {entry.config_map} not found in namespace {job.namespace}"
        sources.append(_Source(where, entry.config_map, obj))
    # Every source is checked before any snapshot is made: a job that fails
    # leaves nothing behind.
    code_allowed = bool(spec.allow_code_execution) and settings.allow_code_execution
    if not code_allowed:
        for source in sources:
            findings = _scan(source.obj)
            if findings:
                return _code_refused(source, findings, spec, settings)
    for source in sources:
        problem = _snapshot(kube, job, source)
        if problem is not None:
            return problem
    return None


def _scan(obj: dict[str, Any]) -> tuple[taskcode.Finding, ...]:
    meta = obj.get("metadata") or {}
    key = (str(meta.get("uid")), str(meta.get("resourceVersion")))
    with _scans_lock:
        if key in _scans:
            _scans.move_to_end(key)
            return _scans[key]
    findings = tuple(taskcode.scan_configmap(obj.get("data") or {}, obj.get("binaryData") or {}))
    if meta.get("uid") and meta.get("resourceVersion"):
        with _scans_lock:
            _scans[key] = findings
            while len(_scans) > SCAN_CACHE_ENTRIES:
                _scans.popitem(last=False)
    return findings


def _code_refused(
    source: _Source,
    findings: Sequence[taskcode.Finding],
    spec: api.LMEvalJobSpec,
    settings: Settings,
) -> str:
    shown = "; ".join(str(f) for f in findings[:MESSAGE_FINDINGS])
    more = len(findings) - MESSAGE_FINDINGS
    if more > 0:
        shown += f" (and {more} more)"
    missing = []
    if not spec.allow_code_execution:
        missing.append("spec.allowCodeExecution: true")
    if not settings.allow_code_execution:
        missing.append(f'allow-code-execution: "true" in ConfigMap {CONFIGMAP_NAME} (an admin)')
    return (
        f"{source.where}: ConfigMap {source.name} has task files that run code in the job: "
        f"{shown}. Custom tasks that name code run only with {' and '.join(missing)}"
    )


def _snapshot(kube: Kube, job: JobView, source: _Source) -> str | None:
    manifest = snapshot_manifest(job, source.obj)
    name = manifest["metadata"]["name"]
    try:
        if kube.create_configmap(manifest):
            return None
    except ApiError as error:
        if error.transient:
            raise  # transient: the next cycle tries again
        return f"{source.where}: the snapshot of ConfigMap {source.name} was refused: {error}"
    existing = kube.read_configmap(job.namespace, name)
    if existing is None:  # deleted between the two requests
        raise RuntimeError(f"ConfigMap {job.namespace}/{name} vanished; trying again")
    wrong = _not_ours(existing, job, manifest)
    if wrong is None:
        return None  # made by this job on an earlier attempt: adopted
    return (
        f"{source.where}: ConfigMap {job.namespace}/{name}, where the snapshot of ConfigMap "
        f"{source.name} goes, already exists and {wrong}"
    )


def _not_ours(existing: dict[str, Any], job: JobView, manifest: dict[str, Any]) -> str | None:
    """Why an existing ConfigMap is not this job's snapshot of the content checked."""
    why = not_the_jobs(existing, job.uid)
    if why is not None:
        return (
            f"was not made by this job ({why}): it is not the poller's, so it is neither "
            "mounted, written nor deleted, and no pod was made; delete it, or rename the job"
        )
    if existing.get("immutable") is not True:
        return "is not immutable; the job cannot run it"
    if content_digest(existing) != manifest["metadata"]["annotations"][ANNOTATION_DIGEST]:
        return (
            "holds other files than the ConfigMap holds now (it changed since this job "
            "first started: a job runs the files as they were then; recreate the job)"
        )
    return None
