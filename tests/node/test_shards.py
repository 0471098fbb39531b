"""A sharded LMEvalJob on the real node, one of its shard pods lost mid-run.

The poller runs in-cluster; the kubelet runs the shard pods, the merge pod
and their model servers (the sample's server as a sidecar of each pod) from
the project's images on containerd and runc. The shards share a claim: a
static hostPath PersistentVolume (ReadWriteOnce, pre-bound) whose directory
the test reads on the host, as the kubelet bind-mounts it. Checks, for the
served-model sample with ``parallelism: 2`` and answers slowed to
`DELAY` s each:

- once shard 0's pod runs and its response cache on the claim
  (``shards/<job>/shard-0/cache/responses_rank0.db``) holds answers, its pod
  is deleted as a drain or a lost node would take it (``kubectl delete pod
  --wait=false``, graceful, no other warning);
- ``status.shards[0]`` counts it (``failures`` 1, ``attempt`` 2) and a new
  pod of the same name and another UID runs the shard on the node;
- the job ends Succeeded, ``shardsDone`` 2/2, shard 1 untouched (attempt 1,
  no failure); shard 0's message says how many requests its cache answered,
  at least as many as the cache held before its pod was deleted: those were
  not sent to the model again;
- the merged results equal an unsharded run's (the same job without
  ``parallelism``, run beside it): ``results``, ``groups`` and
  ``n-samples``, task by task, every score and stderr exactly.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from poller import api
from poller.jobpod import podspec
from poller.results.lmeval import RESULTS_GZ_KEY, RESULTS_KEY, packed_results_text
from tests.hubcache import static_claim_manifests
from tests.node.conftest import NODE_NAME, NodeCluster, served_job
from tests.waiting import wait_for

pytestmark = [pytest.mark.node, pytest.mark.lmeval]

CLAIM = "shard-outputs"
# Seconds per answer: shard 0 sends 16 requests (4 documents of each sample
# task: 12 choices to score, 4 answers to generate), so after its first
# answers its pod runs several seconds more, time to delete it mid-run.
DELAY = "0.5"
# Answers shard 0's cache holds when its pod is deleted (at least).
CACHED_BEFORE_DELETE = 3
# lm_eval's results fields a merge must give exactly as one unsharded run does.
COMPARED = ("results", "groups", "n-samples")
FINISH_TIMEOUT = 420.0


def _writable_claim(cluster: NodeCluster, namespace: str, path: Path) -> None:
    """Claim CLAIM, Bound to a hostPath PV at `path` that the job's UID may write.

    As tests/hubcache.py makes it, but ReadWriteOnce (the shards write; they
    run on one node, which is what the poller's pod affinity asks)."""
    path.mkdir(parents=True)
    path.chmod(0o777)  # the job runs as the image's UID, not as the test
    manifests = static_claim_manifests(namespace, name=CLAIM, path=path)
    for manifest in manifests:
        manifest["spec"]["accessModes"] = ["ReadWriteOnce"]
    cluster.apply(*manifests, namespace=namespace)
    wait_for(
        lambda: cluster.get("pvc", CLAIM, namespace).get("status", {}).get("phase") == "Bound",
        timeout=60,
        what=f"claim {CLAIM} Bound",
    )


def _cached_answers(claim: Path, job: str, index: int) -> int | None:
    """How many answers shard `index`'s response cache holds; None while unreadable."""
    path = claim / "shards" / job / f"shard-{index}" / "cache" / "responses_rank0.db"
    if not path.is_file():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            (rows,) = db.execute("SELECT COUNT(*) FROM unnamed").fetchone()
    except sqlite3.Error:
        return None  # made, its table not yet; or a write in progress
    return int(rows)


def _main_running(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    main: dict[str, Any] = next((s for s in statuses if s.get("name") == "lmeval"), {})
    return "running" in (main.get("state") or {})


def _results(cluster: NodeCluster, namespace: str, status: dict[str, Any]) -> dict[str, Any]:
    """The job's whole results JSON, from its results ConfigMap."""
    found = cluster.get("configmap", status["resultsConfigMap"], namespace)
    if RESULTS_KEY in (found.get("data") or {}):
        text = found["data"][RESULTS_KEY]
    else:
        text = packed_results_text(found["binaryData"][RESULTS_GZ_KEY])
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _assert_same_results(merged: dict[str, Any], whole: dict[str, Any]) -> None:
    for key in COMPARED:
        ours, theirs = merged.get(key) or {}, whole.get(key) or {}
        assert sorted(ours) == sorted(theirs), (key, sorted(ours), sorted(theirs))
        for task in theirs:
            assert ours[task] == theirs[task], (key, task, ours[task], theirs[task])


def test_a_shard_pod_lost_mid_run_resumes_from_its_cache(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    claim = node_cluster.workdir / "claims" / job_namespace
    _writable_claim(node_cluster, job_namespace, claim)
    configmap, whole = served_job(node_cluster, "whole")
    _, sharded = served_job(node_cluster, "sharded", delay=DELAY)
    for job in (whole, sharded):
        job["spec"]["outputs"] = {"pvcName": CLAIM}
    sharded["spec"]["parallelism"] = 2
    try:
        node_cluster.apply(configmap, whole, sharded, namespace=job_namespace)
        uid = node_cluster.get(api.PLURAL, "sharded", job_namespace)["metadata"]["uid"]
        pod_name = podspec.shard_pod_name("sharded", uid, 0)

        # Shard 0's pod runs, and its cache holds answers: the shard is mid-run.
        def first_pod() -> dict[str, Any] | None:
            pod = node_cluster.get("pod", pod_name, job_namespace)
            return pod if _main_running(pod) else None

        first = wait_for(first_pod, timeout=180, interval=0.5, what=f"{pod_name} running")
        assert first["spec"]["nodeName"] == NODE_NAME

        def answered_some() -> int | None:
            rows = _cached_answers(claim, "sharded", 0)
            return rows if rows is not None and rows >= CACHED_BEFORE_DELETE else None

        cached_before = wait_for(
            answered_some, timeout=120, interval=0.1, what="shard 0's cache holding answers"
        )
        node_cluster.kubectl("delete", "pod", pod_name, "-n", job_namespace, "--wait=false")

        # The poller counts the lost pod and makes the shard a new one, of the
        # same name and another UID, which the kubelet runs.
        def second_attempt() -> tuple[dict[str, Any], dict[str, Any]] | None:
            records = node_cluster.job_status(job_namespace, "sharded").get("shards") or []
            record = records[0] if records else {}
            if record.get("attempt") != 2 or record.get("state") != "Running":
                return None
            pod = node_cluster.get("pod", pod_name, job_namespace)
            if pod.get("metadata", {}).get("uid") != record.get("podUID"):
                return None
            return (record, pod) if _main_running(pod) else None

        retried, second = wait_for(
            second_attempt, timeout=180, interval=0.5, what="shard 0's second pod running"
        )
        final = node_cluster.wait_final(job_namespace, "sharded", timeout=FINISH_TIMEOUT)
        reference = node_cluster.wait_final(job_namespace, "whole", timeout=FINISH_TIMEOUT)
    finally:
        node_cluster.plane.kubectl(
            "delete", "pv", f"{job_namespace}-{CLAIM}", "--wait=false", check=False
        )

    assert retried["failures"] == 1, retried
    assert pod_name in retried.get("message", ""), retried  # what the lost attempt said
    assert second["metadata"]["uid"] != first["metadata"]["uid"], (first, second)
    assert second["spec"]["nodeName"] == NODE_NAME

    assert reference["reason"] == "Succeeded", reference.get("message")
    assert final["reason"] == "Succeeded", final.get("message")
    assert final["shardsDone"] == "2/2", final
    lost, other = final["shards"]
    assert lost["state"] == "Succeeded", lost
    assert (lost["attempt"], lost["failures"]) == (2, 1), lost
    assert other["state"] == "Succeeded", other
    assert (other["attempt"], other.get("failures", 0)) == (1, 0), other
    said = re.fullmatch(
        r"shard 0/2: (\d+) requests, (\d+) answered from the cache \(resumed\)",
        lost.get("message", ""),
    )
    assert said is not None, lost
    requests, from_cache = int(said.group(1)), int(said.group(2))
    # Every answer the cache held when the pod was lost came from it, none
    # was asked again; and the pod was lost mid-run: some were still to ask.
    assert cached_before <= from_cache < requests, (cached_before, lost)
    assert other.get("message", "").startswith("shard 1/2: "), other

    merged = _results(node_cluster, job_namespace, final)
    unsharded = _results(node_cluster, job_namespace, reference)
    # Equal to the unsharded run, and not vacuously: the sample's known scores
    # (the toy server answers deterministically) over all 8 documents.
    _assert_same_results(merged, unsharded)
    assert merged["results"]["sample_arith_gen"]["exact_match,none"] == 0.5, merged["results"]
    assert merged["results"]["sample_arith_mc"]["acc,none"] == 0.25, merged["results"]
    assert merged["n-samples"]["sample_arith_mc"] == {"original": 8, "effective": 8}
