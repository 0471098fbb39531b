"""How jobs end when the kubelet says no, in the kubelet's own words.

Checks, on the real node:

- cancel: ``spec.cancel`` makes the poller delete the pod, the kubelet sends
  SIGTERM, the driver stops lm_eval within the grace period and reports it,
  and the job ends Cancelled;
- a memory limit below what the evaluation needs: the kernel's OOM killer,
  reported by the runtime as ``OOMKilled``, ends the job Failed saying so;
- an image that does not exist in the registry: ``ErrImagePull`` /
  ``ImagePullBackOff`` until the pending timeout, then Failed with those words;
- an env secret that does not exist: ``CreateContainerConfigError`` until the
  pending timeout, then Failed naming the secret.
"""

from __future__ import annotations

import json

import pytest

from driver.protocol import EXIT_CANCELLED
from tests.node.conftest import SUITE_PENDING, NodeCluster, job_body, served_job
from tests.waiting import wait_for

pytestmark = [pytest.mark.node, pytest.mark.lmeval]

# Long enough to see the kubelet retry, short enough for the suite.
PENDING = "20s"


def _main_running(cluster: NodeCluster, namespace: str, job: str) -> bool:
    pod = cluster.pod_of(namespace, job)
    for container in pod.get("status", {}).get("containerStatuses", []):
        if container["name"] == "lmeval" and "running" in container.get("state", {}):
            return True
    return False


def test_cancel_reaches_lm_eval_through_the_kubelet(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    configmap, job = served_job(node_cluster, "cancelled", delay="2")
    node_cluster.apply(configmap, job, namespace=job_namespace)
    wait_for(
        lambda: node_cluster.job_status(job_namespace, "cancelled").get("state") == "Running",
        timeout=120,
        what="job Running",
    )
    wait_for(
        lambda: _main_running(node_cluster, job_namespace, "cancelled"),
        timeout=60,
        what="lmeval container running",
    )
    pod = node_cluster.job_status(job_namespace, "cancelled")["podName"]
    # Every version of the pod until it is gone: the kubelet reports the
    # container's end before the pod object disappears.
    watch = node_cluster.watch_pod(job_namespace, pod)
    try:
        node_cluster.kubectl(
            "-n",
            job_namespace,
            "patch",
            "lmevaljob",
            "cancelled",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"cancel": True}}),
        )
        status = node_cluster.wait_final(job_namespace, "cancelled", timeout=120)
        wait_for(
            lambda: not node_cluster.get("pod", pod, job_namespace),
            timeout=120,
            what=f"pod {pod} gone",
        )
    finally:
        versions = watch.stop()
    assert status["reason"] == "Cancelled", status.get("message")
    message = status.get("message", "")
    print(f"cancel: {message}")
    assert "cancel" in message.lower(), message
    ended = [
        c["state"]["terminated"]
        for version in versions
        for c in version.get("status", {}).get("containerStatuses", [])
        if c["name"] == "lmeval" and "terminated" in c.get("state", {})
    ]
    assert ended, "the kubelet never reported the evaluation container's end"
    print(f"cancel: lmeval container ended {ended[-1]}")
    # The driver's own exit code for "stopped by SIGTERM" (not the kubelet's
    # SIGKILL after the grace period, 137): SIGTERM reached lm_eval in time.
    assert ended[-1]["exitCode"] == EXIT_CANCELLED, ended[-1]
    # The driver's report, which the kubelet keeps as the termination message
    # (the pod's FallbackToLogsOnError): lm_eval stopped by SIGTERM, not killed.
    assert "cancelled by SIGTERM" in ended[-1].get("message", ""), ended[-1]
    assert '"killed":false' in ended[-1]["message"], ended[-1]


def test_memory_limit_ends_failed_with_oomkilled(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    configmap, job = job_body("dummy-model", "oom")
    # lm_eval and its imports need a few hundred MiB; 48Mi is far below.
    job["spec"]["pod"] = {"resources": {"limits": {"memory": "48Mi"}}}
    node_cluster.apply(configmap, job, namespace=job_namespace)
    status = node_cluster.wait_final(job_namespace, "oom", timeout=180)
    assert status["reason"] == "Failed", status
    print(f"oom: {status.get('message')}")
    assert "OOMKilled" in status.get("message", ""), status.get("message")


def test_missing_image_fails_with_the_kubelets_words(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    missing = node_cluster.node.image("lmeval-poller/no-such-image:absent")
    node_cluster.set_settings(pod_image=missing, pod_pending_timeout=PENDING)
    try:
        configmap, job = job_body("dummy-model", "no-image")
        node_cluster.apply(configmap, job, namespace=job_namespace)
        status = node_cluster.wait_final(job_namespace, "no-image", timeout=180)
    finally:
        node_cluster.set_settings(
            pod_image=node_cluster.image_refs["job"], pod_pending_timeout=SUITE_PENDING
        )
    assert status["reason"] == "Failed", status
    message = status.get("message", "")
    print(f"missing image: {message}")
    assert "ErrImagePull" in message or "ImagePullBackOff" in message, message
    assert "no-such-image" in message, message


def test_missing_secret_fails_with_create_container_config_error(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    configmap, job = job_body("dummy-model", "no-secret")
    job["spec"]["envSecrets"] = [
        {"env": "OPENAI_API_KEY", "secretRef": {"name": "absent-secret", "key": "token"}}
    ]
    node_cluster.set_settings(pod_pending_timeout=PENDING)
    try:
        node_cluster.apply(configmap, job, namespace=job_namespace)
        status = node_cluster.wait_final(job_namespace, "no-secret", timeout=180)
    finally:
        node_cluster.set_settings(pod_pending_timeout=SUITE_PENDING)
    assert status["reason"] == "Failed", status
    message = status.get("message", "")
    print(f"missing secret: {message}")
    assert "CreateContainerConfigError" in message, message
    assert "absent-secret" in message, message
