"""A running job pod's image changed by a co-tenant, on a real kubelet.

The apiserver lets whoever may patch pods change a container's image, and the
kubelet then kills that container and starts the new image in its place, with
the job's Secrets, even in a pod that never restarts. Checks, with the poller
deployed as a user installs it (every admission policy bound cluster-wide):

- the job-pods policy refuses the image patch, naming ``spec``, and the job
  goes on to Succeed with its own results;
- with that policy's binding removed (a cluster without it), the patch goes
  through and the kubelet really restarts the container with the new image
  (seen in the pod's status while the poller is scaled to zero, so that the
  kubelet's behaviour is observed, not raced); once the poller is back, the
  job ends Failed, cause AlteredPod, naming the pod, its results never read,
  and the pod is deleted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.node.conftest import NodeCluster, served_job
from tests.waiting import wait_for

pytestmark = [pytest.mark.node, pytest.mark.lmeval]

POLICY = "lmeval-job-pods-frozen"


def _main(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == "lmeval"), {})


def _running_pod(cluster: NodeCluster, namespace: str, job: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pod = cluster.pod_of(namespace, job)
        return pod if "running" in (_main(pod).get("state") or {}) else None

    found: dict[str, Any] = wait_for(running, timeout=180, interval=1, what=f"{job} running")
    return found


def _patch_image(cluster: NodeCluster, namespace: str, pod: str, image: str) -> Any:
    patch = {"spec": {"containers": [{"name": "lmeval", "image": image}]}}
    return cluster.plane.kubectl(
        "-n",
        namespace,
        "patch",
        "pod",
        pod,
        "--type=strategic",
        "-p",
        json.dumps(patch),
        check=False,
    )


def _scale_poller(cluster: NodeCluster, replicas: int) -> None:
    cluster.kubectl(
        "-n", "lmeval-system", "scale", "deployment/lmeval-poller", f"--replicas={replicas}"
    )
    if replicas:
        cluster.kubectl(
            "-n",
            "lmeval-system",
            "rollout",
            "status",
            "deployment/lmeval-poller",
            "--timeout=180s",
            timeout=200,
        )
    else:
        wait_for(
            lambda: (
                not json.loads(
                    cluster.kubectl(
                        "-n",
                        "lmeval-system",
                        "get",
                        "pods",
                        "-l",
                        "app.kubernetes.io/name=lmeval-poller",
                        "-o",
                        "json",
                    )
                )["items"]
            ),
            timeout=120,
            what="the poller's pods gone",
        )


@pytest.fixture
def unprotected(node_cluster: NodeCluster) -> Iterator[None]:
    """The job-pods policy's binding removed for the test, then put back."""
    binding = node_cluster.kubectl("get", "validatingadmissionpolicybinding", POLICY, "-o", "json")
    document = json.loads(binding)
    node_cluster.kubectl("delete", "validatingadmissionpolicybinding", POLICY)
    try:
        yield
    finally:
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
            document["metadata"].pop(key, None)
        document.pop("status", None)
        node_cluster.plane.kubectl("apply", "-f", "-", input_text=json.dumps(document))
        _scale_poller(node_cluster, 1)


def test_the_policy_refuses_an_image_patch(node_cluster: NodeCluster, job_namespace: str) -> None:
    configmap, job = served_job(node_cluster, "guarded", delay="0.3")
    node_cluster.apply(configmap, job, namespace=job_namespace)
    pod = _running_pod(node_cluster, job_namespace, "guarded")
    name = pod["metadata"]["name"]

    def refused() -> str | None:
        out = _patch_image(node_cluster, job_namespace, name, node_cluster.image_refs["poller"])
        return out.stderr if out.returncode != 0 else None

    message = wait_for(refused, timeout=10, what="the patch refused")
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in message, message
    assert f"spec: pod {name} is the pod of an LMEvalJob" in message
    status = node_cluster.wait_final(job_namespace, "guarded")
    assert status["reason"] == "Succeeded", status.get("message")
    assert _main(node_cluster.get("pod", name, job_namespace)).get("restartCount", 0) == 0


def test_without_the_policy_the_kubelet_restarts_it_and_the_poller_fails_the_job(
    node_cluster: NodeCluster, job_namespace: str, unprotected: None
) -> None:
    configmap, job = served_job(node_cluster, "hijacked", delay="0.5")
    node_cluster.apply(configmap, job, namespace=job_namespace)
    pod = _running_pod(node_cluster, job_namespace, "hijacked")
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    recorded = node_cluster.job_status(job_namespace, "hijacked")
    assert recorded.get("podFingerprint", "").startswith("sha256:"), recorded
    evil = node_cluster.image_refs["poller"]
    _scale_poller(node_cluster, 0)
    out = _patch_image(node_cluster, job_namespace, name, evil)
    assert out.returncode == 0, out.stderr

    def restarted() -> dict[str, Any] | None:
        main = _main(node_cluster.get("pod", name, job_namespace))
        return main if main.get("restartCount", 0) >= 1 else None

    main = wait_for(restarted, timeout=120, interval=1, what="the kubelet's restart")
    assert main["image"].endswith(evil.rsplit("/", 1)[-1]) or main["image"] == evil, main

    _scale_poller(node_cluster, 1)
    status = node_cluster.wait_final(job_namespace, "hijacked", timeout=180)
    assert status["reason"] == "Failed", status
    assert f"pod {name} was changed after the poller created it" in status["message"]
    assert "results" not in status
    reasons = {c["type"]: c["reason"] for c in status.get("conditions", [])}
    assert reasons.get("Succeeded") == "AlteredPod", reasons
    wait_for(
        lambda: node_cluster.get("pod", name, job_namespace).get("metadata", {}).get("uid") != uid,
        timeout=120,
        what=f"pod {name} deleted",
    )
