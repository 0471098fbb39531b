"""The job-pods policy in ``deploy/admission/job-pods-policy.yaml``, with real users.

A job pod runs with its job's Secrets and its log is read as the job's
results, so once admitted nobody may change what it runs. The user
``mallory`` may update and patch pods, and update their ephemeral
containers, in the test namespace (what a co-tenant with ordinary edit
rights has). On a pod that carries the poller's proof annotation, checks:

- replacing a container's image is refused (403, the policy named, the
  message naming ``spec``), and so is adding an ephemeral container
  (``kubectl debug``), naming ``spec.ephemeralContainers``;
- removing or changing the proof annotation, or the poller's labels, is
  refused, naming the key;
- unrelated label and annotation edits stay allowed;
- a pod without the proof is not judged (its image may change);
- the policy type-checks without warnings.

As in the claims policy's tests, the policy is bound to each test's namespace
only (the control plane is shared by the session).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import user_kubeconfig

from poller.decisions.views import PROOF_ANNOTATION
from tests.deploy.conftest import DEPLOY
from tests.deploy.policies import Requester, Result, apply_policy, bound_to, type_check_status
from tests.deploy.policies import refused as refused_by
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

POLICY_FILE = DEPLOY / "admission" / "job-pods-policy.yaml"
POLICY = "lmeval-job-pods-frozen"
MANAGED_BY = {"app.kubernetes.io/managed-by": "lmeval-poller"}
JOB_UID_LABEL = "foundation-model-stack.github.com/job-uid"


@pytest.fixture(scope="module")
def pods_policy(poller_installed: ControlPlane) -> ControlPlane:
    apply_policy(poller_installed, POLICY_FILE, POLICY)
    return poller_installed


def _pod(name: str, *, proof: bool, image: str = "registry.example/eval:1") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {**MANAGED_BY, JOB_UID_LABEL: "u-1"}}
    if proof:
        metadata["annotations"] = {PROOF_ANNOTATION: "v1.1." + "0" * 64}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"restartPolicy": "Never", "containers": [{"name": "lmeval", "image": image}]},
    }


@pytest.fixture
def bound(pods_policy: ControlPlane, admin_api: client.ApiClient, namespace: str) -> Iterator[str]:
    """The policy in force in this test's namespace only, with one proof-bearing pod
    (made by the admin, as the poller would) named ``job-pod``."""
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_pod(namespace, _pod("job-pod", proof=True))

    def in_force() -> bool:
        patch = {"spec": {"containers": [{"name": "lmeval", "image": "probe:1"}]}}
        try:
            core.patch_namespaced_pod("job-pod", namespace, patch, dry_run="All")
        except ApiException as error:
            return error.status == 403
        return False

    with bound_to(pods_policy, POLICY, namespace, in_force):
        yield namespace


class PodEditor(Requester):
    """A requester who also adds ephemeral containers (``kubectl debug``)."""

    def add_ephemeral(self, name: str) -> Result:
        debug = {
            "spec": {
                "ephemeralContainers": [
                    {"name": "debugger", "image": "registry.example/shell:1", "stdin": True}
                ]
            }
        }
        return self.call(
            self.core.patch_namespaced_pod_ephemeralcontainers, name, self.namespace, debug
        )


@pytest.fixture
def mallory(bound: str, pods_policy: ControlPlane) -> Iterator[PodEditor]:
    """A user who may create, update and patch pods and their ephemeral containers."""
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "update", "patch"]},
        {
            "apiGroups": [""],
            "resources": ["pods/ephemeralcontainers"],
            "verbs": ["get", "update", "patch"],
        },
    ]
    objects = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-editor"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "pod-editor"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-editor",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}
            ],
        },
    ]
    pods_policy.kubectl("apply", "-n", bound, "-f", "-", input_text=yaml.safe_dump_all(objects))
    requester = PodEditor(user_kubeconfig(pods_policy, "mallory"), bound)
    wait_for(
        lambda: (
            requester.patch_pod("job-pod", {"metadata": {"labels": {"probe": "1"}}}) == (200, "")
        ),
        timeout=30,
        what="mallory's Role in force",
    )
    yield requester
    requester.close()


def refused(result: Result, *words: str) -> None:
    refused_by(POLICY, result, *words)


def test_the_policy_type_checks_without_warnings(pods_policy: ControlPlane) -> None:
    assert not type_check_status(pods_policy, POLICY).get("expressionWarnings")


def test_a_job_pods_image_cannot_be_changed(
    mallory: PodEditor, admin_api: client.ApiClient
) -> None:
    patch = {"spec": {"containers": [{"name": "lmeval", "image": "registry.example/evil:1"}]}}
    refused(
        mallory.patch_pod("job-pod", patch),
        "spec: pod job-pod is the pod of an LMEvalJob",
        "cannot be changed",
    )
    image = client.CoreV1Api(admin_api).read_namespaced_pod("job-pod", mallory.namespace)
    assert image.spec.containers[0].image == "registry.example/eval:1"


def test_no_ephemeral_container_can_be_added(mallory: PodEditor) -> None:
    refused(
        mallory.add_ephemeral("job-pod"),
        "spec.ephemeralContainers: pod job-pod is the pod of an LMEvalJob",
    )


def test_its_proof_and_the_pollers_labels_stay(mallory: PodEditor) -> None:
    refused(
        mallory.patch_pod("job-pod", {"metadata": {"annotations": {PROOF_ANNOTATION: None}}}),
        f"metadata.annotations[{PROOF_ANNOTATION}]",
        "cannot be changed or removed",
    )
    refused(
        mallory.patch_pod("job-pod", {"metadata": {"labels": {JOB_UID_LABEL: None}}}),
        f"metadata.labels[{JOB_UID_LABEL}]",
    )
    refused(
        mallory.patch_pod(
            "job-pod", {"metadata": {"labels": {"app.kubernetes.io/managed-by": "x"}}}
        ),
        "metadata.labels[app.kubernetes.io/managed-by]",
    )
    # Everything else about its metadata stays editable.
    assert mallory.patch_pod("job-pod", {"metadata": {"labels": {"team": "b"}}}) == (200, "")
    notes = {"metadata": {"annotations": {"example.com/note": "x"}}}
    assert mallory.patch_pod("job-pod", notes) == (200, "")


def test_a_pod_without_the_proof_is_not_judged(
    mallory: PodEditor, admin_api: client.ApiClient
) -> None:
    client.CoreV1Api(admin_api).create_namespaced_pod(mallory.namespace, _pod("other", proof=False))
    patch = {"spec": {"containers": [{"name": "lmeval", "image": "registry.example/other:2"}]}}
    assert mallory.patch_pod("other", patch) == (200, "")
