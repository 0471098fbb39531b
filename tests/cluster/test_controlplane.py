"""The local control plane is a real Kubernetes API.

Checks, against the processes the suite itself started: the pinned release
answers /version; the real scheduler places a plain user's pod on a kwok
node, which then runs and ends with the exit code and message the test chose;
pod logs and exec are served; the garbage collector and the namespace
controller work; a ServiceAccount without bindings is refused everything but
discovery; and the audit reader reports exactly the calls a user made.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from lmeval_sandbox import build, kwok
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import api_client, service_account_kubeconfig, user_kubeconfig

from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def _pod(name: str, annotations: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations),
        spec=client.V1PodSpec(
            containers=[client.V1Container(name="main", image="example.invalid/eval:1")],
            automount_service_account_token=False,
        ),
    )


def _bind_edit(admin_api: client.ApiClient, namespace: str, user: str) -> None:
    client.RbacAuthorizationV1Api(admin_api).create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=f"{user}-edit"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"
            ),
            subjects=[
                client.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")
            ],
        ),
    )


def _main_state(
    core: client.CoreV1Api, namespace: str, name: str
) -> client.V1ContainerState | None:
    pod = core.read_namespaced_pod(name, namespace)
    statuses = pod.status.container_statuses or []
    return statuses[0].state if statuses else None


def test_version_reports_pinned_release(
    control_plane: ControlPlane, admin_api: client.ApiClient
) -> None:
    assert control_plane.binaries is not None
    for name in build.BINARIES:
        assert (control_plane.binaries / name).is_file()
    info = client.VersionApi(admin_api).get_code()
    assert info.git_version == build.kubernetes_version()
    assert info.git_version.startswith("v1.34.")


def test_plane_ready_quickly_with_cached_binaries(control_plane: ControlPlane) -> None:
    startup_without_build = control_plane.times.total - control_plane.times.binaries
    assert startup_without_build < 30, control_plane.times
    assert all(control_plane.running().values()), control_plane.running()


def test_user_pod_scheduled_runs_and_exits_as_chosen(
    control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> None:
    _bind_edit(admin_api, namespace, "alice")
    with api_client(user_kubeconfig(control_plane, "alice")) as alice:
        core = client.CoreV1Api(alice)
        core.create_namespaced_pod(namespace, _pod("eval"))
        running = wait_for(
            lambda: (s := _main_state(core, namespace, "eval")) and s.running,
            what="pod Running",
        )
        assert running.started_at is not None
        pod = core.read_namespaced_pod("eval", namespace)
        assert pod.spec.node_name.startswith("kwok-node-")
        assert pod.status.phase == "Running"
        events = (
            client.CoreV1Api(admin_api)
            .list_namespaced_event(
                namespace, field_selector="involvedObject.name=eval,reason=Scheduled"
            )
            .items
        )
        assert events and events[0].reporting_component == "default-scheduler"

        # The moment of termination is the test's choice: now.
        core.patch_namespaced_pod(
            "eval",
            namespace,
            {
                "metadata": {
                    "annotations": {
                        kwok.ANNOTATION_EXIT_CODE: "7",
                        kwok.ANNOTATION_EXIT_MESSAGE: "ValueError: chosen by the test",
                    }
                }
            },
        )
        terminated = wait_for(
            lambda: (s := _main_state(core, namespace, "eval")) and s.terminated,
            what="main container terminated",
        )
        assert terminated.exit_code == 7
        assert terminated.reason == "Error"
        assert terminated.message == "ValueError: chosen by the test"
        assert core.read_namespaced_pod("eval", namespace).status.phase == "Failed"

        core.create_namespaced_pod(namespace, _pod("ok", {kwok.ANNOTATION_EXIT_CODE: "0"}))
        wait_for(
            lambda: core.read_namespaced_pod("ok", namespace).status.phase == "Succeeded",
            what="pod Succeeded",
        )
        done = _main_state(core, namespace, "ok")
        assert done is not None and done.terminated.exit_code == 0
        assert done.terminated.reason == "Completed"


def test_waiting_reason_keeps_pod_pending(admin_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_pod(
        namespace,
        _pod(
            "stuck",
            {
                kwok.ANNOTATION_WAITING_REASON: "ImagePullBackOff",
                kwok.ANNOTATION_WAITING_MESSAGE: 'Back-off pulling image "example.invalid/eval:1"',
            },
        ),
    )
    waiting = wait_for(
        lambda: (s := _main_state(core, namespace, "stuck")) and s.waiting, what="container Waiting"
    )
    assert waiting.reason == "ImagePullBackOff"
    assert "example.invalid/eval:1" in waiting.message
    assert core.read_namespaced_pod("stuck", namespace).status.phase == "Pending"


def test_logs_tail_and_exec(admin_api: client.ApiClient, namespace: str, tmp_path: Path) -> None:
    core = client.CoreV1Api(admin_api)
    custom = client.CustomObjectsApi(admin_api)
    core.create_namespaced_pod(namespace, _pod("logged"))
    wait_for(
        lambda: (s := _main_state(core, namespace, "logged")) and s.running, what="pod Running"
    )

    lines = [f"line {i} of the evaluation" for i in range(50)]
    log_file = tmp_path / "logged.log"
    log_file.write_text(kwok.cri_log_lines(lines))
    custom.create_namespaced_custom_object(
        "kwok.x-k8s.io",
        "v1alpha1",
        namespace,
        "logs",
        kwok.logs_body(namespace, "logged", log_file),
    )
    (tmp_path / "results.json").write_text(json.dumps({"results": {"t": {"acc,none": 0.5}}}))
    custom.create_namespaced_custom_object(
        "kwok.x-k8s.io",
        "v1alpha1",
        namespace,
        "execs",
        kwok.exec_body(namespace, "logged", tmp_path),
    )

    def tail() -> str | None:
        try:
            text: str = core.read_namespaced_pod_log(
                "logged", namespace, container="main", tail_lines=3
            )
        except ApiException:
            return None  # kwok has not seen the Logs object yet
        return text or None

    assert wait_for(tail, what="pod log").splitlines() == lines[-3:]

    def exec_cat() -> str | None:
        # Exec swaps the ApiClient's request method while it runs: own client.
        with client.ApiClient(admin_api.configuration) as exec_api:
            try:
                out: str = stream(
                    client.CoreV1Api(exec_api).connect_get_namespaced_pod_exec,
                    "logged",
                    namespace,
                    command=["cat", "results.json"],
                    stderr=True,
                    stdin=False,
                    stdout=True,
                    tty=False,
                    _request_timeout=20,
                )
            except ApiException:
                return None
        return out or None

    assert json.loads(wait_for(exec_cat, what="exec output")) == {
        "results": {"t": {"acc,none": 0.5}}
    }


def test_garbage_collection_and_namespace_deletion(admin_api: client.ApiClient) -> None:
    core = client.CoreV1Api(admin_api)
    name = "gc-check"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for(lambda: core.list_namespaced_service_account(name).items, what="default SA")
    owner = core.create_namespaced_config_map(
        name, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    pod = _pod("owned")
    pod.metadata.owner_references = [
        client.V1OwnerReference(
            api_version="v1",
            kind="ConfigMap",
            name="owner",
            uid=owner.metadata.uid,
            controller=True,
            block_owner_deletion=True,
        )
    ]
    core.create_namespaced_pod(name, pod)
    core.delete_namespaced_config_map("owner", name, propagation_policy="Background")

    def pod_gone() -> bool:
        return not [p for p in core.list_namespaced_pod(name).items if p.metadata.name == "owned"]

    wait_for(pod_gone, timeout=60, what="garbage collection of the owned pod")

    core.create_namespaced_config_map(
        name, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="leftover"))
    )
    core.create_namespaced_pod(name, _pod("leftover"))
    core.delete_namespace(name)

    def namespace_gone() -> bool:
        return name not in [n.metadata.name for n in core.list_namespace().items]

    wait_for(namespace_gone, timeout=90, what="namespace deletion to finish")


def test_service_account_without_bindings_has_no_rights(
    control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> None:
    client.CoreV1Api(admin_api).create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
    )
    with api_client(service_account_kubeconfig(control_plane, namespace, "nobody")) as nobody:
        core = client.CoreV1Api(nobody)
        for call in (
            core.list_namespaced_pod,
            core.list_namespaced_secret,
            core.list_namespaced_config_map,
        ):
            with pytest.raises(ApiException) as refused:
                call(namespace)
            assert refused.value.status == 403
        review = client.AuthorizationV1Api(nobody).create_self_subject_rules_review(
            client.V1SelfSubjectRulesReview(
                spec=client.V1SelfSubjectRulesReviewSpec(namespace=namespace)
            )
        )
    discovery = {"selfsubjectaccessreviews", "selfsubjectrulesreviews", "selfsubjectreviews"}
    for rule in review.status.resource_rules:
        assert set(rule.resources) <= discovery, rule
        assert rule.verbs == ["create"], rule
    assert {r for rule in review.status.resource_rules for r in rule.resources} == discovery
    for rule in review.status.non_resource_rules:
        assert rule.verbs == ["get"], rule


def test_audit_reader_reports_exact_calls(
    control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> None:
    _bind_edit(admin_api, namespace, "auditee")
    mark = control_plane.audit.mark()
    with api_client(user_kubeconfig(control_plane, "auditee")) as auditee:
        core = client.CoreV1Api(auditee)
        core.list_namespaced_pod(namespace)
        with pytest.raises(ApiException):
            core.read_namespaced_config_map("missing", namespace)
        core.create_namespaced_config_map(
            namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="made"))
        )
        with pytest.raises(ApiException):
            core.list_namespaced_pod("kube-system")
    expected = Counter(
        {
            ("list", "pods", "", 200): 1,
            ("get", "configmaps", "", 404): 1,
            ("create", "configmaps", "", 201): 1,
            ("list", "pods", "", 403): 1,
        }
    )
    summary = wait_for(
        lambda: (s := control_plane.audit.summary("auditee", since=mark)) == expected and s,
        timeout=10,
        what="audit events of auditee",
    )
    assert summary == expected
    calls = control_plane.audit.calls_by("auditee", since=mark)
    assert {c.namespace for c in calls} == {namespace, "kube-system"}
    assert [c.name for c in calls if c.verb == "create"] == ["made"]


def test_stage_file_uses_the_annotation_names_the_code_exports() -> None:
    text = kwok.kwok_config_yaml()
    for name in (
        kwok.ANNOTATION_EXIT_CODE,
        kwok.ANNOTATION_EXIT_MESSAGE,
        kwok.ANNOTATION_EXIT_REASON,
        kwok.ANNOTATION_WAITING_REASON,
        kwok.ANNOTATION_WAITING_MESSAGE,
    ):
        assert f'"{name}"' in text, name
