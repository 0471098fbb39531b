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
- the driver-image path: in an image with lm-eval but without our wheel,
  an init container copies the driver from the driver image and the
  evaluation runs ``python -m driver`` from that copy;
- each job's ``status.provenance`` names the image digest the kubelet ran
  (containerd's ``imageID``) and the versions of the run;
- a log larger than ``containerLogMaxSize`` is rotated by the kubelet and the
  job still gets its results (the markers come after the rotation); a
  rotation between the driver's last markers and the container's end, the
  one loss log mode cannot avoid, is told apart (the rotated file holds the
  completed marker, the current one does not) and excused once.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from driver.contract import EVENT_COMPLETED
from driver.protocol import MARKER_PREFIX
from tests.node.conftest import (
    CONTAINER_LOG_MAX_SIZE,
    NODE_NAME,
    NodeCluster,
    job_body,
    served_job,
)

pytestmark = [pytest.mark.node, pytest.mark.lmeval]

# Far below what an evaluation prints (lm_eval's own lines alone are ~8 KiB).
ROTATE_AT = "2Ki"


def _scores(status: dict[str, Any]) -> dict[str, Any]:
    """lm_eval's per-task scores from ``status.results`` (its JSON, as a string)."""
    scores: dict[str, Any] = json.loads(status["results"])["results"]
    return scores


def _assert_succeeded(status: dict[str, Any], tasks: set[str]) -> None:
    assert status["reason"] == "Succeeded", status.get("message")
    assert set(_scores(status)) >= tasks, _scores(status)


@pytest.mark.parametrize("source", ["log", "exec"])
def test_dummy_and_served_models_succeed(
    node_cluster: NodeCluster, job_namespace: str, source: str
) -> None:
    node_cluster.set_settings(results_source=source)
    try:
        configmap, dummy = job_body("dummy-model", "dummy")
        _, served = served_job(node_cluster, "served")
        node_cluster.apply(configmap, dummy, served, namespace=job_namespace)
        dummy_status = node_cluster.wait_final(job_namespace, "dummy")
        served_status = node_cluster.wait_final(job_namespace, "served")
    finally:
        node_cluster.set_settings(results_source="log")
    _assert_succeeded(dummy_status, {"sample_arith_mc"})
    _assert_succeeded(served_status, {"sample_arith_mc", "sample_arith_gen"})
    # The toy server answers deterministically: the scores the local runner
    # gets too (README, "What you see").
    scores = _scores(served_status)
    assert scores["sample_arith_gen"]["exact_match,none"] == 0.5, scores
    assert scores["sample_arith_mc"]["acc,none"] == 0.25, scores
    pod = node_cluster.pod_of(job_namespace, "served")
    if pod:  # kept until the TTL; where it is, it ran on the real node
        assert pod["spec"]["nodeName"] == NODE_NAME
    # Provenance: the image digest the kubelet actually ran (containerd's
    # imageID), not the tag the pod asked for, and the versions of the run.
    for status in (dummy_status, served_status):
        provenance = status["provenance"]
        assert provenance["image"].endswith(node_cluster.image_refs["job"].split("/", 1)[1])
        assert re.search(r"sha256:[0-9a-f]{64}$", provenance["imageID"]), provenance
        assert provenance["lmEvalVersion"] and provenance["driverVersion"], provenance
    assert served_status["provenance"]["model"] == "local-completions"
    assert served_status["provenance"]["serverModels"], served_status["provenance"]
    if pod:
        (main,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "lmeval"]
        assert served_status["provenance"]["imageID"] == main["imageID"]


def test_driver_image_runs_in_a_plain_lm_eval_image(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    # pod-image is lm-eval without our wheel: only the init container's copy
    # of the driver (from the driver image) can run the evaluation.
    node_cluster.set_settings(
        pod_image=node_cluster.image_refs["plain"], driver_image=node_cluster.image_refs["driver"]
    )
    try:
        configmap, job = job_body("dummy-model", "copied-driver")
        node_cluster.apply(configmap, job, namespace=job_namespace)
        status = node_cluster.wait_final(job_namespace, "copied-driver")
        pod = node_cluster.pod_of(job_namespace, "copied-driver")
    finally:
        node_cluster.set_settings(pod_image=node_cluster.image_refs["job"], driver_image="")
    _assert_succeeded(status, {"sample_arith_mc"})
    if pod:  # kept until the TTL: the kubelet ran the copy from the driver image
        (init,) = pod["status"]["initContainerStatuses"]
        assert init["image"].endswith(node_cluster.image_refs["driver"].split("/", 1)[1])
        assert init["state"]["terminated"]["exitCode"] == 0
        assert pod["spec"]["containers"][0]["image"] == node_cluster.image_refs["plain"]


def _completed_marker_in(log_dir: Path) -> list[str]:
    """The container log files (current and rotated, gzip'd or not) that hold the
    driver's completed marker."""
    found = []
    for path in sorted(log_dir.iterdir()):
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode(errors="replace")
        if any(MARKER_PREFIX in line and EVENT_COMPLETED in line for line in text.splitlines()):
            found.append(path.name)
    return found


def _rotated_run(cluster: NodeCluster, namespace: str, name: str) -> tuple[dict[str, Any], Path]:
    configmap, job = served_job(cluster, name, delay="0.3")
    cluster.apply(configmap, job, namespace=namespace)
    status = cluster.wait_final(namespace, name)
    (pod_dir,) = Path(cluster.node.pod_logs).glob(f"{namespace}_{name}-*")
    return status, pod_dir / "lmeval"


def test_rotated_log_still_yields_results(node_cluster: NodeCluster, job_namespace: str) -> None:
    # A slow model server keeps the evaluation running across several of the
    # kubelet's log checks (every 3 s) while its log outgrows a tiny maximum.
    node_cluster.node.restart_kubelet(container_log_max_size=ROTATE_AT)
    try:
        status, log_dir = _rotated_run(node_cluster, job_namespace, "rotated")
        if status["reason"] != "Succeeded":
            # The one loss log mode cannot avoid (README, "Results from the
            # log"): the kubelet rotated the log after the driver's last
            # markers and before the container ended, so the current file,
            # all `kubectl logs` serves, holds none of them. Only that is
            # excused, and only once: the rotated files must hold the
            # completed marker, the current one must not.
            assert "no results markers in the log" in status.get("message", ""), status
            holding = _completed_marker_in(log_dir)
            assert holding and "0.log" not in holding, holding
            status, log_dir = _rotated_run(node_cluster, job_namespace, "rotated-again")
        logs = sorted(p.name for p in log_dir.iterdir())
    finally:
        node_cluster.node.restart_kubelet(container_log_max_size=CONTAINER_LOG_MAX_SIZE)
    _assert_succeeded(status, {"sample_arith_mc", "sample_arith_gen"})
    # The kubelet rotated the evaluation container's log at least once: the
    # beginning of the log (the driver's first markers) was gone from
    # `kubectl logs` when the poller read the results.
    assert any(name != "0.log" for name in logs), logs
