"""The latency step (issue 35): a cheaper cycle, progress reads per minute, new jobs sooner.

Checks, without a cluster: once the observer holds views, the live pods and
the hot jobs are listed as metadata and only what changed is read by name
(whole LISTs on the first cycle and when much changed), with the same views
as whole LISTs give; progress reads accrue per minute, capped per cycle;
`new_job_waits` says whether a job without status is new to the last cycle;
and the service brings the cycle forward for it, only when no cycle runs,
and follows new-job-check-interval live (0 pauses the check).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from poller.api.settings import Settings, SettingsTracker
from poller.cycle.reconciler import Reconciler
from poller.jobpod import podspec
from poller.kube.client import JobsPage
from poller.service import JOB_ID, NEW_JOBS_ID, PollingService
from tests.unit.test_observe_then_decide import PROOF, RecordingKube, _job, _pod, _running


def _versioned(obj: dict[str, Any], version: str) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}


class MetadataKube(RecordingKube):
    """Serves several jobs and pods, as metadata when asked, and counts the LISTs
    and the reads by name."""

    def __init__(self, jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        super().__init__(jobs[0], pods, [])
        self.jobs = jobs
        self.lists: list[str] = []
        self.found: list[str] = []
        self.new: list[dict[str, Any]] = []

    @staticmethod
    def _slim(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        keys = ("namespace", "name", "uid", "resourceVersion")
        return [{"metadata": {k: o["metadata"][k] for k in keys}} for o in items]

    def list_jobs(self, namespace: str | None = None, **query: Any) -> list[dict[str, Any]]:
        metadata = bool(query.get("metadata_only"))
        self.lists.append("jobs-metadata" if metadata else "jobs")
        return self._slim(self.jobs) if metadata else self.jobs

    def list_pods(self, selector: str, namespace: str | None = None, **query: Any) -> Any:
        metadata = bool(query.get("metadata_only"))
        self.lists.append("pods-metadata" if metadata else "pods")
        return self._slim(self.pods) if metadata else self.pods

    def find_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            self.found.append(f"job {name}")
        return next((j for j in self.jobs if j["metadata"]["name"] == name), None)

    def find_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            self.found.append(f"pod {name}")
        return next((p for p in self.pods if p["metadata"]["name"] == name), None)

    def list_jobs_page(self, namespace: str | None, **query: Any) -> JobsPage:
        if query.get("field_selector") == "status.state=":
            return JobsPage(self._slim(self.new), None)
        return JobsPage([], None)


def _cluster(count: int) -> MetadataKube:
    names = [f"job{k}" for k in range(count)]
    jobs = [_versioned(_job(name, _running(name)), "5") for name in names]
    pods = [_versioned(_pod(name, None), "7") for name in names]
    for pod in pods:  # as the poller labels its pods (the LIST selects them by it)
        pod["metadata"]["labels"] = {podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY}
    return MetadataKube(jobs, pods)


def _listing(kube: MetadataKube, reconciler: Reconciler) -> Any:
    kube.lists.clear()
    kube.found.clear()
    return reconciler.observer.list_cluster(PROOF.attempt_of, Settings(), 0.0)


def test_after_the_first_cycle_only_what_changed_is_read_whole() -> None:
    kube = _cluster(120)
    reconciler = Reconciler(kube, settings_namespace="sys", proof=PROOF)  # type: ignore[arg-type]
    first = _listing(kube, reconciler)
    assert kube.lists == ["jobs", "pods"] and kube.found == []
    idle = _listing(kube, reconciler)
    assert kube.lists == ["jobs-metadata", "pods-metadata"] and kube.found == []
    # The cached views stand for the unchanged objects: the same views, joined alike.
    assert idle.jobs == first.jobs and idle.pods_by_job == first.pods_by_job
    # One pod ended its wait and one job's status was written: each read by name.
    kube.pods[3] = _versioned(kube.pods[3], "8")
    kube.jobs[5] = _versioned({**kube.jobs[5], "spec": {"model": "dummy", "tasks": ["b"]}}, "6")
    changed = _listing(kube, reconciler)
    assert sorted(kube.found) == ["job job5", f"pod {kube.pods[3]['metadata']['name']}"]
    assert changed.jobs_read == 1 and changed.pods_read == 1
    assert changed.jobs[5].spec["tasks"] == ["b"] and changed.jobs[5].resource_version == "6"
    assert changed.pods_by_job["uid-job3"] is not idle.pods_by_job["uid-job3"]
    assert reconciler.observer._pods["pod-job3"][0] == "8"
    assert changed.pods_by_job["uid-job4"] is idle.pods_by_job["uid-job4"]


def test_when_much_changed_the_lists_are_read_whole() -> None:
    kube = _cluster(20)
    reconciler = Reconciler(kube, settings_namespace="sys", proof=PROOF)  # type: ignore[arg-type]
    _listing(kube, reconciler)
    kube.pods[0] = _versioned(kube.pods[0], "9")  # 1 of 20 changed: more than 1 in 50
    _listing(kube, reconciler)
    assert kube.lists == ["jobs-metadata", "pods-metadata", "pods"] and kube.found == []


def test_a_pod_gone_or_no_longer_ours_is_left_out_as_the_list_would() -> None:
    kube = _cluster(100)
    reconciler = Reconciler(kube, settings_namespace="sys", proof=PROOF)  # type: ignore[arg-type]
    _listing(kube, reconciler)
    gone = kube.pods[1]["metadata"]["name"]
    kube.pods[1] = _versioned(kube.pods[1], "8")
    kube.pods[1]["metadata"]["labels"] = {}
    listing = _listing(kube, reconciler)
    # Read by name, found without the poller's label, then read again as an ended pod would be.
    assert kube.found.count(f"pod {gone}") == 2
    assert "uid-job1" not in listing.pods_by_job


def test_progress_reads_accrue_per_minute_capped_per_cycle() -> None:
    reconciler = Reconciler(RecordingKube({}, [], []), settings_namespace="sys")  # type: ignore[arg-type]
    settings = Settings()  # 300 a minute, at most 50 a cycle
    assert reconciler._progress_budget(settings, 100.0) == 50  # a first cycle: a cycle's worth
    reconciler._progress_credit = 0.0  # as if the 50 were read
    assert reconciler._progress_budget(settings, 102.0) == 10  # 2 s at 5 a second
    reconciler._progress_credit = 0.0
    assert reconciler._progress_budget(settings, 1000.0) == 50  # never more than a cycle's cap
    off = Settings.model_validate({"progress-reads-per-minute": "0"})
    assert reconciler._progress_budget(off, 1100.0) == 0


def test_a_new_job_waits_until_a_cycle_has_listed_it() -> None:
    kube = _cluster(1)
    reconciler = Reconciler(kube, settings_namespace="sys", proof=PROOF)  # type: ignore[arg-type]
    assert not reconciler.new_job_waits()
    fresh = _versioned(_job("fresh", None), "11")
    kube.new = [fresh]
    assert reconciler.new_job_waits()
    kube.jobs.append(fresh)  # the next cycle lists it (and could not start it, say)
    reconciler.run_cycle()
    assert not reconciler.new_job_waits()
    kube.new = [_versioned(fresh, "12")]  # changed since: the next cycle decides it again
    assert reconciler.new_job_waits()
    standby = Reconciler(kube, settings_namespace="sys", may_act=lambda: False)  # type: ignore[arg-type]
    assert not standby.new_job_waits()


class StubPoller:
    """What the service reads of its Reconciler."""

    def __init__(self, data: dict[str, str]) -> None:
        self.tracker = SettingsTracker()
        self.tracker.update(data)
        self.sweep_in_cycle = True
        self.waits = True

    @property
    def settings(self) -> Settings:
        return self.tracker.current

    def refresh_settings(self) -> Settings:
        return self.tracker.current

    def new_job_waits(self) -> bool:
        return self.waits


class StubScheduler:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def modify_job(self, job_id: str, **changes: Any) -> None:
        self.calls.append(("modify", job_id, sorted(changes)))

    def pause_job(self, job_id: str) -> None:
        self.calls.append(("pause", job_id, None))

    def reschedule_job(self, job_id: str, trigger: Any) -> None:
        self.calls.append(("reschedule", job_id, trigger.interval.total_seconds()))


@pytest.fixture
def service() -> tuple[PollingService, StubPoller, StubScheduler]:
    poller = StubPoller({})
    service = PollingService(poller)  # type: ignore[arg-type]
    scheduler = StubScheduler()
    service.scheduler = scheduler  # type: ignore[assignment]
    return service, poller, scheduler


def test_a_new_job_brings_the_cycle_forward_unless_a_cycle_runs(
    service: tuple[PollingService, StubPoller, StubScheduler],
) -> None:
    polling, poller, scheduler = service
    assert not poller.sweep_in_cycle and polling.check_interval == 1.0
    polling._check_new_jobs()
    assert scheduler.calls == [("modify", JOB_ID, ["next_run_time"])]
    polling.cycling.set()  # that cycle may list it; else the next check sees it again
    polling._check_new_jobs()
    poller.waits = False
    polling.cycling.clear()
    polling._check_new_jobs()
    assert len(scheduler.calls) == 1 and polling.brought_forward == 1


def test_the_check_follows_its_setting_live(
    service: tuple[PollingService, StubPoller, StubScheduler],
) -> None:
    polling, poller, scheduler = service
    poller.tracker.update({"new-job-check-interval": "0"})
    polling._follow_check_interval()
    poller.tracker.update({"new-job-check-interval": "500ms"})
    polling._follow_check_interval()
    assert scheduler.calls == [("pause", NEW_JOBS_ID, None), ("reschedule", NEW_JOBS_ID, 0.5)]


def test_a_failing_check_warns_once_until_it_works_again(
    service: tuple[PollingService, StubPoller, StubScheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    polling, poller, scheduler = service
    failures = iter([True, True, True, False])

    def waits() -> bool:
        if next(failures):
            raise ConnectionError("apiserver down")
        return False

    poller.new_job_waits = waits  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="poller.service"):
        for _ in range(4):
            polling._check_new_jobs()
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        ("WARNING", "check for new jobs failed (said once until it works): apiserver down"),
        ("INFO", "check for new jobs works again"),
    ]
    assert scheduler.calls == [] and not polling.check_failing
