"""The claims policy in ``deploy/admission/claims-policy.yaml``, with real users.

The user ``mallory`` may create, update and patch pods and create ConfigMaps,
PersistentVolumeClaims and Secrets in the test namespace (as every job
author may create pods); the poller's ServiceAccount acts with a
TokenRequest token. Every request is real (or a server-side dry run, which
admission judges the same way).

Checks: mallory is refused (403, the policy named) a pod carrying each kind
of claim (the label ``app.kubernetes.io/managed-by: lmeval-poller``, a label
or an annotation under ``foundation-model-stack.github.com/``, an owner
reference to an LMEvalJob or to another kind of that group), a ConfigMap
owned by an LMEvalJob, and a PersistentVolumeClaim or a Secret with the
poller's labels or owned by an LMEvalJob, each with a message naming the
field; the same objects without claims are admitted; the poller's
ServiceAccount is admitted with every claim (on pods, ConfigMaps and
PersistentVolumeClaims, the kinds it may create in a job's namespace); on a
claimed pod, an UPDATE that adds or changes a claim is refused while one that
changes an unrelated label, or removes a claim, is admitted, and adding a
claim to a plain pod is refused; the policy type-checks without warnings;
the poller itself, under the policy, runs a job to Complete (its pod and
results ConfigMap admitted); and a claim mallory makes under a job's managed
outputs claim name *without* any claim, which the policy admits, is never
taken by the poller: the job ends Failed naming it, before any pod, and the
claim is left as it was.

The control plane is shared by the whole session and other modules create
claimed pods as the admin (to play forged or pre-existing pods), so the
policy is bound here only to each test's namespace (a binding with a
``namespaceSelector`` on ``kubernetes.io/metadata.name``), removed after the
test; the policy object alone, unbound, judges nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import service_account_kubeconfig, user_kubeconfig

from poller import api
from poller.cycle.reconciler import Reconciler
from poller.jobpod import offline
from tests.deploy import policies
from tests.deploy.conftest import DEPLOY
from tests.deploy.policies import Result, apply_policy, bound_to, type_check_status
from tests.poller_fixtures import (
    POLLER_NS,
    POLLER_USER,
    CapturedRun,
    Jobs,
    cycle_until,
    serve_log,
    terminate,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

POLICY_FILE = DEPLOY / "admission" / "claims-policy.yaml"
POLICY = "lmeval-poller-claims"
GROUP_PREFIX = f"{api.API_GROUP}/"
MANAGED_BY = {"app.kubernetes.io/managed-by": "lmeval-poller"}

# -- installation ---------------------------------------------------------------


@pytest.fixture(scope="module")
def claims_policy(poller_installed: ControlPlane) -> ControlPlane:
    """The policy object from the file, not its cluster-wide binding."""
    apply_policy(poller_installed, POLICY_FILE, POLICY)
    return poller_installed


@pytest.fixture
def bound(
    claims_policy: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> Iterator[str]:
    """The policy in force in this test's namespace only; the binding goes afterwards."""
    core = client.CoreV1Api(admin_api)

    def in_force() -> bool:
        try:
            core.create_namespaced_pod(namespace, pod("probe", labels=MANAGED_BY), dry_run="All")
        except ApiException as error:
            return error.status == 403
        return False

    with bound_to(claims_policy, POLICY, namespace, in_force):
        yield namespace


# -- requests as people -------------------------------------------------------------


class Requester(policies.Requester):
    """Pod, ConfigMap, claim and Secret requests in one namespace as one identity."""

    def create_configmap(self, body: dict[str, Any], *, dry_run: bool = True) -> Result:
        return self.call(
            self.core.create_namespaced_config_map,
            self.namespace,
            body,
            dry_run="All" if dry_run else None,
        )

    def create_claim(self, body: dict[str, Any], *, dry_run: bool = True) -> Result:
        return self.call(
            self.core.create_namespaced_persistent_volume_claim,
            self.namespace,
            body,
            dry_run="All" if dry_run else None,
        )

    def create_secret(self, body: dict[str, Any]) -> Result:
        return self.call(self.core.create_namespaced_secret, self.namespace, body, dry_run="All")

    def patch_pod(self, name: str, patch: Any) -> Result:
        return self.call(self.core.patch_namespaced_pod, name, self.namespace, patch)


@pytest.fixture
def mallory(bound: str, claims_policy: ControlPlane) -> Iterator[Requester]:
    """A user who may create and update pods and create ConfigMaps in the namespace."""
    namespace = bound
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "update", "patch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["persistentvolumeclaims", "secrets"],
            "verbs": ["create"],
        },
    ]
    objects = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-creator"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "pod-creator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-creator",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}
            ],
        },
    ]
    claims_policy.kubectl(
        "apply", "-n", namespace, "-f", "-", input_text=yaml.safe_dump_all(objects)
    )
    requester = Requester(user_kubeconfig(claims_policy, "mallory"), namespace)

    def allowed() -> bool:
        # RBAC reaches the apiserver's authorizer cache asynchronously.
        return requester.create_pod(pod("probe")) == (200, "")

    wait_for(allowed, timeout=30, what="mallory's Role in force")
    yield requester
    requester.close()


@pytest.fixture
def the_poller(bound: str, claims_policy: ControlPlane) -> Iterator[Requester]:
    """The poller's ServiceAccount, by a TokenRequest token."""
    path = service_account_kubeconfig(claims_policy, POLLER_NS, "lmeval-poller")
    requester = Requester(path, bound)
    yield requester
    requester.close()


@pytest.fixture
def owner(admin_api: client.ApiClient, bound: str) -> dict[str, Any]:
    """An owner reference to a real LMEvalJob (no poller runs on it)."""
    created = client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        bound,
        api.PLURAL,
        {
            "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
            "kind": api.KIND,
            "metadata": {"name": "owner"},
            "spec": {"model": "dummy", "tasks": ["toy_mc"]},
        },
    )
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "name": "owner",
        "uid": created["metadata"]["uid"],
        "controller": True,
    }


def pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "c", "image": "registry.example/none:1"}]},
    }


def claim(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def secret(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    body = claim(name, labels=labels, owners=owners)
    return {"apiVersion": "v1", "kind": "Secret", "metadata": body["metadata"], "data": {}}


def refused(result: Result, *words: str) -> None:
    policies.refused(POLICY, result, *words)


# -- tests ------------------------------------------------------------------------------


def test_the_policy_type_checks_without_warnings(claims_policy: ControlPlane) -> None:
    assert not type_check_status(claims_policy, POLICY).get("expressionWarnings")


def test_a_pod_creator_is_refused_every_kind_of_claim(
    mallory: Requester, owner: dict[str, Any]
) -> None:
    refused(
        mallory.create_pod(pod("forged", owners=[owner])),
        "metadata.ownerReferences[0]: only the lmeval-poller ServiceAccount may create pods "
        "owned by an LMEvalJob",
        "mallory is not its ServiceAccount " + POLLER_USER,
    )
    refused(
        mallory.create_pod(pod("forged", labels={"team": "a", **MANAGED_BY})),
        "metadata.labels[app.kubernetes.io/managed-by]: only the lmeval-poller ServiceAccount "
        "may create pods with this label",
    )
    refused(
        mallory.create_pod(pod("forged", labels={f"{GROUP_PREFIX}job-uid": owner["uid"]})),
        f"metadata.labels[{GROUP_PREFIX}job-uid]:",
    )
    refused(
        mallory.create_pod(pod("forged", annotations={f"{GROUP_PREFIX}anything": "x"})),
        f"metadata.annotations[{GROUP_PREFIX}anything]: only the lmeval-poller ServiceAccount "
        "may create pods with this annotation",
    )
    # Any kind of the group, at any index, even without the controller flag.
    plain_owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-1"}
    other_kind = {
        "apiVersion": f"{GROUP_PREFIX}v2",
        "kind": "Thing",
        "name": "t",
        "uid": "u-2",
    }
    refused(
        mallory.create_pod(pod("forged", owners=[plain_owner, other_kind])),
        "metadata.ownerReferences[1]: only the lmeval-poller ServiceAccount may create pods "
        f"owned by a Thing of {api.API_GROUP}",
    )
    # Every claim of one request is named.
    code, message = mallory.create_pod(pod("forged", labels=MANAGED_BY, owners=[owner]))
    refused((code, message), "metadata.ownerReferences[0]", "metadata.labels[")


def test_a_configmap_owned_by_a_job_is_refused(mallory: Requester, owner: dict[str, Any]) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "owner-results", "ownerReferences": [owner]},
        "data": {"results.json": "{}"},
    }
    refused(
        mallory.create_configmap(body),
        "metadata.ownerReferences[0]: only the lmeval-poller ServiceAccount may create "
        "configmaps owned by an LMEvalJob",
    )
    del body["metadata"]["ownerReferences"]
    assert mallory.create_configmap(body) == (200, "")


def test_a_claim_or_secret_claiming_to_be_the_pollers_is_refused(
    mallory: Requester, owner: dict[str, Any]
) -> None:
    job_uid = {f"{GROUP_PREFIX}job-uid": owner["uid"]}
    refused(
        mallory.create_claim(claim("owner-outputs-abc123", owners=[owner])),
        "metadata.ownerReferences[0]: only the lmeval-poller ServiceAccount may create "
        "persistentvolumeclaims owned by an LMEvalJob",
        "mallory is not its ServiceAccount " + POLLER_USER,
    )
    refused(
        mallory.create_claim(claim("owner-outputs-abc123", labels={**MANAGED_BY, **job_uid})),
        "metadata.labels[app.kubernetes.io/managed-by]: only the lmeval-poller ServiceAccount "
        "may create persistentvolumeclaims with this label",
        f"metadata.labels[{GROUP_PREFIX}job-uid]:",
    )
    refused(
        mallory.create_secret(secret("forged", owners=[owner])),
        "metadata.ownerReferences[0]: only the lmeval-poller ServiceAccount may create "
        "secrets owned by an LMEvalJob",
    )
    refused(
        mallory.create_secret(secret("forged", labels=job_uid)),
        f"metadata.labels[{GROUP_PREFIX}job-uid]: only the lmeval-poller ServiceAccount may "
        "create secrets with this label",
    )
    # The same objects without claims are admitted.
    assert mallory.create_claim(claim("owner-outputs-abc123", labels={"team": "a"})) == (200, "")
    assert mallory.create_secret(secret("plain", labels={"team": "a"})) == (200, "")


def test_the_same_pod_without_claims_is_admitted(mallory: Requester) -> None:
    others = {
        "app.kubernetes.io/managed-by": "helm",  # the label, but another manager
        "example.com/foundation-model-stack.github.com": "x",  # the group, not as a prefix
        "team": "a",
    }
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-1"}
    assert mallory.create_pod(pod("plain", labels=others, owners=[owner])) == (200, "")
    assert mallory.create_pod(pod("plain"), dry_run=False) == (200, "")


def test_the_pollers_service_account_is_admitted(
    the_poller: Requester, owner: dict[str, Any]
) -> None:
    claims = pod(
        "poller-made",
        labels={**MANAGED_BY, f"{GROUP_PREFIX}job-uid": owner["uid"]},
        annotations={f"{GROUP_PREFIX}note": "x"},
        owners=[owner],
    )
    assert the_poller.create_pod(claims, dry_run=False) == (200, "")
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "owner-results", "labels": MANAGED_BY, "ownerReferences": [owner]},
    }
    assert the_poller.create_configmap(configmap) == (200, "")
    made = claim("owner-outputs-abc123", labels=MANAGED_BY, owners=[owner])
    assert the_poller.create_claim(made) == (200, "")


def test_updates_are_refused_only_for_new_or_changed_claims(
    mallory: Requester, the_poller: Requester, owner: dict[str, Any]
) -> None:
    claimed = pod(
        "claimed", labels={**MANAGED_BY, f"{GROUP_PREFIX}job-uid": owner["uid"]}, owners=[owner]
    )
    assert the_poller.create_pod(claimed, dry_run=False) == (200, "")
    # Unrelated edits of a claimed pod are never blocked.
    assert mallory.patch_pod("claimed", {"metadata": {"labels": {"team": "b"}}}) == (200, "")
    annotation = {"metadata": {"annotations": {"example.com/note": "x"}}}
    assert mallory.patch_pod("claimed", annotation) == (200, "")
    refused(
        mallory.patch_pod("claimed", {"metadata": {"labels": {f"{GROUP_PREFIX}job-uid": "u-9"}}}),
        f"metadata.labels[{GROUP_PREFIX}job-uid]: only the lmeval-poller ServiceAccount may "
        "give pods this label",
    )
    refused(
        mallory.patch_pod(
            "claimed", {"metadata": {"annotations": {f"{GROUP_PREFIX}job-name": "x"}}}
        ),
        f"metadata.annotations[{GROUP_PREFIX}job-name]: only the lmeval-poller ServiceAccount "
        "may give pods this annotation",
    )
    second = {**owner, "uid": "u-other", "name": "other", "controller": False}
    refused(
        mallory.patch_pod("claimed", {"metadata": {"ownerReferences": [owner, second]}}),
        "metadata.ownerReferences[1]: only the lmeval-poller ServiceAccount may give pods an "
        "owner reference to an LMEvalJob",
    )
    # Removing a claim takes the pod from the poller, it never hands one to it.
    removed = {"metadata": {"labels": {"app.kubernetes.io/managed-by": None}}}
    assert mallory.patch_pod("claimed", removed) == (200, "")
    # Putting it back is a new claim.
    refused(mallory.patch_pod("claimed", {"metadata": {"labels": MANAGED_BY}}), "managed-by")

    # A plain pod cannot be turned into a claimed one.
    assert mallory.create_pod(pod("plain"), dry_run=False) == (200, "")
    refused(
        mallory.patch_pod("plain", {"metadata": {"ownerReferences": [owner]}}),
        "metadata.ownerReferences[0]",
    )


def test_the_poller_runs_a_job_to_completion_under_the_policy(
    bound: str,
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    assert jobs.namespace == bound
    jobs.create("under-policy")
    pod_name = cycle_until(
        poller,
        lambda: (
            jobs.status("under-policy").get("state") == "Running"
            and jobs.status("under-policy")["podName"]
        ),
        what="Running",
    )
    serve_log(admin_api, jobs.namespace, pod_name, succeeded_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, pod_name, 0)  # an update without claims: admitted
    final = cycle_until(
        poller,
        lambda: (
            jobs.status("under-policy").get("state") == "Complete" and jobs.status("under-policy")
        ),
        what="Complete",
    )
    assert final["reason"] == "Succeeded", final.get("message")
    configmap = jobs.core.read_namespaced_config_map(final["resultsConfigMap"], jobs.namespace)
    assert configmap.metadata.owner_references[0].kind == api.KIND
    # And the admin, like everyone but the poller, may not forge one.
    forged = pod("forged", labels=MANAGED_BY)
    with pytest.raises(ApiException) as caught:
        jobs.core.create_namespaced_pod(jobs.namespace, forged)
    assert caught.value.status == 403 and POLICY in caught.value.body


def test_a_claim_squatted_without_any_claim_is_admitted_and_never_taken(
    mallory: Requester, poller: Reconciler, jobs: Jobs
) -> None:
    assert jobs.namespace == mallory.namespace
    job = jobs.create("victim", outputs={"pvcManaged": {"size": "1Gi"}})
    name = offline.managed_claim_name("victim", job["metadata"]["uid"])
    # Mallory reads the job (anyone in the namespace may) and is first:
    # nothing in her claim claims to be the poller's, so the policy admits it.
    assert mallory.create_claim(claim(name), dry_run=False) == (200, "")
    made = jobs.core.read_namespaced_persistent_volume_claim(name, jobs.namespace)
    final = cycle_until(
        poller,
        lambda: jobs.status("victim").get("state") == "Complete" and jobs.status("victim"),
        what="victim Complete",
    )
    assert final["reason"] == "Failed", final
    assert (
        f"PersistentVolumeClaim {name} in namespace {jobs.namespace} exists and is not this "
        "job's outputs claim (it has no controller ownerReference)"
    ) in final["message"], final["message"]
    assert final["message"].endswith("delete it, or rename the job")
    assert not jobs.pods()
    now = jobs.core.read_namespaced_persistent_volume_claim(name, jobs.namespace)
    assert now.metadata.resource_version == made.metadata.resource_version
    assert not now.metadata.owner_references
