"""How a cycle carries out its decisions, without a cluster.

Checks: jobs that have something to do act concurrently (two jobs whose log
reads wait for each other both finish: a sequential cycle would deadlock on
the barrier), each job's own actions stay in order, the report counts every
patch made on the worker threads, jobs with nothing to do are left exactly
as listed, and a replica that loses its lease while jobs wait stops acting.

The API layer here is a recording stand-in: what the real requests do is
covered by tests/cluster; this module pins the cycle's own scheduling.
"""

from __future__ import annotations

import base64
import threading
from typing import Any

from driver.protocol import encode_marker
from poller import api
from poller.cycle.podproof import KEY_FIELD, PodProof
from poller.cycle.reconciler import ACTION_WORKERS, Reconciler
from poller.decisions.views import PROOF_ANNOTATION
from poller.jobpod import podspec
from poller.kube.client import JobsPage, LogTail

KEY = bytes(range(32))
PROOF = PodProof(KEY)

RUNNING = {
    "state": "Running",
    "podName": "",
    "conditions": [
        {
            "type": "Scheduled",
            "status": "True",
            "reason": "PodCreated",
            "message": "m",
            "lastTransitionTime": "2026-11-30T00:00:00Z",
            "observedGeneration": 1,
        },
        {
            "type": "Running",
            "status": "True",
            "reason": "ContainerRunning",
            "message": "the evaluation container runs",
            "lastTransitionTime": "2026-11-30T00:00:00Z",
            "observedGeneration": 1,
        },
    ],
    "message": "evaluation running",
    "observedGeneration": 1,
}


def pod_of(name: str) -> str:
    return podspec.pod_name(name, f"uid-{name}")


def listed_job(name: str) -> dict[str, Any]:
    status = {**RUNNING, "podName": pod_of(name), "podAttempt": 1, "podUID": f"pod-{name}"}
    api.LMEvalJobStatus.model_validate(status)
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": "5",
            "creationTimestamp": "2026-11-30T00:00:00Z",
        },
        "spec": {"model": "dummy", "tasks": ["toy"]},
        "status": status,
    }


def listed_pod(name: str, *, exit_code: int | None) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": "2026-11-30T00:00:01Z"}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "reason": "Error"}}
    return {
        "metadata": {
            "namespace": "ns",
            "name": pod_of(name),
            "uid": f"pod-{name}",
            "creationTimestamp": "2026-11-30T00:00:00Z",
            "ownerReferences": [{"uid": f"uid-{name}", "controller": True}],
            "annotations": {PROOF_ANNOTATION: PROOF.sign("ns", pod_of(name), f"uid-{name}", 1)},
        },
        "status": {
            "phase": "Running" if exit_code is None else "Failed",
            "containerStatuses": [{"name": podspec.MAIN_CONTAINER, "state": state}],
        },
    }


class StandInKube:
    """Lists fixed objects; log reads of `meeting` pods wait for each other."""

    def __init__(self, jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.jobs, self.pods = jobs, pods
        self.meeting = threading.Barrier(2, timeout=10)
        self.meeting_pods: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def _note(self, what: str, name: str) -> None:
        with self.lock:
            self.calls.append((what, name))

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        # No progress reads: only the transitions' own requests are recorded.
        return {"pod-image": "registry.example/job:1", "progress-reads-per-cycle": "0"}

    def read_secret(self, namespace: str, name: str) -> dict[str, Any]:
        return {"data": {KEY_FIELD: base64.b64encode(KEY).decode()}}

    def list_suites(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return []  # no LMEvalSuite: the suites' half of the cycle lists and stops

    def list_jobs(
        self, namespace: str | None = None, *, field_selector: str | None = None, **_: Any
    ) -> list[dict[str, Any]]:
        return self.jobs

    def list_pods(
        self,
        selector: str,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        **_: Any,
    ) -> list[dict[str, Any]]:
        return self.pods

    # No finished jobs: the sweep lists none, and nothing is read by name.
    def list_jobs_page(self, namespace: str | None, **_: Any) -> JobsPage:
        return JobsPage([], None)

    def find_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def find_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def read_log_tail(
        self, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int
    ) -> LogTail:
        if pod in self.meeting_pods:
            self.meeting.wait()  # BrokenBarrierError (a job error) if nobody else comes
        self._note("log", pod)
        return LogTail(encode_marker("failed", exit_code=3, message="boom").encode() + b"\n", False)

    def patch_job_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> None:
        self._note("patch", name)

    def post_event(self, **event: Any) -> None:
        self._note("event", str(event["job_name"]))

    def apply_configmap(self, manifest: dict[str, Any], *, merge: bool = False) -> None:
        self._note("configmap", manifest["metadata"]["name"])


def test_jobs_with_work_act_concurrently_and_in_order_each() -> None:
    names = ["a-ended", "b-idle", "c-ended", "d-idle"]
    ended = {"a-ended", "c-ended"}
    kube = StandInKube(
        [listed_job(n) for n in names],
        [listed_pod(n, exit_code=3 if n in ended else None) for n in names],
    )
    kube.meeting_pods = {pod_of(n) for n in ended}
    poller = Reconciler(kube, settings_namespace="lmeval-system")  # type: ignore[arg-type]
    report = poller.run_cycle()
    assert ACTION_WORKERS >= 2
    assert report.errors == 0, report.error_messages
    assert report.patches == 2
    by_name = {job.name: job for job in report.snapshot}
    assert [job.name for job in report.snapshot] == names  # LIST order kept
    for name in ended:
        assert by_name[name].status.state == api.JobState.COMPLETE
        own = [what for what, who in kube.calls if who in (name, pod_of(name))]
        assert own[:2] == ["log", "patch"], own  # a job's own actions in order
    idle = {job.name: job for job in report.snapshot if job.name not in ended}
    assert all(job.status.state == api.JobState.RUNNING for job in idle.values())
    idle_names = {"b-idle", "d-idle", pod_of("b-idle"), pod_of("d-idle")}
    assert not {who for _, who in kube.calls} & idle_names


def test_a_replica_that_loses_its_lease_stops_acting() -> None:
    kube = StandInKube([listed_job("a-ended")], [listed_pod("a-ended", exit_code=3)])
    answers = iter([True, True])  # the cycle may start and submit, then the lease is gone
    poller = Reconciler(
        kube,  # type: ignore[arg-type]
        settings_namespace="lmeval-system",
        may_act=lambda: next(answers, False),
    )
    report = poller.run_cycle()
    assert report.skipped
    assert kube.calls == []
    assert report.snapshot[0].status.state == api.JobState.RUNNING
