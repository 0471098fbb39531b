"""The objects the poller makes for a job besides its pod, on the real control plane.

The poller runs as its own ServiceAccount against the real apiserver (kwok
plays the node). A job's managed outputs claim (``outputs.pvcManaged``) and
its results ConfigMap live under names anyone who can read the job can
compute; they are the job's only when the job is their controller:

- a PersistentVolumeClaim made beforehand under the outputs claim's name
  without the job as controller (no owner at all, the job's UID label, or
  another LMEvalJob as controller) ends the job Failed, before any pod
  exists, with a message naming the claim, its kind and what to do; the
  claim is left exactly as it was (same resourceVersion, still there) and,
  per the apiserver's audit log, the poller never patched, updated or
  deleted it;
- a ConfigMap made beforehand under the results ConfigMap's name does the
  same (Failed before any pod, the ConfigMap untouched);
- a claim the job controls (one the poller made before a crash, played here
  by the admin) is adopted and the pod made, and so is the job's own claim
  when it is resumed after a suspend (a second pod, the same claim);
- ``keep: true``: the claim is controlled by the job while it runs, released
  (its owner reference removed) when the job ends, and outlives the job's
  deletion, while a claim without keep goes with its job;
- the release (`Kube.release_claim`) is one atomic JSON patch: it removes
  the owner references only when they are exactly the job's, and a claim
  released already, gone, or owned otherwise is left as it is.

The claims admission policy, which keeps co-tenants from forging the
controller reference, and the squat by a co-tenant it admits, are
tests/deploy/test_claims_policy.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_sandbox.controlplane import ControlPlane

from poller import api
from poller.cycle.reconciler import Reconciler
from poller.jobpod import offline, podspec
from poller.kube.client import Kube
from poller.results import lmeval
from tests.poller_fixtures import POLLER_USER, Jobs, cycle_until
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

MANAGED = {"pvcManaged": {"size": "1Gi"}}
KEPT = {"pvcManaged": {"size": "1Gi", "keep": True}}


def _owner(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "name": name,
        "uid": uid,
        "controller": True,
    }


def _claim(jobs: Jobs, name: str, **metadata: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, **metadata},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    made: dict[str, Any] = jobs.core.api_client.sanitize_for_serialization(
        jobs.core.create_namespaced_persistent_volume_claim(jobs.namespace, body)
    )
    return made


def _read_claim(jobs: Jobs, name: str) -> dict[str, Any] | None:
    try:
        found = jobs.core.read_namespaced_persistent_volume_claim(name, jobs.namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    read: dict[str, Any] = jobs.core.api_client.sanitize_for_serialization(found)
    return read


def _patch_spec(jobs: Jobs, name: str, **spec: Any) -> None:
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, name, {"spec": spec}
    )


def _finished(poller: Reconciler, jobs: Jobs, name: str) -> dict[str, Any]:
    status: dict[str, Any] = cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == "Complete" and jobs.status(name),
        what=f"{name} Complete",
    )
    return status


def _scheduled(poller: Reconciler, jobs: Jobs, name: str, attempt: int = 1) -> dict[str, Any]:
    status: dict[str, Any] = cycle_until(
        poller,
        lambda: jobs.status(name).get("podAttempt") == attempt and jobs.status(name),
        what=f"{name}'s pod attempt {attempt}",
    )
    return status


def _pod_of(jobs: Jobs, uid: str) -> list[str]:
    """The names of the pods of the job `uid` (by their controller)."""
    return [
        p.metadata.name
        for p in jobs.pods()
        if any(o.uid == uid and o.controller for o in p.metadata.owner_references or [])
    ]


def _poller_writes(control_plane: ControlPlane, mark: int, namespace: str, resource: str) -> list:
    return [
        (call.verb, call.code)
        for call in control_plane.audit.events(mark)
        if call.user == POLLER_USER
        and call.namespace == namespace
        and call.resource == resource
        and call.is_write
    ]


def test_a_squatted_outputs_claim_fails_the_job_and_is_never_touched(
    poller: Reconciler, jobs: Jobs, control_plane: ControlPlane
) -> None:
    mark = control_plane.audit.mark()
    other = jobs.create("other-job")
    squats: dict[str, tuple[str, dict[str, Any]]] = {}
    pod_names = set()
    for job, metadata in (
        ("bare", {}),
        ("labelled", None),  # the job's UID label and the poller's, but no controller
        ("owned-else", {"ownerReferences": [_owner("other-job", other["metadata"]["uid"])]}),
    ):
        uid = jobs.create(job, outputs=MANAGED)["metadata"]["uid"]
        if metadata is None:
            metadata = {
                "labels": {
                    podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY,
                    podspec.LABEL_JOB_UID: uid,
                }
            }
        name = offline.managed_claim_name(job, uid)
        squats[job] = (name, _claim(jobs, name, **metadata))
        pod_names.add(podspec.pod_name(job, uid))

    for job, (name, _made) in squats.items():
        final = _finished(poller, jobs, job)
        assert final["reason"] == "Failed", final
        message = final["message"]
        assert (
            f"PersistentVolumeClaim {name} in namespace {jobs.namespace} exists and is not "
            "this job's outputs claim"
        ) in message, message
        assert "neither used, written nor deleted" in message, message
        assert message.endswith("delete it, or rename the job"), message
        assert "podName" not in final
    # (other-job, a plain job, has its pod.)
    assert not pod_names & {p.metadata.name for p in jobs.pods()}
    # One more cycle after the end: still nothing done to the claims.
    poller.run_cycle()
    for job, (name, made) in squats.items():
        now = _read_claim(jobs, name)
        assert now is not None, f"{name} was deleted"
        assert now["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"], job
        assert now["metadata"].get("ownerReferences") == made["metadata"].get("ownerReferences")
    # The apiserver's record: the poller's only writes were the refused creates.
    writes = _poller_writes(control_plane, mark, jobs.namespace, "persistentvolumeclaims")
    assert writes == [("create", 409)] * len(squats), writes


def test_a_squatted_results_configmap_fails_the_job_before_its_pod(
    poller: Reconciler, jobs: Jobs, control_plane: ControlPlane
) -> None:
    mark = control_plane.audit.mark()
    name = lmeval.results_configmap_name("cm-squat")
    made = jobs.core.create_namespaced_config_map(
        jobs.namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"mine": "yes"}),
    )
    jobs.create("cm-squat", outputs=MANAGED)
    final = _finished(poller, jobs, "cm-squat")
    assert final["reason"] == "Failed", final
    assert final["message"].startswith(
        f"ConfigMap {name} in namespace {jobs.namespace} exists and is not this job's results "
        "ConfigMap (it has no controller ownerReference)"
    ), final["message"]
    assert not jobs.pods()
    now = jobs.core.read_namespaced_config_map(name, jobs.namespace)
    assert now.metadata.resource_version == made.metadata.resource_version
    assert now.data == {"mine": "yes"}
    # Checked before the claim was made: nothing of the job's is left behind.
    assert _poller_writes(control_plane, mark, jobs.namespace, "persistentvolumeclaims") == []
    assert _poller_writes(control_plane, mark, jobs.namespace, "configmaps") == []


def test_the_jobs_own_claim_is_adopted_and_its_kept_claim_outlives_it(
    poller: Reconciler, jobs: Jobs
) -> None:
    # A claim the job controls is already there (the poller made it, then
    # crashed before the pod): adopted, and the pod made.
    crashed = jobs.create("crashed", outputs=MANAGED)
    uid = crashed["metadata"]["uid"]
    name = offline.managed_claim_name("crashed", uid)
    made = _claim(jobs, name, ownerReferences=[_owner("crashed", uid)])
    status = _scheduled(poller, jobs, "crashed")
    assert status["outputs"].startswith(f"PersistentVolumeClaim {name}:"), status
    assert jobs.pod(status["podName"]).metadata.uid == status["podUID"]
    adopted = _read_claim(jobs, name)
    assert adopted is not None
    assert adopted["metadata"]["ownerReferences"] == made["metadata"]["ownerReferences"]

    # keep: true. Controlled by the job while it lives, so a resumed job
    # (a second pod) finds it its own.
    kept = jobs.create("kept", outputs=KEPT)
    uid = kept["metadata"]["uid"]
    name = offline.managed_claim_name("kept", uid)
    _scheduled(poller, jobs, "kept")
    claim = _read_claim(jobs, name)
    assert claim is not None
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (api.KIND, uid, True)
    for suspend in (True, False):
        _patch_spec(jobs, "kept", suspend=suspend)
        if suspend:
            cycle_until(
                poller,
                lambda: jobs.status("kept").get("state") == "Suspended" and not _pod_of(jobs, uid),
                what="kept suspended, its pod gone",
            )
    status = _scheduled(poller, jobs, "kept", attempt=2)
    assert status["state"] != "Complete", status
    assert _pod_of(jobs, uid) == [status["podName"]]

    # It ends (cancelled): released, and it stays when the job is deleted.
    _patch_spec(jobs, "kept", cancel=True)
    assert _finished(poller, jobs, "kept")["reason"] == "Cancelled"
    released = _read_claim(jobs, name)
    assert released is not None and not released["metadata"].get("ownerReferences"), released
    assert released["metadata"]["labels"][podspec.LABEL_JOB_UID] == uid

    for job in ("kept", "crashed"):
        jobs.custom.delete_namespaced_custom_object(
            api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, job
        )
    crashed_claim = offline.managed_claim_name("crashed", crashed["metadata"]["uid"])
    wait_for(
        lambda: _read_claim(jobs, crashed_claim) is None,
        timeout=60,
        what="the claim without keep deleted with its job",
    )
    # Without owner references the garbage collector never takes it; it is
    # still there once its job's own dependents (its pod) are gone.
    wait_for(lambda: not jobs.pods(), timeout=60, what="the jobs' pods deleted")
    assert _read_claim(jobs, name) is not None, "the kept claim went with its job"


def test_a_release_only_ever_removes_exactly_the_jobs_reference(
    poller_kube: Kube, jobs: Jobs
) -> None:
    uid = jobs.create("owner")["metadata"]["uid"]
    ours = [offline.owner_reference("owner", uid)]
    # A real owner: one that does not exist would have the garbage collector delete it.
    another = jobs.create("another")["metadata"]["uid"]
    other = [offline.owner_reference("another", another)]
    made = _claim(jobs, "someone-elses", ownerReferences=other)
    # Not the references asked for: the patch's test fails, nothing changes.
    assert not poller_kube.release_claim(jobs.namespace, "someone-elses", ours)
    after = _read_claim(jobs, "someone-elses")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]
    assert not poller_kube.release_claim(jobs.namespace, "no-such-claim", ours)
    _claim(jobs, "the-jobs", ownerReferences=ours)
    assert poller_kube.release_claim(jobs.namespace, "the-jobs", ours)
    released = _read_claim(jobs, "the-jobs")
    assert released is not None and not released["metadata"].get("ownerReferences")
    # Released already (a retried end): nothing to do, and no error.
    assert not poller_kube.release_claim(jobs.namespace, "the-jobs", ours)
