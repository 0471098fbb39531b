"""``spec.outputs.pvcManaged`` on the real plane: the poller makes the job's outputs claim.

The dummy-model sample asks for a managed outputs claim. The poller creates
it before the pod (named ``<job>-outputs-<hash>``, labelled with the job's
UID, owned by the job); a hostPath PersistentVolume that the test
pre-binds to that name stands for the cluster's provisioner, and the local
runner mounts it where the pod asks (``/outputs``). Checks: the job ends
Complete/Succeeded, its status names the claim, lm_eval's run directory and
the complete pod log are on the volume; deleting the job deletes the claim
(the garbage collector, through the owner reference).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.runner import LocalRunner

from poller.cycle.reconciler import Reconciler
from poller.jobpod import offline, podspec
from tests.e2e.conftest import sample, submit
from tests.poller_fixtures import Jobs, cycle_until
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]


def test_the_poller_makes_the_outputs_claim_and_it_goes_with_the_job(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    tmp_path: Path,
) -> None:
    _, job = sample("dummy-model")
    job = copy.deepcopy(job)
    job["metadata"]["name"] = "managed-out"
    job["spec"]["outputs"] = {"pvcManaged": {"size": "1Gi"}}
    created = submit(admin_api, jobs.namespace, job)
    uid = created["metadata"]["uid"]
    claim_name = offline.managed_claim_name("managed-out", uid)
    volume_dir = tmp_path / "volume"
    volume_dir.mkdir()
    core = client.CoreV1Api(admin_api)
    core.create_persistent_volume(
        {
            "metadata": {"name": f"{jobs.namespace}-outputs"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(volume_dir), "type": "Directory"},
                "claimRef": {"namespace": jobs.namespace, "name": claim_name},
            },
        }
    )

    def complete() -> dict[str, Any] | None:
        status = jobs.status("managed-out")
        return status if status.get("state") == "Complete" else None

    final = cycle_until(poller, complete, timeout=240, what="managed-out Complete")
    assert final["reason"] == "Succeeded", final.get("message")
    assert claim_name in final["outputs"]
    claim = core.read_namespaced_persistent_volume_claim(claim_name, jobs.namespace)
    assert claim.metadata.labels[podspec.LABEL_JOB_UID] == uid
    [owner] = claim.metadata.owner_references
    assert (owner.kind, owner.uid) == ("LMEvalJob", uid)
    assert claim.spec.resources.requests["storage"] == "1Gi"
    assert claim.status.phase == "Bound"
    assert list(volume_dir.glob("run-*/**/results_*.json"))
    assert (volume_dir / f"{final['podName']}.log").is_file()

    jobs.custom.delete_namespaced_custom_object(
        "foundation-model-stack.github.com", "v1beta1", jobs.namespace, "lmevaljobs", "managed-out"
    )

    def claim_gone() -> bool:
        names = [
            c.metadata.name
            for c in core.list_namespaced_persistent_volume_claim(jobs.namespace).items
        ]
        return claim_name not in names

    wait_for(claim_gone, timeout=120, what=f"claim {claim_name} deleted with its job")
