"""The shards of a job with spec.parallelism above 1: a pure decision.

Why a module of its own: a sharded job runs in two stages, and only the first
is new. First its N shard pods (`podspec.build_pod` with a shard index), each
evaluating every N-th document of every task and keeping its per-sample
outputs and response cache on the job's claim; then, once every shard has
succeeded, one merge pod under the job's own pod name, which computes the
job's results from the shards' outputs with lm_eval's own aggregation code.
The merge pod is the job's pod in every other module (`decide` runs it,
reads its log and results, gates it), so this module decides the first stage
only:

* each shard's pod is made (deterministic name, the poller's proof for that
  shard and attempt), judged like the job's pod (`ownership.judge_shard`: a
  pod the poller did not make ends the job, untouched), and recorded in
  ``status.shards`` once seen;
* a shard that succeeded is recorded with its termination message (what its
  response cache answered) and its pod deleted, so the cycle never reads it
  again (the cycle's cost follows the pods that exist);
* a shard that failed, was evicted or vanished is retried, up to
  `MAX_SHARD_FAILURES` failed attempts, then the job fails naming the shard
  and its last words; a shard the driver refused (exit code
  `EXIT_SHARD_REFUSED`: too few documents, sampled generation) and a pod
  still pending after pod-pending-timeout fail the job at once (a retry
  would be refused again, or wait for the same image or node);
* the job is Scheduled, then Running while any shard runs, with
  ``status.shardsDone`` (``3/8``) and a progress line saying how many are done.

A suspend, a cancel, Kueue taking its admission back, or any end of the job
deletes the shards' pods (`stop_shards`, applied by `decide` to every
decision); a suspend or Kueue's stop sets the unfinished shards back to
Pending without counting a failure, so resuming starts them again and their
response caches make them continue where they stopped. Does no I/O.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from pydantic import ValidationError

from driver import protocol
from poller import api
from poller.api.settings import Settings
from poller.decisions import kueueadmission
from poller.decisions.actions import Action, CreatePod, Decision, DeletePod, PatchStatus
from poller.decisions.draft import StatusDraft
from poller.decisions.observed import Observed
from poller.decisions.ownership import (
    PodTrust,
    altered_pod_message,
    foreign_pod_message,
    judge_shard,
)
from poller.decisions.scheduling import (
    decide_failure,
    mark_started,
    record_spec,
    validation_message,
)
from poller.decisions.views import JobView, PodView, pending_cause
from poller.jobpod import podspec
from poller.timefmt import seconds_between

__all__ = [
    "MAX_SHARD_FAILURES",
    "in_shard_stage",
    "needs_pods",
    "records",
    "run_shards",
    "stop_shards",
]

# A shard that failed this many times fails the job (retried 3 times).
MAX_SHARD_FAILURES = 4

C = api.ConditionType
S = api.JobState
R = api.JobReason
H = api.ShardState


def in_shard_stage(job: JobView) -> bool:
    """Whether the job runs shards now: sharded, and not every shard succeeded."""
    count = job.shard_count
    if count == 1:
        return False
    done = [s for s in job.status.shards or [] if s.state == H.SUCCEEDED]
    return len(done) < count


def records(job: JobView) -> list[api.ShardStatus]:
    """The job's shard records in index order, a Pending one for each shard not seen yet."""
    known = {s.index: s for s in job.status.shards or [] if s.index < job.shard_count}
    return [
        known.get(k) or api.ShardStatus(index=k, state=H.PENDING) for k in range(job.shard_count)
    ]


def needs_pods(observed: Observed) -> bool:
    """Whether `run_shards` would make a pod now (then it needs the namespace's UID
    range and Kueue's flavors read first)."""
    shards = observed.shards or (None,) * observed.job.shard_count
    return any(
        pod is None and record.state in (H.PENDING, H.FAILED)
        for record, pod in zip(records(observed.job), shards, strict=False)
    )


def _with(record: api.ShardStatus, **changes: object) -> api.ShardStatus:
    return record.model_copy(update=changes)


def _message(text: str) -> str:
    text = " ".join(text.split())
    if len(text) <= api.SHARD_MESSAGE_MAX:
        return text
    return text[: api.SHARD_MESSAGE_MAX - 3] + "..."


def _ended(pod: PodView) -> tuple[bool, str] | None:
    """(succeeded, what it said) once the shard's pod is over; None while it may run."""
    main = pod.main
    if pod.phase == "Failed" and pod.reason == "Evicted":
        return False, f"pod {pod.name} was evicted: {pod.message or 'no message'}"
    if main.state == "terminated":
        said = main.message.strip()
        if main.exit_code == 0:
            return True, said
        detail = said or main.reason or "no message"
        return False, f"pod {pod.name} exited with code {main.exit_code}: {detail}"
    if pod.phase in ("Failed", "Succeeded"):
        detail = ": ".join(part for part in (pod.reason, pod.message) if part)
        return False, f"pod {pod.name} ended ({pod.phase}) before the shard ran: {detail}"
    return None


class _Stage:
    """One cycle's work on the shards: records updated, pods to make and delete."""

    def __init__(self, observed: Observed, settings: Settings, now: dt.datetime) -> None:
        self.observed = observed
        self.settings = settings
        self.now = now
        self.job = observed.job
        self.records = records(self.job)
        self.creates: list[int] = []
        self.deletes: list[str] = []
        self.draft = StatusDraft(self.job, now)
        # Whether a shard ended the job (the first reason found is the one said).
        self.failed = False

    def fail(self, message: str, cause: str) -> None:
        """End the job Failed with `message` (condition reason `cause`)."""
        if not self.failed:
            self.failed = True
            self.draft.finish(R.FAILED, message, cause)

    def shard(self, index: int, pod: PodView | None) -> None:
        record = self.records[index]
        if pod is not None:
            trust, why = judge_shard(self.job, index, pod)
            if trust is PodTrust.FOREIGN:
                self.fail(foreign_pod_message(pod, why), "ForeignPod")
                return
            if trust is PodTrust.ALTERED:
                self.deletes.append(pod.name)
                self.fail(altered_pod_message(pod, why), "AlteredPod")
                return
            made = pod.proof_attempt or 0
            if made > record.attempt:
                # Made, then the poller stopped before its status said so: adopted.
                record = _with(record, attempt=made, state=H.SCHEDULED, pod_uid=None)
            if record.pod_uid is None:
                record = _with(record, pod_uid=pod.uid)
        if pod is None:
            if record.state != H.SUCCEEDED:
                record = self._without_pod(index, record)
        elif record.state in (H.SUCCEEDED, H.FAILED, H.PENDING):
            # Its outcome is recorded (or it was stopped): the pod only goes.
            if not pod.deleting:
                self.deletes.append(pod.name)
        elif not pod.deleting:
            record = self._with_pod(index, record, pod)
        self.records[index] = record

    def _without_pod(self, index: int, record: api.ShardStatus) -> api.ShardStatus:
        if record.state in (H.SCHEDULED, H.RUNNING):
            name = podspec.shard_pod_name(self.job.name, self.job.uid, index)
            return self._failed(index, record, f"pod {name} vanished before the shard finished")
        # Pending (never made, or stopped) or Failed with attempts left: a pod now.
        self.creates.append(index)
        return _with(record, state=H.SCHEDULED, attempt=record.attempt + 1, pod_uid=None)

    def _with_pod(self, index: int, record: api.ShardStatus, pod: PodView) -> api.ShardStatus:
        ended = _ended(pod)
        if ended is None:
            if pod.main.state == "running":
                return _with(record, state=H.RUNNING)
            waited = seconds_between(pod.created, self.now)
            if waited > self.settings.pod_pending_timeout:
                timeout = int(self.settings.pod_pending_timeout)
                cause = pending_cause(pod)
                self.fail(
                    f"shard {index}: pod {pod.name} did not start within {timeout} s: {cause}",
                    "PodPendingTimeout",
                )
            return _with(record, state=H.SCHEDULED)
        succeeded, said = ended
        self.deletes.append(pod.name)
        if succeeded:
            return _with(record, state=H.SUCCEEDED, message=_message(said) or None)
        if pod.main.exit_code == protocol.EXIT_SHARD_REFUSED:
            # Refused before any request (too few documents, do_sample, ...): the
            # same spec would be refused again, so no retry.
            self.fail(f"shard {index} of {self.job.shard_count}: {said}", "ShardRefused")
            return _with(record, state=H.FAILED, message=_message(said))
        return self._failed(index, record, said)

    def _failed(self, index: int, record: api.ShardStatus, said: str) -> api.ShardStatus:
        failures = record.failures + 1
        record = _with(record, state=H.FAILED, failures=failures, message=_message(said))
        if failures >= MAX_SHARD_FAILURES:
            self.fail(
                f"shard {index} of {self.job.shard_count} failed {failures} times; its last "
                f"attempt: {said}",
                "ShardFailed",
            )
        return record


def run_shards(observed: Observed, settings: Settings, now: dt.datetime) -> Decision:
    """The shard stage's actions for one cycle (`in_shard_stage` is true)."""
    job = observed.job
    count = job.shard_count
    shards = observed.shards or (None,) * count
    stage = _Stage(observed, settings, now)
    for index in range(count):
        stage.shard(index, shards[index] if index < len(shards) else None)
    draft = stage.draft
    draft.fields["shards"] = [r.model_dump(exclude_none=True) for r in stage.records]
    done = sum(1 for r in stage.records if r.state == H.SUCCEEDED)
    draft.fields["shards_done"] = f"{done}/{count}"
    deletes: list[Action] = [DeletePod(name) for name in stage.deletes]
    if stage.failed:
        return Decision(draft.actions(before=deletes))
    spec: api.LMEvalJobSpec | None = None
    creates: list[Action] = []
    if stage.creates:
        try:
            spec = api.LMEvalJobSpec.model_validate(job.spec)
        except ValidationError as error:
            return decide_failure(job, now, validation_message(error))
        try:
            creates = _creates(observed, settings, spec, stage)
        except podspec.JobPodError as error:
            return decide_failure(job, now, str(error))
    _stage_status(observed, spec, stage, done)
    return Decision([*deletes, *creates, *draft.actions()])


def _creates(
    observed: Observed, settings: Settings, spec: api.LMEvalJobSpec, stage: _Stage
) -> list[Action]:
    """The shard pods to make, placed where Kueue admitted the job (raises
    JobPodError when the spec cannot become a pod)."""
    job, kueue = observed.job, observed.kueue
    actions: list[Action] = []
    claim = podspec.managed_claim(job.name, job.namespace, job.uid, spec)
    for index in stage.creates:
        manifest = podspec.build_pod(
            name=job.name,
            namespace=job.namespace,
            uid=job.uid,
            spec=spec,
            settings=settings,
            run_as_user=observed.run_as_user,
            shard=index,
        )
        if kueue is not None and kueue.workload is not None:
            manifest = kueueadmission.place(manifest, kueue.flavors or ())
        attempt = stage.records[index].attempt
        actions.append(CreatePod(manifest, attempt, claim, shard=index))
    return actions


def _stage_status(
    observed: Observed, spec: api.LMEvalJobSpec | None, stage: _Stage, done: int
) -> None:
    """Scheduled when the first pods are made (or made again after a suspend),
    Running while a shard runs; progress is the share of shards done."""
    job, kueue, draft = observed.job, observed.kueue, stage.draft
    count = job.shard_count
    running = sum(1 for r in stage.records if r.state == H.RUNNING)
    if job.status.state in (None, S.NEW, S.SUSPENDED):
        workload = kueue.workload if kueue is not None else None
        admitted_by = None
        if workload is not None:
            admitted_by = f"admitted by Kueue (ClusterQueue {workload.cluster_queue})"
        mark_started(draft, f"{count} shard pods created", "ShardsCreated", spec, admitted_by)
        record_spec(job, draft)
    if running:
        message = f"{running} of {count} shards running, {done} done"
        if draft.fields.get("state") != S.RUNNING.value:
            draft.state(S.RUNNING, R.NO_REASON, message)
        else:
            draft.fields["message"] = message
        draft.condition(C.RUNNING, True, "ShardsRunning", "the shards' evaluations run")
    elif done == count:
        draft.fields["message"] = f"all {count} shards succeeded: merging their results"
    percent = 100.0 * done / count
    current = draft.fields.get("progress") or {}
    if current.get("percent") != percent:
        draft.fields["progress"] = {
            "percent": percent,
            "phase": "shards",
            "line": f"{done}/{count} shards done",
            "update_time": draft.now,
        }


def stop_shards(observed: Observed, decision: Decision) -> Decision:
    """`decision` with the shard pods deleted when it leaves the job stopped
    (Complete or Suspended), and, when Suspended, the unfinished shards set back
    to Pending (a stop is not a failure: resuming starts them again).

    Pods that are not the job's (`judge_shard`: FOREIGN) are never touched.
    """
    job = observed.job
    if job.shard_count == 1:
        return decision
    patches = [a for a in decision.actions if isinstance(a, PatchStatus)]
    status = patches[-1].status if patches else job.status
    if status.state not in (S.COMPLETE, S.SUSPENDED):
        return decision
    deletes: list[Action] = []
    for index, pod in enumerate(observed.shards):
        if pod is None or pod.deleting:
            continue
        if judge_shard(job, index, pod)[0] is PodTrust.FOREIGN:
            continue
        if not any(isinstance(a, DeletePod) and a.name == pod.name for a in decision.actions):
            deletes.append(DeletePod(pod.name))
    actions = [*deletes, *decision.actions]
    if status.state == S.SUSPENDED and status.shards:
        stopped = [
            _with(r, state=H.PENDING, pod_uid=None) if r.state in (H.SCHEDULED, H.RUNNING) else r
            for r in status.shards
        ]
        if stopped != list(status.shards):
            new = status.model_copy(update={"shards": stopped})
            if patches:
                actions = [replace(a, status=new) if a is patches[-1] else a for a in actions]
            else:
                actions.append(PatchStatus(new, job.resource_version))
    return Decision(actions)
