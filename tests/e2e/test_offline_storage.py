"""Models and datasets from storage, offline: a standard lm_eval task on the real plane.

A static PersistentVolume (hostPath, the way a cluster administrator
pre-provisions storage) points at a Hugging Face hub cache that the test
writes itself (tests/hubcache.py: ``allenai/ai2_arc``'s ARC-Easy laid out as
huggingface_hub lays out a downloaded repository). A claim binds to it
(kube-controller-manager's binder), and an LMEvalJob names the claim in
``spec.offline.storage.pvcName``. The job evaluates lm_eval's *standard*
``arc_easy`` task, unchanged (``dataset_path: allenai/ai2_arc``), with
``local-completions`` against the loopback model server, offline. The local
runner plays the kubelet: it mounts the claim's PV directory where the pod
asks (``/cache/storage``). Checks: the job ends Complete/Succeeded, its
results are arc_easy's on the rows written here, the model server answered,
and the cache was never written (datasets' Arrow cache went to the pod's
HF_HOME emptyDir).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import LocalRunner

from poller.cycle.reconciler import Reconciler
from poller.jobpod import offline
from tests.e2e.conftest import sample, submit
from tests.hubcache import ARC_ROWS, static_claim_manifests, tree_state, write_arc_easy
from tests.poller_fixtures import Jobs, cycle_until
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

LMEVAL_TIMEOUT = 240.0


def static_claim(admin_api: client.ApiClient, namespace: str, name: str, path: Path) -> None:
    """A hostPath PV at `path`, pre-bound to claim `namespace/name`, and the claim."""
    core = client.CoreV1Api(admin_api)
    volume, pvc = static_claim_manifests(namespace, name, path)
    core.create_persistent_volume(volume)
    core.create_namespaced_persistent_volume_claim(namespace, pvc)

    def bound() -> bool:
        claim = core.read_namespaced_persistent_volume_claim(name, namespace)
        return claim.status.phase == "Bound"

    wait_for(bound, timeout=60, what=f"claim {name} Bound")


def test_standard_task_with_its_dataset_from_a_claim_offline(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    model_server: ModelServer,
    tmp_path: Path,
) -> None:
    storage = tmp_path / "storage"
    write_arc_easy(storage / "hub")
    before = tree_state(storage)
    static_claim(admin_api, jobs.namespace, "hf-cache", storage)

    _, served = sample("served-model", model_server.port)
    job = copy.deepcopy(served)
    job["metadata"]["name"] = "arc-offline"
    job["spec"]["tasks"] = ["arc_easy"]
    del job["spec"]["customTasks"]
    job["spec"]["offline"] = {"storage": {"pvcName": "hf-cache"}}
    submit(admin_api, jobs.namespace, job)

    def complete() -> dict[str, Any] | None:
        status = jobs.status("arc-offline")
        return status if status.get("state") == "Complete" else None

    final = cycle_until(poller, complete, timeout=LMEVAL_TIMEOUT, what="arc-offline Complete")
    assert final["reason"] == "Succeeded", final.get("message")
    results = json.loads(final["results"])
    assert set(results["results"]) == {"arc_easy"}
    assert results["configs"]["arc_easy"]["dataset_path"] == "allenai/ai2_arc"
    assert results["n-samples"]["arc_easy"]["effective"] == len(ARC_ROWS["test"])
    assert model_server.count("POST /v1/completions") > 0

    pod = jobs.pod(final["podName"])
    [volume] = [v for v in pod.spec.volumes if v.name == offline.STORAGE_VOLUME]
    assert volume.persistent_volume_claim.claim_name == "hf-cache"
    assert volume.persistent_volume_claim.read_only is True
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["HF_HUB_CACHE"] == offline.HUB_CACHE
    assert env["HF_HUB_OFFLINE"] == env["HF_DATASETS_OFFLINE"] == "1"
    log = jobs.core.read_namespaced_pod_log(final["podName"], jobs.namespace, container="lmeval")
    assert "dataset(s) of" in log and "allenai/ai2_arc" in log

    # Read, never written: datasets' Arrow cache is in the pod's HF_HOME.
    assert tree_state(storage) == before
    root = runner.pod_root(jobs.namespace, final["podName"])
    assert root is not None
    assert (root / "cache" / "storage").resolve() == storage
    assert any((root / "cache" / "huggingface" / "datasets").iterdir())
