"""The complete job lifecycle on the real control plane.

Checks each way a job can end or pause, with the words the user reads:
pods stuck Pending (Unschedulable from the real scheduler, image pull and
container config errors reported by the "kubelet"), OOM kills and signals,
pods deleted or evicted under a running job (never re-created), cancel
(spec.cancel and a seed-style status.state Cancelled), suspend and resume,
activeDeadlineSeconds, ttlSecondsAfterFinished with garbage collection, the
log archive kept before a pod is deleted, progress in status (read after
every transition of the cycle, at most progress-reads-per-cycle), a missing
custom-task ConfigMap, and FIFO queueing under max-running-jobs across two
namespaces.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from kubernetes import client
from lmeval_sandbox import kwok
from lmeval_sandbox.controlplane import ControlPlane

from driver.protocol import encode_marker
from poller import api
from poller.cycle.reconciler import Reconciler
from poller.kube.client import Kube, LogTail
from poller.results.lmeval import LOG_ARCHIVE_KEY
from tests.poller_fixtures import (
    BASE_SETTINGS,
    JOB_SA_MANIFEST,
    POLLER_NS,
    CapturedRun,
    Jobs,
    cycle_until,
    serve_log,
    set_settings,
    terminate,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def _complete(poller: Reconciler, jobs: Jobs, name: str, timeout: float = 30) -> dict:
    return cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == "Complete" and jobs.status(name),
        timeout=timeout,
        what=f"{name} Complete",
    )


def _pod_of(poller: Reconciler, jobs: Jobs, name: str, running: bool = True) -> str:
    def probe() -> str | None:
        status = jobs.status(name)
        wanted = "Running" if running else "Scheduled"
        return status.get("podName") if status.get("state") == wanted else None

    return cycle_until(poller, probe, what=f"{name} pod")


def _events(admin_api: client.ApiClient, namespace: str, name: str) -> set[str]:
    items = (
        client.CoreV1Api(admin_api)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        .items
    )
    return {e.reason for e in items}


def _settings(admin_api: client.ApiClient, **extra: str) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, **extra})


@pytest.mark.parametrize(
    ("annotations", "pod_override", "words", "cause"),
    [
        (
            {
                kwok.ANNOTATION_WAITING_REASON: "ImagePullBackOff",
                kwok.ANNOTATION_WAITING_MESSAGE: 'Back-off pulling image "registry.example/x:1"',
            },
            None,
            'Back-off pulling image "registry.example/x:1"',
            "ImagePullBackOff",
        ),
        (
            {
                kwok.ANNOTATION_WAITING_REASON: "CreateContainerConfigError",
                kwok.ANNOTATION_WAITING_MESSAGE: 'secret "api-key" not found',
            },
            None,
            'secret "api-key" not found',
            "CreateContainerConfigError",
        ),
        (
            {},
            {"nodeSelector": {"gpu": "h100"}},
            "didn't match Pod's node affinity/selector",
            "Unschedulable",
        ),
    ],
)
def test_pending_too_long_fails_with_the_cause(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    annotations: dict,
    pod_override: dict | None,
    words: str,
    cause: str,
) -> None:
    _settings(admin_api, **{"pod-pending-timeout": "3s"})
    spec: dict = {"annotations": annotations}
    if pod_override:
        spec["pod"] = pod_override
    jobs.create("stuck", **spec)
    final = _complete(poller, jobs, "stuck")
    assert final["reason"] == "Failed"
    assert words in final["message"], final["message"]
    assert "did not start within 3 s" in final["message"]
    finished = next(c for c in final["conditions"] if c["type"] == "Finished")
    assert finished["reason"] == cause
    cycle_until(poller, lambda: not jobs.pods(), what="stuck pod deleted")
    assert cause in _events(admin_api, jobs.namespace, "stuck")


def test_waiting_within_timeout_never_fails(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    _settings(admin_api, **{"pod-pending-timeout": "10m"})
    jobs.create("patient", annotations={kwok.ANNOTATION_WAITING_REASON: "ContainerCreating"})
    cycle_until(
        poller, lambda: jobs.status("patient").get("state") == "Scheduled", what="Scheduled"
    )
    for _ in range(3):
        assert poller.run_cycle().errors == 0
    assert jobs.status("patient")["state"] == "Scheduled"
    assert len(jobs.pods()) == 1


@pytest.mark.parametrize(
    ("code", "reason", "words"),
    [(137, "OOMKilled", "OOMKilled"), (143, "Error", "killed by signal 15 (SIGTERM)")],
)
def test_killed_containers_are_reported_as_such(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    code: int,
    reason: str,
    words: str,
) -> None:
    jobs.create("killed")
    pod = _pod_of(poller, jobs, "killed")
    terminate(admin_api, jobs.namespace, pod, code, reason=reason)
    final = _complete(poller, jobs, "killed")
    assert final["reason"] == "Failed"
    assert words in final["message"] and f"exit code {code}" in final["message"]


def test_deleted_pod_fails_and_is_never_recreated(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    jobs.create("orphan")
    pod = _pod_of(poller, jobs, "orphan")
    client.CoreV1Api(admin_api).delete_namespaced_pod(pod, jobs.namespace, grace_period_seconds=0)
    final = _complete(poller, jobs, "orphan")
    assert final["reason"] == "Failed"
    assert "deleted before the evaluation finished" in final["message"]
    for _ in range(2):
        poller.run_cycle()
    assert jobs.pods() == []


def test_evicted_pod_fails_with_the_eviction_message(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    jobs.create("evicted")
    pod = _pod_of(poller, jobs, "evicted")
    client.CoreV1Api(admin_api).patch_namespaced_pod_status(
        pod,
        jobs.namespace,
        {
            "status": {
                "phase": "Failed",
                "reason": "Evicted",
                "message": "The node was low on resource: memory.",
            }
        },
    )
    final = _complete(poller, jobs, "evicted")
    assert final["reason"] == "Failed"
    assert "evicted: The node was low on resource: memory." in final["message"]


def test_cancel_deletes_the_pod_and_archives_its_log(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    jobs.create("stop-me")
    pod = _pod_of(poller, jobs, "stop-me")
    serve_log(admin_api, jobs.namespace, pod, succeeded_run.log, tmp_path)
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "stop-me",
        {"spec": {"cancel": True}},
    )
    final = _complete(poller, jobs, "stop-me")
    assert final["reason"] == "Cancelled"
    assert next(c for c in final["conditions"] if c["type"] == "Succeeded")["status"] == "False"
    cycle_until(poller, lambda: not jobs.pods(), what="pod deleted")
    archive = jobs.core.read_namespaced_config_map("stop-me-results", jobs.namespace)
    tail = archive.data[LOG_ARCHIVE_KEY]
    last_line = [line for line in succeeded_run.log.splitlines() if line.strip()][-1]
    assert tail.rstrip().endswith(last_line.strip())
    assert len(tail.encode()) <= 64 * 1024
    assert "Cancelled" in _events(admin_api, jobs.namespace, "stop-me")


def test_seed_style_cancel_is_honoured(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    jobs.create("seed-cancel")
    _pod_of(poller, jobs, "seed-cancel")
    jobs.custom.patch_namespaced_custom_object_status(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "seed-cancel",
        {"status": {"state": "Cancelled"}},
    )
    final = _complete(poller, jobs, "seed-cancel")
    assert final["reason"] == "Cancelled"
    cycle_until(poller, lambda: not jobs.pods(), what="pod deleted")


def test_suspend_and_resume(poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient) -> None:
    jobs.create("pausable")
    first = _pod_of(poller, jobs, "pausable")
    first_uid = jobs.pod(first).metadata.uid

    def patch(suspend: bool) -> None:
        jobs.custom.patch_namespaced_custom_object(
            api.API_GROUP,
            api.API_VERSION,
            jobs.namespace,
            api.PLURAL,
            "pausable",
            {"spec": {"suspend": suspend}},
        )

    patch(True)
    status = cycle_until(
        poller,
        lambda: (
            (s := jobs.status("pausable")).get("state") == "Suspended" and not jobs.pods() and s
        ),
        what="Suspended, pod gone",
    )
    suspended = next(c for c in status["conditions"] if c["type"] == "Suspended")
    assert suspended["status"] == "True"
    patch(False)
    cycle_until(
        poller, lambda: jobs.status("pausable").get("state") == "Running", what="Running again"
    )
    pods = jobs.pods()
    assert len(pods) == 1 and pods[0].metadata.uid != first_uid
    final = jobs.status("pausable")
    assert next(c for c in final["conditions"] if c["type"] == "Suspended")["status"] == "False"
    assert {"Suspended", "Resumed"} <= _events(admin_api, jobs.namespace, "pausable")


def test_active_deadline(poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient) -> None:
    jobs.create("slow", activeDeadlineSeconds=2)
    _pod_of(poller, jobs, "slow")
    final = _complete(poller, jobs, "slow")
    assert final["reason"] == "Failed"
    assert final["message"].startswith("DeadlineExceeded")
    assert (
        next(c for c in final["conditions"] if c["type"] == "Finished")["reason"]
        == "DeadlineExceeded"
    )
    cycle_until(poller, lambda: not jobs.pods(), what="pod deleted")
    assert "DeadlineExceeded" in _events(admin_api, jobs.namespace, "slow")


def test_ttl_deletes_the_finished_job_and_what_it_owns(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    jobs.create("short-lived", ttlSecondsAfterFinished=1)
    pod = _pod_of(poller, jobs, "short-lived")
    serve_log(admin_api, jobs.namespace, pod, succeeded_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, pod, 0)
    final = _complete(poller, jobs, "short-lived")
    assert final["reason"] == "Succeeded"
    configmap = final["resultsConfigMap"]

    def gone() -> bool:
        names = [
            j["metadata"]["name"]
            for j in jobs.custom.list_namespaced_custom_object(
                api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL
            )["items"]
        ]
        return "short-lived" not in names

    cycle_until(poller, gone, what="job deleted by TTL")

    def owned_gone() -> bool:
        cms = [c.metadata.name for c in jobs.core.list_namespaced_config_map(jobs.namespace).items]
        return configmap not in cms and not jobs.pods()

    cycle_until(poller, owned_gone, timeout=60, what="pod and ConfigMap garbage-collected")


def test_progress_reaches_status(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, tmp_path: Path
) -> None:
    _settings(admin_api, **{"progress-interval": "1s"})
    jobs.create("busy")
    pod = _pod_of(poller, jobs, "busy")
    lines = [
        encode_marker("started", run_id="r1"),
        "Running loglikelihood requests:  10%|#         | 10/100 [00:01<00:09]",
        encode_marker(
            "progress",
            phase="Running loglikelihood requests",
            percent=42.0,
            n=42,
            total=100,
            elapsed=2.0,
            remaining=3.0,
        ),
    ]
    serve_log(admin_api, jobs.namespace, pod, "\n".join(lines), tmp_path)
    status = cycle_until(
        poller,
        lambda: (
            (jobs.status("busy").get("progress") or {}).get("percent") == 42.0
            and jobs.status("busy")
        ),
        what="progress in status",
    )
    assert status["progress"]["phase"] == "Running loglikelihood requests"
    assert status["progress"]["line"].startswith("42% Running loglikelihood requests")
    assert status["state"] == "Running"


class _RecordingKube(Kube):
    """The real API layer, noting which log reads and status writes happen in what order."""

    def __init__(self, kube: Kube) -> None:
        super().__init__(kube.transport)
        self.calls: list[tuple[str, str]] = []

    def read_log_tail(
        self, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int
    ) -> LogTail:
        self.calls.append(("log", pod))
        return super().read_log_tail(namespace, pod, container, tail_lines, limit_bytes)

    def patch_job_status(
        self, namespace: str, name: str, status: dict, resource_version: str
    ) -> None:
        self.calls.append(("patch", name))
        super().patch_job_status(namespace, name, status, resource_version)


def test_progress_reads_are_capped_and_wait_for_transitions(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    # One a cycle; per minute more than these cycles ever accrue a need for.
    _settings(
        admin_api,
        **{
            "progress-interval": "1h",
            "progress-reads-per-cycle": "1",
            "progress-reads-per-minute": "60000",
        },
    )
    pods = {}
    for name in ("p-a", "p-b", "z-done"):
        jobs.create(name)
    for name in ("p-a", "p-b", "z-done"):
        pods[name] = _pod_of(poller, jobs, name)
    for name, percent in (("p-a", 10.0), ("p-b", 20.0)):
        marker = encode_marker("progress", phase="loglikelihood", percent=percent, n=1, total=9)
        serve_log(admin_api, jobs.namespace, pods[name], marker, tmp_path)
    serve_log(admin_api, jobs.namespace, pods["z-done"], "Traceback: boom", tmp_path)
    terminate(admin_api, jobs.namespace, pods["z-done"], 3, message="boom")
    core = client.CoreV1Api(admin_api)
    wait_for(
        lambda: any(
            c.state.terminated
            for c in core.read_namespaced_pod(pods["z-done"], namespace).status.container_statuses
            or []
        ),
        what="z-done's container terminated",
    )
    # A fresh poller: every running job is due a progress read, one is allowed.
    kube = _RecordingKube(poller.kube)
    fresh = Reconciler(kube, settings_namespace=POLLER_NS, namespaces=[namespace])
    report = fresh.run_cycle()
    assert report.errors == 0, report.error_messages
    assert jobs.status("z-done")["state"] == "Complete"
    assert (jobs.status("p-a").get("progress") or {}).get("percent") == 10.0
    assert "progress" not in jobs.status("p-b")
    # z-done comes last in the LIST, yet it ended before any progress was read.
    assert kube.calls.index(("patch", "z-done")) < kube.calls.index(("log", pods["p-a"]))
    assert ("log", pods["p-b"]) not in kube.calls
    # The next cycle reads the one left; p-a is not due again for an hour.
    kube.calls.clear()
    assert fresh.run_cycle().errors == 0
    assert (jobs.status("p-b").get("progress") or {}).get("percent") == 20.0
    assert kube.calls == [("log", pods["p-b"]), ("patch", "p-b")]


def test_missing_custom_task_configmap_fails_clearly(poller: Reconciler, jobs: Jobs) -> None:
    jobs.create("no-tasks", customTasks=[{"configMap": "my-tasks"}])
    jobs.create("fine")
    final = _complete(poller, jobs, "no-tasks")
    assert final["reason"] == "Failed"
    assert "ConfigMap my-tasks not found" in final["message"]
    cycle_until(
        poller,
        lambda: jobs.status("fine").get("state") == "Running",
        what="the other job keeps going",
    )


def test_queue_caps_running_jobs_fifo_across_namespaces(
    poller_kube: Kube,
    admin_api: client.ApiClient,
    control_plane: ControlPlane,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(admin_api)
    namespaces = []
    for suffix in ("a", "b"):
        name = f"queue-{suffix}-{tmp_path.name[-6:].lower().strip('_')}".replace("_", "-")
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        control_plane.kubectl("apply", "-n", name, "-f", str(JOB_SA_MANIFEST))
        namespaces.append(name)
    try:
        for ns in namespaces:
            wait_for(
                lambda ns=ns: core.list_namespaced_service_account(ns).items, what="default SA"
            )
        _settings(admin_api, **{"max-running-jobs": "2"})
        poller = Reconciler(poller_kube, settings_namespace=POLLER_NS, namespaces=namespaces)
        first, second = Jobs(admin_api, namespaces[0]), Jobs(admin_api, namespaces[1])
        order = [(first, "q1"), (first, "q2"), (first, "q3"), (second, "q4"), (second, "q5")]
        for jobs, name in order:
            jobs.create(name)
        # The cycle in which each job's pod first appeared: pods made in the
        # same cycle (two slots freed at once) have no order between them.
        started: dict[str, int] = {}
        max_pods = 0
        finished: set[str] = set()
        for cycle in range(80):
            report = poller.run_cycle()
            assert report.errors == 0, report.error_messages
            pods = first.pods() + second.pods()
            live = [
                p
                for p in pods
                if not (
                    p.status.container_statuses and p.status.container_statuses[0].state.terminated
                )
            ]
            max_pods = max(max_pods, len(live))
            for pod in pods:
                job_name = pod.metadata.owner_references[0].name
                started.setdefault(job_name, cycle)
                state = pod.status.container_statuses
                if (
                    state
                    and state[0].state.running
                    and not (pod.metadata.annotations or {}).get(kwok.ANNOTATION_EXIT_CODE)
                ):
                    serve_log(
                        admin_api,
                        pod.metadata.namespace,
                        pod.metadata.name,
                        succeeded_run.log,
                        tmp_path,
                    )
                    terminate(admin_api, pod.metadata.namespace, pod.metadata.name, 0)
            finished = {
                name for jobs, name in order if jobs.status(name).get("state") == "Complete"
            }
            if len(finished) == len(order):
                break
        assert finished == {name for _, name in order}
        assert max_pods == 2  # the cap was reached and never passed
        # FIFO within a namespace, fair across namespaces: q4 (b's oldest) no
        # later than q2 and q5 no later than q3, though q2 and q3 are older.
        # Which cycle frees a slot depends on when kwok reports each pod
        # ended, so the rule is checked, not one exact sequence.
        assert started["q1"] == started["q4"] == min(started.values()), started
        assert started["q1"] <= started["q2"] <= started["q3"], started
        assert started["q4"] <= started["q5"], started
        assert started["q4"] <= started["q2"] and started["q5"] <= started["q3"], started
        assert started["q2"] > started["q1"], started  # the cap held q2 back
        queued = {e.reason for ns in namespaces for e in core.list_namespaced_event(ns).items}
        assert "Queued" in queued
        assert all(first.status(n)["reason"] == "Succeeded" for n in ("q1", "q2", "q3"))
    finally:
        _settings(admin_api)
        for ns in namespaces:
            core.delete_namespace(ns)


def _serve_exec(admin_api: client.ApiClient, namespace: str, pod: str, work_dir: Path) -> None:
    client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
        "kwok.x-k8s.io",
        "v1alpha1",
        namespace,
        "execs",
        kwok.exec_body(
            namespace, pod, work_dir, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
        ),
    )


@pytest.mark.parametrize("exec_works", [True, False])
def test_exec_results_match_log_results(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
    exec_works: bool,
) -> None:
    _settings(admin_api, **{"results-source": "exec", "progress-interval": "1s"})
    jobs.create("held")
    pod = _pod_of(poller, jobs, "held")
    command = jobs.pod(pod).spec.containers[0].command
    assert "--hold-seconds=300" in command
    if exec_works:
        _serve_exec(admin_api, jobs.namespace, pod, tmp_path)
    # The driver has reported and holds its container: still Running.
    serve_log(admin_api, jobs.namespace, pod, succeeded_run.log, tmp_path)
    stored = cycle_until(
        poller,
        lambda: jobs.status("held").get("results") and jobs.status("held"),
        what="results read while held",
    )
    assert stored["state"] == "Running"
    assert stored["resultsSource"] == ("exec" if exec_works else "log")
    assert json.loads(stored["results"]) == succeeded_run.results
    terminate(admin_api, jobs.namespace, pod, 0)
    final = _complete(poller, jobs, "held")
    assert final["reason"] == "Succeeded"
    assert json.loads(final["results"]) == succeeded_run.results
