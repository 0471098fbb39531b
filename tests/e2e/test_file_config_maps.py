"""Extra read-only ConfigMap volumes (``spec.fileConfigMaps``) on the real plane.

A task (from ``customTasks``) reads its data from a file that only a
``fileConfigMaps`` mount provides (``/data/arith/arith.jsonl``); the dummy
model evaluates it on the sandbox's local node. The job ends
Complete/Succeeded with that task's results, and the pod mounts the
ConfigMap read-only where the job asked.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from kubernetes import client
from lmeval_sandbox.runner import LocalRunner

from poller.cycle.reconciler import Reconciler
from tests.e2e.conftest import sample, submit
from tests.poller_fixtures import Jobs, cycle_until

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]


def test_a_task_reads_its_data_from_a_file_config_map(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, runner: LocalRunner
) -> None:
    tasks, job = sample("dummy-model")
    task = yaml.safe_load(tasks["data"]["sample_arith_mc.yaml"])
    task["task"] = "extra_arith_mc"
    task["dataset_kwargs"]["data_files"]["test"] = "/data/arith/arith.jsonl"
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_config_map(
        jobs.namespace,
        {"metadata": {"name": "extra-tasks"}, "data": {"extra.yaml": yaml.safe_dump(task)}},
    )
    core.create_namespaced_config_map(
        jobs.namespace,
        {"metadata": {"name": "arith-data"}, "data": {"arith.jsonl": tasks["data"]["arith.jsonl"]}},
    )
    job = copy.deepcopy(job)
    job["metadata"]["name"] = "extra-files"
    job["spec"]["tasks"] = ["extra_arith_mc"]
    job["spec"]["customTasks"] = [{"configMap": "extra-tasks"}]
    job["spec"]["fileConfigMaps"] = [
        {"configMapRef": {"name": "arith-data"}, "mountPath": "/data/arith"}
    ]
    submit(admin_api, jobs.namespace, job)

    def complete() -> dict[str, Any] | None:
        status = jobs.status("extra-files")
        return status if status.get("state") == "Complete" else None

    final = cycle_until(poller, complete, timeout=240, what="extra-files Complete")
    assert final["reason"] == "Succeeded", final.get("message")
    assert "extra_arith_mc" in final["results"]
    pod = jobs.pod(final["podName"])
    [mount] = [m for m in pod.spec.containers[0].volume_mounts if m.mount_path == "/data/arith"]
    assert mount.read_only is True
    [volume] = [v for v in pod.spec.volumes if v.name == mount.name]
    assert volume.config_map.name == "arith-data"
