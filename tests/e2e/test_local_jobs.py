"""LMEvalJobs that really run: the poller, the real driver and real lm_eval, end to end.

Job pods land on the sandbox's local node, where the local pod runner runs
them as processes. Checks: each sample in ``deploy/samples/`` goes New ->
Scheduled -> Running -> Complete/Succeeded with ``status.results`` equal to
the results file lm_eval wrote in the pod's ``/outputs``, and the pod status
and ``pods/log`` look as a kubelet would make them; an unknown task ends
Failed with lm_eval's own message and exit code; deleting a running job's
pod stops the local processes (driver and lm_eval) and ends the job Failed
("deleted"); ``spec.cancel`` stops them too and ends the job Cancelled.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import NODE_NAME, LocalRunner

from driver.decoder import decode_text
from poller import api
from poller.cycle.reconciler import Reconciler
from tests.e2e.conftest import results_file, sample, submit
from tests.poller_fixtures import BASE_SETTINGS, Jobs, cycle_until, set_settings
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

LMEVAL_TIMEOUT = 240.0


def _complete(jobs: Jobs, name: str) -> dict[str, Any] | None:
    status = jobs.status(name)
    return status if status.get("state") == "Complete" else None


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        for child, parent in parents.items():
            if parent == current and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _pod_log(jobs: Jobs, pod: str) -> str:
    text: str = jobs.core.read_namespaced_pod_log(pod, jobs.namespace, container="lmeval")
    return text


@pytest.mark.parametrize("name", ["served-model", "dummy-model"])
def test_sample_job_runs_real_lm_eval(
    name: str,
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    model_server: ModelServer,
) -> None:
    _, job = sample(name, model_server.port)
    submit(admin_api, jobs.namespace, job)
    states: list[str] = []

    def finished() -> dict[str, Any] | None:
        status = jobs.status(name)
        if status.get("state") and (not states or states[-1] != status["state"]):
            states.append(status["state"])
        return _complete(jobs, name)

    final = cycle_until(poller, finished, timeout=LMEVAL_TIMEOUT, what=f"{name} Complete")
    assert final["reason"] == "Succeeded", final.get("message")
    assert states[-3:] == ["Scheduled", "Running", "Complete"], states

    pod = jobs.pod(final["podName"])
    assert pod.spec.node_name == NODE_NAME
    assert pod.status.phase == "Succeeded"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    assert terminated.started_at <= terminated.finished_at

    root = runner.pod_root(jobs.namespace, final["podName"])
    assert root is not None
    written = results_file(root)
    assert json.loads(final["results"]) == written
    assert set(written["results"]) == set(job["spec"]["tasks"])
    if name == "served-model":
        assert model_server.count("POST /v1/completions") > 0

    # The log came through the apiserver's pods/log path, as on a real node.
    decoded = decode_text(_pod_log(jobs, final["podName"]))
    assert decoded.outcome is not None and decoded.outcome.event == "completed"
    assert decoded.results == written


def test_unknown_task_fails_with_lm_evals_message(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, runner: LocalRunner
) -> None:
    _, job = sample("dummy-model")
    job = copy.deepcopy(job)
    job["metadata"]["name"] = "unknown-task"
    job["spec"]["tasks"] = ["no_such_task"]
    submit(admin_api, jobs.namespace, job)
    final = cycle_until(
        poller,
        lambda: _complete(jobs, "unknown-task"),
        timeout=LMEVAL_TIMEOUT,
        what="unknown-task Complete",
    )
    assert final["reason"] == "Failed"
    assert "no_such_task" in final["message"], final["message"]
    assert "exit code 1" in final["message"], final["message"]
    assert "results" not in final
    terminated = jobs.pod(final["podName"]).status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (1, "Error")
    # FallbackToLogsOnError: the log's tail is the termination message.
    assert "no_such_task" in terminated.message


def _running_job(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, runner: LocalRunner, name: str
) -> tuple[str, int, set[int]]:
    """Start a dummy-model job; once lm_eval runs: (pod, driver PID, its descendants)."""
    _, job = sample("dummy-model")
    job = copy.deepcopy(job)
    job["metadata"]["name"] = name
    submit(admin_api, jobs.namespace, job)
    status = cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == "Running" and jobs.status(name),
        timeout=60,
        what=f"{name} Running",
    )
    pod = status["podName"]
    wait_for(
        lambda: decode_text(_pod_log(jobs, pod)).started is not None,
        timeout=60,
        what="the driver's started marker in the pod log",
    )
    pid = runner.pid(jobs.namespace, pod)
    assert pid is not None and _alive(pid)
    family = wait_for(lambda: _descendants(pid), timeout=30, what="lm_eval under the driver")
    return pod, pid, family


def test_deleting_the_pod_stops_the_processes_and_fails_the_job(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, runner: LocalRunner
) -> None:
    pod, pid, family = _running_job(poller, jobs, admin_api, runner, "deleted-pod")
    jobs.core.delete_namespaced_pod(pod, jobs.namespace)
    wait_for(
        lambda: not any(_alive(p) for p in {pid, *family}),
        timeout=40,
        what="the driver and lm_eval to stop",
    )
    final = cycle_until(
        poller, lambda: _complete(jobs, "deleted-pod"), timeout=60, what="deleted-pod Complete"
    )
    assert final["reason"] == "Failed"
    assert "deleted" in final["message"], final["message"]
    wait_for(lambda: not jobs.pods(), timeout=30, what="the pod to be finalised")


@pytest.mark.skipif(
    "cancel" not in api.LMEvalJobSpec.model_fields, reason="spec.cancel not implemented"
)
def test_cancel_stops_the_processes_and_cancels_the_job(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, runner: LocalRunner
) -> None:
    _pod, pid, family = _running_job(poller, jobs, admin_api, runner, "cancelled")
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "cancelled",
        {"spec": {"cancel": True}},
    )
    final = cycle_until(
        poller, lambda: _complete(jobs, "cancelled"), timeout=60, what="cancelled Complete"
    )
    assert final["reason"] == "Cancelled", final.get("message")
    wait_for(
        lambda: not any(_alive(p) for p in {pid, *family}),
        timeout=40,
        what="the driver and lm_eval to stop",
    )


def test_runner_kills_what_survives_the_grace_period(
    jobs: Jobs, admin_api: client.ApiClient, runner: LocalRunner
) -> None:
    """A container that ignores SIGTERM is SIGKILLed, children included, after its grace."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "stubborn"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": False,
            "nodeSelector": {"sandbox.lmeval.io/local": "true"},
            "tolerations": [
                {
                    "key": "sandbox.lmeval.io/local",
                    "operator": "Equal",
                    "value": "true",
                    "effect": "NoSchedule",
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "none",
                    "command": [
                        "python",
                        "-c",
                        "import signal, subprocess, time; "
                        "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                        "subprocess.Popen(['sleep', '600'], start_new_session=True); "
                        "print('ready', flush=True); time.sleep(600)",
                    ],
                }
            ],
        },
    }
    jobs.core.create_namespaced_pod(jobs.namespace, pod)

    def ready() -> bool:
        try:
            return "ready" in (jobs.core.read_namespaced_pod_log("stubborn", jobs.namespace) or "")
        except client.exceptions.ApiException:
            return False  # kwok has not seen the pod's Logs object yet

    wait_for(ready, timeout=60, what="the container to run")
    pid = runner.pid(jobs.namespace, "stubborn")
    assert pid is not None
    family = wait_for(lambda: _descendants(pid), timeout=10, what="the sleep child")
    jobs.core.delete_namespaced_pod("stubborn", jobs.namespace)
    wait_for(lambda: not _alive(pid), timeout=30, what="SIGKILL after the grace period")
    assert not any(_alive(p) for p in family)
    wait_for(lambda: not jobs.pods(), timeout=30, what="the pod to be finalised")


def test_driver_copy_init_container_is_skipped(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, runner: LocalRunner
) -> None:
    """With settings driver-image, the pod copies the driver in an init container first.

    Here the driver is installed already: the runner reports the copy
    Completed without running it and the main container's ``python -m driver``
    runs as usual.
    """
    set_settings(admin_api, {**BASE_SETTINGS, "driver-image": "registry.example/driver:test"})
    try:
        _, job = sample("dummy-model")
        job = copy.deepcopy(job)
        job["metadata"]["name"] = "copied-driver"
        submit(admin_api, jobs.namespace, job)
        final = cycle_until(
            poller,
            lambda: _complete(jobs, "copied-driver"),
            timeout=LMEVAL_TIMEOUT,
            what="copied-driver Complete",
        )
    finally:
        set_settings(admin_api, dict(BASE_SETTINGS))
    assert final["reason"] == "Succeeded", final.get("message")
    pod = jobs.pod(final["podName"])
    assert [c.name for c in pod.spec.init_containers] == ["install-driver"]
    assert pod.spec.containers[0].command[:3] == ["python", "-m", "driver"]
    init = pod.status.init_container_statuses[0].state.terminated
    assert (init.exit_code, init.reason) == (0, "Completed")
