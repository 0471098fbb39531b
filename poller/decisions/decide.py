"""Decide what to do for one LMEvalJob: a pure function.

``decide(observed, settings, now)`` looks at what was observed of the job
(`poller.decisions.observed.Observed`: the job, its pod or None, its queue slot,
Kueue's and the gate's views and, when ``what_to_observe`` asked for them,
the decoded log tail, the exec'd results and the namespace's UID), the
settings and the injected clock, and returns the actions that move the job
one step along

    New -> Scheduled -> Running -> Complete (Succeeded | Failed | Cancelled)
                 \\-> Suspended -> (resume) -> Scheduled ...

It is level-triggered and idempotent: given the same observation it returns
the same actions, and once the status reflects the observation it returns no
status patch at all, so an idle cycle writes nothing. It never re-creates a
pod behind the user's back: a vanished or evicted pod ends the job Failed;
only an explicit resume starts a fresh pod. Whenever it deletes a pod that
ran, it first asks for the log tail to be archived. A pod under the job's
pod name is first judged (`poller.decisions.ownership`): one the poller did not make
ends the job and is never touched. Which branch an observation takes is
`poller.decisions.routing` (shared with `what_to_observe`); how a job gets its pod
(made from its spec, adopted, or queued for a slot) is `poller.decisions.scheduling`;
reading a finished evaluation's outcome is `poller.decisions.outcome`. What stays here
is what each branch does once routed: the dispatch, the running job, its
stops (cancel, suspend, deadline, eviction, a pod that never starts), the
retention of a finished job, and Kueue's waits and finished workloads. It
does no I/O and imports nothing from `kubernetes`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from poller import api
from poller.api.settings import Settings
from poller.decisions import kueueadmission, outcome, regression, shards
from poller.decisions.actions import (
    Action,
    ArchiveLog,
    CreateWorkload,
    Decision,
    DeleteJob,
    DeletePod,
    DeleteWorkload,
    LogRequest,
    Needs,
    PatchStatus,
    PatchWorkloadStatus,
    ReleaseHold,
    StoreResults,
)
from poller.decisions.draft import StatusDraft
from poller.decisions.kueueadmission import KueueView
from poller.decisions.observed import Observed
from poller.decisions.ownership import altered_pod_message, foreign_pod_message, judge_pod
from poller.decisions.routing import Step, deadline_exceeded, route, submitted_for
from poller.decisions.scheduling import adopt, decide_failure, job_pod, queued, schedule
from poller.decisions.views import JobView, PodView, pending_cause, waiting_init
from poller.jobpod import gittasks, podspec
from poller.timefmt import seconds_between

__all__ = [
    "PROGRESS_TAIL_LINES",
    "decide",
    "what_to_observe",
]

# Progress markers are rate-limited by the driver; the newest is near the end.
PROGRESS_TAIL_LINES = 60
# Waiting reasons that only resolve when someone acts; they still fail only
# after pod-pending-timeout, but their words are what the message quotes.
_WAITING_CAUSES = (
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
)

C = api.ConditionType
S = api.JobState
R = api.JobReason


def _remove_pod(pod: PodView | None, settings: Settings) -> list[Action]:
    """Archive the log of a pod that ran, then delete it."""
    if pod is None or pod.deleting:
        return []
    actions: list[Action] = []
    if settings.log_archive_bytes and pod.main.state in ("running", "terminated"):
        actions.append(ArchiveLog(pod.name, podspec.MAIN_CONTAINER, settings.log_archive_bytes))
    actions.append(DeletePod(pod.name))
    return actions


def _stop(
    job: JobView,
    pod: PodView | None,
    settings: Settings,
    now: dt.datetime,
    reason: api.JobReason,
    message: str,
    cause: str | None = None,
) -> Decision:
    draft = StatusDraft(job, now)
    draft.finish(reason, message, cause)
    # Results and the archived log are stored before the pod may go.
    return Decision(draft.actions(before=_remove_pod(pod, settings)))


def _suspend(observed: Observed, settings: Settings, now: dt.datetime) -> Decision:
    # A job under Kueue gives its workload up (and its quota); resuming queues a new one.
    job, pod, kueue = observed.job, observed.pod, observed.kueue
    workload = kueue.workload if kueue is not None else None
    give_up: list[Action] = []
    if workload is not None and not workload.deleting:
        give_up = [DeleteWorkload(workload.name)]
    if kueue is None and job.status.state == S.SUSPENDED and (pod is None or pod.deleting):
        return Decision()
    draft = StatusDraft(job, now)
    draft.state(S.SUSPENDED, R.NO_REASON, "suspended: spec.suspend is true")
    draft.fields.setdefault("suspend_time", draft.now)
    draft.condition(C.SUSPENDED, True, "Suspended", "spec.suspend is true")
    if any(c.type == C.RUNNING.value for c in draft.conditions):
        draft.condition(C.RUNNING, False, "Suspended", "the pod was deleted")
    return Decision(draft.actions(before=[*_remove_pod(pod, settings), *give_up]))


def _finish_workload(
    status: api.LMEvalJobStatus, kueue: KueueView | None, now: dt.datetime
) -> list[PatchWorkloadStatus]:
    """A finished job's workload is marked Finished, which frees its quota in Kueue."""
    workload = kueue.workload if kueue is not None else None
    if workload is None or workload.finished or workload.deleting:
        return []
    if status.state != S.COMPLETE:
        return []
    succeeded = status.reason == R.SUCCEEDED
    message = status.message or (status.reason or R.NO_REASON).value
    patch = kueueadmission.finished_status(workload, succeeded, message, now)
    return [PatchWorkloadStatus(workload.name, patch, workload.resource_version)]


def _retention(observed: Observed, settings: Settings, now: dt.datetime) -> Decision:
    job, gate = observed.job, observed.gate
    finish = _finish_workload(job.status, observed.kueue, now)
    kept = _kept(job, settings, now)
    if kept.actions or gate is None:
        return Decision([*finish, *kept.actions])
    # A finished gated job: its regression gate (`poller.decisions.regression`).
    gated: list[Action] = []
    if (found := regression.decide_gate(job, gate)) is not None:
        draft = StatusDraft(job, now)
        regression.apply_gate(draft, found)
        gated = draft.actions()
    return Decision([*finish, *gated])


def _kept(job: JobView, settings: Settings, now: dt.datetime) -> Decision:
    ttl = job.ttl_seconds_after_finished
    if ttl is None:
        ttl = settings.default_ttl_seconds_after_finished
    if ttl is None or job.status.complete_time is None:
        return Decision()
    if seconds_between(job.status.complete_time, now) < ttl:
        return Decision()
    return Decision([DeleteJob()])


def _pending(job: JobView, pod: PodView, settings: Settings, now: dt.datetime) -> Decision | None:
    """Fail a pod that has waited too long; None while it may still start."""
    waited = seconds_between(pod.created, now)
    if waited <= settings.pod_pending_timeout:
        return None
    cause = pending_cause(pod)
    message = f"pod {pod.name} did not start within {int(settings.pod_pending_timeout)} s: {cause}"
    reason = "PodPendingTimeout"
    if pod.unschedulable_message:
        reason = "Unschedulable"
    elif (waiting := waiting_init(pod)) is not None and waiting[1].reason in _WAITING_CAUSES:
        reason = waiting[1].reason
    elif pod.main.reason in _WAITING_CAUSES:
        reason = pod.main.reason
    return _stop(job, pod, settings, now, R.FAILED, message, cause=reason)


def what_to_observe(
    observed: Observed, settings: Settings, now: dt.datetime, *, progress_due: bool = False
) -> Needs:
    """What `decide` will need beyond what was listed, read before it runs. Pure.

    `observed` holds the listed parts only: the job, its pod, its queue slot,
    Kueue's and the gate's views (the parts read after, by what this
    returns, are None). A pod about to be made needs the namespace's UID
    range; a terminated container, its log (from
    `outcome.first_results_window`, widened by the rule of
    `outcome.next_results_window`); a running one, when
    `progress_due` (the cycle's rate limiter), its log's last
    PROGRESS_TAIL_LINES lines, and in exec mode the results file the driver
    holds, if that log shows it holding one (`outcome.results_to_exec`); a
    finished gated job (`gate`), both jobs' per-item scores when its gate
    needs them (`poller.decisions.regression.needs_items`).
    """
    job, pod, kueue, gate = observed.job, observed.pod, observed.kueue, observed.gate
    step = route(observed, now)
    if step is Step.RETENTION and gate is not None and not _kept(job, settings, now).actions:
        return Needs(gate_items=regression.needs_items(job, gate))
    if step is Step.SCHEDULE or (step is Step.SHARDS and shards.needs_pods(observed)):
        workload = kueue.workload if kueue is not None else None
        return Needs(namespace_uid=True, flavors=workload.flavors if workload else ())
    if step is Step.KUEUE_SUBMIT and job.priority_class:
        return Needs(priority_class=job.priority_class)
    if step is Step.FINISHED and pod is not None:
        return Needs(log=outcome.first_results_window(job, pod))
    if step is Step.RUNNING and pod is not None and progress_due:
        request = LogRequest(pod.name, podspec.MAIN_CONTAINER, PROGRESS_TAIL_LINES, "progress")
        held = settings.results_source == "exec" and job.status.results is None
        return Needs(log=request, held_results=held)
    return Needs()


def decide(observed: Observed, settings: Settings, now: dt.datetime) -> Decision:
    """The actions that move `observed.job` toward what it asks and what its pod shows. Pure.

    Called once per job and cycle, on `observed` completed with what
    `what_to_observe` asked for: `log` the last window of the pod's log read,
    `exec_view` what an exec'd `cat` of the held results returned,
    `run_as_user` the namespace's OpenShift UID (for a pod made now), if any.
    `queue` is set when the job waits for a free slot (max-running-jobs);
    `kueue` when the job is under Kueue (`poller.decisions.kueueadmission`), with what
    `what_to_observe` asked of it; `gate` when it has a regression gate
    (`poller.decisions.regression`), with the per-item scores read.
    """
    decision = shards.stop_shards(observed, _decide(observed, settings, now))
    kueue = observed.kueue
    if kueue is None or any(isinstance(a, PatchWorkloadStatus) for a in decision.actions):
        return decision  # (a finished job's retention marks its workload itself)
    # A job that finishes now frees its Kueue quota in the same breath, before
    # its status says Complete: a poller stopped in between finds the job not
    # Complete and decides it again, where one stopped after the status would
    # leave the workload holding its quota (Complete jobs are not listed).
    for index, action in enumerate(decision.actions):
        if isinstance(action, PatchStatus) and action.status.state == S.COMPLETE:
            finish = _finish_workload(action.status, kueue, now)
            decision.actions[index:index] = [replace(a, best_effort=True) for a in finish]
            break
    return decision


def _decide(observed: Observed, settings: Settings, now: dt.datetime) -> Decision:
    """`decide`, before a finishing job's workload is marked Finished."""
    job, pod, queue, kueue = observed.job, observed.pod, observed.queue, observed.kueue
    step = route(observed, now)
    if step is Step.NOTHING:
        return Decision()
    if step is Step.RETENTION:
        return _retention(observed, settings, now)
    if kueue is not None and step.name.startswith("KUEUE_"):
        return _gated(step, observed, kueue, settings, now)
    if step is Step.UNREADABLE:
        message = f"the poller cannot read this LMEvalJob: {job.problem}"
        return decide_failure(job, now, message, cause="UnreadableJob")
    if step is Step.SPEC_CHANGED:
        message = (
            "spec: changed after the job started, in more than cancel, suspend, "
            "ttlSecondsAfterFinished and activeDeadlineSeconds; its results would be recorded "
            "with a spec that did not produce them, so it was stopped. Submit the changed spec "
            "as a new job (`lmeval rerun` copies a job's spec); the admission policy "
            "lmevaljob-requester-rights refuses such edits where it is installed"
        )
        return _stop(job, pod, settings, now, R.FAILED, message, cause="SpecChanged")
    if step is Step.CANCEL:
        return _stop(job, pod, settings, now, R.CANCELLED, "cancelled: spec.cancel is true")
    if step is Step.SUSPEND:
        return _suspend(observed, settings, now)
    if step is Step.SCHEDULE:
        return schedule(observed, settings, now)
    if step is Step.SHARDS:
        return shards.run_shards(observed, settings, now)
    if step is Step.OVERDUE:
        overdue = deadline_exceeded(job, now) or ""
        return _stop(job, pod, settings, now, R.FAILED, overdue, cause="DeadlineExceeded")
    if step is Step.QUEUED and queue is not None:
        return queued(job, queue, now)
    if pod is None:  # Step.POD_VANISHED
        pod_name = job.status.pod_name or "the job pod"
        return decide_failure(
            job, now, f"pod {pod_name} was deleted before the evaluation finished"
        )
    return _decide_with_pod(step, observed, pod, settings, now)


def _decide_with_pod(
    step: Step, observed: Observed, pod: PodView, settings: Settings, now: dt.datetime
) -> Decision:
    """`decide` for the steps that have a pod (`pod`: `observed.pod`, there)."""
    job = observed.job
    if step is Step.FOREIGN_POD:
        # Never read, archive or delete a pod the poller did not make.
        why = judge_pod(job, pod)[1]
        return decide_failure(job, now, foreign_pod_message(pod, why), cause="ForeignPod")
    if step is Step.ALTERED_POD:
        # Its log and results come from what replaced the job's code: unread,
        # unarchived; the pod goes (it runs with the job's Secrets).
        why = judge_pod(job, pod)[1]
        draft = StatusDraft(job, now)
        draft.finish(R.FAILED, altered_pod_message(pod, why), "AlteredPod")
        return Decision(draft.actions(before=[] if pod.deleting else [DeletePod(pod.name)]))
    if step is Step.ADOPT_POD:
        return adopt(job, pod, now)
    if step is Step.EVICTED:
        message = f"pod {pod.name} was evicted: {pod.message or 'no message'}"
        return _stop(job, pod, settings, now, R.FAILED, message, cause="Evicted")
    if step is Step.FINISHED:
        return outcome.complete(job, pod, settings, now, observed.log)
    if step is Step.ENDED_EARLY:
        # Ended without the main container ever running (e.g. the driver's
        # init container failed): nothing will change any more.
        detail = ": ".join(part for part in (pod.reason, pod.message) if part)
        message = f"pod {pod.name} ended ({pod.phase}) before the evaluation ran"
        message = f"{message}: {detail}" if detail else message
        if pod.init is not None and pod.init[1].state == "terminated":
            name, init = pod.init
            cloned = gittasks.clone_failure(job.spec, name, init.exit_code, init.message)
            message = cloned if cloned is not None else message
        return _stop(job, pod, settings, now, R.FAILED, message, cause="PodFailed")
    if step is Step.POD_DELETING:
        message = f"pod {pod.name} was deleted before the evaluation finished"
        return _stop(job, pod, settings, now, R.FAILED, message, cause="PodDeleted")
    draft = StatusDraft(job, now)
    if step is Step.STARTING:
        stuck = _pending(job, pod, settings, now)
        return stuck if stuck is not None else Decision(draft.actions())
    return _running(observed, pod, settings, now, draft)


def _running(
    observed: Observed, pod: PodView, settings: Settings, now: dt.datetime, draft: StatusDraft
) -> Decision:
    """The main container runs (`pod`: `observed.pod`): Running, its progress when the
    log was read, and in exec mode the results the driver holds and the release of its hold."""
    job, log = observed.job, observed.log
    if draft.fields.get("state") != S.RUNNING.value:
        draft.state(S.RUNNING, R.NO_REASON, "evaluation running")
    draft.condition(C.RUNNING, True, "ContainerRunning", "the evaluation container runs")
    if log is None:
        return Decision(draft.actions())
    if log.decoded.last_progress:
        draft.progress(log.decoded.last_progress)
    # A run whose reported commits are not its spec's stops here, before its
    # held results (exec mode) are stored as the job's.
    mismatch = outcome.record_task_sources(job, log, draft)
    if mismatch is not None:
        cause = outcome.TASK_SOURCE_MISMATCH
        return _stop(job, pod, settings, now, R.FAILED, mismatch, cause=cause)
    held = outcome.holding(job, pod, settings, log, observed.exec_view, draft) or []
    before: list[Action] = [a for a in held if isinstance(a, StoreResults)]
    releases = [a for a in held if isinstance(a, ReleaseHold)]
    return Decision([*draft.actions(before=before), *releases])


def _kueue_wait(
    job: JobView, workload: kueueadmission.WorkloadView | None, now: dt.datetime, message: str = ""
) -> StatusDraft:
    """The status of a job Kueue holds: Suspended, in Kueue's own words."""
    draft = StatusDraft(job, now)
    message = message or kueueadmission.waiting_message(workload, job.queue_name)
    reason = kueueadmission.waiting_reason(workload)
    draft.state(S.SUSPENDED, R.NO_REASON, message, event=reason)
    draft.fields.setdefault("suspend_time", draft.now)
    draft.condition(C.SUSPENDED, True, reason, message)
    if any(c.type == C.RUNNING.value for c in draft.conditions):
        draft.condition(C.RUNNING, False, reason, message)
    return draft


def _gated(
    step: Step, observed: Observed, kueue: KueueView, settings: Settings, now: dt.datetime
) -> Decision:
    """`decide` for the steps under Kueue's gate (`poller.decisions.kueueadmission`;
    `kueue`: `observed.kueue`, there)."""
    job, workload = observed.job, kueue.workload
    if step is Step.KUEUE_SUBMIT:
        # A sharded job's pod set is its shards (the merge pod runs after them,
        # within the same admission).
        count = job.shard_count
        made = job_pod(job, settings, now, None, shard=0 if count > 1 else None)
        if isinstance(made, Decision):
            return made
        priority = kueue.priority
        if job.priority_class and (priority is None or priority.value is None):
            message = (
                f"waiting: WorkloadPriorityClass {job.priority_class} (label "
                f"{kueueadmission.PRIORITY_LABEL}) does not exist"
            )
            return Decision(_kueue_wait(job, None, now, message).actions())
        manifest = kueueadmission.workload_manifest(
            job_name=job.name,
            job_uid=job.uid,
            namespace=job.namespace,
            queue=job.queue_name,
            pod=made[1],
            count=count,
            priority=priority,
            submitted=submitted_for(job),
        )
        return Decision([CreateWorkload(manifest), *_kueue_wait(job, None, now).actions()])
    if workload is not None and step is Step.KUEUE_RESUBMIT:
        message = (
            f"waiting for Kueue: the job changed since workload {workload.name} was "
            "submitted; submitting it again"
        )
        draft = _kueue_wait(job, None, now, message)
        return Decision([DeleteWorkload(workload.name), *draft.actions()])
    if workload is not None and step is Step.KUEUE_RELEASE:
        status = kueueadmission.requeue_status(workload, now)
        release = PatchWorkloadStatus(workload.name, status, workload.resource_version)
        return Decision([release, *_kueue_wait(job, workload, now).actions()])
    if step is Step.KUEUE_STOP:
        message = kueueadmission.stop_message(workload) + "; the job is back in Kueue's queue"
        draft = _kueue_wait(job, workload, now, message)
        draft.condition(C.RUNNING, False, kueueadmission.waiting_reason(workload), message)
        return Decision(draft.actions(before=_remove_pod(observed.pod, settings)))
    return Decision(_kueue_wait(job, workload, now).actions())
