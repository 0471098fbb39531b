"""Writing a job's status and events: only when they change, never with what the API refuses.

The decisions are pure and produce whole statuses; this turns them into the
merge patches the apiserver takes (a field is removed only by an explicit
null), guarded by the resourceVersion the job was read at so that a stale
write is a conflict instead of a lost update. Events are best effort.

Two things only the actuator learns are folded into a status patch here
(`with_outcome_of_actions`): the UID the apiserver gave the pod it just
created and its fingerprint as admitted (`views.pod_fingerprint`), and why
the results ConfigMap could not be written. And when a job
must end because handling it keeps failing (`poller.cycle.poison`), `end_failed`
writes the ordinary failure, or, if the apiserver refuses that (the status
itself may hold what it refuses), the smallest patch that still ends it.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import replace
from typing import Any, NamedTuple

from poller.cycle import poison
from poller.decisions.actions import PatchStatus, PostEvent
from poller.decisions.scheduling import decide_failure
from poller.decisions.views import JobView
from poller.kube.client import Conflict, Kube

__all__ = ["AdmittedPod", "StatusWrites", "merge_patch", "with_outcome_of_actions"]

log = logging.getLogger(__name__)


class StatusWrites:
    """Status patches and events of jobs, through `Kube` (thread-safe: no state)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def fail(self, job: JobView, now: dt.datetime, message: str, cause: str | None = None) -> int:
        """End `job` Failed with `message`; the number of status patches sent."""
        patches = 0
        for follow_up in decide_failure(job, now, message, cause).actions:
            if isinstance(follow_up, PatchStatus):
                self.patch(job, follow_up)
                patches += 1
            elif isinstance(follow_up, PostEvent):
                self.event(job, follow_up, now)
        return patches

    def end_failed(self, job: JobView, now: dt.datetime, message: str) -> int:
        """`fail`, else the smallest patch that ends the job (raises if that fails too)."""
        try:
            return self.fail(job, now, message, cause="PollerError")
        except Exception as error:  # e.g. the status itself holds what the API refuses
            log.warning("failure patch of %s/%s refused: %s", job.namespace, job.name, error)
        self.kube.patch_job_status(job.namespace, job.name, poison.failure_patch(message, now), "")
        return 1

    def patch(self, job: JobView, action: PatchStatus) -> bool:
        """Write the status; False when another writer got there first."""
        new = action.status.model_dump(by_alias=True, exclude_none=True, mode="json")
        old = job.status.model_dump(by_alias=True, exclude_none=True, mode="json")
        patch = merge_patch(old, new)
        try:
            self.kube.patch_job_status(job.namespace, job.name, patch, action.resource_version)
            return True
        except Conflict:
            log.info(
                "status of %s/%s changed meanwhile; deciding again next cycle",
                job.namespace,
                job.name,
            )
            return False

    def event(self, job: JobView, action: PostEvent, now: dt.datetime) -> None:
        try:
            self.kube.post_event(
                namespace=job.namespace,
                job_name=job.name,
                job_uid=job.uid,
                event_type=action.type,
                reason=action.reason,
                message=action.message,
                now=now,
            )
        except Exception as error:  # events are best effort
            log.warning(
                "cannot record event %s on %s/%s: %s", action.reason, job.namespace, job.name, error
            )


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `old` into `new` whole: `new`, with a null for
    every key of `old` it lacks, at every depth.

    A merge patch merges objects key by key and removes only a key that is
    explicitly null, in nested objects too: without the nulls below the top,
    a key of an earlier status.gate (a p-value, a score) would survive beside
    a new outcome that has none.
    """
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = value
    return patch


class AdmittedPod(NamedTuple):
    """The pod the actuator just created (or adopted): its UID and fingerprint
    ("" when it must not be recorded: the next decision judges the pod)."""

    uid: str
    fingerprint: str


def with_outcome_of_actions(
    action: PatchStatus, pod: AdmittedPod | None, store_problem: str | None
) -> PatchStatus:
    """The status patch, completed with what the earlier actions found out.

    The pure decision cannot know the UID the apiserver gives the pod it
    creates, nor whether the results ConfigMap can be written.
    """
    update: dict[str, Any] = {}
    if pod is not None and action.status.pod_attempt is not None:
        update["pod_uid"] = pod.uid
        update["pod_fingerprint"] = pod.fingerprint or None
    if store_problem is not None:
        update["results_config_map"] = None
        update["message"] = (
            f"{action.status.message}; the complete results were not stored ({store_problem}): "
            "status.results holds them" + (", reduced" if action.status.results_reduced else "")
        )
    if not update:
        return action
    return replace(action, status=action.status.model_copy(update=update))
