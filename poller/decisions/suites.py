"""A suite's decision: which run to start, what each finished run's verdict is, what to keep.

Why a module of its own: an LMEvalSuite (`poller.api.suite`) is a second
kind with a loop of its own, beside the jobs': its triggers start runs
(LMEvalJobs it owns, which the job loop then runs like any other), and
its verdicts compare each finished run with a baseline. The rule is the
jobs' rule: observe everything the decision needs (the suite, its runs as
listed, the pinned baseline, the model's revision, and the per-item scores
`needs_items` asks for), decide once here, purely, then act
(`poller.cycle.suites`).

What a co-tenant can change is not trusted:

* a run is the suite's only when the poller's proof is on it (the
  `poller.cycle.podproof` key, over the run's name and the suite's UID):
  anyone may create an LMEvalJob with the suite's label and owner reference;
* a baseline is a run whose verdict the poller recorded in the suite's
  status (a subresource only the poller writes) and whose UID is still the
  recorded one, or the pinned job, which the admission policy let the
  suite's author name; one whose evaluation settings differ from the
  template's is never used, and the status says why;
* a verdict, once recorded, is never decided again.

The triggers follow a Kubernetes CronJob where it has an answer: the
schedule's missed times run once (the latest), a time missed by more than
startingDeadlineSeconds is skipped, concurrencyPolicy Forbid holds a
trigger until the running run ends, Replace deletes it, Allow runs both;
history limits keep the newest passing and failing runs (and never delete
the current baseline, nor an active run's). A new value of the run-requested
annotation and a new model revision are triggers too; at most one run starts
per suite and cycle (a request by hand first, then a model change, then the
schedule).

Before a run starts, each Must criterion's power is checked when the
template's limit bounds the document count: a run that could not detect
its maxDrop is recorded Inconclusive (Underpowered) with the numbers, and
no pod is made.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from apscheduler.triggers.cron import CronTrigger
from pydantic import ValidationError

from poller import api
from poller.decisions import attestation, regression
from poller.decisions.attestation import SignerView
from poller.decisions.draft import set_condition
from poller.decisions.regression import ItemsRead
from poller.results import pairedstats, suiteverdict
from poller.results.power import describe
from poller.timefmt import format_time, parse_time

__all__ = [
    "ACTIVE",
    "FAILED",
    "FINISHED",
    "MANUAL",
    "MODEL_CHANGE",
    "SCHEDULE",
    "TRIGGER_ANNOTATION",
    "ModelRevision",
    "RunJob",
    "SuiteDecision",
    "SuiteObserved",
    "SuiteView",
    "Trigger",
    "comparable_digest",
    "decide_suite",
    "due_schedule",
    "may_start",
    "needs_items",
    "run_name",
]

SCHEDULE, MODEL_CHANGE, MANUAL = "Schedule", "ModelChange", "Manual"
ACTIVE, FINISHED, FAILED = "Active", "Finished", "Failed"
# Why a run was started, on the run itself (for `lmeval` and for adopting a run
# made just before a crash): {"trigger", "key", "scheduledTime", "revision"}.
TRIGGER_ANNOTATION = "lmeval.foundation-model-stack.github.com/run-trigger"
# What a baseline must share with the run: every setting that changes the
# documents, the prompts or how answers are scored.
COMPARABLE_KEYS = (
    "tasks",
    "numFewShot",
    "limit",
    "genArgs",
    "fewshotAsMultiturn",
    "chatTemplate",
    "systemInstruction",
    "customTasks",
)
# Scheduled times looked at per cycle: a suite down for longer than this many
# periods runs its latest time only (a CronJob says "too many missed start times").
MAX_MISSED = 1000
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


# -- what is observed ------------------------------------------------------------


@dataclass(frozen=True)
class SuiteView:
    """One LMEvalSuite as listed; `spec` None when it does not parse (`problem` says why)."""

    namespace: str
    name: str
    uid: str
    generation: int
    resource_version: str
    creation_timestamp: str
    run_request: str | None
    template: Mapping[str, Any]
    spec: api.LMEvalSuiteSpec | None
    problem: str | None
    status: api.LMEvalSuiteStatus
    raw_status: Mapping[str, Any]

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> SuiteView:
        meta = obj.get("metadata") or {}
        raw_spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        raw_status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
        spec: api.LMEvalSuiteSpec | None = None
        problem: str | None = None
        try:
            spec = api.LMEvalSuiteSpec.model_validate(raw_spec)
        except ValidationError as error:
            problem = _first_error(error)
        try:
            status = api.LMEvalSuiteStatus.model_validate(raw_status)
        except ValidationError:
            # Only the poller writes it: an unreadable one is started again, empty.
            status = api.LMEvalSuiteStatus()
        annotations = meta.get("annotations") or {}
        request = annotations.get(api.RUN_REQUESTED_ANNOTATION)
        template = raw_spec.get("template") if isinstance(raw_spec, dict) else None
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            generation=int(meta.get("generation") or 0),
            resource_version=str(meta.get("resourceVersion") or ""),
            creation_timestamp=str(meta.get("creationTimestamp") or ""),
            run_request=request[:256] if isinstance(request, str) and request else None,
            template=template if isinstance(template, dict) else {},
            spec=spec,
            problem=problem,
            status=status,
            raw_status=raw_status or {},
        )


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    text = f"spec.{where}: {first.get('msg', '')}" if where else str(first.get("msg", ""))
    return text[:512]


@dataclass(frozen=True)
class RunJob:
    """An LMEvalJob a suite reads: one of its proven runs, or its pinned baseline."""

    name: str
    uid: str
    state: str | None
    reason: str | None
    message: str | None
    spec: Mapping[str, Any]
    trigger: Mapping[str, Any] = field(default_factory=dict)
    # status.provenance as the poller recorded it (bounded by the job's schema).
    provenance: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> RunJob:
        meta = obj.get("metadata") or {}
        status: Mapping[str, Any] = _mapping(obj.get("status"))
        spec: Mapping[str, Any] = _mapping(obj.get("spec"))
        trigger: dict[str, Any] = {}
        text = (meta.get("annotations") or {}).get(TRIGGER_ANNOTATION)
        if isinstance(text, str) and len(text) <= 2048:
            try:
                loaded = json.loads(text)
            except ValueError:
                loaded = None
            if isinstance(loaded, dict):
                trigger = {k: v for k, v in loaded.items() if isinstance(v, str)}
        return cls(
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            state=_text(status.get("state")),
            reason=_text(status.get("reason")),
            message=_text(status.get("message")),
            spec=spec or {},
            trigger=trigger,
            provenance=_mapping(status.get("provenance")),
        )

    @property
    def succeeded(self) -> bool:
        return self.state == api.JobState.COMPLETE and self.reason == api.JobReason.SUCCEEDED

    @property
    def finished(self) -> bool:
        return self.state == api.JobState.COMPLETE


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str | None:
    return value[:1024] if isinstance(value, str) else None


@dataclass(frozen=True)
class ModelRevision:
    """The model trigger's InferenceService as read: its revision, or why there is none."""

    revision: str | None = None
    problem: str | None = None


@dataclass(frozen=True)
class SuiteObserved:
    """Everything one suite's decision reads."""

    suite: SuiteView
    # The suite's runs that carry the poller's proof, by name.
    runs: Mapping[str, RunJob] = field(default_factory=dict)
    # spec.baseline.pinned as read (None: absent, or no pin).
    pinned: RunJob | None = None
    model: ModelRevision | None = None
    # Per-item scores read for `needs_items`, by job UID.
    items: Mapping[str, ItemsRead] = field(default_factory=dict)
    # The signing pods of runs whose attestation is Signing, by run name.
    signers: Mapping[str, SignerView] = field(default_factory=dict)


@dataclass(frozen=True)
class Trigger:
    kind: str
    key: str
    scheduled_time: dt.datetime | None = None
    revision: str | None = None
    request: str | None = None


@dataclass(frozen=True)
class SuiteDecision:
    """What to do for one suite: its next status (None: unchanged), runs to create
    (manifests, to be stamped with the poller's proof), runs to delete, events."""

    status: dict[str, Any] | None = None
    create: tuple[dict[str, Any], ...] = ()
    delete: tuple[str, ...] = ()
    events: tuple[tuple[str, str, str], ...] = ()
    # Signing (spec.attestation), by run name: statements to sign (their
    # ConfigMap, then the signing pod), envelopes to keep, signing pods to delete.
    sign_start: tuple[tuple[str, str], ...] = ()
    sign_keep: tuple[tuple[str, str], ...] = ()
    sign_clean: tuple[str, ...] = ()


# -- pure helpers ----------------------------------------------------------------


def comparable_digest(spec: Mapping[str, Any]) -> str:
    """sha256 of the settings a baseline must share with a run (`COMPARABLE_KEYS`)."""
    kept = {key: spec.get(key) for key in COMPARABLE_KEYS if spec.get(key) is not None}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _differing(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return [key for key in COMPARABLE_KEYS if a.get(key) != b.get(key)]


def run_name(suite: SuiteView, trigger: Trigger) -> str:
    """The run's deterministic name: a crash between creating it and recording it
    finds the same name (and adopts the run by its proof) instead of making two.
    The count of triggers handled (status.runsStarted) is in it, so that a trigger
    seen again later (a model rolled back, a request token reused) gets a new run."""
    key = f"{suite.uid}/{trigger.key}/{suite.status.runs_started or 0}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{suite.name}-{digest}"


def _cron(schedule: api.Schedule) -> CronTrigger:
    fields = _MACROS.get(schedule.cron, schedule.cron).split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 fields, not {len(fields)}")
    minute, hour, day, month, weekday = fields
    return CronTrigger(
        minute=minute,
        hour=hour,
        day=day,
        month=month,
        day_of_week=_weekdays(weekday),
        timezone=zoneinfo.ZoneInfo(schedule.time_zone),
    )


_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _weekdays(text: str) -> str:
    """Cron's day-of-week field in APScheduler's numbering: cron (and a CronJob)
    counts 0 as Sunday, APScheduler 3 counts 0 as Monday (its from_crontab does
    not convert), so "0 0 * * 0" (@weekly) would run on Mondays; and a range of
    names from Sunday ("sun-tue") is one APScheduler refuses. So the field is
    expanded to APScheduler's day numbers."""
    if text == "*":
        return text
    days: set[int] = set()
    for part in text.lower().split(","):
        base, slash, step_text = part.partition("/")
        if slash and not (step_text.isdigit() and int(step_text) > 0):
            raise ValueError(f"day of week {part!r}: the step must be a whole number above 0")
        low, dash, high = base.partition("-")
        first, last = (0, 6) if base == "*" else (_day(low), _day(high) if dash else None)
        last = last if last is not None else 6 if slash else first
        if first > last:
            raise ValueError(f"day of week {part!r}: the range ends before it starts")
        days.update(range(first, last + 1, int(step_text) if slash else 1))
    return ",".join(str(n) for n in sorted((day - 1) % 7 for day in days))


def _day(text: str) -> int:
    if text.isdigit() and int(text) <= 6:
        return int(text)
    if text in _DAYS:
        return _DAYS.index(text)
    raise ValueError(f"{text!r} is not a day of the week (0 to 6 from Sunday, or sun to sat)")


def schedule_problem(schedule: api.Schedule) -> str | None:
    """Why the schedule cannot be read (APScheduler's parser and the zone database
    are the exact checks the CRD's pattern only approximates), or None."""
    try:
        zoneinfo.ZoneInfo(schedule.time_zone)
    except (ValueError, KeyError, OSError):
        # Not found (a KeyError), not a normalized key ("/UTC": ValueError), or a
        # folder of the database ("America": IsADirectoryError).
        return f"spec.triggers.schedule.timeZone: unknown time zone {schedule.time_zone!r}"
    try:
        _cron(schedule)
    except (ValueError, KeyError) as error:
        return f"spec.triggers.schedule.cron: {schedule.cron!r} is not a valid schedule: {error}"
    return None


def due_schedule(
    schedule: api.Schedule, last: dt.datetime | None, created: dt.datetime, now: dt.datetime
) -> tuple[dt.datetime | None, str | None]:
    """The scheduled time to run now (the latest missed one), and a note when
    times were skipped (past the deadline, or too many missed)."""
    trigger = _cron(schedule)
    start = last or created
    deadline = schedule.starting_deadline_seconds
    if deadline is not None:
        # As a CronJob: times older than the deadline are never run, so not looked at.
        start = max(start, now - dt.timedelta(seconds=deadline))
    latest: dt.datetime | None = None
    moment = start + dt.timedelta(microseconds=1)
    for _ in range(MAX_MISSED):
        fire = trigger.get_next_fire_time(None, moment)
        if fire is None or fire > now:
            return latest, None
        latest, moment = fire, fire + dt.timedelta(microseconds=1)
    note = (
        f"more than {MAX_MISSED} scheduled times were missed; set or lower "
        "spec.triggers.schedule.startingDeadlineSeconds"
    )
    return latest, note


def _held_past_deadline(
    observed: SuiteObserved, since: dt.datetime, now: dt.datetime
) -> dt.datetime | None:
    """The latest scheduled time that was still due at `since` (when the active run
    started: Forbid held it) and is now missed by more than startingDeadlineSeconds,
    or None. `due_schedule` no longer sees such a time, so without this it would
    stay unrecorded, as if still to come."""
    suite, spec = observed.suite, observed.suite.spec
    schedule = spec.triggers.schedule if spec is not None else None
    if schedule is None or schedule.starting_deadline_seconds is None:
        return None
    deadline = dt.timedelta(seconds=schedule.starting_deadline_seconds)
    created = parse_time(suite.creation_timestamp) or now
    # Only times after since - deadline were still due at `since`.
    start = max(parse_time(suite.status.last_schedule_time) or created, since - deadline)
    unbounded = schedule.model_copy(update={"starting_deadline_seconds": None})
    time, _ = due_schedule(unbounded, start, created, now - deadline)
    return time


def _criterion(spec: api.Criterion) -> suiteverdict.Criterion:
    return suiteverdict.Criterion(
        task=spec.task,
        metric=spec.metric,
        max_drop=spec.max_drop,
        alpha=spec.alpha,
        power=spec.power,
        higher_is_better=spec.higher_is_better,
        tier=spec.tier.value,
    )


def _whole_limit(template: Mapping[str, Any]) -> int | None:
    limit = template.get("limit")
    return int(limit) if isinstance(limit, str) and limit.isdigit() else None


# -- the baseline ----------------------------------------------------------------


@dataclass(frozen=True)
class _Baseline:
    name: str | None = None
    uid: str | None = None
    problem: str | None = None  # why there is none (NoBaseline, NotComparable...)
    reason: str | None = None


def _choose_baseline(observed: SuiteObserved, runs: Sequence[api.RunStatus]) -> _Baseline:
    suite, spec = observed.suite, observed.suite.spec
    assert spec is not None
    digest = comparable_digest(suite.template)
    skipped: list[str] = []
    if spec.baseline.policy == api.BaselinePolicy.LAST_PASSED:
        for run in reversed(runs):
            job = observed.runs.get(run.name)
            if run.verdict != suiteverdict.PASSED or job is None or job.uid != run.uid:
                continue
            if run.spec_digest != digest:
                skipped.append(f"{run.name} (its evaluation settings differ from the template's)")
                continue
            return _Baseline(run.name, run.uid)
    pinned = spec.baseline.pinned
    note = f"; passed runs not used: {', '.join(skipped[:3])}" if skipped else ""
    if pinned is None:
        return _Baseline(
            problem="no run of this suite has passed and spec.baseline.pinned is not set: set "
            "it to a job to compare with (e.g. the evaluation of the model in production)" + note,
            reason="NoBaseline",
        )
    job = observed.pinned
    if job is None:
        return _Baseline(
            problem=f"spec.baseline.pinned: LMEvalJob {pinned} does not exist" + note,
            reason="BaselineMissing",
        )
    differing = _differing(suite.template, job.spec)
    if differing:
        return _Baseline(
            problem=f"spec.baseline.pinned: LMEvalJob {pinned} differs from spec.template in "
            f"{', '.join(differing)}, so its scores are not comparable" + note,
            reason="NotComparable",
        )
    return _Baseline(job.name, job.uid)


def _baseline_job(observed: SuiteObserved, run: api.RunStatus) -> RunJob | None:
    """The baseline recorded for `run`, if it is still the same object."""
    if run.baseline is None:
        return None
    job = observed.runs.get(run.baseline)
    if job is None and observed.pinned is not None and observed.pinned.name == run.baseline:
        job = observed.pinned
    return job if job is not None and job.uid == run.baseline_uid else None


# -- triggers --------------------------------------------------------------------


def _next_trigger(observed: SuiteObserved, now: dt.datetime) -> tuple[Trigger | None, list[str]]:
    """The trigger to act on now, and notes for the status (a model that cannot be
    read, scheduled times skipped)."""
    suite, spec = observed.suite, observed.suite.spec
    assert spec is not None
    status = suite.status
    if suite.run_request is not None and suite.run_request != status.last_run_request:
        key = f"manual/{suite.run_request}"
        return Trigger(MANUAL, key, request=suite.run_request), []
    notes: list[str] = []
    model = observed.model
    if spec.triggers.model_change is not None and model is not None:
        if model.problem is not None:
            notes.append(model.problem)
        elif model.revision and model.revision != status.last_model_revision:
            trigger = Trigger(MODEL_CHANGE, f"model/{model.revision}", revision=model.revision)
            return trigger, notes
    schedule = spec.triggers.schedule
    if schedule is not None:
        created = parse_time(suite.creation_timestamp) or now
        time, note = due_schedule(schedule, parse_time(status.last_schedule_time), created, now)
        if note:
            notes.append(note)
        if time is not None:
            key = f"schedule/{format_time(time)}"
            return Trigger(SCHEDULE, key, scheduled_time=time), notes
    return None, notes


def _handled(status: dict[str, Any], trigger: Trigger) -> None:
    status["runsStarted"] = int(status.get("runsStarted") or 0) + 1
    if trigger.kind == MANUAL:
        status["lastRunRequest"] = trigger.request
    elif trigger.kind == MODEL_CHANGE:
        status["lastModelRevision"] = trigger.revision
    elif trigger.scheduled_time is not None:
        recorded = parse_time(status.get("lastScheduleTime"))
        if recorded is None or recorded < trigger.scheduled_time:  # never back in time
            status["lastScheduleTime"] = format_time(trigger.scheduled_time)


def _run_manifest(suite: SuiteView, name: str, trigger: Trigger) -> dict[str, Any]:
    note: dict[str, str] = {"trigger": trigger.kind, "key": trigger.key[:512]}
    if trigger.scheduled_time is not None:
        note["scheduledTime"] = format_time(trigger.scheduled_time)
    if trigger.revision is not None:
        note["revision"] = trigger.revision[:512]
    # Per-item scores are what the comparison pairs.
    spec = {**suite.template, "logSamples": True}
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {
            "name": name,
            "namespace": suite.namespace,
            "labels": {api.SUITE_LABEL: suite.name},
            "annotations": {TRIGGER_ANNOTATION: json.dumps(note, sort_keys=True)},
            "ownerReferences": [
                {
                    "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
                    "kind": api.SUITE_KIND,
                    "name": suite.name,
                    "uid": suite.uid,
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": spec,
    }


# -- verdicts --------------------------------------------------------------------


def _run_baseline_pair(observed: SuiteObserved, run: api.RunStatus) -> tuple[str, str] | None:
    job = _baseline_job(observed, run)
    return (job.name, job.uid) if job is not None and job.succeeded else None


def needs_items(observed: SuiteObserved) -> tuple[tuple[str, str], ...]:
    """The jobs (name, UID) whose per-item scores deciding needs read now: each
    active run that succeeded, and its baseline. Pure."""
    spec = observed.suite.spec
    if spec is None:
        return ()
    wanted: dict[str, str] = {}
    for run in observed.suite.status.runs:
        job = observed.runs.get(run.name)
        if run.state != ACTIVE or job is None or not job.succeeded:
            continue
        if run.uid is not None and job.uid != run.uid:
            continue  # another object under the run's name (`_progress_run`: RunMissing)
        pair = _run_baseline_pair(observed, run)
        if pair is not None:
            wanted[job.uid] = job.name
            wanted[pair[1]] = pair[0]
    return tuple((name, uid) for uid, name in wanted.items())


def _judge(
    spec: api.LMEvalSuiteSpec, run_read: ItemsRead | None, base_read: ItemsRead | None, base: str
) -> list[suiteverdict.CriterionResult]:
    results: list[suiteverdict.CriterionResult] = []
    run_results = regression.results_of(run_read)
    base_results = regression.results_of(base_read)
    for item in spec.criteria:
        criterion = _criterion(item)
        run_items = regression.task_items(run_read, item.task, "the run")
        base_items = regression.task_items(base_read, item.task, f"baseline {base}")
        problem = next((p for p in (run_items, base_items) if isinstance(p, str)), None)
        if problem is None and run_results is not None and base_results is not None:
            try:
                pairedstats.check_results_comparable(item.task, base_results, run_results)
            except pairedstats.NotComparable as error:
                problem = str(error)
                results.append(suiteverdict.not_compared(criterion, "NotComparable", problem))
                continue
        if problem is not None:
            results.append(suiteverdict.not_compared(criterion, "NoItemScores", problem))
            continue
        assert not isinstance(run_items, str) and not isinstance(base_items, str)
        results.append(suiteverdict.judge(criterion, base_items, run_items))
    return results


def _criterion_status(result: suiteverdict.CriterionResult) -> api.CriterionStatus:
    return api.CriterionStatus(
        task=result.criterion.task,
        metric=result.criterion.metric,
        tier=result.criterion.tier,
        verdict=result.verdict,
        reason=result.reason,
        message=result.message[:1024],
        p_value=result.p_value,
        difference=result.difference,
        paired=result.paired,
        minimum_detectable_drop=result.minimum_detectable_drop,
    )


def _progress_run(
    observed: SuiteObserved, run: api.RunStatus, stamp: str, events: list[tuple[str, str, str]]
) -> api.RunStatus:
    """An active run as it now stands: still active, failed, or judged."""
    spec = observed.suite.spec
    assert spec is not None
    job = observed.runs.get(run.name)
    if job is None or (run.uid is not None and job.uid != run.uid):
        return run.model_copy(
            update={
                "state": FAILED,
                "finished": stamp,
                "reason": "RunMissing",
                "message": f"LMEvalJob {run.name} was deleted before its verdict",
            }
        )
    if run.uid is None:
        run = run.model_copy(update={"uid": job.uid})
    if not job.finished:
        return run
    if not job.succeeded:
        message = f"LMEvalJob {run.name} ended {job.reason}: {job.message or ''}".strip()
        events.append(("Warning", "RunFailed", message))
        return run.model_copy(
            update={
                "state": FAILED,
                "finished": stamp,
                "reason": job.reason or "Failed",
                "message": message[:1024],
            }
        )
    inconclusive = suiteverdict.INCONCLUSIVE
    if run.baseline is None:
        reason, message = run.reason or "NoBaseline", run.message or ""
        return _verdict(run, stamp, inconclusive, reason, message, [], events)
    base = _baseline_job(observed, run)
    if base is None:
        message = f"baseline {run.baseline} is gone, or is another object under its name now"
        return _verdict(run, stamp, inconclusive, "BaselineMissing", message, [], events)
    if not base.finished:
        return run  # the pinned job still runs: wait for it
    if not base.succeeded:
        message = f"baseline {base.name} did not succeed ({base.reason})"
        return _verdict(run, stamp, inconclusive, "BaselineFailed", message, [], events)
    results = _judge(spec, observed.items.get(job.uid), observed.items.get(base.uid), base.name)
    verdict, reason, message = suiteverdict.suite_verdict(results)
    statuses = [_criterion_status(r) for r in results]
    return _verdict(run, stamp, verdict, reason, message, statuses, events)


def _verdict(
    run: api.RunStatus,
    stamp: str,
    verdict: str,
    reason: str,
    message: str,
    criteria: list[api.CriterionStatus],
    events: list[tuple[str, str, str]],
) -> api.RunStatus:
    kind = "Normal" if verdict == suiteverdict.PASSED else "Warning"
    words = f"run {run.name}: {verdict} ({reason}): {message}"
    events.append((kind, f"Run{verdict}", words[:1024]))
    return run.model_copy(
        update={
            "state": FINISHED,
            "finished": stamp,
            "verdict": verdict,
            "reason": reason,
            "message": message[:1024],
            "criteria": criteria,
        }
    )


def _precheck(
    observed: SuiteObserved, baseline: _Baseline
) -> tuple[str, list[api.CriterionStatus]] | None:
    """The Underpowered verdict a run gets before it starts, or None (it may start)."""
    spec = observed.suite.spec
    assert spec is not None
    limit = _whole_limit(observed.suite.template)
    if limit is None:
        return None
    base_read = observed.items.get(baseline.uid) if baseline.uid else None
    short: list[api.CriterionStatus] = []
    for item in spec.criteria:
        if item.tier != api.Tier.MUST:
            continue
        values = _baseline_values(base_read, item.task, item.metric)
        check = suiteverdict.precheck(_criterion(item), limit, values)
        if check is None or check.enough:
            continue
        short.append(
            api.CriterionStatus(
                task=item.task,
                metric=item.metric,
                tier=item.tier.value,
                verdict=suiteverdict.INCONCLUSIVE,
                reason="Underpowered",
                message=f"spec.template.limit {limit}: {describe(check)}"[:1024],
                minimum_detectable_drop=check.minimum_detectable_drop,
            )
        )
    if not short:
        return None
    first = short[0]
    message = (
        f"{len(short)} Must criterion(s) cannot detect their maxDrop with at most {limit} "
        f"documents; {first.task} {first.metric}: {first.message}"
    )
    return message, short


def _baseline_values(read: ItemsRead | None, task: str, metric: str) -> list[float] | None:
    items = regression.task_items(read, task, "baseline")
    if isinstance(items, str) or metric not in items.metrics:
        return None
    return list(items.metrics[metric].values)


def may_start(observed: SuiteObserved, now: dt.datetime) -> bool:
    """Whether a trigger is due (a run may start this cycle): the pinned baseline
    is read only then, or while a run goes on. Pure."""
    spec = observed.suite.spec
    if spec is None or spec.suspend:
        return False
    if spec.triggers.schedule is not None and schedule_problem(spec.triggers.schedule):
        return False
    return _next_trigger(observed, now)[0] is not None


def needs_baseline_items(observed: SuiteObserved, now: dt.datetime) -> tuple[str, str] | None:
    """The baseline whose per-item scores a run about to start needs for its power
    check (the template's limit bounds the documents), or None. Pure."""
    spec = observed.suite.spec
    if spec is None or spec.suspend or _whole_limit(observed.suite.template) is None:
        return None
    schedule = spec.triggers.schedule
    if schedule is not None and schedule_problem(schedule) is not None:
        return None  # no run starts: decide_suite reports the schedule instead
    trigger, _ = _next_trigger(observed, now)
    if trigger is None:
        return None
    baseline = _choose_baseline(observed, observed.suite.status.runs)
    if baseline.name is None or baseline.uid is None:
        return None
    job = observed.runs.get(baseline.name) or observed.pinned
    if job is None or not job.succeeded or job.uid != baseline.uid:
        return None
    return baseline.name, baseline.uid


# -- the decision ----------------------------------------------------------------


def decide_suite(observed: SuiteObserved, now: dt.datetime) -> SuiteDecision:
    """One suite's decision on complete observations. Pure."""
    suite = observed.suite
    stamp = format_time(now)
    old = suite.status
    status: dict[str, Any] = old.model_dump(by_alias=True, exclude_none=True, mode="json")
    conditions = list(old.conditions)
    spec = suite.spec
    problem = suite.problem
    if spec is not None and spec.triggers.schedule is not None:
        problem = schedule_problem(spec.triggers.schedule)
    if spec is None or problem is not None:
        conditions = set_condition(
            conditions,
            api.SuiteCondition.VALID,
            False,
            "InvalidSpec",
            problem or "",
            stamp,
            suite.generation,
        )
        status.update(message=problem, observedGeneration=suite.generation)
        return _finish(suite, status, conditions, (), (), ())
    conditions = set_condition(
        conditions, api.SuiteCondition.VALID, True, "Valid", "", stamp, suite.generation
    )
    events: list[tuple[str, str, str]] = []
    runs = [
        _progress_run(observed, run, stamp, events) if run.state == ACTIVE else run
        for run in old.runs
    ]
    adopted = _adopted(observed, runs, stamp)
    runs.extend(adopted)
    create: list[dict[str, Any]] = []
    delete: list[str] = []
    trigger, notes = _next_trigger(observed, now)
    if trigger is not None and run_name(suite, trigger) in {run.name for run in adopted}:
        # The trigger's run was made before a crash lost the status write: adopted
        # above, so the trigger is handled (another run would take its name again).
        _handled(status, trigger)
        trigger = None
    message: str | None = "; ".join(notes) if notes else None
    if spec.suspend:
        trigger, message = None, "suspended: no new runs (spec.suspend)"
    active = [run for run in runs if run.state == ACTIVE]
    forbid = bool(active) and spec.concurrency_policy == api.ConcurrencyPolicy.FORBID
    since = min((parse_time(run.started) or now for run in active), default=now)
    if forbid and not spec.suspend and (held := _held_past_deadline(observed, since, now)):
        # Forbid held it past its deadline: missed for good, as a CronJob skips it.
        _handled(status, Trigger(SCHEDULE, f"schedule/{format_time(held)}", scheduled_time=held))
    if trigger is not None:
        if forbid:
            message = f"{trigger.kind} run waits: {active[-1].name} is running (Forbid)"
        else:
            if active and spec.concurrency_policy == api.ConcurrencyPolicy.REPLACE:
                for run in active:
                    delete.append(run.name)
                runs = [
                    run.model_copy(
                        update={
                            "state": FAILED,
                            "finished": stamp,
                            "reason": "Replaced",
                            "message": f"replaced by a {trigger.kind} run (Replace)",
                        }
                    )
                    if run.state == ACTIVE
                    else run
                    for run in runs
                ]
            entry, manifest = _start(observed, runs, trigger, stamp)
            runs.append(entry)
            if manifest is not None:
                create.append(manifest)
                events.append(("Normal", "RunCreated", f"{trigger.kind} run {entry.name} created"))
            else:
                events.append(("Warning", "RunInconclusive", entry.message or ""))
            _handled(status, trigger)
            message = None
    signing = _Signing()
    if spec.attestation is not None:
        runs = [_attest(observed, run, signing) for run in runs]
    runs, pruned = _prune(observed, runs)
    delete.extend(pruned)
    status["runs"] = [run.model_dump(by_alias=True, exclude_none=True, mode="json") for run in runs]
    status["active"] = [run.name for run in runs if run.state == ACTIVE]
    status["observedGeneration"] = suite.generation
    if message is None:
        status.pop("message", None)
    else:
        status["message"] = message[:1024]
    ended = [run for run in runs if run.state != ACTIVE]
    latest = ended[-1] if ended else None
    if latest is not None:
        # The Verdict column: a run that failed has none, and says so.
        status["lastVerdict"] = latest.verdict or FAILED
    conditions = _verdict_conditions(conditions, latest, runs, stamp, suite.generation)
    decision = _finish(suite, status, conditions, create, delete, events)
    return replace(
        decision,
        sign_start=tuple(signing.start),
        sign_keep=tuple(signing.keep),
        sign_clean=tuple(signing.clean),
    )


@dataclass
class _Signing:
    """The signing steps one decision asks for (`SuiteDecision.sign_*`)."""

    start: list[tuple[str, str]] = field(default_factory=list)
    keep: list[tuple[str, str]] = field(default_factory=list)
    clean: list[str] = field(default_factory=list)


def _attest(observed: SuiteObserved, run: api.RunStatus, signing: _Signing) -> api.RunStatus:
    """`run` with its attestation's next step (spec.attestation): a run with a
    verdict and a job (an Underpowered run before any pod has none) is signed once."""
    suite, spec = observed.suite, observed.suite.spec
    assert spec is not None
    state = run.attestation.state if run.attestation is not None else None
    if run.state != FINISHED or run.verdict is None or run.uid is None:
        return run
    if state not in (None, attestation.SIGNING):
        return run
    jobs = {name: job.provenance for name, job in observed.runs.items()}
    if observed.pinned is not None:
        jobs[observed.pinned.name] = observed.pinned.provenance
    provenance = {name: jobs.get(name, {}) for name in (run.name, run.baseline) if name}
    statement = attestation.statement(
        spec=spec,
        namespace=suite.namespace,
        suite_name=suite.name,
        suite_uid=suite.uid,
        generation=suite.generation,
        run=run,
        provenance=provenance,
    )
    step = attestation.next_step(run, observed.signers.get(run.name), statement)
    if step.start is not None:
        signing.start.append((run.name, step.start))
    if step.keep is not None:
        signing.keep.append((run.name, step.keep))
    if step.clean:
        signing.clean.append(run.name)
    return run if step.status is None else run.model_copy(update={"attestation": step.status})


def _verdict_conditions(
    conditions: list[api.Condition],
    latest: api.RunStatus | None,
    runs: Sequence[api.RunStatus],
    stamp: str,
    generation: int,
) -> list[api.Condition]:
    running = [run.name for run in runs if run.state == ACTIVE]
    conditions = set_condition(
        conditions,
        api.SuiteCondition.RUNNING,
        bool(running),
        "RunActive" if running else "NoRunActive",
        ", ".join(running),
        stamp,
        generation,
    )
    if latest is None:
        return conditions
    words = f"run {latest.name}: {latest.message or ''}"
    verdict, reason = latest.verdict, latest.reason or "RunFailed"
    conditions = set_condition(
        conditions,
        api.SuiteCondition.PASSED,
        verdict == suiteverdict.PASSED,
        reason,
        words,
        stamp,
        generation,
    )
    return set_condition(
        conditions,
        api.SuiteCondition.REGRESSED,
        verdict == suiteverdict.REGRESSED,
        reason,
        words,
        stamp,
        generation,
    )


def _finish(
    suite: SuiteView,
    status: dict[str, Any],
    conditions: list[api.Condition],
    create: Sequence[dict[str, Any]],
    delete: Sequence[str],
    events: Sequence[tuple[str, str, str]],
) -> SuiteDecision:
    status["conditions"] = [
        c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in conditions
    ]
    try:
        before = (
            api.LMEvalSuiteStatus.model_validate(suite.raw_status) if suite.raw_status else None
        )
    except ValidationError:
        before = None  # unreadable (`SuiteView.from_object` started it again): rewritten
    changed = before is None or before.model_dump(
        by_alias=True, exclude_none=True, mode="json"
    ) != api.LMEvalSuiteStatus.model_validate(status).model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )
    return SuiteDecision(
        status=status if changed else None,
        create=tuple(create),
        delete=tuple(delete),
        events=tuple(events),
    )


def _start(
    observed: SuiteObserved, runs: Sequence[api.RunStatus], trigger: Trigger, stamp: str
) -> tuple[api.RunStatus, dict[str, Any] | None]:
    """The new run's entry, and its manifest (None: it was judged before it started)."""
    suite = observed.suite
    name = run_name(suite, trigger)
    baseline = _choose_baseline(observed, runs)
    entry = api.RunStatus(
        name=name,
        trigger=trigger.kind,
        scheduled_time=format_time(trigger.scheduled_time) if trigger.scheduled_time else None,
        revision=trigger.revision,
        started=stamp,
        state=ACTIVE,
        baseline=baseline.name,
        baseline_uid=baseline.uid,
        spec_digest=comparable_digest(suite.template),
        reason=baseline.reason,
        message=baseline.problem[:1024] if baseline.problem else None,
    )
    short = _precheck(observed, baseline)
    if short is not None:
        message, criteria = short
        finished = entry.model_copy(
            update={
                "state": FINISHED,
                "finished": stamp,
                "verdict": suiteverdict.INCONCLUSIVE,
                "reason": "Underpowered",
                "message": message[:1024],
                "criteria": criteria,
            }
        )
        return finished, None
    return entry, _run_manifest(suite, name, trigger)


def _adopted(
    observed: SuiteObserved, runs: Sequence[api.RunStatus], stamp: str
) -> list[api.RunStatus]:
    """Proven runs the status does not list: made just before a crash lost the write.
    Each is recorded as an active run (its trigger from its annotation)."""
    known = {run.name for run in runs}
    spec = observed.suite.spec
    assert spec is not None
    out: list[api.RunStatus] = []
    for name, job in sorted(observed.runs.items()):
        if name in known:
            continue
        baseline = _choose_baseline(observed, runs)
        out.append(
            api.RunStatus(
                name=name,
                uid=job.uid,
                trigger=job.trigger.get("trigger", MANUAL),
                scheduled_time=job.trigger.get("scheduledTime"),
                revision=job.trigger.get("revision"),
                started=stamp,
                state=ACTIVE,
                baseline=baseline.name,
                baseline_uid=baseline.uid,
                spec_digest=comparable_digest(job.spec),
                reason=baseline.reason,
                message=baseline.problem[:1024] if baseline.problem else None,
            )
        )
    return out


def _prune(
    observed: SuiteObserved, runs: list[api.RunStatus]
) -> tuple[list[api.RunStatus], list[str]]:
    """The runs kept by the history limits (always the current baseline and the
    baselines of active runs), and the LMEvalJobs of the others to delete."""
    spec = observed.suite.spec
    assert spec is not None
    baseline = _choose_baseline(observed, runs).name
    # The baselines of active runs too: their verdicts still need them.
    kept_baselines = {baseline} | {r.baseline for r in runs if r.state == ACTIVE}
    passing = [r for r in runs if r.state != ACTIVE and r.verdict == suiteverdict.PASSED]
    failing = [r for r in runs if r.state != ACTIVE and r.verdict != suiteverdict.PASSED]
    dropped = {
        r.name
        for group, limit in (
            (passing, spec.passing_runs_history_limit),
            (failing, spec.failing_runs_history_limit),
        )
        for r in group[: max(0, len(group) - limit)]
        if r.name not in kept_baselines
    }
    kept = [r for r in runs if r.name not in dropped]
    while len(kept) > api.MAX_RUNS_KEPT:  # a bound on the status, whatever the limits say
        oldest = next((r for r in kept if r.state != ACTIVE and r.name not in kept_baselines), None)
        if oldest is None:
            break  # only active runs (and the baseline): the schema's bound refuses more
        dropped.add(oldest.name)
        kept.remove(oldest)
    return kept, sorted(name for name in dropped if name in observed.runs)


def with_items(observed: SuiteObserved, items: Mapping[str, ItemsRead]) -> SuiteObserved:
    """`observed` completed with the per-item scores read for it."""
    return replace(observed, items={**observed.items, **items})
