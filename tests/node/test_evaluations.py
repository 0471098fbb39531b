"""Real evaluations on the real node, seen as a user sees them (the job's status).

Checks, with the poller deployed in-cluster from its own image and job pods
run by a kubelet on containerd and runc from the job image:

- a dummy-model job and a ``local-completions`` job against the sample model
  server (a sidecar in the job pod) both succeed with lm_eval's scores in
  ``status.results``, in both results modes: ``log`` (markers read through
  the apiserver from the kubelet) and ``exec`` (``cat`` run in the held
  container through the apiserver and the kubelet);
- the pod ran on the real node, not on a (tainted) kwok node, although the
  job has no placement at all;
- the driver-image path: an init container copies the driver from the
  driver image and the evaluation runs ``python -m driver``;
- a log larger than ``containerLogMaxSize`` is rotated by the kubelet and the
  job still gets its results (the markers come after the rotation).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.node.conftest import NODE_NAME, NodeCluster, job_body, model_server_sidecar

pytestmark = [pytest.mark.node, pytest.mark.lmeval]


def _served_job(cluster: NodeCluster, name: str, **extra: object) -> tuple[dict, dict]:  # type: ignore[type-arg]
    configmap, job = job_body("served-model", name, **extra)
    job["spec"]["pod"] = {"sidecars": [model_server_sidecar(cluster.image_refs["job"])]}
    return configmap, job


def _assert_succeeded(status: dict, tasks: set[str]) -> None:  # type: ignore[type-arg]
    assert status["reason"] == "Succeeded", status.get("message")
    scores = status["results"]
    assert tasks <= set(scores), scores


@pytest.mark.parametrize("source", ["log", "exec"])
def test_dummy_and_served_models_succeed(
    node_cluster: NodeCluster, job_namespace: str, source: str
) -> None:
    node_cluster.set_settings(results_source=source)
    try:
        configmap, dummy = job_body("dummy-model", "dummy")
        _, served = _served_job(node_cluster, "served")
        node_cluster.apply(configmap, dummy, served, namespace=job_namespace)
        dummy_status = node_cluster.wait_final(job_namespace, "dummy")
        served_status = node_cluster.wait_final(job_namespace, "served")
    finally:
        node_cluster.set_settings(results_source="log")
    _assert_succeeded(dummy_status, {"sample_arith_mc"})
    _assert_succeeded(served_status, {"sample_arith_mc", "sample_arith_gen"})
    # The toy server answers deterministically: these are its known scores.
    gen = served_status["results"]["sample_arith_gen"]
    assert any(key.startswith("exact_match") for key in gen), gen
    pod = node_cluster.pod_of(job_namespace, "served")
    if pod:  # kept until the TTL; where it is, it ran on the real node
        assert pod["spec"]["nodeName"] == NODE_NAME


def test_driver_image_init_container_copies_the_driver(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    node_cluster.set_settings(driver_image=node_cluster.image_refs["driver"])
    try:
        configmap, job = job_body("dummy-model", "copied-driver")
        node_cluster.apply(configmap, job, namespace=job_namespace)
        status = node_cluster.wait_final(job_namespace, "copied-driver")
        events = node_cluster.kubectl("get", "events", "-n", job_namespace, "-o", "json")
    finally:
        node_cluster.set_settings(driver_image="")
    _assert_succeeded(status, {"sample_arith_mc"})
    # The kubelet really ran the init container from the driver image.
    assert node_cluster.image_refs["driver"] in events
    assert "install-driver" in events


def test_rotated_log_still_yields_results(node_cluster: NodeCluster, job_namespace: str) -> None:
    configmap, job = _served_job(node_cluster, "rotated", logSamples=True)
    node_cluster.apply(configmap, job, namespace=job_namespace)
    status = node_cluster.wait_final(job_namespace, "rotated")
    _assert_succeeded(status, {"sample_arith_mc", "sample_arith_gen"})
    # The kubelet rotated the evaluation container's log at least once.
    pod_dirs = list(Path(node_cluster.node.pod_logs).glob(f"{job_namespace}_rotated-*"))
    assert pod_dirs, "no pod log directory on the node"
    rotated = [p.name for p in (pod_dirs[0] / "lmeval").iterdir() if p.name != "0.log"]
    assert rotated, "the log was never rotated: raise the job's output or lower the max size"
