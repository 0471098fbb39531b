"""The kustomize rendering applies cleanly to the real apiserver.

Checks: ``kubectl kustomize deploy/overlays/kubernetes`` (kustomize as built
into the sandbox's kubectl) passes a server-side dry run and then a real
server-side apply without errors or Pod Security warnings; the Deployment's
pod is admitted in the ``restricted`` namespace and becomes available (on a
kwok node: the container does not really run, so the probes and the entry
point are covered by the static and metrics tests, not here); the admission
policy compiles without type-checking warnings. The OpenShift overlay only
gets the server-side dry run: OpenShift's own admission (SCCs) is not
there to judge it, and applying it would change the shared namespace.

The real apply leaves the installation in place for the rest of the session
(it is what ``poller_installed`` installs too, plus the Deployment, which is
deleted afterwards, and the settings ConfigMap, which is set aside before and
put back after, as other tests left it), except the claims policy's
cluster-wide binding: other modules create claimed pods as the admin (to
play forged or leftover pods), which that policy refuses to all but the
poller; ``test_claims_policy`` binds it to its own namespaces instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client
from lmeval_sandbox.controlplane import ControlPlane

from poller.api.settings import CONFIGMAP_NAME
from tests.deploy.conftest import OVERLAYS, POLLER_NS, documents
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

CLAIMS_POLICY = "lmeval-poller-claims"


def _render(plane: ControlPlane, overlay: str) -> str:
    done = plane.kubectl("kustomize", str(OVERLAYS[overlay]), check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _apply(plane: ControlPlane, manifests: str, *extra: str) -> str:
    done = plane.kubectl(
        "apply", "--server-side", "-f", "-", *extra, input_text=manifests, check=False
    )
    assert done.returncode == 0, f"apply {extra} failed:\n{done.stderr}\n{done.stdout}"
    # Pod Security speaks through warnings (on the Deployment, for its pods).
    # The only warning allowed is kubectl's note that objects an earlier
    # client-side apply made (the test fixtures') keep that apply's annotation.
    warnings = [
        line
        for line in done.stderr.splitlines()
        if line.startswith("Warning") and "failed to migrate" not in line
    ]
    assert not warnings, done.stderr
    return done.stdout


@pytest.fixture
def settings_set_aside(admin_api: client.ApiClient) -> Iterator[None]:
    """The settings ConfigMap as other tests left it, removed for the test and put back.

    Other tests write it with the API client, which makes them its fields'
    managers: a server-side apply of the install's own ConfigMap would then
    (rightly) report a conflict, as it would for an admin who edited it live.
    """
    core = client.CoreV1Api(admin_api)
    try:
        before: dict[str, str] | None = (
            core.read_namespaced_config_map(CONFIGMAP_NAME, POLLER_NS).data or {}
        )
        core.delete_namespaced_config_map(CONFIGMAP_NAME, POLLER_NS)
    except client.exceptions.ApiException as error:
        if error.status != 404:
            raise
        before = None
    yield
    try:
        core.delete_namespaced_config_map(CONFIGMAP_NAME, POLLER_NS)
    except client.exceptions.ApiException as error:
        if error.status != 404:
            raise
    if before is not None:
        body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=CONFIGMAP_NAME), data=before)
        core.create_namespaced_config_map(POLLER_NS, body)


@pytest.fixture
def claims_binding_removed(control_plane: ControlPlane) -> Iterator[None]:
    """The claims policy's cluster-wide binding, deleted after the test (see above)."""
    yield
    control_plane.kubectl(
        "delete", "validatingadmissionpolicybinding", CLAIMS_POLICY, "--ignore-not-found"
    )


def test_kubernetes_overlay_applies_and_the_poller_pod_is_admitted(
    control_plane: ControlPlane,
    admin_api: client.ApiClient,
    settings_set_aside: None,
    claims_binding_removed: None,
) -> None:
    manifests = _render(control_plane, "kubernetes")
    docs = documents(manifests)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ValidatingAdmissionPolicy", "CustomResourceDefinition"} <= kinds

    # A dry run cannot create the namespace its other objects go to: that
    # one object is applied for real first (as a real apply would anyway).
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    _apply(control_plane, yaml.safe_dump(namespace))
    _apply(control_plane, manifests, "--dry-run=server")
    applied = _apply(control_plane, manifests)
    assert "deployment.apps/lmeval-poller serverside-applied" in applied

    apps = client.AppsV1Api(admin_api)
    try:

        def available() -> bool:
            deployment = apps.read_namespaced_deployment("lmeval-poller", POLLER_NS)
            return (deployment.status.available_replicas or 0) >= 1

        wait_for(available, timeout=60, what="the poller Deployment available")
        pods = client.CoreV1Api(admin_api).list_namespaced_pod(
            POLLER_NS, label_selector="app.kubernetes.io/name=lmeval-poller"
        )
        (pod,) = pods.items
        assert pod.spec.security_context.run_as_user == 1001
        assert pod.spec.containers[0].security_context.read_only_root_filesystem is True
    finally:
        apps.delete_namespaced_deployment("lmeval-poller", POLLER_NS)

    def policy_checked(policy: str) -> dict | None:
        out = control_plane.kubectl("get", "validatingadmissionpolicies", policy, "-o", "json")
        status = json.loads(out.stdout).get("status") or {}
        return status if "typeChecking" in status else None

    for policy in ("lmevaljob-requester-rights", CLAIMS_POLICY):
        status = wait_for(
            lambda p=policy: policy_checked(p), timeout=30, what=f"{policy}'s type checking"
        )
        assert not status["typeChecking"].get("expressionWarnings"), status


def test_openshift_overlay_passes_a_server_side_dry_run(
    poller_installed: ControlPlane, settings_set_aside: None
) -> None:
    # poller_installed: the namespace exists (a dry run cannot create it).
    _apply(poller_installed, _render(poller_installed, "openshift"), "--dry-run=server")
