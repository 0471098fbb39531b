"""An LMEvalSuite's pure decision (`poller.decisions.suites`), cycle by cycle, without a cluster.

Suites are built as the API returns them (metadata, spec, status) and their
runs through `RunJob.from_object`; `World` plays the cycle's part
(`poller.cycle.suites`): it reads the per-item scores `needs_items` and
`needs_baseline_items` ask for, creates and deletes the runs the decision
names and writes its status back, so a test follows a suite over cycles.

Checks the schedule with a CronJob's rules (nothing before the first time,
the latest missed time once, startingDeadlineSeconds, a time zone, macros
and cron's day-of-week numbering, a schedule or zone the parser refuses
named in Valid=False); concurrencyPolicy Forbid, Replace and Allow; the
manual and model-change triggers and their order (one run per cycle);
suspend; deterministic run names; the baseline rules (LastPassed, pinned,
BaselineMissing, NotComparable, NoBaseline, policy Pinned); verdicts
(Passed, Regressed, a failed job, a deleted run, a baseline gone, a pinned
baseline still running) and the scores asked for; the power check before a
run; adoption of a run made before a crash (and of its trigger); history
limits and the bound on status.runs; that a status is written only when it
changed; and the run's manifest.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from driver.itemscores import ItemScores, TaskItems, docs_digest, encode_item_scores, metric_items
from poller import api
from poller.decisions import suites
from poller.decisions.regression import ItemsRead
from poller.decisions.suites import (
    ModelRevision,
    RunJob,
    SuiteDecision,
    SuiteObserved,
    SuiteView,
    comparable_digest,
    decide_suite,
    due_schedule,
    needs_baseline_items,
    needs_items,
    run_name,
)
from poller.timefmt import format_time

UTC = dt.UTC
NOW = dt.datetime(2024, 6, 3, 12, 0, 30, tzinfo=UTC)  # a Monday
CREATED = dt.datetime(2024, 6, 1, tzinfo=UTC)  # a Saturday
SUITE_UID = "6f1c1d1e-0000-4000-8000-5111e0000001"
TASK, METRIC = "arith", "acc,none"
TEMPLATE: dict[str, Any] = {"model": "local-completions", "tasks": [TASK]}
CRITERION: dict[str, Any] = {"task": TASK, "metric": METRIC, "maxDrop": 0.05}
SUCCEEDED = {"state": "Complete", "reason": "Succeeded", "message": "done"}
RUNNING = {"state": "Running"}
N = 400
SAME = [0.0 if i % 5 == 0 else 1.0 for i in range(N)]  # 0.8 right
RIGHT = [1.0] * N
WORSE = [0.0 if i % 10 in (0, 3, 7) else 1.0 for i in range(N)]  # 0.7 right


# -- building what the API returns ----------------------------------------------------


def suite(
    spec: Mapping[str, Any] | None = None,
    *,
    status: Mapping[str, Any] | None = None,
    request: str | None = None,
    name: str = "evals",
    uid: str = SUITE_UID,
    created: dt.datetime = CREATED,
) -> dict[str, Any]:
    annotations = {} if request is None else {api.RUN_REQUESTED_ANNOTATION: request}
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.SUITE_KIND,
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": uid,
            "generation": 3,
            "resourceVersion": "41",
            "creationTimestamp": format_time(created),
            "annotations": annotations,
        },
        "spec": {"template": TEMPLATE, "criteria": [CRITERION], **(spec or {})},
        "status": dict(status or {}),
    }


def job_object(
    name: str,
    *,
    uid: str | None = None,
    status: Mapping[str, Any] | None = None,
    spec: Mapping[str, Any] | None = None,
    trigger: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    annotations = {} if trigger is None else {suites.TRIGGER_ANNOTATION: json.dumps(trigger)}
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": uid or f"uid-{name}",
            "annotations": annotations,
        },
        "spec": dict(spec if spec is not None else {**TEMPLATE, "logSamples": True}),
        "status": dict(status or {}),
    }


def job(name: str, **kwargs: Any) -> RunJob:
    return RunJob.from_object(job_object(name, **kwargs))


def encoded(values: Sequence[float], *, task: str = TASK) -> str:
    """What the poller keeps in binaryData: base64 of gzip of the driver's JSON."""
    ids = tuple(range(len(values)))
    items = TaskItems(ids, docs_digest((i, f"doc{i}") for i in ids), {METRIC: metric_items(values)})
    raw = encode_item_scores(ItemScores({task: items}))
    return base64.b64encode(gzip.compress(raw)).decode()


def read(values: Sequence[float]) -> ItemsRead:
    return ItemsRead(encoded=encoded(values))


def entry(name: str, verdict: str | None, **fields: Any) -> dict[str, Any]:
    """A status.runs entry as the poller writes it: finished with `verdict`
    (None: Failed), with the template's digest unless told."""
    state = suites.FINISHED if verdict else suites.FAILED
    out = {
        "name": name,
        "uid": f"uid-{name}",
        "trigger": suites.MANUAL,
        "started": "2024-06-01T01:00:00Z",
        "finished": "2024-06-01T02:00:00Z",
        "state": state,
        "specDigest": comparable_digest(TEMPLATE),
    }
    if verdict:
        out.update(verdict=verdict, reason=verdict)
    out.update(fields)
    return out


def decide(
    obj: Mapping[str, Any],
    now: dt.datetime = NOW,
    *,
    runs: Mapping[str, RunJob] | None = None,
    pinned: RunJob | None = None,
    model: ModelRevision | None = None,
    items: Mapping[str, ItemsRead] | None = None,
) -> SuiteDecision:
    observed = SuiteObserved(
        SuiteView.from_object(obj),
        runs=dict(runs or {}),
        pinned=pinned,
        model=model,
        items=dict(items or {}),
    )
    return decide_suite(observed, now)


def condition(status: Mapping[str, Any], kind: str) -> dict[str, Any]:
    found = [c for c in status.get("conditions", []) if c["type"] == kind]
    assert len(found) == 1, status.get("conditions")
    result: dict[str, Any] = found[0]
    return result


@dataclass
class World:
    """One suite and its LMEvalJobs, as the cycle observes and changes them."""

    obj: dict[str, Any]
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    pinned: dict[str, Any] | None = None
    model: ModelRevision | None = None
    items: dict[str, ItemsRead] = field(default_factory=dict)  # by job UID
    asked: list[tuple[str, str]] = field(default_factory=list)  # the last cycle's reads

    def observed(self, now: dt.datetime) -> SuiteObserved:
        observed = SuiteObserved(
            SuiteView.from_object(self.obj),
            runs={name: RunJob.from_object(obj) for name, obj in self.jobs.items()},
            pinned=RunJob.from_object(self.pinned) if self.pinned is not None else None,
            model=self.model,
        )
        self.asked = list(needs_items(observed))
        before = needs_baseline_items(observed, now)
        if before is not None:
            self.asked.append(before)
        read = {uid: self.items.get(uid, ItemsRead(problem="not stored")) for _, uid in self.asked}
        return suites.with_items(observed, read)

    def cycle(self, now: dt.datetime = NOW) -> SuiteDecision:
        decision = decide_suite(self.observed(now), now)
        for manifest in decision.create:
            name = manifest["metadata"]["name"]
            if name not in self.jobs:  # the API refuses a second object of a name
                made = json.loads(json.dumps(manifest))
                made["metadata"]["uid"] = f"uid-{name}"
                self.jobs[name] = {**made, "status": {}}
        for name in decision.delete:
            self.jobs.pop(name, None)
        if decision.status is not None:
            self.obj = {**self.obj, "status": decision.status}
        return decision

    def finish(
        self,
        name: str,
        values: Sequence[float] | None = None,
        status: Mapping[str, Any] = SUCCEEDED,
    ) -> None:
        self.jobs[name]["status"] = dict(status)
        if values is not None:
            self.items[self.jobs[name]["metadata"]["uid"]] = read(values)

    def request(self, token: str) -> None:
        self.obj["metadata"]["annotations"][api.RUN_REQUESTED_ANNOTATION] = token

    def patch_spec(self, **changes: Any) -> None:
        self.obj = {**self.obj, "spec": {**self.obj["spec"], **changes}}

    @property
    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.obj["status"]
        return status

    @property
    def runs(self) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = self.status.get("runs", [])
        return runs

    def run(self, name: str) -> dict[str, Any]:
        return next(r for r in self.runs if r["name"] == name)


def created_names(decision: SuiteDecision) -> list[str]:
    return [m["metadata"]["name"] for m in decision.create]


def pinned_base(
    status: Mapping[str, Any] = SUCCEEDED, uid: str = "uid-prod", **spec: Any
) -> dict[str, Any]:
    return job_object("prod-eval", uid=uid, status=status, spec={**TEMPLATE, **spec})


# -- the schedule ---------------------------------------------------------------------


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "last", "created", "now", "due"),
    [
        # Nothing before the first scheduled time after the suite was made.
        ({"cron": "0 3 * * *"}, None, "2024-06-03T02:00", "2024-06-03T02:59:59", None),
        ({"cron": "0 3 * * *"}, None, "2024-06-03T02:00", "2024-06-03T03:00:05", "03:00"),
        # Four hours missed: the latest one, once.
        ({"cron": "0 * * * *"}, "2024-06-03T08:00", CREATED, "2024-06-03T12:00:30", "12:00"),
        # The last one recorded: nothing until the next.
        ({"cron": "0 * * * *"}, "2024-06-03T12:00", CREATED, "2024-06-03T12:59:00", None),
        # Missed by 30 s: within a deadline of 60 s, past one of 20 s.
        (
            {"cron": "0 * * * *", "startingDeadlineSeconds": 60},
            "2024-06-03T08:00",
            CREATED,
            "2024-06-03T12:00:30",
            "12:00",
        ),
        (
            {"cron": "0 * * * *", "startingDeadlineSeconds": 20},
            "2024-06-03T08:00",
            CREATED,
            "2024-06-03T12:00:30",
            None,
        ),
        # Read in the time zone: 03:00 in Berlin (CEST) is 01:00 UTC.
        (
            {"cron": "0 3 * * *", "timeZone": "Europe/Berlin"},
            None,
            "2024-06-02T12:00",
            "2024-06-03T01:00:30",
            "01:00",
        ),
        ({"cron": "0 3 * * *"}, None, "2024-06-02T12:00", "2024-06-03T01:00:30", None),
        # Macros.
        ({"cron": "@daily"}, None, "2024-06-02T12:00", "2024-06-03T00:00:30", "00:00"),
        ({"cron": "@hourly"}, None, "2024-06-03T10:30", "2024-06-03T12:10", "12:00"),
    ],
)
def test_due_schedule_follows_a_cronjob(
    schedule: dict[str, Any],
    last: str | None,
    created: dt.datetime | str,
    now: str,
    due: str | None,
) -> None:
    made = created if isinstance(created, dt.datetime) else at(created)
    parsed = api.Schedule.model_validate(schedule)
    found, note = due_schedule(parsed, at(last) if last else None, made, at(now))
    assert note is None
    expected = None if due is None else at(f"{now[:10]}T{due}")
    assert found == expected


@pytest.mark.parametrize(
    ("cron", "day"),
    [
        # Cron (and a CronJob) count the days of the week from 0, Sunday.
        ("@weekly", "2024-06-02"),  # Sunday
        ("0 0 * * 0", "2024-06-02"),
        ("0 0 * * 1", "2024-06-03"),  # Monday
        ("0 0 * * 6", "2024-06-01"),  # Saturday
        ("0 0 * * 1-5", "2024-06-03"),
        ("0 0 * * 5", "2024-05-31"),  # Friday
        ("0 0 * * sun-tue", "2024-06-03"),
        ("0 0 * * fri,sat", "2024-06-01"),
        ("0 0 * * */3", "2024-06-02"),  # Sunday, Wednesday, Saturday (not Monday)
        ("0 0 * * 3-6/3", "2024-06-01"),  # Wednesday, Saturday
    ],
)
def test_days_of_the_week_count_from_sunday(cron: str, day: str) -> None:
    schedule = api.Schedule(cron=cron)
    # The latest time of the past week, seen on Monday 2024-06-03 at noon.
    found, _ = due_schedule(schedule, None, at("2024-05-27T12:00"), NOW)
    assert found == at(f"{day}T00:00")


def test_more_missed_times_than_looked_at_are_noted() -> None:
    schedule = api.Schedule(cron="* * * * *")
    found, note = due_schedule(schedule, None, NOW - dt.timedelta(days=2), NOW)
    assert found is not None and found <= NOW
    assert note is not None and "startingDeadlineSeconds" in note


def test_a_schedule_runs_the_latest_missed_time_once() -> None:
    world = World(suite({"triggers": {"schedule": {"cron": "0 * * * *"}}}))
    world.obj["status"] = {"lastScheduleTime": "2024-06-03T08:00:00Z"}
    decision = world.cycle()
    (name,) = created_names(decision)
    assert name == world.status["active"][0]
    (run,) = world.runs
    assert (run["trigger"], run["scheduledTime"]) == ("Schedule", "2024-06-03T12:00:00Z")
    assert world.status["lastScheduleTime"] == "2024-06-03T12:00:00Z"
    annotation = json.loads(
        decision.create[0]["metadata"]["annotations"][suites.TRIGGER_ANNOTATION]
    )
    assert annotation["scheduledTime"] == "2024-06-03T12:00:00Z"
    # Even with Allow, the missed 09:00, 10:00 and 11:00 never run.
    world.patch_spec(concurrencyPolicy="Allow")
    assert world.cycle(NOW + dt.timedelta(minutes=30)).create == ()
    assert world.cycle(NOW + dt.timedelta(minutes=60)).create != ()


def test_nothing_runs_before_the_first_scheduled_time() -> None:
    obj = suite({"triggers": {"schedule": {"cron": "0 3 * * *"}}}, created=at("2024-06-03T11:00"))
    decision = decide(obj)
    assert decision.create == ()
    assert decision.status is not None and "lastScheduleTime" not in decision.status
    assert decision.status["runs"] == [] and "message" not in decision.status


def test_a_time_missed_past_the_deadline_is_skipped() -> None:
    schedule = {"cron": "0 * * * *", "startingDeadlineSeconds": 20}
    obj = suite(
        {"triggers": {"schedule": schedule}},
        status={"lastScheduleTime": "2024-06-03T08:00:00Z"},
    )
    decision = decide(obj)  # 12:00 was missed by 30 s
    assert decision.create == ()
    assert decision.status is not None
    assert decision.status["lastScheduleTime"] == "2024-06-03T08:00:00Z"
    assert decision.status["runs"] == []


def test_a_time_forbid_held_past_the_deadline_never_runs() -> None:
    schedule = {"cron": "0 * * * *", "startingDeadlineSeconds": 30}
    world = World(suite({"triggers": {"schedule": schedule}}, request="first"))
    (first,) = created_names(world.cycle(at("2024-06-03T11:50")))
    held = at("2024-06-03T12:00")
    world.cycle(held + dt.timedelta(seconds=5))
    assert world.status["message"] == f"Schedule run waits: {first} is running (Forbid)"
    assert "lastScheduleTime" not in world.status, "a held time is not handled yet"
    world.cycle(held + dt.timedelta(seconds=45))
    assert "waits" not in world.status.get("message", ""), "past its deadline: not waiting"
    assert world.status["lastScheduleTime"] == format_time(held), "handled: skipped"
    assert world.cycle(held + dt.timedelta(seconds=46)).status is None
    world.finish(first, status={"state": "Complete", "reason": "Cancelled"})
    decision = world.cycle(held + dt.timedelta(seconds=50))
    assert decision.create == (), "the held time was skipped for good"
    assert [r["name"] for r in world.runs] == [first]
    assert world.cycle(at("2024-06-03T13:00:10")).create != (), "the next time runs"


def test_a_time_held_behind_a_request_is_handled_once_past_its_deadline() -> None:
    schedule = {"cron": "0 * * * *", "startingDeadlineSeconds": 30}
    world = World(suite({"triggers": {"schedule": schedule}}, request="go"))
    world.obj["status"] = {"lastScheduleTime": "2024-06-03T11:00:00Z"}
    noon = at("2024-06-03T12:00")
    (first,) = created_names(world.cycle(noon + dt.timedelta(seconds=10)))
    assert world.run(first)["trigger"] == suites.MANUAL, "a request first"
    world.cycle(noon + dt.timedelta(seconds=20))
    assert world.status["message"] == f"Schedule run waits: {first} is running (Forbid)"
    world.cycle(noon + dt.timedelta(seconds=45))
    assert world.status["lastScheduleTime"] == "2024-06-03T12:00:00Z"
    assert "message" not in world.status


@pytest.mark.parametrize(
    ("schedule", "field_name", "words"),
    [
        ({"cron": "61 * * * *"}, "spec.triggers.schedule.cron", "'61 * * * *'"),
        ({"cron": "0 0 * * 7"}, "spec.triggers.schedule.cron", "'0 0 * * 7'"),
        ({"cron": "0 0 * * 5-1"}, "spec.triggers.schedule.cron", "'0 0 * * 5-1'"),
        ({"cron": "*/0 * * * *"}, "spec.triggers.schedule.cron", "'*/0 * * * *'"),
        (
            {"cron": "@daily", "timeZone": "Mars/Olympus"},
            "spec.triggers.schedule.timeZone",
            "'Mars/Olympus'",
        ),
        # A folder of the zone database, and keys zoneinfo refuses to read.
        ({"cron": "@daily", "timeZone": "America"}, "spec.triggers.schedule.timeZone", "America"),
        ({"cron": "@daily", "timeZone": "/UTC"}, "spec.triggers.schedule.timeZone", "'/UTC'"),
        ({"cron": "@daily", "timeZone": "UTC/"}, "spec.triggers.schedule.timeZone", "'UTC/'"),
    ],
)
def test_a_schedule_the_parser_refuses_names_the_field_and_runs_nothing(
    schedule: dict[str, Any], field_name: str, words: str
) -> None:
    template = {**TEMPLATE, "limit": "1000"}
    spec = {"template": template, "triggers": {"schedule": schedule}}
    # Asked before deciding, by the cycle: no trigger to look at, no error.
    assert needs_baseline_items(SuiteObserved(SuiteView.from_object(suite(spec))), NOW) is None
    obj = suite(spec, request="now")
    observed = SuiteObserved(SuiteView.from_object(obj))
    assert needs_baseline_items(observed, NOW) is None
    decision = decide_suite(observed, NOW)
    assert decision.create == () and decision.delete == ()
    assert decision.status is not None
    valid = condition(decision.status, "Valid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert valid["message"].startswith(f"{field_name}: ") and words in valid["message"]
    assert decision.status["message"] == valid["message"]
    assert "lastRunRequest" not in decision.status
    assert decide(decision_obj(obj, decision)).status is None


def decision_obj(obj: Mapping[str, Any], decision: SuiteDecision) -> dict[str, Any]:
    """`obj` with the status `decision` wrote (unchanged when it wrote none)."""
    return {**obj, "status": obj["status"] if decision.status is None else decision.status}


def test_a_spec_that_does_not_parse_names_the_field() -> None:
    obj = suite({"criteria": [{"task": TASK, "maxDrop": 0}]}, request="now")
    decision = decide(obj)
    assert decision.create == () and decision.status is not None
    valid = condition(decision.status, "Valid")
    assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
    assert valid["message"].startswith("spec.criteria.0.maxDrop")


# -- concurrency ----------------------------------------------------------------------


def test_forbid_holds_a_trigger_until_the_active_run_ends() -> None:
    world = World(suite(request="first"))
    (first,) = created_names(world.cycle())
    world.request("second")
    decision = world.cycle(NOW + dt.timedelta(seconds=10))
    assert decision.create == () and decision.delete == ()
    assert world.status["message"] == f"Manual run waits: {first} is running (Forbid)"
    assert world.status["lastRunRequest"] == "first"
    assert condition(world.status, "Running")["status"] == "True"
    world.finish(first, SAME)
    decision = world.cycle(NOW + dt.timedelta(seconds=20))
    (second,) = created_names(decision)
    assert second != first
    assert world.status["lastRunRequest"] == "second" and "message" not in world.status
    assert world.run(first)["state"] == suites.FINISHED
    assert world.status["active"] == [second]


def test_replace_deletes_the_active_run_and_records_it_replaced() -> None:
    world = World(suite({"concurrencyPolicy": "Replace"}, request="first"))
    (first,) = created_names(world.cycle())
    world.request("second")
    decision = world.cycle(NOW + dt.timedelta(seconds=10))
    (second,) = created_names(decision)
    assert decision.delete == (first,)
    replaced = world.run(first)
    assert (replaced["state"], replaced["reason"]) == (suites.FAILED, "Replaced")
    assert replaced["message"] == "replaced by a Manual run (Replace)"
    assert replaced["finished"] == format_time(NOW + dt.timedelta(seconds=10))
    assert world.status["active"] == [second]
    assert world.status["lastVerdict"] == suites.FAILED


def test_allow_runs_beside_the_active_run() -> None:
    world = World(suite({"concurrencyPolicy": "Allow"}, request="first"))
    (first,) = created_names(world.cycle())
    world.request("second")
    decision = world.cycle(NOW + dt.timedelta(seconds=10))
    (second,) = created_names(decision)
    assert decision.delete == ()
    assert world.status["active"] == [first, second]
    running = condition(world.status, "Running")
    assert running["status"] == "True" and running["message"] == f"{first}, {second}"


# -- triggers -------------------------------------------------------------------------


def test_a_new_request_starts_one_run_and_the_same_value_none() -> None:
    world = World(suite(request="2024-06-03T12:00:00Z"))
    decision = world.cycle()
    (name,) = created_names(decision)
    assert world.status["lastRunRequest"] == "2024-06-03T12:00:00Z"
    assert world.run(name)["trigger"] == suites.MANUAL
    assert ("Normal", "RunCreated", f"Manual run {name} created") in decision.events
    world.patch_spec(concurrencyPolicy="Allow")
    for minutes in (5, 6):
        again = world.cycle(NOW + dt.timedelta(minutes=minutes))
        assert again.create == () and again.events == ()
    assert again.status is None
    assert [r["name"] for r in world.runs] == [name]


def test_a_model_change_starts_a_run_for_each_new_revision() -> None:
    spec = {
        "triggers": {"modelChange": {"inferenceService": {"name": "granite"}}},
        "concurrencyPolicy": "Allow",
    }
    world = World(suite(spec), model=ModelRevision(revision="granite-predictor-00001"))
    decision = world.cycle()
    (first,) = created_names(decision)
    run = world.run(first)
    assert (run["trigger"], run["revision"]) == (suites.MODEL_CHANGE, "granite-predictor-00001")
    assert world.status["lastModelRevision"] == "granite-predictor-00001"
    note = json.loads(decision.create[0]["metadata"]["annotations"][suites.TRIGGER_ANNOTATION])
    assert note == {
        "trigger": "ModelChange",
        "key": "model/granite-predictor-00001",
        "revision": "granite-predictor-00001",
    }
    assert world.cycle(NOW + dt.timedelta(seconds=10)).create == (), "the same revision"
    world.model = ModelRevision(revision="granite-predictor-00002")
    (second,) = created_names(world.cycle(NOW + dt.timedelta(seconds=20)))
    assert world.run(second)["revision"] == "granite-predictor-00002" and second != first


def test_an_unreadable_inference_service_is_reported_and_starts_nothing() -> None:
    spec = {"triggers": {"modelChange": {"inferenceService": {"name": "granite"}}}}
    problem = "spec.triggers.modelChange.inferenceService: InferenceService granite not found"
    decision = decide(suite(spec), model=ModelRevision(problem=problem))
    assert decision.create == ()
    assert decision.status is not None and decision.status["message"] == problem
    assert "lastModelRevision" not in decision.status
    assert condition(decision.status, "Valid")["status"] == "True"


def test_one_run_per_cycle_manual_then_model_change_then_schedule() -> None:
    spec = {
        "triggers": {
            "schedule": {"cron": "0 * * * *"},
            "modelChange": {"inferenceService": {"name": "granite"}},
        },
        "concurrencyPolicy": "Allow",
    }
    world = World(suite(spec, request="by-hand"), model=ModelRevision(revision="rev-1"))
    kinds = []
    for second in range(4):
        decision = world.cycle(NOW + dt.timedelta(seconds=second))
        assert len(decision.create) <= 1
        kinds += [world.run(name)["trigger"] for name in created_names(decision)]
    assert kinds == [suites.MANUAL, suites.MODEL_CHANGE, suites.SCHEDULE]
    assert world.status["lastRunRequest"] == "by-hand"
    assert world.status["lastModelRevision"] == "rev-1"
    assert world.status["lastScheduleTime"] == "2024-06-03T12:00:00Z"


def test_suspend_starts_no_run_and_says_so() -> None:
    world = World(suite({"suspend": True}, request="now"))
    decision = world.cycle()
    assert decision.create == ()
    assert world.status["message"] == "suspended: no new runs (spec.suspend)"
    assert "lastRunRequest" not in world.status
    world.patch_spec(suspend=False)
    assert len(world.cycle(NOW + dt.timedelta(seconds=10)).create) == 1, "the request, resumed"


# -- run names ------------------------------------------------------------------------


def test_run_names_are_derived_from_the_suite_uid_and_the_trigger() -> None:
    view = SuiteView.from_object(suite())
    manual = suites.Trigger(suites.MANUAL, "manual/a", request="a")
    assert run_name(view, manual) == run_name(SuiteView.from_object(suite()), manual)
    assert re.fullmatch(r"evals-[0-9a-f]{8}", run_name(view, manual))
    other_trigger = suites.Trigger(suites.MANUAL, "manual/b", request="b")
    other_suite = SuiteView.from_object(suite(uid="6f1c1d1e-0000-4000-8000-5111e0000002"))
    names = {run_name(view, manual), run_name(view, other_trigger), run_name(other_suite, manual)}
    assert len(names) == 3
    # The name the decision creates is that name.
    decision = decide(suite(request="a"))
    assert created_names(decision) == [run_name(view, manual)]


def test_a_run_of_the_longest_suite_name_fits_a_label() -> None:
    name = "s" * api.SUITE_NAME_MAX
    view = SuiteView.from_object(suite(name=name))
    key = "schedule/" + format_time(NOW) + "x" * 600
    made = run_name(view, suites.Trigger(suites.SCHEDULE, key, scheduled_time=NOW))
    assert len(made) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", made)
    assert len(made) + len("-abcdef") <= 63, "its pod's name too"


# -- the baseline ---------------------------------------------------------------------


def start_one(
    status_runs: list[dict[str, Any]],
    jobs: Mapping[str, RunJob],
    *,
    spec: Mapping[str, Any] | None = None,
    pinned: RunJob | None = None,
) -> dict[str, Any]:
    """The entry of the run a request starts now, with these runs recorded."""
    obj = suite(
        {"concurrencyPolicy": "Allow", "passingRunsHistoryLimit": 20, **(spec or {})},
        status={"runs": status_runs},
        request="go",
    )
    decision = decide(obj, runs=jobs, pinned=pinned)
    (name,) = created_names(decision)
    assert decision.status is not None
    found: dict[str, Any] = next(r for r in decision.status["runs"] if r["name"] == name)
    return found


LASTPASSED_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "the latest that passed": ({}, "p2"),
    "its job is gone": ({"drop": "p2"}, "p1"),
    "its job is another object now": ({"uid": ("p2", "uid-new")}, "p1"),
    "its settings differ": ({"digest": "p2"}, "p1"),
}


@pytest.mark.parametrize("case", LASTPASSED_CASES)
def test_last_passed_picks_the_latest_passed_run_still_there_and_comparable(case: str) -> None:
    change, expected = LASTPASSED_CASES[case]
    runs = [
        entry("p1", "Passed"),
        entry("r1", "Regressed"),
        entry("p2", "Passed"),
        entry("i1", "Inconclusive"),
        entry("f1", None, reason="Failed"),
    ]
    if "digest" in change:
        runs[2]["specDigest"] = comparable_digest({**TEMPLATE, "numFewShot": 5})
    jobs = {r["name"]: job(r["name"], status=SUCCEEDED) for r in runs}
    if "drop" in change:
        del jobs[change["drop"]]
    if "uid" in change:
        name, uid = change["uid"]
        jobs[name] = job(name, uid=uid, status=SUCCEEDED)
    started = start_one(runs, jobs, pinned=None)
    assert (started["baseline"], started["baselineUid"]) == (expected, f"uid-{expected}")
    assert "reason" not in started and "message" not in started


def test_passed_runs_whose_settings_differ_are_named_when_none_is_used() -> None:
    other = comparable_digest({**TEMPLATE, "limit": "10"})
    started = start_one([entry("p1", "Passed", specDigest=other)], {"p1": job("p1")})
    assert "baseline" not in started and started["reason"] == "NoBaseline"
    assert "passed runs not used: p1 (its evaluation settings differ" in started["message"]


def test_no_passed_run_falls_back_to_the_pinned_job() -> None:
    spec = {"baseline": {"pinned": "prod-eval"}}
    pinned = RunJob.from_object(pinned_base())
    started = start_one([entry("r1", "Regressed")], {"r1": job("r1")}, spec=spec, pinned=pinned)
    assert (started["baseline"], started["baselineUid"]) == ("prod-eval", "uid-prod")


def test_a_missing_pinned_job_is_baseline_missing() -> None:
    started = start_one([], {}, spec={"baseline": {"pinned": "prod-eval"}}, pinned=None)
    assert "baseline" not in started and started["reason"] == "BaselineMissing"
    assert started["message"] == "spec.baseline.pinned: LMEvalJob prod-eval does not exist"


def test_a_pinned_job_with_other_settings_is_not_comparable() -> None:
    pinned = RunJob.from_object(pinned_base(tasks=[TASK, "hellaswag"], limit="100"))
    started = start_one([], {}, spec={"baseline": {"pinned": "prod-eval"}}, pinned=pinned)
    assert "baseline" not in started and started["reason"] == "NotComparable"
    assert started["message"].startswith("spec.baseline.pinned: LMEvalJob prod-eval differs")
    assert "in tasks, limit, so its scores are not comparable" in started["message"]


def test_no_passed_run_and_no_pin_is_no_baseline() -> None:
    started = start_one([entry("r1", "Regressed")], {"r1": job("r1")})
    assert "baseline" not in started and started["reason"] == "NoBaseline"
    assert "spec.baseline.pinned is not set" in started["message"]


def test_policy_pinned_ignores_passed_runs() -> None:
    spec = {"baseline": {"policy": "Pinned", "pinned": "prod-eval"}}
    pinned = RunJob.from_object(pinned_base())
    started = start_one([entry("p1", "Passed")], {"p1": job("p1")}, spec=spec, pinned=pinned)
    assert started["baseline"] == "prod-eval"


# -- verdicts -------------------------------------------------------------------------


def pinned_world(**spec: Any) -> World:
    """A suite with a pinned baseline that succeeded with RIGHT, its run started."""
    world = World(
        suite({"baseline": {"pinned": "prod-eval"}, **spec}, request="go"),
        pinned=pinned_base(),
        items={"uid-prod": read(RIGHT)},
    )
    world.cycle()
    assert len(world.jobs) == 1 and world.runs[0]["baseline"] == "prod-eval"
    return world


@pytest.mark.parametrize(
    ("base", "values", "verdict", "reason"),
    [
        (SAME, SAME, "Passed", "Passed"),
        (RIGHT, WORSE, "Regressed", "Regressed"),
    ],
)
def test_a_succeeded_run_gets_the_suites_verdict_with_the_numbers(
    base: list[float], values: list[float], verdict: str, reason: str
) -> None:
    world = pinned_world()
    world.items["uid-prod"] = read(base)
    (name,) = world.jobs
    world.cycle(NOW + dt.timedelta(seconds=10))  # the run's UID recorded while it runs
    world.finish(name, values)
    decision = world.cycle(NOW + dt.timedelta(minutes=5))
    assert sorted(world.asked) == sorted([(name, f"uid-{name}"), ("prod-eval", "uid-prod")])
    run = world.run(name)
    assert (run["state"], run["verdict"], run["reason"]) == ("Finished", verdict, reason)
    assert run["finished"] == format_time(NOW + dt.timedelta(minutes=5))
    (criterion,) = run["criteria"]
    assert (criterion["task"], criterion["metric"], criterion["tier"]) == (TASK, METRIC, "Must")
    assert criterion["paired"] == N and criterion["pValue"] is not None
    # Passed only with the power to see a drop of maxDrop.
    assert (criterion["minimumDetectableDrop"] <= 0.05) is (verdict == "Passed")
    expected_difference = (sum(values) - sum(base)) / N
    assert criterion["difference"] == pytest.approx(expected_difference)
    assert world.status["lastVerdict"] == verdict and world.status["active"] == []
    assert condition(world.status, "Passed")["status"] == str(verdict == "Passed")
    assert condition(world.status, "Regressed")["status"] == str(verdict == "Regressed")
    kind = "Normal" if verdict == "Passed" else "Warning"
    assert [e[:2] for e in decision.events] == [(kind, f"Run{verdict}")]
    # Once recorded, a verdict is never decided again, whatever becomes of the job.
    world.finish(name, status={"state": "Complete", "reason": "Failed"})
    assert world.cycle(NOW + dt.timedelta(minutes=6)).status is None
    assert world.asked == []


def test_a_run_recorded_without_its_uid_is_judged_on_its_scores() -> None:
    world = pinned_world()
    (name,) = world.jobs
    assert "uid" not in world.run(name)
    world.finish(name, RIGHT)  # succeeded before any cycle recorded its UID
    world.cycle(NOW + dt.timedelta(minutes=5))
    assert (name, f"uid-{name}") in world.asked
    run = world.run(name)
    assert (run["verdict"], run["uid"]) == ("Passed", f"uid-{name}")


@pytest.mark.parametrize("reason", ["Failed", "Cancelled"])
def test_a_run_whose_job_failed_is_failed_with_its_reason(reason: str) -> None:
    world = pinned_world()
    (name,) = world.jobs
    world.finish(name, status={"state": "Complete", "reason": reason, "message": "lm_eval: boom"})
    decision = world.cycle(NOW + dt.timedelta(minutes=5))
    run = world.run(name)
    assert (run["state"], run["reason"]) == (suites.FAILED, reason)
    assert run["message"] == f"LMEvalJob {name} ended {reason}: lm_eval: boom"
    assert "verdict" not in run and world.status["lastVerdict"] == suites.FAILED
    assert ("Warning", "RunFailed", run["message"]) in decision.events
    assert condition(world.status, "Passed")["reason"] == reason
    assert world.asked == []


@pytest.mark.parametrize("replaced", [False, True])
def test_a_run_deleted_before_its_verdict_is_run_missing(replaced: bool) -> None:
    world = pinned_world()
    (name,) = world.jobs
    world.cycle(NOW + dt.timedelta(seconds=10))
    if replaced:
        world.jobs[name]["metadata"]["uid"] = "uid-someone-else"
    else:
        del world.jobs[name]
    world.cycle(NOW + dt.timedelta(minutes=5))
    run = world.run(name)
    assert (run["state"], run["reason"]) == (suites.FAILED, "RunMissing")
    assert run["message"] == f"LMEvalJob {name} was deleted before its verdict"


def test_a_baseline_gone_makes_the_run_inconclusive() -> None:
    world = pinned_world()
    (name,) = world.jobs
    assert world.pinned is not None
    world.pinned["metadata"]["uid"] = "uid-prod-recreated"  # another object, same name
    world.finish(name, RIGHT)
    world.cycle(NOW + dt.timedelta(minutes=5))
    assert world.asked == [], "no scores read for a comparison that cannot be made"
    run = world.run(name)
    assert (run["verdict"], run["reason"]) == ("Inconclusive", "BaselineMissing")
    assert run["message"] == ("baseline prod-eval is gone, or is another object under its name now")
    assert world.status["lastVerdict"] == "Inconclusive"


def test_a_run_waits_for_its_pinned_baseline_still_running() -> None:
    world = pinned_world()
    (name,) = world.jobs
    assert world.pinned is not None
    world.pinned["status"] = dict(RUNNING)
    world.finish(name, RIGHT)
    world.cycle(NOW + dt.timedelta(minutes=5))
    assert world.asked == [] and world.run(name)["state"] == suites.ACTIVE
    world.pinned["status"] = dict(SUCCEEDED)
    world.cycle(NOW + dt.timedelta(minutes=6))
    assert sorted(world.asked) == sorted([(name, f"uid-{name}"), ("prod-eval", "uid-prod")])
    assert world.run(name)["verdict"] == "Passed"


def test_a_run_without_a_baseline_is_inconclusive_no_baseline() -> None:
    world = World(suite(request="go"))
    (name,) = created_names(world.cycle())
    world.finish(name, RIGHT)
    world.cycle(NOW + dt.timedelta(minutes=5))
    assert world.asked == []
    run = world.run(name)
    assert (run["verdict"], run["reason"]) == ("Inconclusive", "NoBaseline")
    assert condition(world.status, "Passed")["status"] == "False"


def test_a_passed_run_becomes_the_next_runs_baseline() -> None:
    world = pinned_world()
    (first,) = world.jobs
    world.finish(first, RIGHT)
    world.request("again")
    (second,) = created_names(world.cycle(NOW + dt.timedelta(minutes=5)))
    assert world.run(first)["verdict"] == "Passed"
    assert (world.run(second)["baseline"], world.run(second)["baselineUid"]) == (
        first,
        f"uid-{first}",
    )


# -- the power check before a run -----------------------------------------------------


def test_a_limit_too_small_for_max_drop_is_underpowered_without_a_job() -> None:
    template = {**TEMPLATE, "limit": "20"}
    criteria = [{"task": TASK, "metric": METRIC, "maxDrop": 0.02}]
    world = World(suite({"template": template, "criteria": criteria}, request="go"))
    decision = world.cycle()
    assert decision.create == () and world.jobs == {}
    (run,) = world.runs
    assert (run["state"], run["verdict"], run["reason"]) == (
        "Finished",
        "Inconclusive",
        "Underpowered",
    )
    assert run["message"].startswith("1 Must criterion(s) cannot detect their maxDrop with at")
    (criterion,) = run["criteria"]
    assert criterion["reason"] == "Underpowered" and criterion["verdict"] == "Inconclusive"
    assert criterion["minimumDetectableDrop"] > 0.02
    assert criterion["message"].startswith("spec.template.limit 20: 20 documents detect a drop")
    assert "maxDrop 0.02 needs" in criterion["message"]
    assert world.status["lastRunRequest"] == "go", "the request is handled"
    assert world.status["lastVerdict"] == "Inconclusive" and world.status["active"] == []
    assert [e[:2] for e in decision.events] == [("Warning", "RunInconclusive")]
    assert condition(world.status, "Passed")["reason"] == "Underpowered"


def test_a_large_limit_makes_a_run() -> None:
    template = {**TEMPLATE, "limit": "100000"}
    criteria = [{"task": TASK, "metric": METRIC, "maxDrop": 0.02}]
    decision = decide(suite({"template": template, "criteria": criteria}, request="go"))
    assert len(decision.create) == 1


def test_only_must_criteria_are_checked_before_a_run() -> None:
    template = {**TEMPLATE, "limit": "20"}
    criteria = [{"task": TASK, "metric": METRIC, "maxDrop": 0.02, "tier": "Should"}]
    decision = decide(suite({"template": template, "criteria": criteria}, request="go"))
    assert len(decision.create) == 1


@pytest.mark.parametrize(("values", "starts"), [(None, False), (RIGHT, True)])
def test_the_power_check_uses_the_baselines_scores(
    values: list[float] | None, starts: bool
) -> None:
    # 300 documents: the [0, 1] worst case cannot see a drop of 0.05, a baseline
    # that got every document right (the sd a drop of 0.05 implies) can.
    template = {**TEMPLATE, "limit": "300"}
    world = World(
        suite({"template": template, "baseline": {"pinned": "prod-eval"}}, request="go"),
        pinned=pinned_base(limit="300"),
        items={} if values is None else {"uid-prod": read(values)},
    )
    decision = world.cycle()
    assert world.asked == [("prod-eval", "uid-prod")]
    assert (len(decision.create) == 1) is starts
    assert world.runs[0]["state"] == (suites.ACTIVE if starts else suites.FINISHED)


def test_baseline_scores_are_asked_for_only_when_a_run_is_about_to_start() -> None:
    template = {**TEMPLATE, "limit": "300"}
    spec = {"template": template, "baseline": {"pinned": "prod-eval"}}
    pinned = RunJob.from_object(pinned_base(limit="300"))
    for obj, wanted in [
        (suite(spec, request="go"), ("prod-eval", "uid-prod")),
        (suite(spec), None),  # no trigger
        (suite({**spec, "suspend": True}, request="go"), None),
        (suite({**spec, "template": TEMPLATE}, request="go"), None),  # no limit
    ]:
        observed = SuiteObserved(SuiteView.from_object(obj), pinned=pinned)
        assert needs_baseline_items(observed, NOW) == wanted


# -- adoption -------------------------------------------------------------------------


def test_a_proven_run_the_status_does_not_list_is_adopted() -> None:
    note = {
        "trigger": "Schedule",
        "key": "schedule/2024-06-03T12:00:00Z",
        "scheduledTime": "2024-06-03T12:00:00Z",
    }
    world = World(suite(), jobs={"evals-lost": job_object("evals-lost", trigger=note)})
    decision = world.cycle()
    assert decision.create == ()
    (run,) = world.runs
    assert (run["name"], run["uid"], run["state"]) == ("evals-lost", "uid-evals-lost", "Active")
    assert (run["trigger"], run["scheduledTime"]) == ("Schedule", "2024-06-03T12:00:00Z")
    assert run["started"] == format_time(NOW) and run["reason"] == "NoBaseline"
    assert world.status["active"] == ["evals-lost"]


@pytest.mark.parametrize("policy", ["Forbid", "Replace", "Allow"])
def test_a_run_made_before_a_crash_is_adopted_with_its_trigger(policy: str) -> None:
    spec = {
        "concurrencyPolicy": policy,
        "triggers": {
            "schedule": {"cron": "0 * * * *"},
            "modelChange": {"inferenceService": {"name": "granite"}},
        },
    }
    world = World(suite(spec, request="go"), model=ModelRevision(revision="rev-1"))
    world.obj["status"] = {
        "lastScheduleTime": "2024-06-03T12:00:00Z",
        "lastModelRevision": "rev-1",
    }
    (name,) = created_names(world.cycle())
    world.obj["status"] = {  # the status write was lost
        "lastScheduleTime": "2024-06-03T12:00:00Z",
        "lastModelRevision": "rev-1",
    }
    decision = world.cycle(NOW + dt.timedelta(seconds=10))
    assert decision.create == () and decision.delete == ()
    assert [r["name"] for r in world.runs] == [name]
    assert world.run(name)["state"] == suites.ACTIVE
    assert world.status["lastRunRequest"] == "go" and "message" not in world.status
    assert world.cycle(NOW + dt.timedelta(seconds=20)).status is None


def test_runs_without_the_proof_are_not_the_suites() -> None:
    # The cycle passes proven runs only: an LMEvalJob named like a run but not
    # passed is neither adopted nor a baseline.
    runs = [entry("p1", "Passed")]
    obj = suite(status={"runs": runs}, request="go")
    decision = decide(obj, runs={})
    assert decision.status is not None
    (started,) = [r for r in decision.status["runs"] if r["name"] != "p1"]
    assert started["reason"] == "NoBaseline"


# -- history --------------------------------------------------------------------------


def history(*verdicts: str | None) -> list[dict[str, Any]]:
    return [entry(f"r{i}", verdict) for i, verdict in enumerate(verdicts)]


@pytest.mark.parametrize(
    ("verdicts", "limits", "kept", "deleted"),
    [
        # Passed r0 r1 r2 r4, limit 2: r0 and r1 go; not passed r3 r5 r6, limit 1.
        (
            ["Passed", "Passed", "Passed", "Regressed", "Passed", None, "Inconclusive"],
            (2, 1),
            ["r2", "r4", "r6"],
            ["r0", "r1", "r3", "r5"],
        ),
        # No passed run kept but the current baseline (r2, the latest Passed).
        (["Passed", "Passed", "Passed", "Regressed"], (0, 1), ["r2", "r3"], ["r0", "r1"]),
        # Limits that keep all.
        (["Passed", "Regressed"], (3, 1), ["r0", "r1"], []),
        # No failing run kept.
        (["Regressed", None, "Passed"], (3, 0), ["r2"], ["r0", "r1"]),
    ],
)
def test_history_limits_delete_the_oldest_but_never_the_baseline(
    verdicts: list[str | None], limits: tuple[int, int], kept: list[str], deleted: list[str]
) -> None:
    runs = history(*verdicts)
    jobs = {r["name"]: job(r["name"], status=SUCCEEDED) for r in runs}
    obj = suite(
        {"passingRunsHistoryLimit": limits[0], "failingRunsHistoryLimit": limits[1]},
        status={"runs": runs},
    )
    decision = decide(obj, runs=jobs)
    assert decision.status is not None
    assert [r["name"] for r in decision.status["runs"]] == kept
    assert sorted(decision.delete) == deleted


def test_history_deletes_only_jobs_that_exist() -> None:
    runs = history("Regressed", "Regressed", "Regressed")
    obj = suite({"failingRunsHistoryLimit": 1}, status={"runs": runs})
    decision = decide(obj, runs={"r1": job("r1"), "r2": job("r2")})
    assert decision.status is not None
    assert [r["name"] for r in decision.status["runs"]] == ["r2"]
    assert decision.delete == ("r1",)


def test_the_baseline_of_an_active_run_is_kept() -> None:
    # With Allow, r0 is still the baseline of the active run r1 when r2 passes.
    runs = [
        entry("r0", "Passed"),
        {
            **entry("r1", None),
            "state": "Active",
            "baseline": "r0",
            "baselineUid": "uid-r0",
            "reason": None,
        },
        entry("r2", "Passed"),
    ]
    runs[1].pop("finished")
    runs[1].pop("reason")
    jobs = {"r0": job("r0", status=SUCCEEDED), "r1": job("r1", status=RUNNING)}
    jobs["r2"] = job("r2", status=SUCCEEDED)
    obj = suite({"passingRunsHistoryLimit": 1, "concurrencyPolicy": "Allow"}, status={"runs": runs})
    decision = decide(obj, runs=jobs)
    assert decision.status is not None
    assert [r["name"] for r in decision.status["runs"]] == ["r0", "r1", "r2"]
    assert decision.delete == ()


def test_status_runs_stay_within_their_bound() -> None:
    limit = 20
    finished = history(*(["Passed"] * limit + ["Regressed"] * limit))
    active = []
    for i in range(limit * 2, api.MAX_RUNS_KEPT):
        run = {**entry(f"r{i}", None), "state": "Active"}
        for key in ("finished", "reason"):
            run.pop(key, None)
        active.append(run)
    runs = finished + active
    assert len(runs) == api.MAX_RUNS_KEPT
    jobs = {r["name"]: job(r["name"], status=RUNNING) for r in runs}
    obj = suite(
        {
            "passingRunsHistoryLimit": limit,
            "failingRunsHistoryLimit": limit,
            "concurrencyPolicy": "Allow",
        },
        status={"runs": runs},
        request="one-more",
    )
    decision = decide(obj, runs=jobs)
    (new,) = created_names(decision)
    assert decision.status is not None
    names = [r["name"] for r in decision.status["runs"]]
    assert len(names) == api.MAX_RUNS_KEPT and names[-1] == new
    assert decision.delete == ("r0",), "the oldest finished run that is not the baseline"
    api.LMEvalSuiteStatus.model_validate(decision.status)


# -- status writes --------------------------------------------------------------------


STEADY_CASES: dict[str, tuple[dict[str, Any], dict[str, RunJob]]] = {
    "idle": (suite(), {}),
    "scheduled, not yet due": (
        suite({"triggers": {"schedule": {"cron": "0 3 * * *"}}}, created=at("2024-06-03T04:00")),
        {},
    ),
    "a request waiting (Forbid)": (
        suite(
            status={"runs": [{**entry("r0", None), "state": "Active"}]},
            request="go",
        ),
        {"r0": job("r0", status=RUNNING)},
    ),
    "suspended": (suite({"suspend": True}, request="go"), {}),
    "a schedule the parser refuses": (
        suite({"triggers": {"schedule": {"cron": "61 * * * *"}}}, request="go"),
        {},
    ),
    "a model that cannot be read": (
        suite({"triggers": {"modelChange": {"inferenceService": {"name": "gone"}}}}),
        {},
    ),
    "a history with verdicts": (
        suite(status={"runs": history("Passed", "Regressed")}),
        {"r0": job("r0", status=SUCCEEDED), "r1": job("r1", status=SUCCEEDED)},
    ),
}


@pytest.mark.parametrize("case", STEADY_CASES)
def test_a_decided_status_is_not_written_again(case: str) -> None:
    obj, jobs = STEADY_CASES[case]
    model = ModelRevision(problem="InferenceService gone not found")
    first = decide(obj, runs=jobs, model=model)
    assert first.status is not None
    again = decide(decision_obj(obj, first), runs=jobs, model=model)
    assert again.status is None and again.create == () and again.events == ()
    later = decide(decision_obj(obj, first), NOW + dt.timedelta(seconds=40), runs=jobs, model=model)
    assert later.status is None


def test_an_unreadable_status_is_written_again() -> None:
    obj = suite(status={"runs": "not a list", "somethingNew": 1})
    decision = decide(obj)
    assert decision.status is not None and decision.status["runs"] == []
    assert decide(decision_obj(obj, decision)).status is None


# -- the run's manifest ---------------------------------------------------------------


def test_the_manifest_is_the_template_owned_by_the_suite() -> None:
    template = {
        "model": "local-completions",
        "modelArgs": [{"name": "base_url", "value": "http://model:8000/v1/completions"}],
        "tasks": [TASK, "hellaswag"],
        "numFewShot": 5,
        "limit": "100000",
        "genArgs": [{"name": "temperature", "value": "0"}],
    }
    obj = suite({"template": template}, request="go")
    decision = decide(obj)
    (manifest,) = decision.create
    name = manifest["metadata"]["name"]
    assert (manifest["apiVersion"], manifest["kind"]) == (
        f"{api.API_GROUP}/{api.API_VERSION}",
        api.KIND,
    )
    meta = manifest["metadata"]
    assert meta["namespace"] == "ns" and meta["labels"] == {api.SUITE_LABEL: "evals"}
    (owner,) = meta["ownerReferences"]
    assert owner["controller"] is True
    assert (owner["kind"], owner["name"], owner["uid"]) == (api.SUITE_KIND, "evals", SUITE_UID)
    assert owner["apiVersion"] == f"{api.API_GROUP}/{api.API_VERSION}"
    assert manifest["spec"] == {**template, "logSamples": True}
    api.LMEvalJobSpec.model_validate(manifest["spec"])
    assert json.loads(meta["annotations"][suites.TRIGGER_ANNOTATION]) == {
        "trigger": "Manual",
        "key": "manual/go",
    }
    assert decision.status is not None
    (run,) = decision.status["runs"]
    assert run["name"] == name and run["specDigest"] == comparable_digest(template)
    # What the run's job reads back is the suite's run, with its trigger.
    read_back = RunJob.from_object({**manifest, "metadata": {**meta, "uid": "u"}})
    assert read_back.trigger == {"trigger": "Manual", "key": "manual/go"}
    assert comparable_digest(read_back.spec) == comparable_digest(template)
