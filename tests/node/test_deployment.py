"""The poller as users deploy it: its image, ``kubectl apply -k``, in-cluster.

Checks, on the real node:

- the Deployment from ``deploy/overlays/kubernetes`` (only the image and the
  settings swapped by an overlay) becomes Available: the image starts under
  the Deployment's own restricted security context, and its startup and
  readiness probes pass, which needs a first successful cycle;
- the poller talks to the API with its mounted ServiceAccount token through
  the ``kubernetes`` Service (the in-cluster config path): the audit log
  shows its requests as ``system:serviceaccount:lmeval-system:lmeval-poller``
  from the pod's address;
- a real Prometheus scrapes its metrics through the Service's cluster IP
  (kube-proxy's rules) and answers PromQL on the poller's cycle counter.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from lmeval_sandbox.prometheus import PrometheusServer

from tests.node.conftest import NODE_NAME, NodeCluster
from tests.waiting import wait_for

pytestmark = [pytest.mark.node]

POLLER_USER = "system:serviceaccount:lmeval-system:lmeval-poller"


def _poller_pod(cluster: NodeCluster) -> dict[str, Any]:
    pods = json.loads(
        cluster.kubectl(
            "get",
            "pods",
            "-n",
            "lmeval-system",
            "-l",
            "app.kubernetes.io/name=lmeval-poller",
            "-o",
            "json",
        )
    )["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]  # type: ignore[no-any-return]


def test_poller_runs_in_cluster_with_its_token(node_cluster: NodeCluster) -> None:
    pod = _poller_pod(node_cluster)
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["spec"]["containers"][0]["image"] == node_cluster.image_refs["poller"]
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True", pod["status"]
    pod_ip = pod["status"]["podIP"]

    def from_the_pod() -> list[dict[str, Any]] | None:
        lines = node_cluster.plane.audit.path.read_text().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        found = [
            e
            for e in events
            if e.get("user", {}).get("username") == POLLER_USER
            and pod_ip in e.get("sourceIPs", [])
            and e.get("objectRef", {}).get("resource") == "lmevaljobs"
        ]
        return found or None

    # The audit backend writes in its own time, and the pod's first requests
    # (the settings ConfigMap) may be all that is written yet: wait for the
    # list of jobs itself rather than for any request.
    seen = wait_for(from_the_pod, timeout=60, what="the poller's list of jobs from its pod")
    assert all(e["user"]["username"] == POLLER_USER for e in seen)


def test_prometheus_scrapes_the_poller_through_its_service(node_cluster: NodeCluster) -> None:
    service = json.loads(
        node_cluster.kubectl(
            "get", "service", "lmeval-poller-metrics", "-n", "lmeval-system", "-o", "json"
        )
    )
    target = f"{service['spec']['clusterIP']}:8080"
    with PrometheusServer(node_cluster.workdir / "prometheus", [target]) as prometheus:

        def cycles() -> float | None:
            result = prometheus.query('lmeval_poll_cycles_total{job="lmeval-poller"}')
            return sum(float(r["value"][1]) for r in result) or None

        first = wait_for(cycles, timeout=60, interval=1, what="poll cycles scraped")
        later = wait_for(
            lambda: (c := cycles()) and c > first and c,
            timeout=60,
            interval=1,
            what="the counter moving",
        )
        assert later > first
        up = prometheus.query(f'up{{instance="{target}"}}')
        assert up and up[0]["value"][1] == "1", up
