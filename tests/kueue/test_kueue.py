"""LMEvalJobs under a real Kueue: queued, admitted, placed, preempted.

Kueue (built from its Go module, its webhooks on loopback) runs on the real
control plane with LMEvalJob as an external framework; the poller runs as
its own ServiceAccount under ``deploy/base/rbac.yaml``. Job pods land on kwok
nodes with GPUs; a pod "finishes" when the test serves it a real driver log
and makes its container exit (kwok stages).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox import kwok

from poller.cycle.reconciler import Reconciler
from poller.decisions import kueueadmission
from poller.results.lmeval import LOG_ARCHIVE_KEY
from tests.kueue_fixtures import GPU, GPU_TOLERATION, Queues
from tests.poller_fixtures import CapturedRun, Jobs, cycle_until, serve_log, terminate

pytestmark = [pytest.mark.cluster, pytest.mark.kueue]


def _states(jobs: Jobs, *names: str) -> dict[str, str | None]:
    return {name: jobs.status(name).get("state") for name in names}


def _finish(
    admin_api: client.ApiClient, jobs: Jobs, name: str, run: CapturedRun, tmp_path: Path
) -> None:
    """The job's pod prints a real successful driver run and exits 0."""
    pod = jobs.status(name)["podName"]
    serve_log(admin_api, jobs.namespace, pod, run.log, tmp_path)
    terminate(admin_api, jobs.namespace, pod, 0)


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def test_quota_of_two_gpus_runs_two_jobs_and_queues_the_third(
    poller: Reconciler,
    jobs: Jobs,
    queues: Queues,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    queues.create({"a100": 2})
    made = [queues.job(jobs, name) for name in ("first", "second", "third")]
    names = [job["metadata"]["name"] for job in made]

    def two_run_one_waits() -> dict[str, str | None] | None:
        states = _states(jobs, *names)
        running = [n for n, s in states.items() if s == "Running"]
        waiting = [n for n, s in states.items() if s == "Suspended"]
        return states if len(running) == 2 and len(waiting) == 1 else None

    cycle_until(poller, two_run_one_waits, timeout=60, what="two Running, one Suspended")
    states = _states(jobs, *names)
    waiting = next(n for n, s in states.items() if s == "Suspended")
    status = jobs.status(waiting)
    # Kueue's own words about the missing quota.
    assert "insufficient unused quota" in status["message"], status["message"]
    assert GPU in status["message"]
    suspended = next(c for c in status["conditions"] if c["type"] == "Suspended")
    assert suspended["status"] == "True" and suspended["reason"] == "KueueInadmissible"
    assert not any(
        p.metadata.name == status.get("podName") for p in jobs.pods() if status.get("podName")
    )
    for name in names:
        if name == waiting:
            continue
        pod = jobs.pod(jobs.status(name)["podName"])
        assert pod.spec.node_selector == {"gpu-type": "a100"}
        assert pod.spec.node_name == "kueue-a100"
        # Owned by the job, exactly one pod set of count 1 with the pod's GPU.
        workload = queues.workload(next(j for j in made if j["metadata"]["name"] == name))
        assert workload is not None
        owner = workload["metadata"]["ownerReferences"][0]
        assert owner["controller"] is True and owner["kind"] == "LMEvalJob"
        (pod_set,) = workload["spec"]["podSets"]
        assert pod_set["count"] == 1
        resources = pod_set["template"]["spec"]["containers"][0]["resources"]
        assert resources["requests"][GPU] == "1"

    done = next(n for n, s in states.items() if s == "Running")
    _finish(admin_api, jobs, done, succeeded_run, tmp_path)
    cycle_until(
        poller,
        lambda: (
            jobs.status(done).get("state") == "Complete"
            and jobs.status(waiting).get("state") == "Running"
        ),
        timeout=60,
        what=f"{done} Complete and {waiting} Running",
    )
    assert jobs.status(done)["reason"] == "Succeeded"
    finished = queues.workload(next(j for j in made if j["metadata"]["name"] == done))
    assert finished is not None and _condition(finished, "Finished").get("status") == "True"


def test_no_label_means_no_workload_and_no_wait(
    poller: Reconciler, jobs: Jobs, queues: Queues
) -> None:
    queues.create({"a100": 0})  # no quota at all: a labelled job would wait for ever
    gpu = {"resources": {"limits": {GPU: "1"}}, "tolerations": [GPU_TOLERATION]}
    jobs.create("plain", pod=gpu)
    cycle_until(poller, lambda: jobs.status("plain").get("state") == "Running", what="Running")
    job = jobs.get("plain")
    assert queues.workload(job) is None
    assert kueueadmission.QUEUE_LABEL not in (job["metadata"].get("labels") or {})


def test_a_higher_priority_job_preempts_a_running_one(
    poller: Reconciler,
    jobs: Jobs,
    queues: Queues,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    low_class, high_class = f"low-{jobs.namespace}"[:63], f"high-{jobs.namespace}"[:63]
    queues.create({"a100": 1}, preemption=True, priority_classes={low_class: 100, high_class: 1000})
    low = queues.job(jobs, "low", priority=low_class)
    cycle_until(poller, lambda: jobs.status("low").get("state") == "Running", what="low Running")
    first = jobs.status("low")
    first_pod = jobs.pod(first["podName"]).metadata.uid
    # What it printed so far is archived when its pod goes.
    serve_log(admin_api, jobs.namespace, first["podName"], "evaluating...\n", tmp_path)

    queues.job(jobs, "high", priority=high_class)
    cycle_until(
        poller,
        lambda: (
            jobs.status("high").get("state") == "Running"
            and jobs.status("low").get("state") == "Suspended"
        ),
        timeout=60,
        what="high Running, low preempted",
    )
    status = jobs.status("low")
    assert "Preempted" in status["message"], status["message"]
    assert next(c for c in status["conditions"] if c["type"] == "Suspended")["reason"] == (
        "KueuePreempted"
    )
    assert all(p.metadata.uid != first_pod for p in jobs.pods())  # its pod was deleted
    archive = jobs.core.read_namespaced_config_map("low-results", jobs.namespace)
    assert "evaluating..." in archive.data[LOG_ARCHIVE_KEY]
    high_workload = queues.workload(jobs.get("high"))
    assert high_workload is not None and high_workload["spec"]["priority"] == 1000

    _finish(admin_api, jobs, "high", succeeded_run, tmp_path)
    cycle_until(
        poller,
        lambda: (
            jobs.status("high").get("state") == "Complete"
            and jobs.status("low").get("state") == "Running"
        ),
        timeout=60,
        what="high Complete, low Running again",
    )
    again = jobs.status("low")
    assert again["podAttempt"] == 2
    assert jobs.pod(again["podName"]).metadata.uid != first_pod  # a fresh pod
    # Its kwok Logs object (same pod name) serves the file: the fresh pod's log.
    (tmp_path / f"{again['podName']}.log").write_text(
        kwok.cri_log_lines(succeeded_run.log.splitlines())
    )
    terminate(admin_api, jobs.namespace, again["podName"], 0)
    cycle_until(poller, lambda: jobs.status("low").get("state") == "Complete", what="low done")
    assert jobs.status("low")["reason"] == "Succeeded"
    workload = queues.workload(low)
    assert workload is not None and _condition(workload, "Finished").get("status") == "True"


def test_the_pod_lands_where_the_admitted_flavor_says(
    poller: Reconciler, jobs: Jobs, queues: Queues
) -> None:
    queues.create({"a100": 1, "h100": 1})
    queues.job(jobs, "on-a")
    cycle_until(poller, lambda: jobs.status("on-a").get("state") == "Running", what="on-a")
    queues.job(jobs, "on-h")  # a100 is full: Kueue assigns the second flavor
    cycle_until(poller, lambda: jobs.status("on-h").get("state") == "Running", what="on-h")
    for name, kind in (("on-a", "a100"), ("on-h", "h100")):
        pod = jobs.pod(jobs.status(name)["podName"])
        assert pod.spec.node_selector == {"gpu-type": kind}
        assert pod.spec.node_name == f"kueue-{kind}"  # tainted: the flavor's toleration
        tolerations = [t.to_dict() for t in pod.spec.tolerations or []]
        assert {**GPU_TOLERATION, "toleration_seconds": None, "value": None} in tolerations


def test_deleting_the_job_deletes_its_workload(
    poller: Reconciler, jobs: Jobs, queues: Queues, admin_api: client.ApiClient
) -> None:
    queues.create({"a100": 0})
    job = queues.job(jobs, "doomed")
    cycle_until(poller, lambda: queues.workload(job) is not None, what="workload")
    client.CustomObjectsApi(admin_api).delete_namespaced_custom_object(
        "foundation-model-stack.github.com",
        "v1beta1",
        jobs.namespace,
        "lmevaljobs",
        "doomed",
        propagation_policy="Background",
    )
    cycle_until(poller, lambda: queues.workload(job) is None, what="workload collected")


def test_an_inadmissible_workload_says_why_and_a_fixed_label_resubmits(
    poller: Reconciler, jobs: Jobs, queues: Queues
) -> None:
    queues.create({"a100": 1})
    queues.local_queue = "no-such-queue"  # the job names a LocalQueue that does not exist
    queues.job(jobs, "lost")

    def said() -> str | None:
        message = jobs.status("lost").get("message") or ""
        return message if "doesn't exist" in message else None

    message = cycle_until(poller, said, timeout=60, what="Kueue's reason in status")
    assert "no-such-queue" in message
    assert jobs.status("lost")["state"] == "Suspended"
    assert not jobs.pods()
    first = queues.workload(jobs.get("lost"))
    assert first is not None

    # The label fixed: its workload is submitted again, to the right queue, and runs.
    jobs.custom.patch_namespaced_custom_object(
        "foundation-model-stack.github.com",
        "v1beta1",
        jobs.namespace,
        "lmevaljobs",
        "lost",
        {"metadata": {"labels": {kueueadmission.QUEUE_LABEL: "team"}}},
    )
    cycle_until(poller, lambda: jobs.status("lost").get("state") == "Running", what="Running")
    second = queues.workload(jobs.get("lost"))
    assert second is not None and second["metadata"]["uid"] != first["metadata"]["uid"]
    assert second["spec"]["queueName"] == "team"


def test_suspend_gives_the_workload_up_and_resume_queues_a_new_one(
    poller: Reconciler, jobs: Jobs, queues: Queues
) -> None:
    queues.create({"a100": 1})
    job = queues.job(jobs, "pausable")
    cycle_until(poller, lambda: jobs.status("pausable").get("state") == "Running", what="Running")
    first = queues.workload(job)
    assert first is not None

    def suspend(value: bool) -> None:
        jobs.custom.patch_namespaced_custom_object(
            "foundation-model-stack.github.com",
            "v1beta1",
            jobs.namespace,
            "lmevaljobs",
            "pausable",
            {"spec": {"suspend": value}},
        )

    suspend(True)
    cycle_until(
        poller,
        lambda: queues.workload(job) is None and not jobs.pods(),
        timeout=60,
        what="pod and workload gone",
    )
    assert jobs.status("pausable")["state"] == "Suspended"
    suspend(False)
    cycle_until(
        poller, lambda: jobs.status("pausable").get("state") == "Running", what="Running again"
    )
    second = queues.workload(job)
    assert second is not None and second["metadata"]["uid"] != first["metadata"]["uid"]
    assert _condition(second, "Admitted").get("status") == "True"
    assert jobs.status("pausable")["podAttempt"] == 2
