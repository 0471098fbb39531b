"""Pod identity on the real control plane: a job's pod is only the pod the poller made.

Another user who may create pods (every job author may) tries what a hostile
tenant would, and each attempt must fail without touching the victim's job,
or end that job Failed with a message naming the pod, never with invented
scores:

- a pod that copies the job pod's labels and controller ownerReference, beside
  the real one, whose log claims other scores and which exits first: ignored,
  the job's results are the real pod's;
- the same claim from a pod in *another* namespace (all a viewer of the job
  needs is its UID): ignored;
- a pod created under the job's deterministic pod name before the poller's
  first cycle, with the poller's labels and a made-up proof, and one without
  any label (invisible to the poller's LIST, met as AlreadyExists): the job
  ends Failed naming it, and the pod is left as it was;
- the real pod deleted and replaced under the same name with its proof
  annotation copied: Failed, "deleted and replaced";
- a ConfigMap under the job's results ConfigMap name made by someone else:
  never overwritten; the job still Succeeds with its results in status, and
  says why the complete results were not stored;
- a poller that dies between creating a pod and recording it in the status:
  the next poller adopts that pod (proof for the next attempt) instead of
  failing or making a second one (the audit log counts one creation);
- the key that proves origin lives in the poller's Secret and survives
  restarts: a second Reconciler trusts the first one's pods;
- upgrade: a running job whose pod an older poller made (no proof) before the
  key existed keeps running and finishes; a proof-less pod made after the
  key existed is refused.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.controlplane import ControlPlane

from poller.cycle.podproof import KEY_FIELD, KEY_SECRET
from poller.cycle.reconciler import Reconciler
from poller.decisions.views import PROOF_ANNOTATION
from poller.jobpod import podspec
from poller.kube.client import Kube
from poller.results import lmeval
from tests.poller_fixtures import (
    POLLER_NS,
    CapturedRun,
    Jobs,
    cycle_until,
    forged_log,
    serve_log,
    terminate,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def _claiming_pod(
    name: str, namespace: str, job: dict[str, Any], *, labels: bool = True, proof: str = ""
) -> dict[str, Any]:
    """A pod that claims to be `job`'s, as any user who may create pods can make it."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "ownerReferences": [
            {
                "apiVersion": job["apiVersion"],
                "kind": job["kind"],
                "name": job["metadata"]["name"],
                "uid": job["metadata"]["uid"],
                "controller": True,
            }
        ],
    }
    if labels:
        meta["labels"] = {
            podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY,
            podspec.LABEL_JOB_NAME: job["metadata"]["name"],
            podspec.LABEL_JOB_UID: job["metadata"]["uid"],
        }
    if proof:
        meta["annotations"] = {PROOF_ANNOTATION: proof}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": podspec.MAIN_CONTAINER, "image": "registry.example/fake:1"}],
        },
    }


def _running(poller: Reconciler, jobs: Jobs, name: str) -> str:
    status = cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == "Running" and jobs.status(name),
        what=f"{name} Running",
    )
    return str(status["podName"])


def _complete(poller: Reconciler, jobs: Jobs, name: str) -> dict[str, Any]:
    return cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == "Complete" and jobs.status(name),
        what=f"{name} Complete",
    )


def _wait_pod_running(core: client.CoreV1Api, namespace: str, name: str) -> None:
    def running() -> bool:
        statuses = core.read_namespaced_pod(name, namespace).status.container_statuses or []
        return bool(statuses and statuses[0].state.running)

    wait_for(running, timeout=30, what=f"pod {name} running on kwok")


def test_a_claiming_pod_beside_the_real_one_is_ignored(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    job = jobs.create("victim", modelArgs=[{"name": "pretrained", "value": "dummy"}])
    real = _running(poller, jobs, "victim")
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_pod(jobs.namespace, _claiming_pod("victim-fake", jobs.namespace, job))
    _wait_pod_running(core, jobs.namespace, "victim-fake")
    serve_log(admin_api, jobs.namespace, "victim-fake", forged_log(), tmp_path)
    terminate(admin_api, jobs.namespace, "victim-fake", 0)
    for _ in range(3):  # the forged pod has ended: nothing may come of it
        assert poller.run_cycle().errors == 0
    assert jobs.status("victim")["state"] == "Running"

    serve_log(admin_api, jobs.namespace, real, succeeded_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, real, 0)
    final = _complete(poller, jobs, "victim")
    assert final["reason"] == "Succeeded", final
    assert json.loads(final["results"]) == succeeded_run.results
    assert (
        final["podName"] == real
        and final["podUID"] == core.read_namespaced_pod(real, jobs.namespace).metadata.uid
    )


def test_a_claim_from_another_namespace_is_ignored(
    poller_kube: Kube,
    jobs: Jobs,
    admin_api: client.ApiClient,
    control_plane: ControlPlane,
    namespace: str,
) -> None:
    other = f"{namespace}-b"
    core = client.CoreV1Api(admin_api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    try:
        wait_for(
            lambda: any(
                sa.metadata.name == "default"
                for sa in core.list_namespaced_service_account(other).items
            ),
            timeout=30,
            what="default ServiceAccount",
        )
        job = jobs.create("faraway")
        name = podspec.pod_name("faraway", job["metadata"]["uid"])
        # The exact pod name, labels and owner, in the wrong namespace.
        core.create_namespaced_pod(other, _claiming_pod(name, other, job))
        both = Reconciler(poller_kube, settings_namespace=POLLER_NS, namespaces=[namespace, other])
        cycle_until(
            both,
            lambda: jobs.status("faraway").get("state") in ("Scheduled", "Running"),
            what="the job's own pod",
        )
        assert jobs.pod(name).metadata.namespace == namespace
        assert jobs.status("faraway")["podUID"] == jobs.pod(name).metadata.uid
    finally:
        core.delete_namespace(other)


@pytest.mark.parametrize("labelled", [True, False], ids=["labelled", "unlabelled"])
def test_a_pod_squatting_the_job_pod_name_fails_the_job_naming_it(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, labelled: bool
) -> None:
    job = jobs.create("squatted")
    name = podspec.pod_name("squatted", job["metadata"]["uid"])
    core = client.CoreV1Api(admin_api)
    squatter = _claiming_pod(name, jobs.namespace, job, labels=labelled, proof="v1.1." + "0" * 64)
    made = core.create_namespaced_pod(jobs.namespace, squatter)
    final = _complete(poller, jobs, "squatted")
    assert final["reason"] == "Failed"
    message = final["message"]
    assert f"pod {name} in namespace {jobs.namespace} was not created by the poller" in message
    assert "no valid proof" in message
    assert "podUID" not in final
    # Left exactly as it was: not adopted, not deleted, not relabelled.
    still = core.read_namespaced_pod(name, jobs.namespace)
    assert still.metadata.uid == made.metadata.uid and still.metadata.deletion_timestamp is None
    for _ in range(2):
        assert poller.run_cycle().errors == 0
    assert jobs.status("squatted") == final


def test_a_replaced_pod_with_a_copied_proof_is_refused(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    job = jobs.create("replaced")
    name = _running(poller, jobs, "replaced")
    core = client.CoreV1Api(admin_api)
    real = core.read_namespaced_pod(name, jobs.namespace)
    copied = real.metadata.annotations[PROOF_ANNOTATION]
    core.delete_namespaced_pod(name, jobs.namespace, grace_period_seconds=0)
    wait_for(
        lambda: not [p for p in jobs.pods() if p.metadata.uid == real.metadata.uid],
        timeout=30,
        what="the real pod gone",
    )
    core.create_namespaced_pod(
        jobs.namespace, _claiming_pod(name, jobs.namespace, job, proof=copied)
    )
    final = _complete(poller, jobs, "replaced")
    assert final["reason"] == "Failed"
    assert "the job's pod was deleted and replaced" in final["message"]


def test_a_squatted_results_configmap_is_never_overwritten(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    jobs.create("cmsquat")
    name = _running(poller, jobs, "cmsquat")
    core = client.CoreV1Api(admin_api)
    squat = lmeval.results_configmap_name("cmsquat")
    core.create_namespaced_config_map(
        jobs.namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name=squat), data={"mine": "yes"}),
    )
    serve_log(admin_api, jobs.namespace, name, succeeded_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, name, 0)
    final = _complete(poller, jobs, "cmsquat")
    assert final["reason"] == "Succeeded", final
    assert json.loads(final["results"]) == succeeded_run.results
    assert "resultsConfigMap" not in final
    assert (
        f"ConfigMap {squat} in namespace {jobs.namespace} exists and is not owned"
        in (final["message"])
    )
    assert core.read_namespaced_config_map(squat, jobs.namespace).data == {"mine": "yes"}


class _Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing in the cycle catches it."""


class _DiesAfterCreatingPods(Kube):
    def patch_job_status(self, *args: Any, **kwargs: Any) -> None:
        raise _Crash


def test_a_poller_that_dies_between_pod_and_status_is_followed_by_one_that_adopts(
    poller_kube: Kube,
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    control_plane: ControlPlane,
) -> None:
    mark = control_plane.audit.mark()
    job = jobs.create("crashy")
    dying = Reconciler(
        _DiesAfterCreatingPods(poller_kube.transport),
        settings_namespace=POLLER_NS,
        namespaces=[jobs.namespace],
    )
    with pytest.raises(_Crash):
        dying.run_cycle()
    name = podspec.pod_name("crashy", job["metadata"]["uid"])
    assert [p.metadata.name for p in jobs.pods()] == [name]
    assert "state" not in jobs.status("crashy")  # the status was never written
    # A fresh poller (the `poller` fixture: another object, the same key Secret).
    status = cycle_until(
        poller,
        lambda: jobs.status("crashy").get("state") == "Running" and jobs.status("crashy"),
        what="adopted and Running",
    )
    assert status["podAttempt"] == 1
    assert status["podUID"] == jobs.pod(name).metadata.uid
    creations = [
        call
        for call in control_plane.audit.events(mark)
        if call.verb == "create"
        and call.resource == "pods"
        and not call.subresource
        and call.namespace == jobs.namespace
    ]
    assert [c.code for c in creations] == [201]


def test_the_key_is_kept_in_the_poller_secret(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, poller_kube: Kube
) -> None:
    jobs.create("keyed")
    name = _running(poller, jobs, "keyed")
    secret = client.CoreV1Api(admin_api).read_namespaced_secret(KEY_SECRET, POLLER_NS)
    assert len(secret.data["key"]) >= 44  # base64 of 32 bytes
    proof = jobs.pod(name).metadata.annotations[PROOF_ANNOTATION]
    assert proof.startswith("v1.1.")
    # Another poller process (new object, key read from the Secret) trusts the pod.
    again = Reconciler(poller_kube, settings_namespace=POLLER_NS, namespaces=[jobs.namespace])
    report = again.run_cycle()
    assert report.errors == 0
    assert jobs.status("keyed")["state"] == "Running"


def test_an_upgrade_keeps_the_pods_an_older_poller_made(
    poller_kube: Kube,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(admin_api)
    # As an older poller left it: status names the pod, records no attempt or UID,
    # and the pod carries no proof.
    job = jobs.create("legacy")
    name = podspec.pod_name("legacy", job["metadata"]["uid"])
    made = core.create_namespaced_pod(jobs.namespace, _claiming_pod(name, jobs.namespace, job))
    jobs.custom.patch_namespaced_custom_object_status(
        "foundation-model-stack.github.com",
        "v1beta1",
        jobs.namespace,
        "lmevaljobs",
        "legacy",
        {"status": {"state": "Scheduled", "podName": name}},
    )
    born = made.metadata.creation_timestamp
    wait_for(
        lambda: dt.datetime.now(dt.UTC) >= born + dt.timedelta(seconds=1.5),
        timeout=10,
        what="a second boundary after the pod was made",
    )
    # The upgrade: the new poller's key is made after that pod.
    with contextlib.suppress(client.exceptions.ApiException):
        core.delete_namespaced_secret(KEY_SECRET, POLLER_NS)
    upgraded = Reconciler(poller_kube, settings_namespace=POLLER_NS, namespaces=[jobs.namespace])
    status = cycle_until(
        upgraded,
        lambda: jobs.status("legacy").get("state") == "Running" and jobs.status("legacy"),
        what="the older pod adopted",
    )
    assert (status["podAttempt"], status["podUID"]) == (0, made.metadata.uid)
    secret = core.read_namespaced_secret(KEY_SECRET, POLLER_NS)
    assert len(secret.data[KEY_FIELD]) >= 44
    serve_log(admin_api, jobs.namespace, name, succeeded_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, name, 0)
    final = _complete(upgraded, jobs, "legacy")
    assert final["reason"] == "Succeeded", final

    # A proof-less pod made now, for a job that has none yet, is not an older poller's.
    late = jobs.create("late")
    late_name = podspec.pod_name("late", late["metadata"]["uid"])
    core.create_namespaced_pod(jobs.namespace, _claiming_pod(late_name, jobs.namespace, late))
    refused = _complete(upgraded, jobs, "late")
    assert refused["reason"] == "Failed" and "no valid proof" in refused["message"]
