"""Decide what to do for one LMEvalJob: a pure function.

``decide(job, pod, settings, now, log)`` looks at the job, its pod (or None),
the settings, the injected clock and, when it asked for it, the decoded log
tail, and returns the actions that move the job one step along

    New -> Scheduled -> Running -> Complete (Succeeded | Failed | Cancelled)

It is level-triggered and idempotent: given the same observation it returns
the same actions, and once the status reflects the observation it returns no
status patch at all, so an idle cycle writes nothing. It never re-creates a
pod for a job that already had one: a vanished pod ends the job Failed.
It does no I/O and imports nothing from `kubernetes`.
"""

from __future__ import annotations

import datetime as dt
import signal as signals

from pydantic import ValidationError

from driver import protocol
from poller import api, podspec, results
from poller.model import (
    Action,
    CreatePod,
    Decision,
    JobView,
    LogView,
    PatchStatus,
    PodView,
    PostEvent,
    ReadLog,
    StoreResults,
    format_time,
)
from poller.settings import Settings

__all__ = ["FIRST_TAIL_LINES", "MAX_TAIL_LINES", "decide", "decide_failure", "set_condition"]

# Results markers are ~32 KiB lines; a toy run's whole log is a few hundred
# lines. Start small and enlarge only when the decoder says the log was cut.
FIRST_TAIL_LINES = 400
MAX_TAIL_LINES = 25_600

C = api.ConditionType


def set_condition(
    conditions: list[api.Condition],
    kind: api.ConditionType,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int,
) -> list[api.Condition]:
    """Conditions with `kind` set; lastTransitionTime moves only when status flips."""
    wanted = "True" if status else "False"
    out: list[api.Condition] = []
    found = False
    for condition in conditions:
        if condition.type != kind.value:
            out.append(condition)
            continue
        found = True
        moved = condition.status != wanted
        out.append(
            api.Condition(
                type=kind.value,
                status=wanted,
                reason=reason,
                message=message,
                last_transition_time=now if moved else condition.last_transition_time,
                observed_generation=generation,
            )
        )
    if not found:
        out.append(
            api.Condition(
                type=kind.value,
                status=wanted,
                reason=reason,
                message=message,
                last_transition_time=now,
                observed_generation=generation,
            )
        )
    return out


class _Status:
    """A mutable draft of the next status, compared with the current one at the end."""

    def __init__(self, job: JobView, now: dt.datetime) -> None:
        self.job = job
        self.now = format_time(now)
        self.fields = job.status.model_dump(exclude_none=True)
        self.conditions = list(job.status.conditions or [])
        self.events: list[PostEvent] = []

    def condition(
        self, kind: api.ConditionType, status: bool, reason: str, message: str = ""
    ) -> None:
        self.conditions = set_condition(
            self.conditions, kind, status, reason, message, self.now, self.job.generation
        )

    def state(self, state: api.JobState, reason: api.JobReason, message: str) -> None:
        if self.fields.get("state") != state.value:
            kind = "Warning" if reason == api.JobReason.FAILED else "Normal"
            event_reason = reason.value if state == api.JobState.COMPLETE else state.value
            self.events.append(PostEvent(kind, event_reason, message))
        self.fields.update(state=state, reason=reason, message=message)

    def finish(self, reason: api.JobReason, message: str) -> None:
        self.state(api.JobState.COMPLETE, reason, message)
        self.fields.setdefault("complete_time", self.now)
        self.condition(C.RUNNING, False, "Finished", message)
        self.condition(C.FINISHED, True, reason.value, message)
        self.condition(C.SUCCEEDED, reason == api.JobReason.SUCCEEDED, reason.value, message)

    def actions(self) -> list[Action]:
        self.fields["conditions"] = self.conditions
        self.fields["observed_generation"] = self.job.generation
        new = api.LMEvalJobStatus.model_validate(self.fields)
        if new == self.job.status:
            return []
        return [PatchStatus(new, self.job.resource_version), *self.events]


def decide_failure(job: JobView, now: dt.datetime, message: str) -> Decision:
    """End `job` Failed with `message` (e.g. its pod was refused). Pure."""
    draft = _Status(job, now)
    draft.finish(api.JobReason.FAILED, message)
    return Decision(draft.actions())


def _validation_message(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"invalid spec: spec.{where}: {first['msg']} ({error.error_count()} problem(s))"


def _schedule(job: JobView, settings: Settings, now: dt.datetime) -> Decision:
    try:
        spec = api.LMEvalJobSpec.model_validate(job.spec)
    except ValidationError as error:
        return decide_failure(job, now, _validation_message(error))
    try:
        manifest = podspec.build_pod(
            name=job.name, namespace=job.namespace, uid=job.uid, spec=spec, settings=settings
        )
    except podspec.JobPodError as error:
        return decide_failure(job, now, str(error))
    name = manifest["metadata"]["name"]
    draft = _Status(job, now)
    draft.state(api.JobState.SCHEDULED, api.JobReason.NO_REASON, f"pod {name} created")
    draft.fields.update(pod_name=name, last_schedule_time=draft.now)
    draft.condition(C.SCHEDULED, True, "PodCreated", f"pod {name} created")
    return Decision([CreatePod(manifest), *draft.actions()])


def _signal_text(number: int) -> str:
    try:
        return f"signal {number} ({signals.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def _termination_message(pod: PodView) -> str:
    main = pod.main
    code = main.exit_code
    if main.reason == "OOMKilled":
        return f"OOMKilled: the evaluation container exceeded its memory limit (exit code {code})"
    signal_number = main.signal or (code - 128 if code is not None and code > 128 else None)
    parts = [f"exit code {code}"]
    if signal_number:
        parts.append(f"killed by {_signal_text(signal_number)}")
    if main.reason and main.reason not in ("Error", "Completed"):
        parts.append(main.reason)
    text = ", ".join(parts)
    detail = main.message.strip().splitlines()[-1] if main.message.strip() else ""
    return f"{text}: {detail}" if detail else text


def _complete(job: JobView, pod: PodView, now: dt.datetime, log: LogView | None) -> Decision:
    if log is None:
        return Decision([ReadLog(pod.name, podspec.MAIN_CONTAINER, FIRST_TAIL_LINES)])
    decoded = log.decoded
    cut = (
        decoded.results is None
        and decoded.results_error is not None
        and ("starts after" in decoded.results_error or "chunks seen" in decoded.results_error)
    )
    if cut and log.tail_lines < MAX_TAIL_LINES:
        return Decision([ReadLog(pod.name, podspec.MAIN_CONTAINER, log.tail_lines * 4)])

    draft = _Status(job, now)
    actions: list[Action] = []
    outcome = decoded.outcome
    exit_code = pod.main.exit_code
    if exit_code == 0 and decoded.results is not None:
        text, reduced = results.reduce_results(decoded.results)
        name = results.results_configmap_name(job.name)
        actions.append(
            StoreResults(
                results.results_configmap(
                    namespace=job.namespace,
                    job_name=job.name,
                    job_uid=job.uid,
                    results=decoded.results,
                    labels={podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY},
                )
            )
        )
        draft.fields.update(results=text, results_reduced=reduced, results_config_map=name)
        tasks = ", ".join(sorted((decoded.results.get("results") or {}).keys()))
        draft.finish(api.JobReason.SUCCEEDED, f"evaluation finished: {tasks}")
    elif exit_code == 0:
        why = f"log unavailable: {log.unavailable}" if log.unavailable else decoded.results_error
        draft.finish(
            api.JobReason.FAILED, f"lm_eval exited 0 but the pod log holds no results: {why}"
        )
    elif outcome is not None and outcome.event == protocol.EVENT_CANCELLED:
        draft.finish(api.JobReason.CANCELLED, outcome.message or "cancelled")
    elif pod.main.reason == "OOMKilled" or outcome is None or not outcome.message:
        draft.finish(api.JobReason.FAILED, _termination_message(pod))
    else:
        draft.finish(api.JobReason.FAILED, f"{outcome.message} (exit code {exit_code})")
    return Decision([*actions, *draft.actions()])


def decide(
    job: JobView,
    pod: PodView | None,
    settings: Settings,
    now: dt.datetime,
    log: LogView | None = None,
) -> Decision:
    """The actions that move `job` toward what its pod shows. Pure."""
    if job.deleting:
        return Decision()
    state = job.status.state
    if state == api.JobState.COMPLETE:
        return Decision()
    if pod is None:
        if state in (None, api.JobState.NEW):
            return _schedule(job, settings, now)
        pod_name = job.status.pod_name or "the job pod"
        return decide_failure(
            job, now, f"pod {pod_name} was deleted before the evaluation finished"
        )
    if pod.main.state == "terminated":
        return _complete(job, pod, now, log)
    draft = _Status(job, now)
    if state in (None, api.JobState.NEW):
        # Adopted a pod made by an earlier poller that died before writing status.
        draft.state(api.JobState.SCHEDULED, api.JobReason.NO_REASON, f"pod {pod.name} created")
        draft.fields.update(pod_name=pod.name, last_schedule_time=draft.now)
        draft.condition(C.SCHEDULED, True, "PodCreated", f"pod {pod.name} created")
    if pod.main.state == "running":
        draft.state(api.JobState.RUNNING, api.JobReason.NO_REASON, "evaluation running")
        draft.condition(C.RUNNING, True, "ContainerRunning", "the evaluation container runs")
    return Decision(draft.actions())
