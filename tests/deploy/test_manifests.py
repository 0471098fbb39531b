"""The manifests in ``deploy/`` as kustomize renders them (no cluster needed).

Checks: both overlays render the same objects, all namespaced ones in
lmeval-system; the rendered ClusterRole is exactly ``deploy/base/rbac.yaml``
(the file the integration suite runs the poller under) and nothing else is
bound to the poller's ServiceAccount; the Deployment is restricted by
construction (non-root, no escalation, no capabilities, RuntimeDefault
seccomp, read-only root), probes /healthz and /readyz on the metrics port,
passes arguments the entry point accepts (leader election on), and pins a UID only in the
kubernetes overlay (never on OpenShift); the Service reaches the pod; the
settings ConfigMap holds every setting at its built-in default (or names it
in a comment), and the install guide (INSTALL.md or README.md) documents
every setting and every rule; the job-namespace component gives a
token-less ServiceAccount that nothing binds, and restricted Pod Security
labels; the optional deploy/metrics component's ServiceMonitor selects the
base's metrics Service and port; the claims policy names the ServiceAccount
the Deployment runs as, and is bound in every namespace.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from poller import api
from poller.api.settings import CONFIGMAP_NAME, Settings
from tests.deploy.conftest import (
    DEPLOY,
    POLLER_NS,
    REPO,
    Manifest,
    documents,
    find,
    kustomize,
    yaml_file,
)

RBAC_FILE = DEPLOY / "base" / "rbac.yaml"
# The install guide: deploy/INSTALL.md, or README.md once merged into it.
GUIDES = (DEPLOY / "INSTALL.md", DEPLOY / "CONFIGURE.md", DEPLOY / "RBAC.md", REPO / "README.md")
POLLER_SA = {"kind": "ServiceAccount", "name": "lmeval-poller", "namespace": POLLER_NS}
CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
RESTRICTED_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}


def _keys(docs: list[Manifest]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def _pod_spec(docs: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, "Deployment", "lmeval-poller")["spec"]["template"]["spec"]
    return spec


def test_overlays_render_the_same_objects(rendered: dict[str, list[Manifest]]) -> None:
    kubernetes, openshift = rendered["kubernetes"], rendered["openshift"]
    assert _keys(kubernetes) == _keys(openshift)
    expected = {
        ("Namespace", POLLER_NS),
        ("CustomResourceDefinition", f"{api.PLURAL}.{api.API_GROUP}"),
        ("ServiceAccount", "lmeval-poller"),
        ("ClusterRole", "lmeval-poller"),
        ("ClusterRoleBinding", "lmeval-poller"),
        ("ConfigMap", CONFIGMAP_NAME),
        ("Deployment", "lmeval-poller"),
        ("Service", "lmeval-poller-metrics"),
        ("ValidatingAdmissionPolicy", "lmevaljob-requester-rights"),
        ("ValidatingAdmissionPolicyBinding", "lmevaljob-requester-rights"),
        ("ValidatingAdmissionPolicy", "lmeval-poller-claims"),
        ("ValidatingAdmissionPolicyBinding", "lmeval-poller-claims"),
        ("ValidatingAdmissionPolicy", "lmeval-job-pods-frozen"),
        ("ValidatingAdmissionPolicyBinding", "lmeval-job-pods-frozen"),
    }
    assert expected <= _keys(kubernetes)
    for doc in kubernetes:
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == POLLER_NS, doc["metadata"]
    namespace = find(kubernetes, "Namespace", POLLER_NS)
    assert RESTRICTED_LABELS.items() <= namespace["metadata"]["labels"].items()
    # The CRD is the generated file, untouched (kustomize only adds a label).
    crd = find(kubernetes, "CustomResourceDefinition", f"{api.PLURAL}.{api.API_GROUP}")
    generated = yaml_file(REPO / "crds" / "lmevaljobs.yaml")[0]
    assert crd["spec"] == generated["spec"]


def test_cluster_role_is_the_tested_rbac_file(rendered: dict[str, list[Manifest]]) -> None:
    """The integration suite runs the poller under rbac.yaml: the rendering must not differ."""
    source = yaml_file(RBAC_FILE)
    role = find(source, "ClusterRole", "lmeval-poller")
    for docs in rendered.values():
        assert find(docs, "ClusterRole", "lmeval-poller")["rules"] == role["rules"]
        bound = [
            d
            for d in docs
            if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
            and any({k: s.get(k) for k in POLLER_SA} == POLLER_SA for s in d.get("subjects") or [])
        ]
        # Whatever names the poller's ServiceAccount comes from rbac.yaml itself.
        assert _keys(bound) == _keys(
            [d for d in source if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
        )
        for binding in bound:
            assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in {
                (d["kind"], d["metadata"]["name"]) for d in source
            }


@pytest.mark.parametrize("overlay", ["kubernetes", "openshift"])
def test_deployment_is_restricted_and_probed(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    docs = rendered[overlay]
    deployment = find(docs, "Deployment", "lmeval-poller")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # never two pollers at once
    pod = _pod_spec(docs)
    assert pod["serviceAccountName"] == "lmeval-poller"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == "quay.io/lmeval-poller/lmeval-poller:latest"
    assert container["command"] == ["lmeval-poller"]
    assert container["args"] == ["--json-logs", "--metrics-port=8080", "--leader-elect"]
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in context
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", 8080)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # Only /tmp is writable, and it is an emptyDir.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/tmp": "tmp"}
    assert {v["name"]: v for v in pod["volumes"]}["tmp"]["emptyDir"]

    service = find(docs, "Service", "lmeval-poller-metrics")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


@pytest.mark.parametrize("overlay", ["kubernetes", "openshift"])
def test_claims_policy_names_the_pollers_service_account(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    """Only the poller may make claimed pods: the policy must name the account it runs as."""
    docs = rendered[overlay]
    deployment = find(docs, "Deployment", "lmeval-poller")
    account = _pod_spec(docs)["serviceAccountName"]
    user = f"system:serviceaccount:{deployment['metadata']['namespace']}:{account}"
    policy = find(docs, "ValidatingAdmissionPolicy", "lmeval-poller-claims")
    poller = policy["spec"]["variables"][0]
    assert poller == {"name": "poller", "expression": f"'{user}'"}
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "lmeval-poller-claims")
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every namespace


def test_only_the_kubernetes_overlay_pins_a_uid(rendered: dict[str, list[Manifest]]) -> None:
    pinned = _pod_spec(rendered["kubernetes"])["securityContext"]
    assert pinned["runAsUser"] == 1001 and pinned["runAsUser"] != 0

    def uid_fields(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [k for k in node if k in ("runAsUser", "runAsGroup", "fsGroup")]
            return found + [f for v in node.values() for f in uid_fields(v)]
        if isinstance(node, list):
            return [f for v in node for f in uid_fields(v)]
        return []

    # OpenShift's restricted-v2 SCC assigns the UID from the namespace's range
    # and refuses any other: nothing in the rendering may choose one.
    assert uid_fields(rendered["openshift"]) == []
    namespace = find(rendered["openshift"], "Namespace", POLLER_NS)
    assert namespace["metadata"]["labels"]["security.openshift.io/scc.podSecurityLabelSync"] == (
        "false"
    )


def test_deployment_arguments_are_accepted_by_the_entry_point(
    rendered: dict[str, list[Manifest]],
) -> None:
    from poller.__main__ import parse_args

    container = _pod_spec(rendered["kubernetes"])["containers"][0]
    args = parse_args(container["args"])
    assert args.json_logs is True
    assert args.metrics_port == 8080
    assert args.leader_elect is True


def _configmap_comment_keys(text: str) -> set[str]:
    return set(re.findall(r"^\s*#\s*([a-z][a-z0-9-]+):", text, flags=re.MULTILINE))


def _configmap_comment_defaults(text: str) -> dict[str, str]:
    """The `# key: "value"` lines of a commented-out settings list."""
    found = re.findall(r'^\s*#\s*([a-z][a-z0-9-]+):\s*("(?:[^"\\]|\\.)*")\s*$', text, re.MULTILINE)
    return {key: yaml.safe_load(value) for key, value in found}


def test_settings_configmap_sets_nothing_and_documents_every_default() -> None:
    # The ConfigMap is the operators' alone: the manifests own no key of it,
    # so that applying a newer release never overwrites or removes one.
    path = DEPLOY / "base" / "settings.yaml"
    (configmap,) = yaml_file(path)
    assert configmap["metadata"] == {"name": CONFIGMAP_NAME, "namespace": POLLER_NS}
    assert "data" not in configmap, "the manifests must not own settings keys"
    text = path.read_text()
    documented = _configmap_comment_defaults(text)
    defaults = Settings().model_dump(by_alias=True)
    parsed = Settings.model_validate(documented).model_dump(by_alias=True)
    assert parsed == defaults, "a value listed in settings.yaml is not the built-in default"
    missing = set(Settings.keys()) - _configmap_comment_keys(text)
    assert not missing, f"settings.yaml does not document: {sorted(missing)}"


def test_release_job_image_is_an_install_default_under_the_configmap() -> None:
    from poller.api.settings import INSTALL_DEFAULT_ENV

    (deployment,) = [
        d for d in yaml_file(DEPLOY / "base" / "deployment.yaml") if d["kind"] == "Deployment"
    ]
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env[INSTALL_DEFAULT_ENV["pod-image"]] == Settings().pod_image


def test_install_guide_documents_every_setting_and_rule() -> None:
    present = [path for path in GUIDES if path.exists()]
    assert present, "no install guide (deploy/INSTALL.md or README.md)"
    text = "\n".join(path.read_text() for path in present)
    settings_keys = Settings.keys()  # a classmethod: ConfigMap key -> field
    for key in settings_keys:
        assert f"`{key}`" in text, f"INSTALL.md does not document setting {key}"
    rows = re.findall(r"^\|\s*`([^`]+)`\s*\|\s*([^|]+)\|", text, flags=re.MULTILINE)
    documented: set[tuple[str, str]] = set()
    for resource, verbs in rows:
        documented |= {(resource, v) for v in re.findall(r"[a-z]+", verbs)}
    for doc in yaml_file(RBAC_FILE):
        for rule in doc.get("rules") or []:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert (resource, verb) in documented, (
                        f"INSTALL.md's RBAC table has no row for {verb} {resource}"
                    )


def test_job_namespace_component(kubectl_bin: Path) -> None:
    docs = documents(kustomize(kubectl_bin, DEPLOY / "examples" / "job-namespace"))
    namespace = find(docs, "Namespace", "lmeval-jobs")
    assert RESTRICTED_LABELS.items() <= namespace["metadata"]["labels"].items()
    account = find(docs, "ServiceAccount", Settings().job_service_account)
    assert account["metadata"]["namespace"] == "lmeval-jobs"
    assert account["automountServiceAccountToken"] is False
    # The component brings no rights at all.
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding", "ClusterRoleBinding")]


def test_metrics_component_scrapes_the_base_service(kubectl_bin: Path, tmp_path: Path) -> None:
    """deploy/metrics (a Component owned by the metrics work) fits the base's Service."""
    metrics = DEPLOY / "metrics"
    if not (metrics / "kustomization.yaml").exists():
        pytest.skip("no deploy/metrics component")
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources: [{os.path.relpath(DEPLOY / 'overlays' / 'kubernetes', tmp_path)}]\n"
        f"components: [{os.path.relpath(metrics, tmp_path)}]\n"
    )
    docs = documents(kustomize(kubectl_bin, tmp_path))
    service = find(docs, "Service", "lmeval-poller-metrics")
    for monitor in [d for d in docs if d["kind"] == "ServiceMonitor"]:
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= service["metadata"]["labels"].items()
        ports = {p["name"] for p in service["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
