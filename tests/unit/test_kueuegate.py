"""Kueue's gate (`poller.decisions.kueueadmission`) and `decide` under it: pure, table-driven.

A job labelled with a LocalQueue, on a cluster where Kueue is installed,
submits a Workload, waits Suspended in Kueue's words, starts on admission
with the flavors' placement, gives its pod up when evicted, releases its
quota once the pod is gone, and marks its workload Finished when done: in
the decision that finishes the job, before its status (a poller stopped in
between decides the job again; Complete jobs are not listed), and without
letting a refused workload write hold the status back. The same job
without Kueue (``kueue=None``) decides exactly as before.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest

from poller import api
from poller.api.settings import Settings
from poller.cycle.act import Actuator
from poller.decisions import decide, kueueadmission
from poller.decisions.actions import (
    ArchiveLog,
    CreatePod,
    CreateWorkload,
    Decision,
    DeletePod,
    DeleteWorkload,
    Needs,
    PatchStatus,
    PatchWorkloadStatus,
)
from poller.decisions.kueueadmission import Flavor, KueueView, Priority, WorkloadView
from poller.decisions.observed import Observed
from poller.decisions.views import JobView
from poller.kube.errors import ApiError, Conflict
from poller.timefmt import format_time
from tests.unit.test_decide import NOW, condition, pod, running_status, status_of

SETTINGS = Settings()
GPU = {"limits": {"nvidia.com/gpu": "1"}}


def job(status: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> JobView:
    if status and "podName" in status:
        status = {"podAttempt": 1, "podUID": "pod-uid", **status}
    return JobView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": "eval",
                "uid": "uid-1",
                "generation": 3,
                "resourceVersion": "41",
                "creationTimestamp": format_time(NOW - dt.timedelta(minutes=5)),
                "labels": {kueueadmission.QUEUE_LABEL: "team-a"} if labels is None else labels,
            },
            "spec": {"model": "dummy", "tasks": ["toy"], "pod": {"resources": GPU}},
            "status": status or {},
        }
    )


def workload(
    *conditions: tuple[str, str, str, str],
    admission: dict[str, Any] | None = None,
    deleting: bool = False,
) -> WorkloadView:
    return WorkloadView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": kueueadmission.workload_name("eval", "uid-1"),
                "resourceVersion": "7",
                "ownerReferences": [{"uid": "uid-1", "controller": True}],
                **({"deletionTimestamp": "2026-11-29T12:00:00Z"} if deleting else {}),
            },
            "status": {
                "conditions": [
                    {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": "x"}
                    for t, s, r, m in conditions
                ],
                **({"admission": admission} if admission else {}),
            },
        }
    )


ADMISSION = {
    "clusterQueue": "gpus",
    "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "a100"}, "count": 1}],
}
PENDING = workload(
    (
        "QuotaReserved",
        "False",
        "Pending",
        "couldn't assign flavors to pod set main: insufficient unused quota for "
        "nvidia.com/gpu in flavor a100, 1 more needed",
    )
)
ADMITTED = workload(
    ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpus"),
    ("Admitted", "True", "Admitted", "The workload is admitted"),
    admission=ADMISSION,
)
EVICTED = workload(
    ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpus"),
    ("Admitted", "True", "Admitted", "The workload is admitted"),
    ("Evicted", "True", "Preempted", "Preempted to accommodate a higher priority Workload"),
    admission=ADMISSION,
)
REQUEUED = workload(
    ("QuotaReserved", "False", "Pending", "Preempted to accommodate a higher priority Workload"),
    ("Evicted", "True", "Preempted", "Preempted to accommodate a higher priority Workload"),
)
A100 = Flavor("a100", {"gpu": "a100"}, ({"key": "gpu", "operator": "Exists"},))


def suspended_status(message: str = "waiting for Kueue") -> dict[str, Any]:
    return {
        "state": "Suspended",
        "reason": "NoReason",
        "message": message,
        "suspendTime": format_time(NOW - dt.timedelta(seconds=30)),
    }


def test_a_new_job_submits_a_workload_of_exactly_its_pod() -> None:
    view = KueueView(None)
    assert decide.what_to_observe(Observed(job(), None, kueue=view), SETTINGS, NOW) == Needs()
    decision = decide.decide(Observed(job(), None, kueue=view), SETTINGS, NOW)
    created = [a for a in decision.actions if isinstance(a, CreateWorkload)]
    assert len(created) == 1
    manifest = created[0].manifest
    assert manifest["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert manifest["metadata"]["ownerReferences"][0]["controller"] is True
    assert manifest["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert manifest["spec"]["queueName"] == "team-a"
    (pod_set,) = manifest["spec"]["podSets"]
    assert pod_set["count"] == 1
    main = pod_set["template"]["spec"]["containers"][0]
    assert main["resources"]["requests"]["nvidia.com/gpu"] == "1"  # limits as requests
    assert not any(isinstance(a, CreatePod) for a in decision.actions)
    status = status_of(decision)
    assert status.state == api.JobState.SUSPENDED
    assert "LocalQueue team-a" in (status.message or "")
    assert condition(status, "Suspended").status == "True"


def test_a_priority_class_label_is_resolved_before_submitting() -> None:
    labelled = job(labels={kueueadmission.QUEUE_LABEL: "q", kueueadmission.PRIORITY_LABEL: "high"})
    needs = decide.what_to_observe(Observed(labelled, None, kueue=KueueView(None)), SETTINGS, NOW)
    assert needs.priority_class == "high"
    view = KueueView(None, priority=Priority("high", 1000))
    decision = decide.decide(Observed(labelled, None, kueue=view), SETTINGS, NOW)
    (created,) = [a for a in decision.actions if isinstance(a, CreateWorkload)]
    assert created.manifest["spec"]["priority"] == 1000
    assert created.manifest["spec"]["priorityClassName"] == "high"
    missing = KueueView(None, priority=Priority("high", None))
    decision = decide.decide(Observed(labelled, None, kueue=missing), SETTINGS, NOW)
    assert not any(isinstance(a, CreateWorkload) for a in decision.actions)
    assert "WorkloadPriorityClass high" in (status_of(decision).message or "")


def test_a_waiting_workload_keeps_the_job_suspended_in_kueues_words() -> None:
    decision = decide.decide(
        Observed(job(suspended_status()), None, kueue=KueueView(PENDING)), SETTINGS, NOW
    )
    status = status_of(decision)
    assert status.state == api.JobState.SUSPENDED
    assert "insufficient unused quota for nvidia.com/gpu" in (status.message or "")
    assert condition(status, "Suspended").reason == "KueueInadmissible"
    # Written once: the same observation again writes nothing.
    again = job({**suspended_status(), **status.model_dump(by_alias=True, exclude_none=True)})
    assert (
        decide.decide(Observed(again, None, kueue=KueueView(PENDING)), SETTINGS, NOW).actions == []
    )


def test_admission_starts_the_pod_with_the_flavors_placement() -> None:
    current = job(suspended_status())
    needs = decide.what_to_observe(
        Observed(current, None, kueue=KueueView(ADMITTED)), SETTINGS, NOW
    )
    assert needs.flavors == ("a100",) and needs.namespace_uid
    view = KueueView(ADMITTED, flavors=(A100,))
    decision = decide.decide(Observed(current, None, kueue=view), SETTINGS, NOW)
    (create,) = [a for a in decision.actions if isinstance(a, CreatePod)]
    assert create.manifest["spec"]["nodeSelector"] == {"gpu": "a100"}
    assert {"key": "gpu", "operator": "Exists"} in create.manifest["spec"]["tolerations"]
    status = status_of(decision)
    assert status.state == api.JobState.SCHEDULED
    assert condition(status, "Suspended").reason == "Admitted"
    assert "ClusterQueue gpus" in condition(status, "Suspended").message


def test_an_admitted_running_job_is_left_to_run() -> None:
    current = job(running_status())
    plain = decide.decide(Observed(current, pod()), SETTINGS, NOW)
    assert (
        decide.decide(Observed(current, pod(), kueue=KueueView(ADMITTED)), SETTINGS, NOW) == plain
    )


def test_eviction_deletes_the_pod_and_puts_the_job_back_in_the_queue() -> None:
    decision = decide.decide(
        Observed(job(running_status()), pod(), kueue=KueueView(EVICTED)), SETTINGS, NOW
    )
    kinds = [type(a) for a in decision.actions]
    assert kinds.index(ArchiveLog) < kinds.index(DeletePod)
    status = status_of(decision)
    assert status.state == api.JobState.SUSPENDED
    assert "Preempted" in (status.message or "")
    assert condition(status, "Running").status == "False"
    assert condition(status, "Suspended").reason == "KueuePreempted"


def test_once_the_pod_is_gone_the_quota_goes_back_to_kueue() -> None:
    current = job(suspended_status("evicted"))
    decision = decide.decide(Observed(current, None, kueue=KueueView(EVICTED)), SETTINGS, NOW)
    (release,) = [a for a in decision.actions if isinstance(a, PatchWorkloadStatus)]
    assert release.resource_version == "7"
    assert release.status["admission"] is None
    kinds = {c["type"]: c for c in release.status["conditions"]}
    assert kinds["QuotaReserved"]["status"] == "False"
    assert kinds["Admitted"]["status"] == "False"
    assert kinds["Requeued"]["status"] == "True"
    assert kinds["Evicted"]["status"] == "True"  # Kueue's own, kept
    # Requeued: it waits again, and a new admission starts a fresh pod.
    waiting = decide.decide(Observed(current, None, kueue=KueueView(REQUEUED)), SETTINGS, NOW)
    assert not [a for a in waiting.actions if isinstance(a, PatchWorkloadStatus | CreatePod)]


def test_a_finished_job_marks_its_workload_finished_once() -> None:
    done = {
        "state": "Complete",
        "reason": "Succeeded",
        "message": "done",
        "completeTime": format_time(NOW),
    }
    decision = decide.decide(Observed(job(done), None, kueue=KueueView(ADMITTED)), SETTINGS, NOW)
    (finish,) = decision.actions
    assert isinstance(finish, PatchWorkloadStatus)
    finished = [c for c in finish.status["conditions"] if c["type"] == "Finished"]
    assert finished[0]["status"] == "True" and finished[0]["reason"] == "Succeeded"
    marked = workload(("Finished", "True", "Succeeded", "done"), admission=ADMISSION)
    assert (
        decide.decide(Observed(job(done), None, kueue=KueueView(marked)), SETTINGS, NOW).actions
        == []
    )


def test_suspending_a_job_gives_its_workload_up() -> None:
    current = JobView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": "eval",
                "uid": "uid-1",
                "generation": 4,
                "resourceVersion": "42",
                "labels": {kueueadmission.QUEUE_LABEL: "team-a"},
            },
            "spec": {"model": "dummy", "tasks": ["toy"], "suspend": True},
            "status": suspended_status(),
        }
    )
    decision = decide.decide(Observed(current, None, kueue=KueueView(PENDING)), SETTINGS, NOW)
    assert DeleteWorkload(PENDING.name) in decision.actions


def test_a_pod_without_a_workload_is_not_stopped_behind_its_back() -> None:
    current = job(running_status())
    plain = decide.decide(Observed(current, pod()), SETTINGS, NOW)
    assert decide.decide(Observed(current, pod(), kueue=KueueView(None)), SETTINGS, NOW) == plain


def test_without_kueue_a_labelled_job_starts_as_before() -> None:
    decision = decide.decide(Observed(job(), None), SETTINGS, NOW)
    assert any(isinstance(a, CreatePod) for a in decision.actions)
    assert not any(isinstance(a, CreateWorkload) for a in decision.actions)


def test_workload_names_are_deterministic_and_valid() -> None:
    name = kueueadmission.workload_name("x" * 300, "uid")
    assert len(name) <= 253 and name == kueueadmission.workload_name("x" * 300, "uid")
    assert kueueadmission.workload_name("eval", "a") != kueueadmission.workload_name("eval", "b")


class _NoCounts:
    """A cycle's tally that nothing here may add to (no pod, no job status)."""

    def add(self, *, patches: int = 0, pods_created: int = 0) -> None:
        raise AssertionError("nothing to count")


class _StaleKube:
    """Kueue wrote the workload since it was listed: every status patch is stale."""

    def __init__(self) -> None:
        self.calls = 0

    def patch_workload_status(self, *args: Any) -> None:
        self.calls += 1
        raise Conflict("workloads: conflict")


def test_a_stale_workload_write_is_decided_again_next_cycle() -> None:
    kube = _StaleKube()
    actuator = Actuator(kube, None, None, lambda: None)  # type: ignore[arg-type]

    patch = PatchWorkloadStatus("w", {"conditions": []}, "7")
    actuator.carry_out(job(), Decision([patch]), SETTINGS, NOW, _NoCounts())
    assert kube.calls == 1  # tried once, no error raised


def test_messages_after_an_eviction_say_it_once() -> None:
    message = kueueadmission.waiting_message(REQUEUED, "team-a")
    assert message.count("Preempted to accommodate") == 1
    assert message.startswith("waiting for Kueue after an eviction")
    assert kueueadmission.waiting_reason(REQUEUED) == "KueuePreempted"
    assert kueueadmission.waiting_reason(None) == "KueueQueued"
    assert kueueadmission.stop_message(None) == "Kueue's workload was deleted"


def test_a_withdrawn_admission_stops_the_pod_too() -> None:
    decision = decide.decide(
        Observed(job(running_status()), pod(), kueue=KueueView(PENDING)), SETTINGS, NOW
    )
    assert DeletePod(pod().name) in decision.actions
    status = status_of(decision)
    assert status.state == api.JobState.SUSPENDED
    assert "withdrew the admission" in (status.message or "")


def test_a_pod_that_is_over_is_read_as_always_even_if_evicted_meanwhile() -> None:
    finished = pod("terminated", phase="Succeeded", exit_code=0)
    current = job(running_status())
    plain = decide.what_to_observe(Observed(current, finished), SETTINGS, NOW)
    assert (
        decide.what_to_observe(Observed(current, finished, kueue=KueueView(EVICTED)), SETTINGS, NOW)
        == plain
    )


def test_a_job_changed_while_it_waits_submits_a_new_workload() -> None:
    current = job(suspended_status())
    made = decide.decide(Observed(job(), None, kueue=KueueView(None)), SETTINGS, NOW)
    (create,) = [a for a in made.actions if isinstance(a, CreateWorkload)]
    fingerprint = create.manifest["metadata"]["annotations"][kueueadmission.SUBMITTED_ANNOTATION]
    assert fingerprint == "3/team-a/"  # generation, queue, priority class

    def submitted(value: str) -> WorkloadView:
        return replace(PENDING, submitted_for=value)

    same = decide.decide(
        Observed(current, None, kueue=KueueView(submitted(fingerprint))), SETTINGS, NOW
    )
    assert not [a for a in same.actions if isinstance(a, DeleteWorkload)]
    older = decide.decide(
        Observed(current, None, kueue=KueueView(submitted("2/team-a/"))), SETTINGS, NOW
    )
    assert DeleteWorkload(PENDING.name) in older.actions
    assert "submitting it again" in (status_of(older).message or "")
    # While it goes away the job waits; once gone, a new one is submitted.
    going = replace(submitted("2/team-a/"), deleting=True)
    waiting = decide.decide(Observed(current, None, kueue=KueueView(going)), SETTINGS, NOW)
    assert not [a for a in waiting.actions if isinstance(a, DeleteWorkload | CreateWorkload)]


def test_a_job_that_finishes_now_marks_its_workload_before_its_status() -> None:
    # Its pod vanished: the job ends Failed in this decision.
    decision = decide.decide(
        Observed(job(running_status()), None, kueue=KueueView(ADMITTED)), SETTINGS, NOW
    )
    kinds = [type(a) for a in decision.actions]
    assert kinds.index(PatchWorkloadStatus) < kinds.index(PatchStatus), kinds
    (finish,) = [a for a in decision.actions if isinstance(a, PatchWorkloadStatus)]
    assert finish.best_effort
    assert status_of(decision).state == api.JobState.COMPLETE
    # Its retention, later, marks it again only if that write did not land.
    done = replace(job(running_status()), status=status_of(decision))
    (again,) = decide.decide(Observed(done, None, kueue=KueueView(ADMITTED)), SETTINGS, NOW).actions
    assert isinstance(again, PatchWorkloadStatus) and not again.best_effort


class _RefusingKube:
    """Kueue's webhook is down: every workload status patch fails with a 500."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    def patch_workload_status(self, *args: Any) -> None:
        raise ApiError(500, "InternalError", "failed calling webhook")

    def delete_workload(self, namespace: str, name: str) -> None:
        self.deleted.append(name)


def test_a_refused_best_effort_workload_write_does_not_stop_what_follows() -> None:
    kube = _RefusingKube()
    actuator = Actuator(kube, None, None, lambda: None)  # type: ignore[arg-type]

    patch = PatchWorkloadStatus("w", {"conditions": []}, "7", best_effort=True)
    actuator.carry_out(job(), Decision([patch, DeleteWorkload("w")]), SETTINGS, NOW, _NoCounts())
    assert kube.deleted == ["w"]
    strict = replace(patch, best_effort=False)
    with pytest.raises(ApiError, match="InternalError"):
        actuator.carry_out(
            job(), Decision([strict, DeleteWorkload("w")]), SETTINGS, NOW, _NoCounts()
        )
    assert kube.deleted == ["w"]
