"""A job namespace made with ``deploy/components/job-namespace`` gives job pods no rights.

Checks, on the real control plane: the component, rendered by kustomize for
a fresh namespace and applied, labels the namespace Pod Security
``restricted`` and creates the ``lmeval-job`` ServiceAccount without token
automount; acting *as* that ServiceAccount (a TokenRequest token, what a pod
would get if it mounted one), its SelfSubjectRulesReview lists nothing
beyond what every authenticated user has (discovery and self-reviews), and
reading secrets, pods, ConfigMaps or LMEvalJobs is refused; no RoleBinding
or ClusterRoleBinding in the cluster names it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import api_client, service_account_kubeconfig

from poller import api
from poller.api.settings import Settings
from tests.deploy.conftest import DEPLOY, documents

pytestmark = pytest.mark.cluster

JOB_SA = Settings().job_service_account
# What system:basic-user, system:discovery and system:public-info-viewer give
# every authenticated identity, and system:service-account-issuer-discovery
# every ServiceAccount (Kubernetes' default cluster roles).
SELF_REVIEWS = {
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
    ("authentication.k8s.io", "selfsubjectreviews"),
}
DISCOVERY_URLS = {
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/readyz",
    "/openapi",
    "/openapi/*",
    "/version",
    "/version/",
    "/.well-known/openid-configuration",
    "/.well-known/openid-configuration/",
    "/openid/v1/jwks",
    "/openid/v1/jwks/",
}


def _apply_component(plane: ControlPlane, namespace: str, workdir: Path) -> list[dict]:
    """Render the component for `namespace` the way a user's kustomization would."""
    # kustomize takes components by relative path only.
    component = os.path.relpath(DEPLOY / "components" / "job-namespace", workdir)
    (workdir / "namespace.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    )
    (workdir / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": namespace,
                "resources": ["namespace.yaml"],
                "components": [component],
            }
        )
    )
    rendered = plane.kubectl("kustomize", str(workdir)).stdout
    plane.kubectl("apply", "--server-side", "-f", "-", input_text=rendered)
    return documents(rendered)


def test_job_service_account_has_nothing_beyond_discovery(
    control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    docs = _apply_component(control_plane, namespace, tmp_path)
    assert {(d["kind"], d["metadata"]["name"]) for d in docs} == {
        ("Namespace", namespace),
        ("ServiceAccount", JOB_SA),
    }
    core = client.CoreV1Api(admin_api)
    labels = core.read_namespace(namespace).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    account = core.read_namespaced_service_account(JOB_SA, namespace)
    assert account.automount_service_account_token is False

    rbac = client.RbacAuthorizationV1Api(admin_api)
    bindings = [
        *rbac.list_role_binding_for_all_namespaces().items,
        *rbac.list_cluster_role_binding().items,
    ]
    for binding in bindings:
        for subject in binding.subjects or []:
            assert not (
                subject.kind == "ServiceAccount"
                and subject.name == JOB_SA
                and subject.namespace == namespace
            ), f"{binding.metadata.name} binds the job ServiceAccount"

    kubeconfig = service_account_kubeconfig(control_plane, namespace, JOB_SA)
    with api_client(kubeconfig) as job_api:
        review = client.AuthorizationV1Api(job_api).create_self_subject_rules_review(
            client.V1SelfSubjectRulesReview(
                spec=client.V1SelfSubjectRulesReviewSpec(namespace=namespace)
            )
        )
        status = review.status
        assert status.incomplete is False
        for rule in status.resource_rules:
            granted = {(g, r) for g in rule.api_groups for r in rule.resources}
            assert granted <= SELF_REVIEWS, f"job ServiceAccount may {rule.verbs} {granted}"
            assert rule.verbs == ["create"]
        for rule in status.non_resource_rules:
            assert set(rule.verbs) == {"get"}, rule
            assert set(rule.non_resource_urls) <= DISCOVERY_URLS, rule

        core_as_job = client.CoreV1Api(job_api)
        custom_as_job = client.CustomObjectsApi(job_api)
        refused = [
            lambda: core_as_job.list_namespaced_secret(namespace),
            lambda: core_as_job.list_namespaced_pod(namespace),
            lambda: core_as_job.list_namespaced_config_map(namespace),
            lambda: custom_as_job.list_namespaced_custom_object(
                api.API_GROUP, api.API_VERSION, namespace, api.PLURAL
            ),
        ]
        for call in refused:
            with pytest.raises(ApiException) as error:
                call()
            assert error.value.status == 403
