"""Hostile settings on the real control plane: the poller keeps working (issue 15, class 4).

Checks: while the settings ConfigMap holds each hostile value (a YAML syntax
error, nesting 60,000 deep, an alias bomb, a value over 64 KiB, ``1e309``,
``nan``, ``inf``, 10,000 junk keys), the poller's cycles raise nothing and
count no error, a new job still goes New -> Scheduled -> Running -> Complete,
the key keeps its last good value (the good size preset still shapes the
pod, the good poll-interval stays in force) and the problem names the key;
and the polling service keeps cycling at the last good interval with no
failed cycle.
"""

from __future__ import annotations

import threading
import time

import pytest
from kubernetes import client

from poller.api.settings import MAX_PROBLEMS_LISTED
from poller.cycle.reconciler import CycleReport, Reconciler
from poller.service import PollingService
from tests.poller_fixtures import BASE_SETTINGS, Jobs, cycle_until, set_settings, terminate
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

GOOD = {
    **BASE_SETTINGS,
    "poll-interval": "0.5s",
    "pod-pending-timeout": "5m",
    "size-presets": "small: {requests: {cpu: 100m, memory: 64Mi}}",
    "default-size": "small",
}
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10)
)
HOSTILE = {
    "yaml-syntax": {"size-presets": "small: {requests: {cpu: 100m"},
    "deep-nesting": {"size-presets": "[" * 60_000},
    "alias-bomb": {"size-presets": ALIAS_BOMB},
    "over-64KiB": {"size-presets": "# " + "x" * 70_000},
    "1e309": {"poll-interval": "1e309", "pod-pending-timeout": "1e309"},
    "nan": {"pod-pending-timeout": "nan"},
    "inf": {"progress-interval": "inf", "max-running-jobs": "1e309"},
    "junk-keys": {f"junk-{i}": "x" for i in range(10_000)},
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_job_runs_its_course_while_a_setting_is_hostile(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, case: str
) -> None:
    set_settings(admin_api, GOOD)
    good = poller.refresh_settings()
    assert poller.tracker.problem_count == 0 and good.poll_interval == 0.5

    set_settings(admin_api, {**GOOD, **HOSTILE[case]})
    jobs.create("steady")
    pod_name = cycle_until(
        poller, lambda: jobs.status("steady").get("podName"), what="the job's pod"
    )
    assert poller.settings == good  # every key kept its last good value
    listed = min(len(HOSTILE[case]), MAX_PROBLEMS_LISTED)
    assert len(poller.tracker.problems) == listed
    assert poller.tracker.problem_count == len(HOSTILE[case])
    assert set(poller.tracker.problems) <= set(HOSTILE[case])
    # The last good size preset still shapes the pod.
    resources = jobs.pod(pod_name).spec.containers[0].resources
    assert resources.requests == {"cpu": "100m", "memory": "64Mi"}

    cycle_until(poller, lambda: jobs.status("steady").get("state") == "Running", what="Running")
    terminate(admin_api, jobs.namespace, pod_name, 3, message="boom")
    final = cycle_until(
        poller,
        lambda: jobs.status("steady").get("state") == "Complete" and jobs.status("steady"),
        what="Complete",
    )
    assert final["reason"] == "Failed" and "exit code 3" in final["message"]
    assert poller.settings == good


def test_the_service_keeps_cycling_at_the_last_good_interval(
    poller: Reconciler, admin_api: client.ApiClient
) -> None:
    set_settings(admin_api, GOOD)
    starts: list[float] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def record(report: CycleReport | None, failure: BaseException | None) -> None:
        with lock:
            starts.append(time.monotonic())
            if failure is not None:
                failures.append(failure)

    service = PollingService(poller, on_cycle=record)
    assert service.interval == 0.5
    every_hostile = {
        **HOSTILE["junk-keys"],
        **HOSTILE["inf"],
        **HOSTILE["1e309"],
        **HOSTILE["deep-nesting"],  # the one that stopped every cycle
    }
    service.start()
    try:
        set_settings(admin_api, {**GOOD, **every_hostile})
        changed_at = time.monotonic()

        def cycles_after_the_change() -> int:
            with lock:
                return len([t for t in starts if t > changed_at])

        # At 0.5 s, eight cycles take about 4 s; at the 10 s default, 80.
        wait_for(lambda: cycles_after_the_change() >= 8, timeout=15, what="8 cycles")
        assert time.monotonic() - changed_at < 8.0
        assert not failures, failures
        assert service.interval == 0.5 and poller.settings.poll_interval == 0.5
        assert "poll-interval" in poller.tracker.problems
    finally:
        service.stop()
        set_settings(admin_api, dict(BASE_SETTINGS))
