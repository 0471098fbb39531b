"""Kueue as the gate of a job labelled ``kueue.x-k8s.io/queue-name``: pure decisions.

On a cluster with Kueue (its Workload CRD served), a job carrying Kueue's
queue label is an ordinary citizen of Kueue's queues. LMEvalJob is an
*external framework* to Kueue (``integrations.externalFrameworks`` in its
Configuration): Kueue runs no controller for it, so the poller does what
Kueue's job integrations do for a batch Job:

* it creates and owns (controller ownerReference) one ``Workload``
  (``kueue.x-k8s.io/v1beta1``) per job, whose single pod set is exactly the
  pod it will create (count 1, the pod template `podspec.build_pod` makes,
  requests defaulted from limits as the apiserver defaults a pod's), in the
  LocalQueue the label names, at the priority of the WorkloadPriorityClass
  named by ``kueue.x-k8s.io/priority-class`` (resolved by the poller, as
  Kueue's integrations do);
* while the workload waits, the job stays ``Suspended`` with Kueue's own
  words in its status (the QuotaReserved condition's message: "couldn't
  assign flavors ...", an inactive queue, ...);
* once Kueue admits it, the pod is created with the node labels (as node
  selector) and tolerations of the ResourceFlavors assigned to it;
* when Kueue evicts it (preemption, a stopped queue, ...) or takes its
  admission back, the pod is deleted (its log archived as for any pod that
  ran), the job is ``Suspended`` again saying why, and the workload's quota
  reservation is released back to Kueue (the status update Kueue's job
  integrations make: admission cleared, QuotaReserved false, Requeued
  true), so that a later admission starts a fresh pod;
* a job whose spec or Kueue labels changed before its pod exists gets a
  new workload (the old one was made for another pod or queue);
* a finished job marks its workload ``Finished`` (freeing the quota); a job
  suspended by its user gives its workload up (deleted; resuming queues a
  new one); deleting the job deletes the workload (ownerReference).

Without the label, or without Kueue installed, none of this applies and the
job behaves as it always did. Jobs under Kueue are not counted by
``max-running-jobs``: Kueue's quotas govern them.

This module is pure (no I/O, no `kubernetes`): `poller.decisions.decide` calls it (its
routing and scheduling too: `poller.decisions.routing`, `poller.decisions.scheduling`), and
`poller.cycle.observe` reads what it names.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from typing_extensions import TypedDict

from poller import api
from poller.decisions.views import KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL, controller_reference
from poller.jobpod import podspec
from poller.timefmt import format_time

__all__ = [
    "KUEUE_GROUP",
    "KUEUE_VERSION",
    "PRIORITY_LABEL",
    "QUEUE_LABEL",
    "Flavor",
    "Gate",
    "KueueView",
    "Priority",
    "WorkloadObject",
    "WorkloadView",
    "finished_status",
    "gate",
    "place",
    "pod_is_over",
    "requeue_status",
    "waiting_message",
    "workload_manifest",
    "workload_name",
]

KUEUE_GROUP = "kueue.x-k8s.io"
# The version the poller reads and writes: Kueue v0.15 stores v1beta1 (and
# converts to its own v1beta2 through its webhook).
KUEUE_VERSION = "v1beta1"
QUEUE_LABEL = KUEUE_QUEUE_LABEL
PRIORITY_LABEL = KUEUE_PRIORITY_LABEL
WORKLOAD_PRIORITY_SOURCE = f"{KUEUE_GROUP}/workloadpriorityclass"
POD_SET = "main"
# What a workload was submitted for: the job's spec generation, queue and
# priority class. A waiting job whose spec or Kueue labels changed since gets
# a new workload (its pod set must be the pod that will run).
SUBMITTED_ANNOTATION = f"{api.API_GROUP}/submitted-for"
# Evictions after which Kueue's integrations requeue a workload at once.
_REQUEUED_AT_ONCE = ("Preempted", "NodeFailures")
_NAME_LIMIT = 253


class WorkloadObject(TypedDict, total=False):
    """The parts of a Workload `WorkloadView.from_object` reads (a LIST skips the
    rest, above all the pod template)."""

    metadata: Any
    status: Any


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """A Workload the poller made, as listed."""

    namespace: str
    name: str
    resource_version: str
    owner_uid: str
    deleting: bool
    # The raw conditions, kept whole: a merge patch of status replaces the list.
    conditions: tuple[dict[str, Any], ...]
    # status.admission is set: Kueue reserved quota for it.
    quota_reserved: bool
    cluster_queue: str
    # The flavors assigned to the pod set (distinct names, in order).
    flavors: tuple[str, ...]
    # SUBMITTED_ANNOTATION's value ("" when absent).
    submitted_for: str = ""

    def condition(self, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.conditions if c.get("type") == kind), None)

    def true(self, kind: str) -> bool:
        found = self.condition(kind)
        return found is not None and found.get("status") == "True"

    @property
    def admitted(self) -> bool:
        return self.true("Admitted") and self.quota_reserved and not self.evicted

    @property
    def evicted(self) -> bool:
        return self.true("Evicted")

    @property
    def finished(self) -> bool:
        return self.true("Finished")

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> WorkloadView:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        admission = status.get("admission") or None
        owner = controller_reference(meta)
        flavors: list[str] = []
        if admission:
            for assignment in admission.get("podSetAssignments") or []:
                for name in (assignment.get("flavors") or {}).values():
                    if isinstance(name, str) and name not in flavors:
                        flavors.append(name)
        return cls(
            namespace=meta.get("namespace") or "",
            name=meta.get("name") or "",
            resource_version=meta.get("resourceVersion") or "",
            owner_uid=owner.get("uid") or "",
            deleting=bool(meta.get("deletionTimestamp")),
            conditions=tuple(c for c in status.get("conditions") or [] if isinstance(c, dict)),
            quota_reserved=bool(admission),
            cluster_queue=str((admission or {}).get("clusterQueue") or ""),
            flavors=tuple(flavors),
            submitted_for=str((meta.get("annotations") or {}).get(SUBMITTED_ANNOTATION) or ""),
        )


@dataclass(frozen=True)
class Flavor:
    """A ResourceFlavor's placement: node labels (as node selector) and tolerations."""

    name: str
    node_labels: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> Flavor:
        spec = obj.get("spec") or {}
        labels = spec.get("nodeLabels") or {}
        return cls(
            name=(obj.get("metadata") or {}).get("name") or "",
            node_labels={str(k): str(v) for k, v in labels.items()},
            tolerations=tuple(t for t in spec.get("tolerations") or [] if isinstance(t, dict)),
        )


@dataclass(frozen=True)
class Priority:
    """A WorkloadPriorityClass as read (value None: it does not exist)."""

    name: str
    value: int | None


@dataclass(frozen=True)
class KueueView:
    """What a gated job's decision knows of Kueue: its workload (None: not made yet),
    and, when `gate` asked for them, the assigned flavors and the priority class."""

    workload: WorkloadView | None
    flavors: tuple[Flavor, ...] | None = None
    priority: Priority | None = None


class Gate(Enum):
    """What Kueue's side of a gated job calls for (`gate`)."""

    SUBMIT = "submit"  # no workload yet: create it
    RESUBMIT = "resubmit"  # the job changed while it waited: delete the workload
    WAIT = "wait"  # the workload waits for admission
    RELEASE = "release"  # evicted, the pod gone: give the quota back, requeue
    STOP = "stop"  # the pod runs without an admission: delete it, back to the queue
    START = "start"  # admitted, no pod yet: create it where the flavors say
    FREE = "free"  # not Kueue's business now: decide as without Kueue


def workload_name(job_name: str, job_uid: str) -> str:
    """Deterministic name, as Kueue names its integrations' workloads: kind, job, hash."""
    suffix = hashlib.sha256(f"{api.KIND}/{job_uid}".encode()).hexdigest()[:5]
    stem = f"{api.KIND.lower()}-{job_name}"[: _NAME_LIMIT - len(suffix) - 1].rstrip("-.")
    return f"{stem}-{suffix}"


def submitted_for(generation: int, queue: str, priority_class: str) -> str:
    """What a workload made now is for (`SUBMITTED_ANNOTATION`)."""
    return f"{generation}/{queue}/{priority_class}"


def pod_is_over(pod_phase: str, main_state: str) -> bool:
    """Whether a pod is over: its main container terminated, or the pod ended."""
    return main_state == "terminated" or pod_phase in ("Failed", "Succeeded")


def gate(
    *,
    state: api.JobState | None,
    pod_exists: bool,
    pod_deleting: bool,
    pod_phase: str,
    main_state: str,
    workload: WorkloadView | None,
    wanted: str = "",
) -> Gate:
    """Kueue's verdict for a gated job that is neither finished, cancelled nor
    suspended by its user. Pure.

    A pod that exists is left alone while its workload is admitted, when it
    is already over (its outcome is read as for any pod) or going away, and
    when there is no workload at all (a job started before it had the label,
    or before Kueue was installed, is not stopped behind its back). A job
    without a pod whose workload was submitted for another spec generation,
    queue or priority class than `wanted` (`submitted_for`) resubmits.
    """
    if workload is not None and workload.deleting:
        return Gate.FREE if pod_exists else Gate.WAIT
    if pod_exists:
        if workload is None or workload.admitted or pod_deleting:
            return Gate.FREE
        if pod_is_over(pod_phase, main_state):
            return Gate.FREE
        return Gate.STOP
    if state in (api.JobState.SCHEDULED, api.JobState.RUNNING):
        return Gate.FREE  # its pod vanished: the job ends, as without Kueue
    if workload is None:
        return Gate.SUBMIT
    if wanted and workload.submitted_for and workload.submitted_for != wanted:
        return Gate.RESUBMIT
    if workload.evicted and workload.quota_reserved:
        return Gate.RELEASE
    if workload.admitted:
        return Gate.START
    return Gate.WAIT


def waiting_message(workload: WorkloadView | None, queue: str) -> str:
    """What a waiting job's status says: Kueue's own words when it has any."""
    if workload is None:
        return f"waiting for Kueue: submitting a workload to LocalQueue {queue}"
    reserved = workload.condition("QuotaReserved")
    words = str((reserved or {}).get("message") or "").strip()
    evicted = workload.condition("Evicted") if workload.evicted else None
    if evicted is not None:
        why = str(evicted.get("message") or evicted.get("reason") or "").strip()
        prefix = f"waiting for Kueue after an eviction ({why})" if why else "waiting for Kueue"
        if words == why:
            return prefix
    else:
        prefix = f"waiting for Kueue: workload {workload.name} in LocalQueue {queue}"
    if words:
        return f"{prefix}: {words}"
    return f"{prefix}: not admitted yet"


def waiting_reason(workload: WorkloadView | None) -> str:
    """The Suspended condition's reason while Kueue holds the job."""
    if workload is not None and workload.evicted:
        evicted = workload.condition("Evicted") or {}
        return f"Kueue{evicted.get('reason') or 'Evicted'}"
    if workload is not None and workload.condition("QuotaReserved") is not None:
        return "KueueInadmissible"
    return "KueueQueued"


def stop_message(workload: WorkloadView | None) -> str:
    """Why a running pod is taken away from a job."""
    if workload is None:
        return "Kueue's workload was deleted"
    evicted = workload.condition("Evicted")
    if evicted is not None and workload.evicted:
        reason = evicted.get("reason") or "Evicted"
        words = evicted.get("message") or ""
        return f"evicted by Kueue ({reason}): {words}".rstrip(": ")
    return f"Kueue withdrew the admission of workload {workload.name}"


def _requests_with_limits(container: dict[str, Any]) -> dict[str, Any]:
    """A container as the apiserver stores it: a limit without a request is its request."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    if not limits:
        return container
    requests = {**limits, **(resources.get("requests") or {})}
    return {**container, "resources": {**resources, "requests": requests}}


def workload_manifest(
    *,
    job_name: str,
    job_uid: str,
    namespace: str,
    queue: str,
    pod: dict[str, Any],
    priority: Priority | None,
    submitted: str = "",
    count: int = 1,
) -> dict[str, Any]:
    """The Workload for the pod `pod` (a `podspec.build_pod` manifest): one pod set
    of `count` such pods (a sharded job's shards: admitted together, so a job
    never holds part of its quota), owned by the job."""
    spec = dict(pod["spec"])
    spec["containers"] = [_requests_with_limits(c) for c in spec.get("containers") or []]
    if spec.get("initContainers"):
        spec["initContainers"] = [_requests_with_limits(c) for c in spec["initContainers"]]
    metadata = pod["metadata"]
    workload_spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": [
            {
                "name": POD_SET,
                "count": count,
                "template": {
                    "metadata": {"labels": dict(metadata.get("labels") or {})},
                    "spec": spec,
                },
            }
        ],
    }
    if priority is not None and priority.value is not None:
        workload_spec.update(
            priorityClassName=priority.name,
            priorityClassSource=WORKLOAD_PRIORITY_SOURCE,
            priority=priority.value,
        )
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job_name, job_uid),
            "namespace": namespace,
            "labels": {
                podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY,
                podspec.LABEL_JOB_UID: job_uid,
            },
            "annotations": {SUBMITTED_ANNOTATION: submitted} if submitted else {},
            "ownerReferences": metadata["ownerReferences"],
        },
        "spec": workload_spec,
    }


def place(pod: dict[str, Any], flavors: tuple[Flavor, ...]) -> dict[str, Any]:
    """The pod with the assigned flavors' node labels and tolerations added."""
    spec = dict(pod["spec"])
    selector = dict(spec.get("nodeSelector") or {})
    tolerations = list(spec.get("tolerations") or [])
    for flavor in flavors:
        selector.update(flavor.node_labels)
        tolerations += [t for t in flavor.tolerations if t not in tolerations]
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    return {**pod, "spec": spec}


def _condition(
    kind: str, status: bool, reason: str, message: str, now: str, generation: int | None
) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def _with(
    conditions: tuple[dict[str, Any], ...], new: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`conditions` with each of `new` set (its time kept when its status did not flip)."""
    out = [dict(c) for c in conditions]
    for condition in new:
        previous = next((c for c in out if c.get("type") == condition["type"]), None)
        if previous is None:
            out.append(condition)
            continue
        if previous.get("status") == condition["status"]:
            condition["lastTransitionTime"] = previous.get("lastTransitionTime")
        out[out.index(previous)] = condition
    return out


def requeue_status(workload: WorkloadView, now: dt.datetime) -> dict[str, Any]:
    """The status patch that gives an evicted workload's quota back to Kueue, as
    Kueue's own job integrations do once the job stopped: admission cleared,
    QuotaReserved and Admitted false, Requeued (true after a preemption)."""
    stamp = format_time(now)
    evicted = workload.condition("Evicted") or {}
    reason = str(evicted.get("reason") or "Evicted")
    message = str(evicted.get("message") or "evicted")
    conditions = _with(
        workload.conditions,
        [
            _condition("QuotaReserved", False, "Pending", message, stamp, None),
            _condition(
                "Admitted", False, "NoReservation", "The workload has no reservation", stamp, None
            ),
            # Back in the queue at once after a preemption or a node failure;
            # other evictions (a stopped queue, ...) wait for Kueue to requeue
            # them, exactly as Kueue's own integrations leave them.
            _condition("Requeued", reason in _REQUEUED_AT_ONCE, reason, message, stamp, None),
        ],
    )
    return {"admission": None, "conditions": conditions}


def finished_status(
    workload: WorkloadView, succeeded: bool, message: str, now: dt.datetime
) -> dict[str, Any]:
    """The status patch that marks a workload Finished (Kueue frees its quota)."""
    reason = "Succeeded" if succeeded else "Failed"
    finished = _condition("Finished", True, reason, message, format_time(now), None)
    return {"conditions": _with(workload.conditions, [finished])}
