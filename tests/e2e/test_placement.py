"""Pod placement on the real plane: ``spec.pod.affinity`` and ``spec.pod.priorityClassName``.

The dummy-model sample, placed on the sandbox's local node by node affinity
(instead of its nodeSelector) and given a PriorityClass made by the test:
the real kube-scheduler places it by the affinity, the apiserver's priority
admission resolves the class into the pod's priority, the job runs to
Complete/Succeeded; a job naming a PriorityClass that does not exist is
refused by the apiserver when the poller creates its pod, and ends Failed
with the apiserver's words.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.runner import NODE_LABEL, NODE_NAME, LocalRunner

from poller.cycle.reconciler import Reconciler
from tests.e2e.conftest import sample, submit
from tests.poller_fixtures import Jobs, cycle_until

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]


def _placed(name: str, priority_class: str) -> dict[str, Any]:
    _, job = sample("dummy-model")
    job = copy.deepcopy(job)
    job["metadata"]["name"] = name
    pod = job["spec"]["pod"]
    [(key, value)] = pod.pop("nodeSelector").items()
    pod["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
                ]
            }
        }
    }
    pod["priorityClassName"] = priority_class
    return job


def _complete(jobs: Jobs, name: str) -> Any:
    def probe() -> dict[str, Any] | None:
        status = jobs.status(name)
        return status if status.get("state") == "Complete" else None

    return probe


def test_affinity_and_priority_class_place_the_pod(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, runner: LocalRunner
) -> None:
    scheduling = client.SchedulingV1Api(admin_api)
    name = f"{jobs.namespace}-eval"[:63]
    scheduling.create_priority_class({"metadata": {"name": name}, "value": 1234})
    try:
        job = _placed("placed", name)
        assert NODE_LABEL[0] in str(job["spec"]["pod"]["affinity"])
        submit(admin_api, jobs.namespace, job)
        final = cycle_until(poller, _complete(jobs, "placed"), timeout=240, what="placed Complete")
        assert final["reason"] == "Succeeded", final.get("message")
        pod = jobs.pod(final["podName"])
        assert pod.spec.node_name == NODE_NAME
        assert pod.spec.node_selector is None
        assert pod.spec.priority_class_name == name
        assert pod.spec.priority == 1234
        terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert terms.node_selector_terms[0].match_expressions[0].values == ["true"]
    finally:
        scheduling.delete_priority_class(name)


def test_an_unknown_priority_class_fails_the_job_with_the_apiservers_words(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, runner: LocalRunner
) -> None:
    submit(admin_api, jobs.namespace, _placed("unplaced", "no-such-class"))
    final = cycle_until(poller, _complete(jobs, "unplaced"), timeout=60, what="unplaced Complete")
    assert final["reason"] == "Failed"
    assert "no-such-class" in final["message"], final["message"]
