"""The sandbox's local node as the API server sees it, and its pods' status.

The runner plays a kubelet, and a kubelet's side of the API is what it
reports: a Node object (labelled and tainted so that only pods that ask for
it land there), the node's status (capacity, Ready, and the kubelet port,
which sends ``pods/log`` to kwok), and each pod's status in the shape the
poller and ``kubectl`` read on a real node. These are built here from the
runner's local state, apart from the loop that moves pods along; a job is
put on the node with `placement`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from lmeval_sandbox.localproc import LocalPod, memory_kib
from lmeval_sandbox.podfs import HOST_IP
from lmeval_sandbox.podsetup import ApiError, JsonApi
from poller import timefmt

__all__ = [
    "NODE_LABEL",
    "NODE_NAME",
    "NODE_TAINT",
    "ensure_node",
    "node_body",
    "node_status",
    "placement",
    "pod_status",
]

NODE_NAME = "lmeval-sandbox"
NODE_LABEL = ("sandbox.lmeval.io/local", "true")
NODE_TAINT = {"key": NODE_LABEL[0], "value": NODE_LABEL[1], "effect": "NoSchedule"}


def placement() -> dict[str, Any]:
    """The `spec.pod` fields that put a job on the sandbox's local node."""
    return {
        "nodeSelector": {NODE_LABEL[0]: NODE_LABEL[1]},
        "tolerations": [{**NODE_TAINT, "operator": "Equal"}],
    }


# -- the node ------------------------------------------------------------------------


def node_body(name: str, *, tainted: bool = True) -> dict[str, Any]:
    """The Node object: labelled for `placement`, tainted against everything else.

    Untainted (the sandbox's ``run``), it is where any job without placement
    lands, which the kwok nodes, tainted there, then never take.
    """
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                NODE_LABEL[0]: NODE_LABEL[1],
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
            "annotations": {"sandbox.lmeval.io/runner": "local processes"},
        },
        "spec": {"taints": [dict(NODE_TAINT)]} if tainted else {},
    }


def node_status(name: str, kwok_port: int, ready: bool = True) -> dict[str, Any]:
    """The node's status: this machine's capacity, Ready or not, kwok's kubelet port."""
    now = timefmt.format_time(timefmt.now())
    capacity = {
        "cpu": str(os.cpu_count() or 1),
        "memory": f"{memory_kib()}Ki",
        "pods": "110",
        "ephemeral-storage": "100Gi",
    }

    def condition(kind: str, status: bool, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": "True" if status else "False",
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    return {
        "capacity": capacity,
        "allocatable": capacity,
        "addresses": [
            {"type": "InternalIP", "address": HOST_IP},
            {"type": "Hostname", "address": name},
        ],
        # The apiserver sends pods/log and pods/exec for this node to kwok,
        # which serves the logs the runner writes.
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kwok_port}},
        "conditions": [
            condition("MemoryPressure", False, "KubeletHasSufficientMemory", ""),
            condition("DiskPressure", False, "KubeletHasNoDiskPressure", ""),
            condition("PIDPressure", False, "KubeletHasSufficientPID", ""),
            condition(
                "Ready",
                ready,
                "KubeletReady" if ready else "KubeletNotReady",
                "sandbox runner is serving" if ready else "sandbox runner stopped",
            ),
        ],
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "osImage": "lmeval sandbox (local processes)",
            "kernelVersion": os.uname().release,
            "containerRuntimeVersion": "sandbox-runner://1",
            "kubeletVersion": "sandbox",
            "kubeProxyVersion": "",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def ensure_node(
    api: JsonApi, name: str, kwok_port: int, ready: bool = True, *, tainted: bool = True
) -> None:
    """Create the node if needed and (re)write its status."""
    path = f"/api/v1/nodes/{name}"
    if ready and api.get_or_none(path) is None:
        with contextlib.suppress(ApiError):
            api.request("POST", "/api/v1/nodes", body=node_body(name, tainted=tainted))
    api.request(
        "PATCH",
        f"{path}/status",
        body={"status": node_status(name, kwok_port, ready)},
        content_type="application/strategic-merge-patch+json",
    )


# -- its pods ------------------------------------------------------------------------


def _condition(pod: LocalPod, kind: str, ok: bool, reason: str = "") -> dict[str, Any]:
    status = "True" if ok else "False"
    previous = pod.transitions.get(kind)
    when = previous[1] if previous and previous[0] == status else timefmt.format_time(timefmt.now())
    pod.transitions[kind] = (status, when)
    out = {"type": kind, "status": status, "lastTransitionTime": when, "lastProbeTime": None}
    if reason:
        out["reason"] = reason
    return out


def pod_status(pod: LocalPod) -> dict[str, Any]:
    """The pod's status as a kubelet reports it (a condition keeps its transition time)."""
    phase = pod.phase()
    initialized = all(c.state == "terminated" and c.exit_code == 0 for c in pod.init)
    ready = phase == "Running" and all(c.state == "running" for c in pod.main)
    done = phase in ("Succeeded", "Failed")
    not_ready = "PodCompleted" if done else "ContainersNotReady"
    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "conditions": [
            _condition(pod, "PodReadyToStartContainers", pod.prepared),
            _condition(
                pod,
                "Initialized",
                initialized,
                "" if initialized else "ContainersNotInitialized",
            ),
            _condition(pod, "ContainersReady", ready, "" if ready else not_ready),
            _condition(pod, "Ready", ready, "" if ready else not_ready),
        ],
        "containerStatuses": [c.status() for c in pod.main],
    }
    if pod.init:
        status["initContainerStatuses"] = [c.status() for c in pod.init]
    if pod.start_time is not None:
        status["startTime"] = timefmt.format_time(pod.start_time)
    if pod.lost:
        status["reason"] = "ContainerStatusUnknown"
    return status
