"""The admission policy in ``deploy/admission``, on the real apiserver with real users.

Users are client-certificate identities (alice, bob, carol) with Roles in
the test namespace; every request is made *as* them, so the policy's CEL
``authorizer`` sees their real RBAC rights.

Checks, on LMEvalJobs of the real CRD:

- a requester who cannot ``get`` a Secret named in ``spec.envSecrets``,
  ``spec.fileSecrets`` or ``spec.customTasks[].git.credentialsSecret`` is
  refused (403) with a message naming the field, its index and the Secret;
  one who can is admitted; the same for ConfigMaps in
  ``spec.customTasks[].configMap`` (Git and ConfigMap sources mixed, each
  message with the entry's own index), in ``spec.fileConfigMaps``, the
  Secrets of ``spec.offline.storage.s3`` and the claims in
  ``spec.outputs.pvcName`` and ``spec.offline.storage.pvcName``; creating
  claims for ``spec.outputs.pvcManaged`` needs the right to create them;
- a ``spec.baseline`` (the regression gate's) that its requester may not
  ``get`` is refused, naming the field and the job; one they may get is
  admitted;
- more than 8 distinct Secrets are refused unless the requester may read
  every Secret of the namespace (the per-name checks are capped by CEL's cost
  budget);
- a requester who may not create pods is admitted a job that runs only the
  image's own tasks with objects they may read, and refused one that runs code
  of theirs or reaches a claim's data (``allowCodeExecution``, ``customTasks``,
  ``outputs.pvcName``, ``offline.storage.pvcName``), naming the field and why;
- updates are judged again when they change the spec, but not for
  ``cancel``/``suspend`` nor for metadata;
- a finished job's spec is not edited (422, the message says to use
  ``lmeval rerun``), while its TTL and labels stay editable; nor a started
  one's (its first pod made), but for cancel, suspend, its TTL and deadline;
- sidecars (``spec.pod.sidecars``, issue 11) are admitted for a requester who
  may create pods and refused, with "sidecars need the right to create pods
  in <namespace>", for one who may not;
- the CRD prunes pod fields it does not know (``hostNetwork``, ``volumes``,
  a sidecar's ``securityContext``...), or refuses them with strict field
  validation, so today such overrides never reach the poller at all.

Because the schema prunes them, the shape rules (hostPath and other volume
kinds, host namespaces, host ports, privileged, privilege escalation, added
capabilities, security annotations) cannot be exercised on the real CRD.
They are exercised on a *twin*: a CRD of another group whose spec keeps
unknown fields, judged by the same policy text with only its match rule
pointed at the twin; a safe override is admitted there. Annotations that set
a seccomp or AppArmor profile are refused in every form (any key containing
"seccomp" or "apparmor", such as the per-container
``container.seccomp.security.alpha.kubernetes.io/<name>``); the real CRD's
schema refuses them too (tests/cluster/test_schema_limits.py), so they are
tried on the twin, where only the policy judges.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import api_client, user_kubeconfig

from poller import api
from tests.deploy.conftest import DEPLOY, yaml_file
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

POLICY_DIR = DEPLOY / "admission"
POLICY = "lmevaljob-requester-rights"
TWIN_GROUP = "policy-twin.lmeval-poller.example"
TWIN_POLICY = f"{POLICY}-twin"
MAX_SECRETS = 8


# -- installation -------------------------------------------------------------


@pytest.fixture(scope="module")
def policy(poller_installed: ControlPlane) -> ControlPlane:
    """The policy from deploy/admission, applied as the install would.

    Only this policy's file: the claims policy next to it, bound cluster-wide,
    would refuse the claimed pods other modules create as the admin
    (test_claims_policy binds it to its own namespaces).
    """
    poller_installed.kubectl(
        "apply", "--server-side", "-f", str(POLICY_DIR / "lmevaljob-policy.yaml")
    )
    return poller_installed


def _twin_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{TWIN_GROUP}"},
        "spec": {
            "group": TWIN_GROUP,
            "scope": "Namespaced",
            "names": {"plural": api.PLURAL, "singular": "lmevaljob", "kind": api.KIND},
            "versions": [
                {
                    "name": api.API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def _twin_policy() -> list[dict[str, Any]]:
    """The policy text unchanged, except its name and the group it matches."""
    documents = copy.deepcopy(yaml_file(POLICY_DIR / "lmevaljob-policy.yaml"))
    for doc in documents:
        doc["metadata"]["name"] = TWIN_POLICY
        if doc["kind"] == "ValidatingAdmissionPolicy":
            (rule,) = doc["spec"]["matchConstraints"]["resourceRules"]
            assert rule["apiGroups"] == [api.API_GROUP]
            rule["apiGroups"] = [TWIN_GROUP]
        else:
            doc["spec"]["policyName"] = TWIN_POLICY
    return documents


@pytest.fixture(scope="module")
def twin(policy: ControlPlane) -> Iterator[str]:
    """A schema-less twin of the LMEvalJob CRD under the same policy text."""
    plane = policy
    manifests = yaml.safe_dump_all([_twin_crd(), *_twin_policy()])
    plane.kubectl("apply", "--server-side", "-f", "-", input_text=manifests)
    plane.kubectl("wait", "--for=condition=Established", f"crd/{api.PLURAL}.{TWIN_GROUP}")
    yield TWIN_GROUP
    plane.kubectl("delete", "--wait=false", "-f", "-", input_text=manifests, check=False)


# -- people ---------------------------------------------------------------------


def _role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name},
        "rules": rules,
    }


def _binding(name: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


JOB_RIGHTS = {
    "apiGroups": [api.API_GROUP, TWIN_GROUP],
    "resources": [api.PLURAL],
    "verbs": ["create", "get", "update", "patch"],
}
SHARED_SECRETS = ["s-shared", *[f"s-{i}" for i in range(MAX_SECRETS)]]


class People:
    """alice: may create pods, reads some named objects; bob: may not create
    pods, reads one Secret, one ConfigMap and one claim; carol: may create pods
    and claims and read every Secret of the namespace."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.namespace = namespace
        self.clients: dict[str, client.ApiClient] = {}
        for user in ("alice", "bob", "carol"):
            self.clients[user] = api_client(user_kubeconfig(plane, user))

    def close(self) -> None:
        for each in self.clients.values():
            each.close()

    def create(self, who: str, body: dict[str, Any], *, dry_run: bool = True) -> tuple[int, str]:
        """(HTTP status, message) of creating `body` (real or twin) as `who`."""
        custom = client.CustomObjectsApi(self.clients[who])
        try:
            custom.create_namespaced_custom_object(
                body["apiVersion"].split("/")[0],
                api.API_VERSION,
                self.namespace,
                api.PLURAL,
                body,
                dry_run="All" if dry_run else None,
            )
        except ApiException as error:
            return error.status, json.loads(error.body).get("message", "")
        return 201, ""

    def patch(self, who: str, name: str, patch: dict[str, Any]) -> tuple[int, str]:
        custom = client.CustomObjectsApi(self.clients[who])
        try:
            custom.patch_namespaced_custom_object(
                api.API_GROUP, api.API_VERSION, self.namespace, api.PLURAL, name, patch
            )
        except ApiException as error:
            return error.status, json.loads(error.body).get("message", "")
        return 200, ""


@pytest.fixture
def people(policy: ControlPlane, admin_api: client.ApiClient, namespace: str) -> Iterator[People]:
    core = client.CoreV1Api(admin_api)
    for name in ("s-hidden", *SHARED_SECRETS):
        core.create_namespaced_secret(
            namespace,
            client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data={"k": "v"}),
        )
    for name in ("tasks-shared", "tasks-hidden"):
        core.create_namespaced_config_map(
            namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={})
        )
    pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}
    alice = [
        JOB_RIGHTS,
        pods,
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": SHARED_SECRETS,
            "verbs": ["get"],
        },
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["tasks-shared"],
            "verbs": ["get"],
        },
        {
            "apiGroups": [""],
            "resources": ["persistentvolumeclaims"],
            "resourceNames": ["pvc-shared"],
            "verbs": ["get"],
        },
    ]
    bob = [
        JOB_RIGHTS,
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["s-shared"],
            "verbs": ["get"],
        },
        # Readable, so that only the missing pod rights refuse his jobs that use them.
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["tasks-shared"],
            "verbs": ["get"],
        },
        {
            "apiGroups": [""],
            "resources": ["persistentvolumeclaims"],
            "resourceNames": ["pvc-shared"],
            "verbs": ["get"],
        },
    ]
    carol = [
        JOB_RIGHTS,
        pods,
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["create"]},
    ]
    objects = []
    for user, rules in (("alice", alice), ("bob", bob), ("carol", carol)):
        objects += [_role(f"lmevaljob-{user}", rules), _binding(f"lmevaljob-{user}", user)]
    policy.kubectl("apply", "-n", namespace, "-f", "-", input_text=yaml.safe_dump_all(objects))
    everyone = People(policy, namespace)

    def settled() -> bool:
        # RBAC and the policy reach the apiserver's caches asynchronously.
        admitted, _ = everyone.create("alice", job("probe"))
        refused, message = everyone.create("bob", job("probe", allowCodeExecution=True))
        return admitted == 201 and refused == 403 and "create pods" in message

    wait_for(settled, timeout=30, what="RBAC and the admission policy in force")
    yield everyone
    everyone.close()


def job(name: str, group: str = api.API_GROUP, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{group}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {"model": "dummy", "tasks": ["toy_mc"], **spec},
    }


def env_secret(name: str) -> dict[str, Any]:
    return {"env": "TOKEN", "secretRef": {"name": name, "key": "k"}}


def file_secret(name: str, path: str = "/secrets/a") -> dict[str, Any]:
    return {"secretRef": {"secretName": name}, "mountPath": path}


def refused(result: tuple[int, str], status: int, *words: str) -> None:
    code, message = result
    assert code == status, (code, message)
    assert POLICY in message, message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


# -- the real CRD -----------------------------------------------------------------


def test_secrets_need_the_requesters_read_right(people: People) -> None:
    ns = people.namespace
    refused(
        people.create("alice", job("j", envSecrets=[env_secret("s-hidden")])),
        403,
        "spec.envSecrets[0].secretRef.name:",
        "alice may not get Secret s-hidden",
        f"in namespace {ns}",
    )
    refused(
        people.create(
            "alice",
            job("j", fileSecrets=[file_secret("s-shared"), file_secret("s-hidden", "/b")]),
        ),
        403,
        "spec.fileSecrets[1].secretRef.secretName:",
        "s-hidden",
    )
    # With both fields, the index runs over envSecrets first, then fileSecrets.
    refused(
        people.create(
            "alice",
            job("j", envSecrets=[env_secret("s-shared")], fileSecrets=[file_secret("nope")]),
        ),
        403,
        "spec.fileSecrets[0].secretRef.secretName:",
        "nope",
    )
    admitted = job(
        "reads-what-she-may",
        envSecrets=[env_secret("s-shared"), env_secret("s-shared")],
        fileSecrets=[file_secret("s-shared")],
    )
    assert people.create("alice", admitted, dry_run=False) == (201, "")
    # carol may read every Secret of the namespace: one check covers all names.
    assert people.create("carol", job("j", envSecrets=[env_secret("s-hidden")])) == (201, "")


def test_more_secrets_than_the_cost_budget_allows(people: People) -> None:
    # alice may read each of these by name, but only 8 names can be checked.
    many = [env_secret(name) for name in SHARED_SECRETS]
    assert len({e["secretRef"]["name"] for e in many}) == MAX_SECRETS + 1
    refused(
        people.create("alice", job("j", envSecrets=many)),
        403,
        f"more than {MAX_SECRETS} distinct Secrets",
        "reference at most",
    )
    assert people.create("alice", job("j", envSecrets=many[:MAX_SECRETS])) == (201, "")
    # Repeated names are checked once: 12 references to 8 names pass.
    assert people.create("alice", job("j", envSecrets=many[:MAX_SECRETS] + many[:4])) == (
        201,
        "",
    )
    assert people.create("carol", job("j", envSecrets=many)) == (201, "")


def test_config_maps_and_claims_need_read_rights_too(people: People) -> None:
    refused(
        people.create(
            "alice",
            job("j", customTasks=[{"configMap": "tasks-shared"}, {"configMap": "tasks-hidden"}]),
        ),
        403,
        "spec.customTasks[1].configMap:",
        "alice may not get ConfigMap tasks-hidden",
    )
    refused(
        people.create("alice", job("j", outputs={"pvcName": "pvc-hidden"})),
        403,
        "spec.outputs.pvcName:",
        "alice may not get PersistentVolumeClaim pvc-hidden",
    )
    shared = job(
        "j", customTasks=[{"configMap": "tasks-shared"}], outputs={"pvcName": "pvc-shared"}
    )
    assert people.create("alice", shared) == (201, "")


def git_tasks(secret: str | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"url": "https://git.example.com/tasks.git", "branch": "main"}
    if secret is not None:
        source["credentialsSecret"] = secret
    return {"git": source}


def test_git_credentials_need_the_requesters_read_right(people: People) -> None:
    # Git sources sit among ConfigMap sources: messages name the entry's own index.
    refused(
        people.create(
            "alice",
            job("j", customTasks=[{"configMap": "tasks-shared"}, git_tasks("s-hidden")]),
        ),
        403,
        "spec.customTasks[1].git.credentialsSecret:",
        "alice may not get Secret s-hidden",
    )
    refused(
        people.create(
            "alice",
            job(
                "j",
                envSecrets=[env_secret("s-shared")],
                customTasks=[git_tasks(), git_tasks("s-shared"), git_tasks("nope")],
            ),
        ),
        403,
        "spec.customTasks[2].git.credentialsSecret:",
        "may not get Secret nope",
    )
    refused(
        people.create(
            "alice", job("j", customTasks=[git_tasks("s-shared"), {"configMap": "tasks-hidden"}])
        ),
        403,
        "spec.customTasks[1].configMap:",
        "tasks-hidden",
    )
    admitted = job(
        "clones-what-she-may",
        customTasks=[git_tasks(), {"configMap": "tasks-shared"}, git_tasks("s-shared")],
    )
    assert people.create("alice", admitted, dry_run=False) == (201, "")
    # carol may read every Secret of the namespace: one check covers all names.
    assert people.create("carol", job("j", customTasks=[git_tasks("s-hidden")])) == (201, "")


def test_requesters_who_may_not_create_pods_run_only_what_runs_no_code_of_theirs(
    people: People,
) -> None:
    # The image's own tasks, with a Secret bob may read: no pod rights needed.
    assert people.create("bob", job("plain", envSecrets=[env_secret("s-shared")])) == (201, "")
    needing = {
        "spec.allowCodeExecution": ({"allowCodeExecution": True}, "run code of its author"),
        "spec.customTasks": ({"customTasks": [{"configMap": "tasks-shared"}]}, "unsandboxed"),
        "spec.outputs.pvcName": ({"outputs": {"pvcName": "pvc-shared"}}, "write into that"),
        "spec.offline.storage.pvcName": (
            {"offline": {"storage": {"pvcName": "pvc-shared"}}},
            "read that claim",
        ),
    }
    for field, (spec, why) in needing.items():
        refused(
            people.create("bob", job("j", **spec)),
            403,
            f"{field} needs the right to create pods in namespace {people.namespace}, "
            "which bob does not have",
            why,
        )
    # The same jobs are admitted to a requester who may create pods.
    assert people.create("carol", job("j", allowCodeExecution=True)) == (201, "")


def test_updates_are_judged_unless_they_only_stop_the_job(
    people: People, admin_api: client.ApiClient
) -> None:
    edited = job("edited", envSecrets=[env_secret("s-shared")])
    assert people.create("alice", edited, dry_run=False) == (201, "")
    # An admin points the job at a Secret alice cannot read (admins may).
    custom = client.CustomObjectsApi(admin_api)
    custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        people.namespace,
        api.PLURAL,
        "edited",
        {"spec": {"envSecrets": [env_secret("s-hidden")]}},
    )
    # alice may still stop it, and label it, but not change what it runs.
    assert people.patch("alice", "edited", {"metadata": {"labels": {"team": "a"}}}) == (200, "")
    assert people.patch("alice", "edited", {"spec": {"suspend": True}}) == (200, "")
    refused(
        people.patch("alice", "edited", {"spec": {"limit": "5"}}),
        403,
        "spec.envSecrets[0].secretRef.name:",
        "s-hidden",
    )
    assert people.patch("alice", "edited", {"spec": {"cancel": True}}) == (200, "")


def test_a_finished_jobs_spec_is_not_edited(people: People, admin_api: client.ApiClient) -> None:
    assert people.create("alice", job("done"), dry_run=False) == (201, "")
    assert people.patch("alice", "done", {"spec": {"limit": "5"}}) == (200, "")
    client.CustomObjectsApi(admin_api).patch_namespaced_custom_object_status(
        api.API_GROUP,
        api.API_VERSION,
        people.namespace,
        api.PLURAL,
        "done",
        {"status": {"state": "Complete", "reason": "Succeeded"}},
    )
    refused(
        people.patch("alice", "done", {"spec": {"limit": "6"}}),
        422,
        "spec: LMEvalJob done has finished",
        "lmeval rerun done",
    )
    # Its TTL, labels and the lifecycle switches stay editable.
    assert people.patch("alice", "done", {"spec": {"ttlSecondsAfterFinished": 60}}) == (200, "")
    assert people.patch("alice", "done", {"metadata": {"labels": {"kept": "yes"}}}) == (200, "")


def test_a_started_jobs_spec_is_frozen_but_for_its_switches(
    people: People, admin_api: client.ApiClient
) -> None:
    assert people.create("alice", job("started"), dry_run=False) == (201, "")
    # Before its first pod, a job is still a draft.
    assert people.patch("alice", "started", {"spec": {"limit": "5"}}) == (200, "")
    client.CustomObjectsApi(admin_api).patch_namespaced_custom_object_status(
        api.API_GROUP,
        api.API_VERSION,
        people.namespace,
        api.PLURAL,
        "started",
        {"status": {"state": "Running", "podName": "started-abc123"}},
    )
    for edit in (
        {"limit": "6"},
        {"tasks": ["other"]},
        {"modelArgs": [{"name": "a", "value": "b"}]},
    ):
        refused(
            people.patch("alice", "started", {"spec": edit}),
            422,
            "spec: LMEvalJob started has started (pod started-abc123)",
            "only spec.cancel, spec.suspend, spec.ttlSecondsAfterFinished and "
            "spec.activeDeadlineSeconds may change",
            "lmeval rerun started",
        )
    # Its switches and metadata stay editable.
    for switch in (
        {"suspend": True},
        {"ttlSecondsAfterFinished": 60},
        {"activeDeadlineSeconds": 600},
        {"cancel": True},
    ):
        assert people.patch("alice", "started", {"spec": switch}) == (200, "")
    assert people.patch("alice", "started", {"metadata": {"labels": {"k": "v"}}}) == (200, "")


def test_sidecars_only_for_requesters_who_may_create_pods(people: People) -> None:
    sidecar = {"name": "proxy", "image": "registry.example/proxy:1", "args": ["--port=8081"]}
    with_sidecar = job("with-sidecar", pod={"sidecars": [sidecar]})
    assert people.create("alice", with_sidecar, dry_run=False) == (201, "")
    refused(
        people.create("bob", job("j", pod={"sidecars": [sidecar]})),
        403,
        f"spec.pod.sidecars: sidecars need the right to create pods in {people.namespace}",
        "which bob does not have",
    )


def test_unknown_pod_fields_never_reach_the_poller(
    people: People, admin_api: client.ApiClient
) -> None:
    sidecar = {"name": "s", "image": "busybox"}
    unsafe_pod = {
        "hostNetwork": True,
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
        "sidecars": [{**sidecar, "securityContext": {"privileged": True}}],
    }
    body = job("pruned", pod={"env": [{"name": "A", "value": "1"}], **unsafe_pod})
    custom = client.CustomObjectsApi(admin_api)
    # Strict field validation (kubectl's default) refuses them outright...
    with pytest.raises(ApiException) as strict:
        custom.create_namespaced_custom_object(
            api.API_GROUP,
            api.API_VERSION,
            people.namespace,
            api.PLURAL,
            body,
            field_validation="Strict",
        )
    assert strict.value.status == 400
    message = json.loads(strict.value.body)["message"]
    assert 'unknown field "spec.pod.hostNetwork"' in message
    assert 'unknown field "spec.pod.sidecars[0].securityContext"' in message
    # ... and otherwise the schema prunes them before admission and storage
    # (the poller puts every sidecar under the restricted context anyway).
    stored = custom.create_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, people.namespace, api.PLURAL, body
    )
    assert stored["spec"]["pod"] == {"env": [{"name": "A", "value": "1"}], "sidecars": [sidecar]}


# -- the schema-less twin: what the policy does with fields the CRD will grow -----

SAFE_SIDECAR = {
    "name": "proxy",
    "image": "registry.example/proxy:1",
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
    },
}

SHAPES = [
    (
        {"pod": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
        "spec.pod.volumes[root].hostPath: hostPath volumes are not allowed",
    ),
    (
        {"pod": {"volumes": [{"name": "creds", "secret": {"secretName": "s-shared"}}]}},
        "spec.pod.volumes[creds]: only emptyDir, ephemeral and downwardAPI volumes",
    ),
    ({"pod": {"hostNetwork": True}}, "spec.pod.hostNetwork: host namespaces are not allowed"),
    ({"pod": {"hostPID": True}}, "spec.pod.hostPID: host namespaces are not allowed"),
    ({"pod": {"hostIPC": True}}, "spec.pod.hostIPC: host namespaces are not allowed"),
    (
        {"pod": {"sidecars": [{**SAFE_SIDECAR, "securityContext": {"privileged": True}}]}},
        "spec.pod.sidecars[proxy].securityContext.privileged: privileged containers",
    ),
    (
        {"pod": {"initContainers": [{"name": "i", "securityContext": {"privileged": True}}]}},
        "spec.pod.initContainers[i].securityContext.privileged",
    ),
    (
        {"pod": {"securityContext": {"privileged": True}}},
        "spec.pod.securityContext.privileged",
    ),
    (
        {
            "pod": {
                "sidecars": [
                    {**SAFE_SIDECAR, "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}
                ]
            }
        },
        "spec.pod.sidecars[proxy].securityContext.capabilities.add: adding capabilities",
    ),
    (
        {"pod": {"securityContext": {"allowPrivilegeEscalation": True}}},
        "spec.pod.securityContext.allowPrivilegeEscalation: privilege escalation",
    ),
    (
        {"pod": {"sidecars": [{**SAFE_SIDECAR, "ports": [{"containerPort": 80, "hostPort": 80}]}]}},
        "spec.pod.sidecars[proxy].ports[].hostPort: host ports are not allowed",
    ),
    (
        {"annotations": {"container.apparmor.security.beta.kubernetes.io/lmeval": "unconfined"}},
        "spec.annotations[container.apparmor.security.beta.kubernetes.io/lmeval]",
    ),
    # Every form that sets a seccomp or AppArmor profile (issue 15): the
    # per-container seccomp key passed the old prefix check.
    (
        {"annotations": {"container.seccomp.security.alpha.kubernetes.io/lmeval": "unconfined"}},
        "spec.annotations[container.seccomp.security.alpha.kubernetes.io/lmeval]: AppArmor and "
        "seccomp annotations are not allowed",
    ),
    (
        {"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}},
        "spec.annotations[seccomp.security.alpha.kubernetes.io/pod]",
    ),
    (
        {"annotations": {"seccomp-profile.kubernetes.cri-o.io/lmeval": "x"}},
        "spec.annotations[seccomp-profile.kubernetes.cri-o.io/lmeval]",
    ),
    (
        {"annotations": {"AppArmor.example/profile": "unconfined"}},
        "spec.annotations[AppArmor.example/profile]",
    ),
]


@pytest.fixture
def twin_people(people: People, twin: str) -> People:
    def settled() -> bool:
        code, _ = people.create("carol", job("probe", twin, pod={"hostNetwork": True}))
        return code == 422

    wait_for(settled, timeout=30, what="the twin policy in force")
    return people


@pytest.mark.parametrize(("spec", "words"), SHAPES, ids=[w.split(":")[0] for _, w in SHAPES])
def test_pod_overrides_outside_the_safe_subset_are_refused(
    twin_people: People, twin: str, spec: dict[str, Any], words: str
) -> None:
    # carol holds every right the policy asks for: only the shape is judged.
    refused(twin_people.create("carol", job("j", twin, **spec)), 422, words)


def test_all_shape_problems_are_reported_at_once(twin_people: People, twin: str) -> None:
    spec = {"pod": {"hostPID": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}
    refused(
        twin_people.create("carol", job("j", twin, **spec)),
        422,
        "spec.pod.volumes[h].hostPath",
        "; spec.pod.hostPID",
    )


def test_safe_pod_overrides_are_admitted(twin_people: People, twin: str) -> None:
    safe = {
        "pod": {
            "sidecars": [SAFE_SIDECAR],
            "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "e", "ephemeral": {}}],
            "hostNetwork": False,
        },
        "annotations": {"team": "evals"},
    }
    assert twin_people.create("alice", job("j", twin, **safe)) == (201, "")


def test_offline_storage_claims_need_read_rights(people: People) -> None:
    refused(
        people.create("alice", job("j", offline={"storage": {"pvcName": "pvc-hidden"}})),
        403,
        "spec.offline.storage.pvcName:",
        "alice may not get PersistentVolumeClaim pvc-hidden",
    )
    shared = job("j", offline={"storage": {"pvcName": "pvc-shared"}})
    assert people.create("alice", shared) == (201, "")


def _s3(secret: str, region_secret: str | None = None) -> dict[str, Any]:
    refs = {f: {"name": secret, "key": f} for f in ("accessKeyId", "secretAccessKey", "bucket")}
    refs["endpoint"] = {"name": secret, "key": "endpoint"}
    if region_secret:
        refs["region"] = {"name": region_secret, "key": "region"}
    return {"storage": {"s3": {**refs, "path": "hub"}}}


def test_offline_s3_secrets_need_read_rights(people: People) -> None:
    refused(
        people.create("alice", job("j", offline=_s3("s-hidden"))),
        403,
        "spec.offline.storage.s3.accessKeyId.name:",
        "alice may not get Secret s-hidden",
    )
    refused(
        people.create(
            "alice", job("j", envSecrets=[env_secret("s-shared")], offline=_s3("s-shared", "s-x"))
        ),
        403,
        "spec.offline.storage.s3.region.name:",
        "alice may not get Secret s-x",
    )
    assert people.create("alice", job("j", offline=_s3("s-shared", "s-shared"))) == (201, "")


def test_file_config_maps_need_read_rights(people: People) -> None:
    def mounted(name: str, path: str) -> dict[str, Any]:
        return {"configMapRef": {"name": name}, "mountPath": path}

    refused(
        people.create(
            "alice",
            job(
                "j",
                customTasks=[{"configMap": "tasks-shared"}],
                fileConfigMaps=[mounted("tasks-shared", "/data/a"), mounted("tasks-hidden", "/b")],
            ),
        ),
        403,
        "spec.fileConfigMaps[1].configMapRef.name:",
        "alice may not get ConfigMap tasks-hidden",
    )
    shared = job("j", fileConfigMaps=[mounted("tasks-shared", "/data/a")])
    assert people.create("alice", shared) == (201, "")


def test_managed_outputs_claims_need_the_right_to_create_claims(people: People) -> None:
    managed = job("j", outputs={"pvcManaged": {"size": "1Gi"}})
    refused(
        people.create("alice", managed),
        403,
        "spec.outputs.pvcManaged: alice may not create PersistentVolumeClaims in namespace",
    )
    assert people.create("carol", managed) == (201, "")


def test_a_baseline_needs_the_requesters_read_right(
    policy: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> None:
    # dave may create jobs and pods, but get only the LMEvalJob base-shared.
    rules = [
        {"apiGroups": [api.API_GROUP], "resources": [api.PLURAL], "verbs": ["create"]},
        {
            "apiGroups": [api.API_GROUP],
            "resources": [api.PLURAL],
            "resourceNames": ["base-shared"],
            "verbs": ["get"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]},
    ]
    objects = [_role("lmevaljob-dave", rules), _binding("lmevaljob-dave", "dave")]
    policy.kubectl("apply", "-n", namespace, "-f", "-", input_text=yaml.safe_dump_all(objects))
    dave = api_client(user_kubeconfig(policy, "dave"))
    custom = client.CustomObjectsApi(dave)
    gate = {"task": "toy_mc"}

    def create(baseline: str) -> tuple[int, str]:
        body = job("gated", baseline=baseline, gate=gate)
        try:
            custom.create_namespaced_custom_object(
                api.API_GROUP, api.API_VERSION, namespace, api.PLURAL, body, dry_run="All"
            )
        except ApiException as error:
            return error.status, json.loads(error.body).get("message", "")
        return 201, ""

    try:
        wait_for(lambda: create("base-shared")[0] == 201, timeout=30, what="dave's RBAC")
        refused(
            create("base-hidden"),
            403,
            "spec.baseline: dave may not get LMEvalJob base-hidden in namespace",
            "regression gate",
        )
    finally:
        dave.close()
