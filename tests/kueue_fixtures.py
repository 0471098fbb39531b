"""Fixtures for the tests with Kueue: GPU nodes, flavors, queues, labelled jobs.

(A plugin of the root conftest: tests/kueue uses them, and so does the RBAC
audit, which drives the poller's Kueue calls itself.)

Kueue itself is the session fixture ``kueue`` (tests/conftest.py). Two kwok
nodes offer GPUs (``nvidia.com/gpu`` in their capacity), one labelled
``gpu-type: a100``, the other ``gpu-type: h100``, both tainted
``nvidia.com/gpu=present:NoSchedule`` (other tests' pods never land there);
two ResourceFlavors name those labels and carry the toleration, which the
poller adds to the pods Kueue admits to them. Each test makes its own
ClusterQueue (cluster-scoped, named after its namespace, selecting only that
namespace) and LocalQueue, and deletes them afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from lmeval_sandbox import kwok
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.kueue import KueueServer

from poller import api
from poller.decisions import kueueadmission
from tests.poller_fixtures import Jobs, job_body
from tests.waiting import wait_for

GPU = "nvidia.com/gpu"
GPU_NODES = {"kueue-a100": "a100", "kueue-h100": "h100"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
FLAVORS = ("a100", "h100")
KUEUE = f"{kueueadmission.KUEUE_GROUP}/{kueueadmission.KUEUE_VERSION}"


def apply(plane: ControlPlane, *objects: dict[str, Any]) -> None:
    plane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(objects))


@pytest.fixture(scope="session")
def kueue_cluster(kueue: KueueServer, control_plane: ControlPlane) -> KueueServer:
    """Kueue running, with the GPU nodes and their flavors."""
    nodes = []
    for name, kind in GPU_NODES.items():
        node = kwok.node_body(name, labels={"gpu-type": kind})
        node["spec"] = {"taints": [GPU_TAINT]}
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", GPU: "4"}
        node["status"] = {"capacity": capacity, "allocatable": capacity}
        nodes.append(node)
    apply(control_plane, *nodes)
    flavors = [
        {
            "apiVersion": KUEUE,
            "kind": "ResourceFlavor",
            "metadata": {"name": kind},
            "spec": {"nodeLabels": {"gpu-type": kind}, "tolerations": [GPU_TOLERATION]},
        }
        for kind in FLAVORS
    ]
    apply(control_plane, *flavors)

    def ready() -> bool:
        out = control_plane.kubectl(
            "get", "nodes", "-l", "gpu-type", "-o", "jsonpath={.items[*].status.allocatable}"
        ).stdout
        return out.count(GPU) == len(GPU_NODES)

    wait_for(ready, timeout=60, what="GPU nodes with allocatable GPUs")
    return kueue


class Queues:
    """One test's ClusterQueue and LocalQueue, and jobs labelled for them."""

    def __init__(self, plane: ControlPlane, admin_api: client.ApiClient, namespace: str) -> None:
        self.plane = plane
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(admin_api)
        self.cluster_queue = f"cq-{namespace}"[:63]
        self.local_queue = "team"
        self.made: list[tuple[str, str]] = []

    def create(
        self,
        gpus: dict[str, int],
        *,
        preemption: bool = False,
        priority_classes: dict[str, int] | None = None,
    ) -> None:
        """A ClusterQueue with `gpus` per flavor (in that order), and its LocalQueue."""
        spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
            "resourceGroups": [
                {
                    "coveredResources": [GPU],
                    "flavors": [
                        {"name": name, "resources": [{"name": GPU, "nominalQuota": count}]}
                        for name, count in gpus.items()
                    ],
                }
            ],
        }
        if preemption:
            spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
        objects: list[dict[str, Any]] = [
            {
                "apiVersion": KUEUE,
                "kind": "ClusterQueue",
                "metadata": {"name": self.cluster_queue},
                "spec": spec,
            },
            {
                "apiVersion": KUEUE,
                "kind": "LocalQueue",
                "metadata": {"name": self.local_queue, "namespace": self.namespace},
                "spec": {"clusterQueue": self.cluster_queue},
            },
        ]
        self.made.append(("clusterqueue", self.cluster_queue))
        for name, value in (priority_classes or {}).items():
            objects.append(
                {
                    "apiVersion": KUEUE,
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                }
            )
            self.made.append(("workloadpriorityclass", name))
        apply(self.plane, *objects)

        def active() -> bool:
            found = self.custom.get_cluster_custom_object(
                kueueadmission.KUEUE_GROUP,
                kueueadmission.KUEUE_VERSION,
                "clusterqueues",
                self.cluster_queue,
            )
            conditions = (found.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)

        wait_for(active, timeout=30, what=f"ClusterQueue {self.cluster_queue} active")

    def job(
        self, jobs: Jobs, name: str, *, gpus: int = 1, priority: str | None = None, **spec: Any
    ) -> dict[str, Any]:
        """A job asking `gpus` GPUs, labelled for the LocalQueue (and `priority`)."""
        body = job_body(name, pod={"resources": {"limits": {GPU: str(gpus)}}}, **spec)
        labels = {kueueadmission.QUEUE_LABEL: self.local_queue}
        if priority:
            labels[kueueadmission.PRIORITY_LABEL] = priority
        body["metadata"]["labels"] = labels
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            api.API_GROUP, api.API_VERSION, self.namespace, api.PLURAL, body
        )
        return created

    def workload(self, job: dict[str, Any]) -> dict[str, Any] | None:
        name = kueueadmission.workload_name(job["metadata"]["name"], job["metadata"]["uid"])
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                kueueadmission.KUEUE_GROUP,
                kueueadmission.KUEUE_VERSION,
                self.namespace,
                "workloads",
                name,
            )
        except client.exceptions.ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    def delete(self) -> None:
        for kind, name in reversed(self.made):
            self.plane.kubectl("delete", kind, name, "--wait=false", check=False)


@pytest.fixture
def queues(
    kueue_cluster: KueueServer,
    control_plane: ControlPlane,
    admin_api: client.ApiClient,
    job_namespace: str,
) -> Iterator[Queues]:
    made = Queues(control_plane, admin_api, job_namespace)
    yield made
    made.delete()
