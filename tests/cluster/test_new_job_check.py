"""The check for new jobs (issue 35), against a real apiserver: a job created while
the poller is idle gets its pod long before the next poll-interval.

The service runs with a 30 s interval and the check every 0.5 s: the job
must be Scheduled within a few seconds, by a cycle the check brought
forward (the `fieldSelector=status.state=` LIST finds it), and once it has a
status the checks find nothing and bring no further cycle. Turning the check
off is the service's unit test (tests/unit/test_cycle_cadence.py).
"""

from __future__ import annotations

import threading
import time

from kubernetes import client

from poller.cycle.reconciler import CycleReport, Reconciler
from poller.kube.client import Kube
from poller.service import PollingService
from tests.poller_fixtures import BASE_SETTINGS, POLLER_NS, Jobs, set_settings
from tests.waiting import wait_for


def test_a_new_job_starts_without_waiting_for_the_interval(
    poller_kube: Kube, admin_api: client.ApiClient, jobs: Jobs
) -> None:
    settings = {**BASE_SETTINGS, "poll-interval": "30s", "new-job-check-interval": "500ms"}
    set_settings(admin_api, settings)
    poller = Reconciler(poller_kube, settings_namespace=POLLER_NS, namespaces=[jobs.namespace])
    checks: list[bool] = []  # what each check found
    looked = poller.new_job_waits

    def check() -> bool:
        found = looked()
        checks.append(found)
        return found

    poller.new_job_waits = check  # type: ignore[method-assign]
    cycles: list[float] = []
    lock = threading.Lock()

    def record(report: CycleReport | None, failure: BaseException | None) -> None:
        assert failure is None
        with lock:
            cycles.append(time.monotonic())

    service = PollingService(poller, on_cycle=record)
    service.start()
    try:
        wait_for(lambda: cycles, timeout=15, what="the first cycle")
        created = time.monotonic()
        jobs.create("quick")
        wait_for(
            lambda: jobs.status("quick").get("state") == "Scheduled",
            timeout=10,
            what="the new job Scheduled",
        )
        assert time.monotonic() - created < 10  # the interval is 30 s
        assert service.brought_forward >= 1
        brought = service.brought_forward
        # Four more checks: the job has a status now, nothing brings a cycle forward.
        seen = len(checks)
        wait_for(lambda: len(checks) >= seen + 4, timeout=10, what="four more checks")
        assert service.brought_forward == brought and not any(checks[seen:])
        with lock:
            assert len(cycles) <= 1 + brought
    finally:
        service.stop()
        set_settings(admin_api, dict(BASE_SETTINGS))
