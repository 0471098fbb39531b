"""How a job gets its pod: made from its spec, adopted, or queued for a slot. Pure.

Why this module exists: starting a job is the one step of `poller.decisions.decide` that
turns the spec into a pod and writes the Scheduled status; it is kept apart
from what `decide` does with a job once started (runs, stops, suspends,
finishes, waits for Kueue). Here: the spec validated and the pod's manifest
built (`job_pod`, also the pod template of a Kueue workload), where an invalid
spec or a pod `poller.jobpod.podspec` refuses ends the job Failed (`decide_failure`);
the pod placed where Kueue admitted it and the Scheduled status written, a
resumed job's pause counted (`schedule`); a pod the poller made but had not
recorded, recorded (`adopt`); and a waiting job's place in the
max-running-jobs queue, in words that change only near its head
(`queue_message`, `queued`). When a job starts is `poller.decisions.routing`'s to say.
Like `decide`, it does no I/O, imports nothing from `kubernetes` and takes
its clock as an argument.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import ValidationError

from poller import api
from poller.api.settings import Settings
from poller.decisions import kueueadmission
from poller.decisions.actions import CreatePod, Decision
from poller.decisions.draft import StatusDraft
from poller.decisions.observed import Observed
from poller.decisions.views import JobView, PodView, QueueSlot
from poller.jobpod import podspec
from poller.timefmt import seconds_between

__all__ = [
    "EXACT_QUEUE_POSITIONS",
    "adopt",
    "decide_failure",
    "job_pod",
    "mark_started",
    "queue_message",
    "queued",
    "record_spec",
    "schedule",
    "validation_message",
]

# Queued jobs whose status names their exact place (see queue_message).
EXACT_QUEUE_POSITIONS = 10

C = api.ConditionType
S = api.JobState
R = api.JobReason


def decide_failure(
    job: JobView, now: dt.datetime, message: str, cause: str | None = None
) -> Decision:
    """End `job` Failed with `message` (e.g. its pod was refused). Pure."""
    draft = StatusDraft(job, now)
    draft.finish(R.FAILED, message, cause)
    return Decision(draft.actions())


def validation_message(error: ValidationError) -> str:
    """A refused spec's first problem, naming its field."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"invalid spec: spec.{where}: {first['msg']} ({error.error_count()} problem(s))"


def job_pod(
    job: JobView,
    settings: Settings,
    now: dt.datetime,
    run_as_user: int | None,
    shard: int | None = None,
) -> tuple[api.LMEvalJobSpec, dict[str, Any]] | Decision:
    """The job's spec and pod manifest (a sharded job's: its merge pod, or shard
    `shard`'s); or the decision that fails a job that has none."""
    try:
        spec = api.LMEvalJobSpec.model_validate(job.spec)
    except ValidationError as error:
        return decide_failure(job, now, validation_message(error))
    try:
        manifest = podspec.build_pod(
            name=job.name,
            namespace=job.namespace,
            uid=job.uid,
            spec=spec,
            settings=settings,
            run_as_user=run_as_user,
            shard=shard,
        )
    except podspec.JobPodError as error:
        return decide_failure(job, now, str(error))
    return spec, manifest


def schedule(observed: Observed, settings: Settings, now: dt.datetime) -> Decision:
    """A pod for the job now (in the namespace's OpenShift UID range, placed
    where Kueue admitted it), with the status and the claim that go with it."""
    job, kueue = observed.job, observed.kueue
    made = job_pod(job, settings, now, observed.run_as_user)
    if isinstance(made, Decision):
        return made
    spec, manifest = made
    admitted_by = None
    if kueue is not None and kueue.workload is not None:
        manifest = kueueadmission.place(manifest, kueue.flavors or ())
        admitted_by = f"admitted by Kueue (ClusterQueue {kueue.workload.cluster_queue})"
    attempt = (job.status.pod_attempt or 0) + 1
    draft = _scheduled_draft(job, now, manifest["metadata"]["name"], spec, admitted_by)
    # The pod's UID is added by the actuator from the create response.
    draft.fields.update(pod_attempt=attempt, pod_uid=None, pod_fingerprint=None)
    record_spec(job, draft)
    claim = podspec.managed_claim(job.name, job.namespace, job.uid, spec)
    return Decision([CreatePod(manifest, attempt, claim), *draft.actions()])


def _scheduled_draft(
    job: JobView,
    now: dt.datetime,
    name: str,
    spec: api.LMEvalJobSpec | None,
    admitted_by: str | None = None,
) -> StatusDraft:
    """The status of a job whose pod `name` was just created (or adopted);
    `admitted_by` says so when Kueue admitted it."""
    draft = StatusDraft(job, now)
    mark_started(draft, f"pod {name} created", "PodCreated", spec, admitted_by)
    draft.fields["pod_name"] = name
    return draft


def mark_started(
    draft: StatusDraft,
    created: str,
    reason: str,
    spec: api.LMEvalJobSpec | None,
    admitted_by: str | None = None,
) -> None:
    """`draft` Scheduled, its pods just made (`created` says which: the job's pod,
    or a sharded job's shards, condition Scheduled's `reason`): a resumed job's
    pause counted, its start and outputs recorded."""
    job = draft.job
    resumed = job.status.state == S.SUSPENDED
    if resumed:
        paused = seconds_between(job.status.suspend_time, draft.moment)
        draft.fields["suspended_seconds"] = int((job.status.suspended_seconds or 0) + paused)
        draft.fields.pop("suspend_time", None)
        if admitted_by is not None:
            draft.condition(C.SUSPENDED, False, "Admitted", admitted_by)
        else:
            draft.condition(C.SUSPENDED, False, "Resumed", "spec.suspend is false")
        draft.condition(C.RUNNING, False, "Resumed", "a fresh pod was created")
    draft.state(S.SCHEDULED, R.NO_REASON, created, event="Resumed" if resumed else None)
    draft.fields["last_schedule_time"] = draft.now
    draft.fields.setdefault("start_time", draft.now)
    if spec is not None and (outputs := podspec.outputs_location(spec, job.name, job.uid)):
        draft.fields["outputs"] = outputs
    draft.condition(C.SCHEDULED, True, reason, created)


def adopt(job: JobView, pod: PodView, now: dt.datetime) -> Decision:
    """Record a pod the poller made but had not recorded (it crashed, or lost a race)."""
    if job.status.state in (None, S.NEW, S.SUSPENDED):
        try:
            spec: api.LMEvalJobSpec | None = api.LMEvalJobSpec.model_validate(job.spec)
        except ValidationError:
            spec = None  # only the outputs location is lost; the pod decides the rest
        draft = _scheduled_draft(job, now, pod.name, spec)
    else:
        draft = StatusDraft(job, now)
    draft.fields.update(
        pod_name=pod.name,
        pod_uid=pod.uid,
        pod_attempt=pod.proof_attempt,
        pod_fingerprint=pod.fingerprint or None,
    )
    record_spec(job, draft)
    return Decision(draft.actions())


def record_spec(job: JobView, draft: StatusDraft) -> None:
    """Record what the job evaluates when its first pod is made (or adopted): from
    then on its spec is frozen but for its control switches (`views.spec_digest`)."""
    if job.status.spec_digest is None and job.digest:
        draft.fields["spec_digest"] = job.digest


def queue_message(slot: QueueSlot) -> str:
    """What a waiting job's status says of its place; it changes only near the head.

    Every change is a status write, and each time the queue moves every job
    behind the head moves too: exact places for all of a long queue would
    rewrite every waiting job each time one starts. So only the first
    `EXACT_QUEUE_POSITIONS` places are exact, and the total is left out.
    """
    if slot.position <= EXACT_QUEUE_POSITIONS:
        place = f"position {slot.position}"
    else:
        place = f"more than {EXACT_QUEUE_POSITIONS} jobs ahead"
    return f"waiting for a free slot: {place} (max-running-jobs: {slot.limit})"


def queued(job: JobView, slot: QueueSlot, now: dt.datetime) -> Decision:
    draft = StatusDraft(job, now)
    message = queue_message(slot)
    if job.status.state is None:
        draft.state(S.NEW, R.NO_REASON, message, event="Queued")
    else:
        draft.fields["message"] = message
    draft.condition(C.SCHEDULED, False, "Queued", message)
    return Decision(draft.actions())
