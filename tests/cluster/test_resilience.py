"""The poller survives being killed at any instant, and runs as two replicas.

Checks, with real `lmeval-poller` processes against the real control plane:
SIGKILLed at 50 random moments across many transitions, the poller leaves
every job in the right final state, no job ever gets a second pod (the audit
log's pod creations), and no succeeded job lacks its results; with two
replicas under leader election, only the Lease holder writes (audit log, by
user agent), and when the holder is killed the standby takes over within
the lease duration.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import service_account_kubeconfig

from tests.poller_fixtures import (
    BASE_SETTINGS,
    POLLER_NS,
    POLLER_USER,
    CapturedRun,
    Jobs,
    cycle_until,
    serve_log,
    set_settings,
    terminate,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

LEASE_SECONDS = 4.0


class PollerProcesses:
    """Start and kill `lmeval-poller` processes as the poller's ServiceAccount."""

    def __init__(self, plane: ControlPlane, namespace: str, logs: Path) -> None:
        self.kubeconfig = service_account_kubeconfig(plane, POLLER_NS, "lmeval-poller")
        self.namespace = namespace
        self.logs = logs
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self, identity: str, *extra: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{identity}.log").open("ab")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "poller",
                f"--kubeconfig={self.kubeconfig}",
                f"--settings-namespace={POLLER_NS}",
                f"--namespaces={self.namespace}",
                f"--identity={identity}",
                "--metrics-port=0",
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        self.running.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.running:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def processes(
    control_plane: ControlPlane, poller_installed: ControlPlane, job_namespace: str, tmp_path: Path
) -> Iterator[PollerProcesses]:
    procs = PollerProcesses(control_plane, job_namespace, tmp_path)
    yield procs
    procs.stop_all()


def _play_kubelet(
    jobs: Jobs,
    admin_api: client.ApiClient,
    ok: CapturedRun,
    bad: CapturedRun,
    directory: Path,
    handled: set[str],
) -> None:
    """Finish every running pod once: even-numbered jobs succeed, odd ones fail."""
    for pod in jobs.pods():
        statuses = pod.status.container_statuses or []
        if pod.metadata.name in handled or not statuses or not statuses[0].state.running:
            continue
        owner = pod.metadata.owner_references[0].name
        run = ok if int(owner.split("-")[-1]) % 2 == 0 else bad
        serve_log(admin_api, jobs.namespace, pod.metadata.name, run.log, directory)
        terminate(admin_api, jobs.namespace, pod.metadata.name, run.exit_code)
        handled.add(pod.metadata.name)


def test_sigkill_at_random_moments_loses_nothing(
    processes: PollerProcesses,
    jobs: Jobs,
    admin_api: client.ApiClient,
    poller,
    control_plane: ControlPlane,
    succeeded_run: CapturedRun,
    failed_run: CapturedRun,
    tmp_path: Path,
) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, "poll-interval": "0.5s"})
    rng = random.Random(20261129)
    mark = control_plane.audit.mark()
    handled: set[str] = set()
    created = 0
    for kill in range(50):
        if kill % 4 == 0 and created < 24:
            for _ in range(2):
                jobs.create(f"crash-{created}")
                created += 1
        proc = processes.start(f"crash-{kill}")
        time.sleep(rng.uniform(0.5, 2.0))  # the kill moment is random by design
        processes.kill(proc)
        _play_kubelet(jobs, admin_api, succeeded_run, failed_run, tmp_path, handled)

    def all_done() -> bool:
        _play_kubelet(jobs, admin_api, succeeded_run, failed_run, tmp_path, handled)
        return all(jobs.status(f"crash-{i}").get("state") == "Complete" for i in range(created))

    cycle_until(poller, all_done, timeout=120, what="every job Complete after the kills")
    for index in range(created):
        status = jobs.status(f"crash-{index}")
        if index % 2 == 0:
            assert status["reason"] == "Succeeded", status
            assert json.loads(status["results"]) == succeeded_run.results
        else:
            assert status["reason"] == "Failed", status
            assert "no_such_task" in status["message"]
    creations = Counter(
        call.name
        for call in control_plane.audit.events(mark)
        if call.verb == "create"
        and call.resource == "pods"
        and not call.subresource
        and call.code == 201
        and call.namespace == jobs.namespace
    )
    assert len(creations) == created
    assert max(creations.values()) == 1, creations
    assert len(jobs.pods()) == created


def test_two_replicas_only_the_leader_writes_and_the_standby_takes_over(
    processes: PollerProcesses,
    jobs: Jobs,
    admin_api: client.ApiClient,
    control_plane: ControlPlane,
) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, "poll-interval": "0.5s"})
    coordination = client.CoordinationV1Api(admin_api)
    with contextlib.suppress(client.exceptions.ApiException):
        coordination.delete_namespaced_lease("lmeval-poller", POLLER_NS)
    mark = control_plane.audit.mark()
    replicas = {
        name: processes.start(name, "--leader-elect", f"--lease-seconds={LEASE_SECONDS}")
        for name in ("replica-a", "replica-b")
    }
    leader = wait_for(lambda: _holder(coordination), timeout=30, what="a Lease holder")
    for index in range(3):
        jobs.create(f"ha-{index}")
    wait_for(
        lambda: all(jobs.status(f"ha-{i}").get("state") == "Running" for i in range(3)),
        timeout=30,
        what="jobs Running under the leader",
    )
    writers = _writers(control_plane, mark, jobs.namespace)
    assert writers == {f"lmeval-poller/{leader}"}, writers

    processes.kill(replicas[leader])
    killed_at = time.monotonic()
    standby = next(name for name in replicas if name != leader)
    jobs.create("ha-after")
    wait_for(
        lambda: jobs.status("ha-after").get("state") == "Running",
        timeout=30,
        what="the standby schedules new work",
    )
    took = time.monotonic() - killed_at
    assert _holder(coordination) == standby
    # Within the lease duration, plus one poll interval and a scheduling round.
    assert took < LEASE_SECONDS + 3.0, took
    after = _writers(control_plane, mark, jobs.namespace)
    assert after == {f"lmeval-poller/{leader}", f"lmeval-poller/{standby}"}
    never_refused = [
        c for c in control_plane.audit.calls_by(POLLER_USER, since=mark) if c.code == 403
    ]
    assert never_refused == []


def _holder(coordination: client.CoordinationV1Api) -> str | None:
    try:
        lease = coordination.read_namespaced_lease("lmeval-poller", POLLER_NS)
    except client.exceptions.ApiException:
        return None
    return lease.spec.holder_identity if lease.spec else None


def _writers(plane: ControlPlane, mark: int, namespace: str) -> set[str]:
    return {
        call.user_agent.split(" ")[0]
        for call in plane.audit.calls_by(POLLER_USER, since=mark)
        if call.is_write and call.namespace == namespace
    }


def test_sigterm_finishes_the_cycle_and_exits(
    processes: PollerProcesses, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, "poll-interval": "0.5s"})
    proc = processes.start("graceful")
    jobs.create("graceful-job")
    wait_for(
        lambda: jobs.status("graceful-job").get("state") == "Running",
        timeout=30,
        what="the process poller at work",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    log = (processes.logs / "graceful.log").read_text()
    assert "received SIGTERM: finishing the current cycle" in log
    assert log.rstrip().endswith("stopped")
