"""Which branch of `decide` a job and its pod are in: the routing alone. Pure.

Why this module exists: `poller.decisions.decide` answers two questions of one
observation, what to read before deciding (`what_to_observe`) and what to do
(`decide`), and both must take the same branch: otherwise a log is read for a
branch not taken, or a pod the poller did not make is read at all. `route`
is that one answer, kept apart from what each branch does: it looks at the
job, its pod (judged by `poller.decisions.ownership`), its place in the queue, Kueue's
gate (`poller.decisions.kueueadmission`) and the deadline, and names a `Step`; it builds no
status and no action. Like `decide` it does no I/O, imports nothing from
`kubernetes` and takes its clock as an argument.
"""

from __future__ import annotations

import datetime as dt
from enum import Enum

from poller import api
from poller.decisions import kueueadmission, shards
from poller.decisions.kueueadmission import Gate
from poller.decisions.observed import Observed
from poller.decisions.ownership import PodTrust, judge_pod
from poller.decisions.views import JobView, PodView
from poller.timefmt import seconds_between

__all__ = ["Step", "deadline_exceeded", "route", "spec_changed", "submitted_for"]

S = api.JobState


class Step(Enum):
    """Which branch of `decide` a job and its pod are in: the routing alone.

    Shared by `decide` and `what_to_observe`, so that what is read before
    deciding is exactly what the branch taken will use (and a pod the poller
    did not make is never read).
    """

    NOTHING = "nothing"  # the job is being deleted, or its old pod still goes away
    RETENTION = "retention"  # finished: only its TTL
    UNREADABLE = "unreadable"
    FOREIGN_POD = "foreign-pod"
    ALTERED_POD = "altered-pod"  # ours, changed after admission: fail, delete, read nothing
    SPEC_CHANGED = "spec-changed"  # started, then its spec was edited: fail, stop the pod
    ADOPT_POD = "adopt-pod"
    CANCEL = "cancel"
    SUSPEND = "suspend"
    SCHEDULE = "schedule"  # make a pod
    OVERDUE = "overdue"  # activeDeadlineSeconds passed
    QUEUED = "queued"
    POD_VANISHED = "pod-vanished"
    EVICTED = "evicted"
    FINISHED = "finished"  # the main container terminated
    ENDED_EARLY = "ended-early"  # the pod ended before the main container ran
    POD_DELETING = "pod-deleting"
    STARTING = "starting"  # pending, or the container waits
    RUNNING = "running"
    SHARDS = "shards"  # spec.parallelism above 1: make, watch and retry the shard pods
    # Under Kueue (`poller.decisions.kueueadmission`); an admitted job without a pod is SCHEDULE.
    KUEUE_SUBMIT = "kueue-submit"  # create the workload
    KUEUE_RESUBMIT = "kueue-resubmit"  # the job changed while waiting: a new workload
    KUEUE_WAIT = "kueue-wait"  # the workload waits for admission
    KUEUE_RELEASE = "kueue-release"  # evicted, pod gone: give the quota back
    KUEUE_STOP = "kueue-stop"  # the pod runs without an admission: delete it


_GATED_STEPS = {
    Gate.SUBMIT: Step.KUEUE_SUBMIT,
    Gate.RESUBMIT: Step.KUEUE_RESUBMIT,
    Gate.WAIT: Step.KUEUE_WAIT,
    Gate.RELEASE: Step.KUEUE_RELEASE,
    Gate.STOP: Step.KUEUE_STOP,
    Gate.START: Step.SCHEDULE,
}


def route(observed: Observed, now: dt.datetime) -> Step:
    """The branch of `decide` for this observation (its `kueue`: the job is under Kueue). Pure."""
    job, pod, queue, kueue = observed.job, observed.pod, observed.queue, observed.kueue
    if job.deleting:
        return Step.NOTHING
    state = job.status.state
    if state == S.COMPLETE:
        return Step.RETENTION
    if job.problem is not None:
        return Step.UNREADABLE
    if pod is not None:
        trust = judge_pod(job, pod)[0]
        if trust is PodTrust.FOREIGN:
            return Step.FOREIGN_POD
        if trust is PodTrust.ALTERED:
            return Step.ALTERED_POD
        if trust is PodTrust.ADOPT:
            return Step.ADOPT_POD
    if spec_changed(job):
        return Step.SPEC_CHANGED
    if job.cancel_requested:
        return Step.CANCEL
    if job.suspend_requested:
        return Step.SUSPEND
    sharding = shards.in_shard_stage(job)
    start = Step.SHARDS if sharding else Step.SCHEDULE
    pods = [p for p in (pod, *observed.shards) if p is not None]
    if kueue is not None:
        # A sharded job's pods stand together: one that runs is the one Kueue judges.
        live = next(
            (p for p in pods if not kueueadmission.pod_is_over(p.phase, p.main.state)),
            pods[0] if pods else None,
        )
        verdict = kueueadmission.gate(
            state=state,
            pod_exists=live is not None,
            pod_deleting=bool(pods) and all(p.deleting for p in pods),
            pod_phase=live.phase if live is not None else "",
            main_state=live.main.state if live is not None else "",
            workload=kueue.workload,
            wanted=submitted_for(job),
        )
        if verdict is Gate.START:
            return start
        if verdict in _GATED_STEPS:
            return _GATED_STEPS[verdict]
    if state == S.SUSPENDED:
        # The old pods still going away: resume after.
        return Step.NOTHING if pods else start
    if deadline_exceeded(job, now) is not None:
        return Step.OVERDUE
    if sharding:
        return Step.QUEUED if state in (None, S.NEW) and queue is not None else Step.SHARDS
    if pod is None:
        if state in (None, S.NEW):
            return Step.QUEUED if queue is not None else Step.SCHEDULE
        if job.shard_count > 1 and job.status.pod_attempt is None:
            return Step.SCHEDULE  # every shard succeeded: the merge pod
        return Step.POD_VANISHED
    return _pod_step(pod)


def spec_changed(job: JobView) -> bool:
    """Whether a started job's spec differs from the one its first pod was made for
    in more than its control switches (`views.spec_digest`)."""
    recorded = job.status.spec_digest
    return (
        job.status.state in (S.SCHEDULED, S.RUNNING, S.SUSPENDED)
        and bool(recorded)
        and bool(job.digest)
        and job.digest != recorded
    )


def _pod_step(pod: PodView) -> Step:
    if pod.phase == "Failed" and pod.reason == "Evicted":
        return Step.EVICTED
    if pod.main.state == "terminated":
        return Step.FINISHED
    if pod.phase in ("Failed", "Succeeded"):
        return Step.ENDED_EARLY
    if pod.deleting:
        return Step.POD_DELETING
    if pod.main.state != "running":
        return Step.STARTING
    return Step.RUNNING


def deadline_exceeded(job: JobView, now: dt.datetime) -> str | None:
    """Why the job is over its activeDeadlineSeconds (suspended time not counted), or None."""
    limit = job.active_deadline_seconds
    if limit is None or job.status.start_time is None:
        return None
    active = seconds_between(job.status.start_time, now) - (job.status.suspended_seconds or 0)
    if active <= limit:
        return None
    return (
        f"DeadlineExceeded: the job was active for {int(active)} s, longer than "
        f"activeDeadlineSeconds={limit}"
    )


def submitted_for(job: JobView) -> str:
    """What a workload made now for `job` is for: one submitted for anything else is stale."""
    return kueueadmission.submitted_for(job.generation, job.queue_name, job.priority_class)
