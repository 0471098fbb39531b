"""LMEvalSuites end to end: triggers, baselines chosen by rule, verdicts with power.

On the real control plane, the poller (in process, as its ServiceAccount)
runs both halves of its cycle: the suites' (`poller.cycle.suites`) and the
jobs' (the runs are LMEvalJobs). KServe's own InferenceService CRD is
installed from its Go module (no KServe controller: the test writes the
status as KServe would). Checks:

1. a model change: a suite pinned to a baseline job on the sample model
   server, triggered by an InferenceService's revision, runs real lm_eval at
   the first revision and is Passed against the pinned job (150 documents,
   every answer the same; `kubectl wait --for=condition=Passed`); the server
   is then made worse on purpose (30% of the prompts answered wrongly) and a
   new revision written: the new run is gated against the previous passing
   run, not the pinned job, and the suite is Regressed with the paired
   test's numbers (`kubectl wait --for=condition=Regressed`);
2. power before any pod: a suite whose template's limit (10 documents)
   cannot detect its maxDrop (0.02) records an Inconclusive run
   (Underpowered) with the numbers when asked for a run by hand, and no
   LMEvalJob or pod exists;
3. a schedule with a CronJob's semantics, on an injected clock: nothing
   before the first scheduled time; a run at it; Forbid holds the next time
   while the run goes on and runs it once it ended; Replace deletes the
   running run and starts a new one; failingRunsHistoryLimit 1 deletes the
   older failed run (its LMEvalJob gone); with startingDeadlineSeconds a
   time held past its deadline is skipped for good;
4. a cron the schema lets through but APScheduler refuses (61 * * * *)
   makes the suite Valid=False naming spec.triggers.schedule.cron, and no run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.kserve import inference_service_crd
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import LocalRunner

from poller import api
from poller.cycle.reconciler import Reconciler
from poller.kube.client import Kube
from tests.e2e.test_regression_gate import ITEMS, LOCAL_POD, METRIC, TASK, TASKS_CONFIGMAP
from tests.e2e.test_regression_gate import _tasks_configmap as tasks_configmap
from tests.poller_fixtures import POLLER_NS, Jobs, cycle_until
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

LMEVAL_TIMEOUT = 300.0
WRONG_SHARE = 0.3
KSERVE = ("serving.kserve.io", "v1beta1", "inferenceservices")
SUITE_REF = f"{api.SUITE_PLURAL}.{api.API_GROUP}"


@pytest.fixture(scope="module")
def kserve_crd(control_plane: ControlPlane) -> None:
    """KServe's InferenceService CRD, as KServe ships it (no controller)."""
    applied = control_plane.kubectl(
        "apply", "--server-side", "-f", str(inference_service_crd()), check=False
    )
    assert applied.returncode == 0, applied.stderr
    # kubectl wait (and, briefly, get) errs while the new CRD has no conditions yet:
    # ask until it is Established.
    query = '{.status.conditions[?(@.type=="Established")].status}'

    def established() -> bool:
        shown = control_plane.kubectl(
            "get",
            "crd/inferenceservices.serving.kserve.io",
            "-o",
            f"jsonpath={query}",
            check=False,
        )
        return shown.returncode == 0 and shown.stdout.strip() == "True"

    wait_for(established, timeout=120, what="KServe's InferenceService CRD Established")


@pytest.fixture
def server() -> Iterator[ModelServer]:
    """The sample model server, made worse on purpose by the test (wrong_share)."""
    with ModelServer(generation_text="42") as good:
        yield good


class Clock:
    """A clock the test moves (the suites' schedule reads the poller's clock)."""

    def __init__(self, start: dt.datetime) -> None:
        self.now = start

    def __call__(self) -> dt.datetime:
        return self.now


def _template(server: ModelServer, **extra: Any) -> dict[str, Any]:
    return {
        "model": "local-completions",
        "modelArgs": [
            {"name": "model", "value": "toy"},
            {"name": "base_url", "value": server.completions_url},
            {"name": "tokenizer_backend", "value": "remote"},
        ],
        "tasks": [TASK],
        "customTasks": [{"configMap": TASKS_CONFIGMAP}],
        "pod": LOCAL_POD,
        **extra,
    }


def _create_suite(jobs: Jobs, name: str, spec: dict[str, Any], **meta: Any) -> None:
    body = {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.SUITE_KIND,
        "metadata": {"name": name, **meta},
        "spec": spec,
    }
    jobs.custom.create_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.SUITE_PLURAL, body
    )


def _suite(jobs: Jobs, name: str) -> dict[str, Any]:
    found: dict[str, Any] = jobs.custom.get_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.SUITE_PLURAL, name
    )
    return found


def _patch_suite(jobs: Jobs, name: str, patch: dict[str, Any]) -> None:
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.SUITE_PLURAL, name, patch
    )


def _runs(jobs: Jobs, name: str) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = (_suite(jobs, name).get("status") or {}).get("runs") or []
    return runs


def _run_jobs(jobs: Jobs) -> set[str]:
    """The LMEvalJobs of the namespace that carry a suite's label."""
    listed = jobs.custom.list_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, label_selector=api.SUITE_LABEL
    )
    return {item["metadata"]["name"] for item in listed["items"]}


def _condition(suite: dict[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = (suite.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def _set_revision(jobs: Jobs, name: str, revision: str) -> None:
    """What KServe writes when a new predictor revision is ready."""
    status = {
        "url": f"http://{name}.{jobs.namespace}.example.com",
        "components": {"predictor": {"latestReadyRevision": revision}},
    }
    jobs.custom.patch_namespaced_custom_object_status(
        *KSERVE[:2], jobs.namespace, KSERVE[2], name, {"status": status}
    )


def _kubectl_wait(plane: ControlPlane, namespace: str, name: str, condition: str) -> int:
    done = plane.kubectl(
        "wait",
        "-n",
        namespace,
        f"--for=condition={condition}",
        f"{SUITE_REF}/{name}",
        "--timeout=20s",
        check=False,
    )
    return done.returncode


def test_a_new_revision_is_judged_against_the_last_passing_run(
    poller: Reconciler,
    jobs: Jobs,
    runner: LocalRunner,
    control_plane: ControlPlane,
    server: ModelServer,
    kserve_crd: None,
) -> None:
    jobs.core.create_namespaced_config_map(jobs.namespace, tasks_configmap())
    jobs.create("prod-eval", **_template(server, logSamples=True))
    model = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "toy-model"},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "huggingface"}}}},
    }
    jobs.custom.create_namespaced_custom_object(*KSERVE[:2], jobs.namespace, KSERVE[2], model)
    _set_revision(jobs, "toy-model", "toy-model-predictor-00001")
    _create_suite(
        jobs,
        "toy-ci",
        {
            "template": _template(server),
            "criteria": [{"task": TASK, "metric": METRIC, "maxDrop": 0.1}],
            "baseline": {"pinned": "prod-eval"},
            "triggers": {"modelChange": {"inferenceService": {"name": "toy-model"}}},
        },
    )

    # The first revision: a run, judged against the pinned job once both succeeded.
    first = cycle_until(
        poller,
        lambda: next((r for r in _runs(jobs, "toy-ci") if r.get("verdict")), None),
        timeout=LMEVAL_TIMEOUT,
        what="the first run's verdict",
    )
    assert first["verdict"] == "Passed", first
    assert (first["trigger"], first["revision"]) == ("ModelChange", "toy-model-predictor-00001")
    assert first["baseline"] == "prod-eval"
    (criterion,) = first["criteria"]
    assert criterion["paired"] == ITEMS and criterion["difference"] == 0
    assert criterion["minimumDetectableDrop"] <= 0.1 and criterion["reason"] == "NotRegressed"
    assert jobs.status(first["name"])["reason"] == "Succeeded"
    run_pod = jobs.pod(jobs.status(first["name"])["podName"]).spec
    assert run_pod is not None and "--log_samples" in (run_pod.containers[0].command or [])
    assert _kubectl_wait(control_plane, jobs.namespace, "toy-ci", "Passed") == 0

    # The same model, made worse; KServe says a new revision is ready.
    server.wrong_share = WRONG_SHARE
    _set_revision(jobs, "toy-model", "toy-model-predictor-00002")

    def second_verdict() -> dict[str, Any] | None:
        runs = _runs(jobs, "toy-ci")
        return runs[1] if len(runs) == 2 and runs[1].get("verdict") else None

    second = cycle_until(
        poller,
        second_verdict,
        timeout=LMEVAL_TIMEOUT,
        what="the second run's verdict",
    )
    assert second["verdict"] == "Regressed", second
    assert second["revision"] == "toy-model-predictor-00002"
    assert second["baseline"] == first["name"], "the last passing run is the baseline"
    (criterion,) = second["criteria"]
    wrong = server.count("wrong-answers")
    assert 0.15 * ITEMS < wrong < 0.45 * ITEMS, wrong
    assert criterion["paired"] == ITEMS
    assert criterion["difference"] == pytest.approx(-wrong / ITEMS)
    assert criterion["pValue"] < 1e-6 and criterion["verdict"] == "Regressed"
    suite = _suite(jobs, "toy-ci")
    assert suite["status"]["lastVerdict"] == "Regressed"
    assert suite["status"]["lastModelRevision"] == "toy-model-predictor-00002"
    assert _kubectl_wait(control_plane, jobs.namespace, "toy-ci", "Regressed") == 0
    assert _kubectl_wait(control_plane, jobs.namespace, "toy-ci", "Passed=false") == 0

    # Idle: a further cycle writes nothing to the suite.
    before = suite["metadata"]["resourceVersion"]
    report = poller.run_cycle()
    assert report.errors == 0, report.error_messages
    assert _suite(jobs, "toy-ci")["metadata"]["resourceVersion"] == before


def test_too_few_documents_are_inconclusive_before_any_pod(
    poller: Reconciler, jobs: Jobs, server: ModelServer
) -> None:
    _create_suite(
        jobs,
        "tiny",
        {
            "template": _template(server, limit="10"),
            "criteria": [{"task": TASK, "metric": METRIC, "maxDrop": 0.02}],
        },
        annotations={api.RUN_REQUESTED_ANNOTATION: "first"},
    )
    runs = cycle_until(poller, lambda: _runs(jobs, "tiny"), what="the suite's first run")
    (run,) = runs
    assert (run["verdict"], run["reason"], run["trigger"]) == (
        "Inconclusive",
        "Underpowered",
        "Manual",
    )
    (criterion,) = run["criteria"]
    assert "10 documents detect a drop of" in criterion["message"]
    assert "maxDrop 0.02 needs" in criterion["message"]
    assert criterion["minimumDetectableDrop"] > 0.02
    assert not _run_jobs(jobs) and not jobs.pods()
    condition = _condition(_suite(jobs, "tiny"), "Passed")
    assert condition is not None and condition["status"] == "False"
    assert condition["reason"] == "Underpowered"


def _cancel(jobs: Jobs, name: str) -> None:
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, name, {"spec": {"cancel": True}}
    )


def test_a_schedule_follows_a_cronjobs_rules(
    poller_kube: Kube, jobs: Jobs, server: ModelServer
) -> None:
    clock = Clock(dt.datetime.now(dt.UTC))
    poller = Reconciler(
        poller_kube, settings_namespace=POLLER_NS, namespaces=[jobs.namespace], clock=clock
    )
    # Runs land on kwok's nodes (no local placement), where their pods run until
    # the test cancels them.
    jobs.core.create_namespaced_config_map(jobs.namespace, tasks_configmap())
    template = {k: v for k, v in _template(server).items() if k != "pod"}
    _create_suite(
        jobs,
        "nightly",
        {
            "template": template,
            "criteria": [{"task": TASK, "metric": METRIC, "maxDrop": 0.1}],
            "triggers": {"schedule": {"cron": "* * * * *"}},
            "failingRunsHistoryLimit": 1,
        },
    )

    def cycle() -> None:
        report = poller.run_cycle()
        assert report.errors == 0, report.error_messages

    cycle()
    assert _runs(jobs, "nightly") == [], "nothing before the first scheduled time"
    minute = clock.now.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    clock.now = minute + dt.timedelta(seconds=5)
    cycle()
    (first,) = _runs(jobs, "nightly")
    assert (first["trigger"], first["scheduledTime"]) == ("Schedule", api_time(minute))
    assert first["state"] == "Active" and _run_jobs(jobs) == {first["name"]}

    # Forbid: the next time waits while the first run goes on ...
    clock.now += dt.timedelta(minutes=1)
    cycle()
    runs = _runs(jobs, "nightly")
    assert [r["name"] for r in runs] == [first["name"]], runs
    status = _suite(jobs, "nightly")["status"]
    assert "is running (Forbid)" in status["message"]
    # ... and runs once it ended (the job loop ends a cancelled run in the same cycles).
    _cancel(jobs, first["name"])
    runs = cycle_until(
        poller, lambda: (r := _runs(jobs, "nightly")) and len(r) == 2 and r, what="a second run"
    )
    assert runs[0]["state"] == "Failed" and runs[0]["reason"] == "Cancelled"
    second = runs[1]
    assert second["scheduledTime"] == api_time(minute + dt.timedelta(minutes=1))

    # Replace: the running run is deleted and a new one starts; the history keeps
    # one failed run, so the first one's LMEvalJob goes.
    _patch_suite(jobs, "nightly", {"spec": {"concurrencyPolicy": "Replace"}})
    clock.now += dt.timedelta(minutes=1)
    cycle()
    runs = _runs(jobs, "nightly")
    names = [r["name"] for r in runs]
    assert first["name"] not in names, "failingRunsHistoryLimit 1 keeps only the newest"
    replaced = next(r for r in runs if r["name"] == second["name"])
    assert (replaced["state"], replaced["reason"]) == ("Failed", "Replaced")
    third = runs[-1]
    assert third["state"] == "Active" and third["name"] != second["name"]
    wait_for(
        lambda: _run_jobs(jobs) == {third["name"]},
        timeout=60,
        what="the replaced and the pruned runs' LMEvalJobs deleted",
    )

    # startingDeadlineSeconds: a time held (Forbid) past its deadline is skipped for good.
    _patch_suite(
        jobs,
        "nightly",
        {
            "spec": {
                "concurrencyPolicy": "Forbid",
                "triggers": {"schedule": {"cron": "* * * * *", "startingDeadlineSeconds": 30}},
            }
        },
    )
    held = clock.now.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    clock.now = held + dt.timedelta(seconds=5)
    cycle()
    clock.now = held + dt.timedelta(seconds=45)
    cycle()
    # Held by Forbid past its deadline: recorded as handled, never run.
    assert _suite(jobs, "nightly")["status"]["lastScheduleTime"] == api_time(held)
    _cancel(jobs, third["name"])
    cycle_until(
        poller,
        lambda: _runs(jobs, "nightly")[-1]["state"] == "Failed",
        what="the third run ended",
    )
    assert _runs(jobs, "nightly")[-1]["name"] == third["name"], "the skipped time never ran"


def api_time(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_cron_the_parser_refuses_names_the_field(poller: Reconciler, jobs: Jobs) -> None:
    _create_suite(
        jobs,
        "bad-cron",
        {
            "template": {"model": "local-completions", "tasks": [TASK]},
            "criteria": [{"task": TASK, "maxDrop": 0.1}],
            "triggers": {"schedule": {"cron": "61 * * * *"}},
        },
        annotations={api.RUN_REQUESTED_ANNOTATION: "now"},
    )
    condition = cycle_until(
        poller,
        lambda: _condition(_suite(jobs, "bad-cron"), "Valid"),
        what="the suite's Valid condition",
    )
    assert condition["status"] == "False" and condition["reason"] == "InvalidSpec"
    assert condition["message"].startswith("spec.triggers.schedule.cron: '61 * * * *'")
    assert _runs(jobs, "bad-cron") == [] and not _run_jobs(jobs)


def test_the_schema_refuses_a_cron_that_is_not_one(jobs: Jobs) -> None:
    with pytest.raises(client.ApiException) as refused:
        _create_suite(
            jobs,
            "not-cron",
            {
                "template": {"model": "local-completions", "tasks": [TASK]},
                "criteria": [{"task": TASK, "maxDrop": 0.1}],
                "triggers": {"schedule": {"cron": "every night"}},
            },
        )
    assert refused.value.status == 422
    assert "spec.triggers.schedule.cron" in str(refused.value.body)
