"""Whether a pod found under a job's pod name is that job's pod: a pure judgement.

The poller finds a job's pod by the deterministic name it gives it (in the
job's own namespace), never by labels or ownerReferences alone: anyone who
may create pods can copy those. What decides is the proof of origin that
only the poller can compute (`poller.cycle.podproof`, checked into
`PodView.proof_attempt` when the pod is listed) and what the job's status
recorded when the poller created it (`podAttempt`, `podUID`):

* CURRENT: the pod the status records (same attempt; same UID once known).
* ADOPT: the next attempt, made by the poller but not recorded yet: it
  crashed, or lost a race, between creating the pod and writing the status.
  The status then records it; nothing is created twice. Also a pod an older
  poller made before proofs existed (attempt 0, see `poller.cycle.podproof`), for a
  job whose status records no attempt yet.
* ALTERED: the poller's pod, changed since it was admitted: a container's
  image was replaced (the kubelet then restarts that container, with the
  job's Secrets), or an ephemeral container was added. The admission policy
  `deploy/admission/job-pods-policy.yaml` refuses such changes; this is the
  poller's own check, for clusters without it. Its fingerprint
  (`views.pod_fingerprint`, recorded in `status.podFingerprint` from the pod
  as the apiserver admitted it) differs, or the pod itself shows it
  (`PodView.altered`). The job ends Failed and the pod is deleted, its log
  and results unread: what it reports is not the job's.
* FOREIGN: anything else. No proof, another owner, a proof for an older
  attempt (copied from an earlier pod), or the recorded attempt under another
  UID (the real pod was deleted and replaced). A foreign pod is never
  adopted, read, archived or deleted by the poller: the job ends Failed with
  a message naming it.

Objects the poller makes besides pods (results and task-snapshot ConfigMaps)
are judged by their controller alone (`controller_uid`): the claims
admission policy refuses an ownerReference to an LMEvalJob from anyone but
the poller, and the apiserver allows one controller per object.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from poller.decisions.views import JobView, PodView, controller_reference

__all__ = [
    "PodTrust",
    "altered_pod_message",
    "controller_text",
    "controller_uid",
    "foreign_pod_message",
    "judge_pod",
    "judge_shard",
    "not_the_jobs",
]


class PodTrust(Enum):
    CURRENT = "current"
    ADOPT = "adopt"
    ALTERED = "altered"
    FOREIGN = "foreign"


def judge_pod(job: JobView, pod: PodView) -> tuple[PodTrust, str]:
    """The verdict on `pod` for `job`, and for FOREIGN the reason in words."""
    status = job.status
    return _judge(job.uid, status.pod_attempt or 0, status.pod_uid, status.pod_fingerprint, pod)


def judge_shard(job: JobView, index: int, pod: PodView) -> tuple[PodTrust, str]:
    """`judge_pod` for the pod under shard `index`'s name, against that shard's
    record in status (spec.parallelism above 1): the same rules, per shard. A
    shard's pod is recorded once seen (ADOPT: record its attempt and UID)."""
    record = next((s for s in job.status.shards or [] if s.index == index), None)
    attempt = record.attempt if record is not None else 0
    uid = record.pod_uid if record is not None else None
    return _judge(job.uid, attempt, uid, None, pod)


def _judge(
    job_uid: str, recorded: int, recorded_uid: str | None, fingerprint: str | None, pod: PodView
) -> tuple[PodTrust, str]:
    if pod.owner_uid != job_uid:
        return PodTrust.FOREIGN, "its controller ownerReference is not this job"
    attempt = pod.proof_attempt
    if attempt is None:
        return PodTrust.FOREIGN, "it carries no valid proof that the poller created it"
    if attempt in (recorded, recorded + 1) and pod.altered:
        return PodTrust.ALTERED, pod.altered
    if attempt == recorded:
        if recorded_uid is None:
            return PodTrust.ADOPT, ""
        if recorded_uid == pod.uid:
            if fingerprint and pod.fingerprint and fingerprint != pod.fingerprint:
                return PodTrust.ALTERED, (
                    "its containers or their images are not the ones the apiserver admitted "
                    f"(fingerprint {pod.fingerprint}, recorded {fingerprint})"
                )
            return PodTrust.CURRENT, ""
        return PodTrust.FOREIGN, (
            f"its UID {pod.uid} is not {recorded_uid}, the pod the poller created: "
            "the job's pod was deleted and replaced"
        )
    if attempt == recorded + 1:
        return PodTrust.ADOPT, ""
    return PodTrust.FOREIGN, (
        f"its proof names pod attempt {attempt}, and this job's current attempt is {recorded}"
    )


def foreign_pod_message(pod: PodView, why: str) -> str:
    """What a job's status says when a pod it did not make holds its pod name."""
    return (
        f"pod {pod.name} in namespace {pod.namespace} was not created by the poller for "
        f"this job ({why}); it was left untouched and is not taken for the job's pod: "
        "delete it and submit the job again"
    )


def altered_pod_message(pod: PodView, why: str) -> str:
    """What a job's status says when its own pod was changed after admission."""
    return (
        f"pod {pod.name} was changed after the poller created it ({why}): what it runs is not "
        "what the job asked for, so it was deleted and nothing it reported was taken as the "
        "job's results; submit the job again (`lmeval rerun`), and see who may patch pods in "
        f"namespace {pod.namespace}"
    )


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The UID of the object's controller (the ownerReference marked controller), if any."""
    owner = controller_reference(obj.get("metadata") or {})
    return str(owner.get("uid")) if owner else None


def controller_text(obj: Mapping[str, Any]) -> str:
    """The object's controller ownerReference in words: 'LMEvalJob x (uid u)', or 'none'."""
    owner = controller_reference(obj.get("metadata") or {})
    if not owner:
        return "none"
    return f"{owner.get('kind') or '?'} {owner.get('name') or '?'} (uid {owner.get('uid') or '?'})"


def not_the_jobs(found: Mapping[str, Any], job_uid: str) -> str | None:
    """Why `found`, met under a name the poller gives one of a job's objects (its
    managed claim, its results ConfigMap, ...), is not that job's; None when it is.

    Judged by the controller ownerReference alone: the name is known to
    everyone who can read the job, and so are its labels; the claims
    admission policy lets only the poller give an object an owner reference
    to an LMEvalJob, and an object has at most one controller.
    """
    if controller_uid(found) == job_uid:
        return None
    if not controller_reference(found.get("metadata") or {}):
        return "it has no controller ownerReference"
    return f"its controller ownerReference is {controller_text(found)}, not this job"
