"""The poller's first whole slice, on the real control plane.

Checks: a job goes New -> Scheduled -> Running -> Complete/Succeeded with
the results of a real lm_eval run in its status and ConfigMap, and
`kubectl wait --for=condition=Succeeded` finishes; a failing run ends
Failed with the driver's message; the job pod passes the restricted Pod
Security profile, mounts no token, and its ServiceAccount has no rights; an
idle cycle over finished jobs writes nothing; the CRD rejects bad specs with
field paths; and the poller, acting as its own ServiceAccount, is never
refused (no 403 in the audit log).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import api_client, service_account_kubeconfig

from poller import api
from poller.cycle.reconciler import CycleReport, Reconciler
from poller.jobpod import podspec
from poller.kube.client import Kube
from poller.service import PollingService
from tests.poller_fixtures import (
    BASE_SETTINGS,
    POLLER_NS,
    POLLER_USER,
    CapturedRun,
    Jobs,
    cycle_until,
    job_body,
    serve_log,
    set_settings,
    terminate,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def _condition(status: dict, kind: str) -> dict | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


def test_happy_path_results_in_status(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    control_plane: ControlPlane,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    created = jobs.create("happy", limit="4", modelArgs=[{"name": "pretrained", "value": "dummy"}])
    status = cycle_until(
        poller,
        lambda: jobs.status("happy").get("state") == "Scheduled" and jobs.status("happy"),
        what="Scheduled",
    )
    pod_name = status["podName"]
    assert pod_name == podspec.pod_name("happy", created["metadata"]["uid"])
    assert _condition(status, "Scheduled")["status"] == "True"

    cycle_until(poller, lambda: jobs.status("happy").get("state") == "Running", what="Running")
    running = _condition(jobs.status("happy"), "Running")
    assert running is not None and running["status"] == "True"

    serve_log(admin_api, jobs.namespace, pod_name, succeeded_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, pod_name, 0)
    final = cycle_until(
        poller,
        lambda: jobs.status("happy").get("state") == "Complete" and jobs.status("happy"),
        what="Complete",
    )
    assert final["reason"] == "Succeeded", final.get("message")
    assert json.loads(final["results"]) == succeeded_run.results
    assert final["resultsReduced"] is False
    generation = jobs.get("happy")["metadata"]["generation"]
    assert final["observedGeneration"] == generation
    for kind in ("Finished", "Succeeded"):
        condition = _condition(final, kind)
        assert condition is not None and condition["status"] == "True"
        assert condition["observedGeneration"] == generation
    assert _condition(final, "Running")["status"] == "False"

    configmap = client.CoreV1Api(admin_api).read_namespaced_config_map(
        final["resultsConfigMap"], jobs.namespace
    )
    assert json.loads(configmap.data["results.json"]) == succeeded_run.results
    assert configmap.metadata.owner_references[0].uid == created["metadata"]["uid"]

    waited = control_plane.kubectl(
        "wait",
        "-n",
        jobs.namespace,
        "--for=condition=Succeeded",
        "--timeout=10s",
        "lmevaljob/happy",
        check=False,
    )
    assert waited.returncode == 0, waited.stderr

    events = (
        client.CoreV1Api(admin_api)
        .list_namespaced_event(jobs.namespace, field_selector="involvedObject.name=happy")
        .items
    )
    assert {"Scheduled", "Running", "Succeeded"} <= {e.reason for e in events}


def test_failed_run_reports_driver_message(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    failed_run: CapturedRun,
    tmp_path: Path,
) -> None:
    jobs.create("sad")
    status = cycle_until(
        poller, lambda: jobs.status("sad").get("podName") and jobs.status("sad"), what="pod created"
    )
    serve_log(admin_api, jobs.namespace, status["podName"], failed_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, status["podName"], failed_run.exit_code)
    final = cycle_until(
        poller,
        lambda: jobs.status("sad").get("state") == "Complete" and jobs.status("sad"),
        what="Complete",
    )
    assert final["reason"] == "Failed"
    assert "no_such_task" in final["message"], final["message"]
    assert f"exit code {failed_run.exit_code}" in final["message"]
    assert _condition(final, "Succeeded")["status"] == "False"
    assert _condition(final, "Finished")["status"] == "True"
    assert "results" not in final


def test_pod_is_restricted_tokenless_and_rightless(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    control_plane: ControlPlane,
) -> None:
    client.CoreV1Api(admin_api).patch_namespace(
        jobs.namespace,
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    jobs.create(
        "strict",
        tasks=["toy_mc", "toy_gen"],
        numFewShot=2,
        batchSize="auto:4",
        logSamples=True,
        genArgs=[{"name": "temperature", "value": "0"}],
        pod={
            "resources": {"requests": {"cpu": 1, "memory": "1Gi"}},
            "env": [{"name": "EXTRA", "value": "1"}],
        },
        labels={"team": "evals"},
    )
    status = cycle_until(
        poller,
        lambda: jobs.status("strict").get("podName") and jobs.status("strict"),
        what="pod created despite restricted PSA",
    )
    pod = jobs.pod(status["podName"])
    assert pod.spec.automount_service_account_token is False
    assert pod.spec.service_account_name == "lmeval-job"
    assert not any(v.projected for v in pod.spec.volumes or [])  # no token volume
    main = pod.spec.containers[0]
    assert main.security_context.read_only_root_filesystem is True
    assert main.security_context.capabilities.drop == ["ALL"]
    assert main.resources.requests == {"cpu": "1", "memory": "1Gi"}
    assert pod.metadata.labels["team"] == "evals"
    assert pod.metadata.owner_references[0].block_owner_deletion is True
    command = main.command
    lm_eval_args = command[command.index("lm_eval") + 1 :]
    assert lm_eval_args == [
        "--model=dummy",
        "--tasks=toy_mc,toy_gen",
        "--num_fewshot=2",
        "--gen_kwargs=temperature=0",
        "--batch_size=auto:4",
        "--log_samples",
        "--device=cpu",
    ]
    env = {e.name: e.value for e in main.env}
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_DATASETS_OFFLINE"] == "1"
    assert env["EXTRA"] == "1"

    with api_client(
        service_account_kubeconfig(control_plane, jobs.namespace, "lmeval-job")
    ) as job_api:
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(job_api).list_namespaced_secret(jobs.namespace)
        assert refused.value.status == 403
        review = client.AuthorizationV1Api(job_api).create_self_subject_rules_review(
            client.V1SelfSubjectRulesReview(
                spec=client.V1SelfSubjectRulesReviewSpec(namespace=jobs.namespace)
            )
        )
    resources = {r for rule in review.status.resource_rules for r in rule.resources}
    assert resources == {
        "selfsubjectaccessreviews",
        "selfsubjectrulesreviews",
        "selfsubjectreviews",
    }


def test_settings_can_forbid_a_job(poller: Reconciler, jobs: Jobs) -> None:
    jobs.create("online", allowOnline=True)
    final = cycle_until(
        poller,
        lambda: jobs.status("online").get("state") == "Complete" and jobs.status("online"),
        what="Complete",
    )
    assert final["reason"] == "Failed"
    assert "allow-online" in final["message"]
    assert not jobs.pods()


def test_idle_cycle_writes_nothing(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    control_plane: ControlPlane,
) -> None:
    for index in range(6):
        jobs.create(f"idle-{index}")
    cycle_until(poller, lambda: len(jobs.pods()) == 6, what="six pods")
    for pod in jobs.pods():
        terminate(admin_api, jobs.namespace, pod.metadata.name, 3, "boom")
    cycle_until(
        poller,
        lambda: all(jobs.status(f"idle-{i}").get("state") == "Complete" for i in range(6)),
        what="all Complete",
    )
    # The cycle after a job finishes reads it once more by name (settled?).
    settling = poller.run_cycle()
    assert settling.patches == 0 and settling.errors == 0
    mark = control_plane.audit.mark()
    report = poller.run_cycle()
    # Finished jobs are not listed (status.state!=Complete), nor read: they
    # are kept by the store, and their series with it.
    assert (report.jobs, report.jobs_read, report.pods_read) == (0, 0, 0)
    assert report.patches == 0 and report.errors == 0
    assert len(report.retained) == 6

    def idle_calls() -> list | None:
        calls = control_plane.audit.calls_by(POLLER_USER, since=mark)
        return calls if len(calls) >= 4 else None

    calls = wait_for(idle_calls, timeout=10, what="the idle cycle's audit events")
    assert [c for c in calls if c.is_write] == []
    # The settings, the unfinished jobs, the live pods, and the suites (none here).
    assert sorted((c.verb, c.resource) for c in calls) == [
        ("get", "configmaps"),
        ("list", "lmevaljobs"),
        ("list", "lmevalsuites"),
        ("list", "pods"),
    ]


def test_poll_interval_changes_live(
    poller_kube: Kube, admin_api: client.ApiClient, namespace: str
) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, "poll-interval": "3s"})
    poller = Reconciler(poller_kube, settings_namespace=POLLER_NS, namespaces=[namespace])
    starts: list[float] = []
    lock = threading.Lock()

    def record(report: CycleReport | None, failure: BaseException | None) -> None:
        with lock:
            starts.append(time.monotonic())

    service = PollingService(poller, on_cycle=record)
    service.start()
    try:
        wait_for(lambda: len(starts) >= 2, timeout=15, what="two cycles at 3 s")
        with lock:
            old_gap = starts[1] - starts[0]
        assert old_gap > 2.5
        changed_at = time.monotonic()
        set_settings(admin_api, {**BASE_SETTINGS, "poll-interval": "0.5s"})

        def fast_gaps() -> bool:
            with lock:
                after = [t for t in starts if t > changed_at]
            return len(after) >= 4 and all(b - a < 1.0 for a, b in itertools.pairwise(after[1:]))

        wait_for(fast_gaps, timeout=3 + 5, what="cycles every 0.5 s")
        with lock:
            first_fast = [t for t in starts if t > changed_at][1]
        # The new spacing took effect within one old interval (plus one new one).
        assert first_fast - changed_at < 3.0 + 0.5 + 0.5
    finally:
        service.stop()
        set_settings(admin_api, dict(BASE_SETTINGS))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"tasks": ["toy_mc"]}, "spec.model"),
        ({"model": "dummy", "tasks": ["toy_mc"], "limit": "ten"}, "spec.limit"),
        ({"model": "dummy", "tasks": ["--output_path=/x"]}, "spec.tasks[0]"),
        ({"model": "--model=hf", "tasks": ["a"]}, "spec.model"),
        ({"model": "dummy", "tasks": []}, "spec.tasks"),
        (
            {"model": "dummy", "tasks": ["a"], "modelArgs": [{"name": "x", "value": "a,b=c"}]},
            "spec.modelArgs[0].value",
        ),
        ({"model": "dummy", "tasks": ["a"], "batchSize": "-1"}, "spec.batchSize"),
    ],
)
def test_crd_rejects_invalid_specs(
    poller_installed: ControlPlane,
    admin_api: client.ApiClient,
    namespace: str,
    spec: dict,
    field: str,
) -> None:
    body = job_body("bad")
    body["spec"] = spec
    with pytest.raises(ApiException) as rejected:
        client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
            api.API_GROUP, api.API_VERSION, namespace, api.PLURAL, body
        )
    assert rejected.value.status == 422
    assert field in rejected.value.body, rejected.value.body


def test_poller_was_never_refused(poller_installed: ControlPlane) -> None:
    """Runs after the tests above: the poller's identity met no 403 at all."""
    calls = poller_installed.audit.calls_by(POLLER_USER)
    assert calls, "the poller made no calls as its ServiceAccount"
    refused = [(c.verb, c.resource, c.subresource, c.namespace) for c in calls if c.code == 403]
    assert refused == []
