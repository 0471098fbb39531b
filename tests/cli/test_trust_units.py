"""What ``lmeval`` trusts, without a cluster: owned objects and the words of a 403.

Checks: the one checked read (``client.owned_object``) returns an object
whose controller ownerReference is the job's UID, None for an absent one,
and refuses (exit 8) one without a controller, with another controller
(another job, or an earlier job of the same name: same name, other UID) or
with the job only as a non-controlling owner, with a message naming the
object, its actual controller, what is lost and what to do; the results
ConfigMap's name comes from the job's status, else the poller's default.
For 403s: an admission policy's denial (and any other non-RBAC refusal) is
the server's message verbatim, first, with no role advised; an RBAC denial
names user, verb, resource and namespace, and advises a role only when one
of the user roles grants exactly what was refused (none for the poller's
``lmevaljobs/status`` updates or for core resources, none when the
authorizer's own reason names the role, a ClusterRoleBinding at the cluster
scope); the table of what the roles grant is the one in
``deploy/base/user-roles.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lmeval_cli.client import controller_text, owned_object, results_configmap_of
from lmeval_cli.errors import USER_ROLES, ApiError, CliError, ExitCode, explain, role_for

from poller import api

REPO = Path(__file__).resolve().parents[2]
JOB_UID = "5f0c-job"


def _job(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": JOB_UID},
        "spec": {"model": "dummy", "tasks": ["t"]},
        "status": status,
    }


def _owner(uid: str, *, name: str = "j", controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "name": name,
        "uid": uid,
        "controller": controller,
    }


def _configmap(*owners: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "j-results", "namespace": "ns"}
    if owners:
        meta["ownerReferences"] = list(owners)
    return {"metadata": meta, "data": {"results.json": '{"forged": 0.99}'}}


class _Stored:
    """A cluster holding one object per (resource, name); records what was read."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.objects = objects
        self.read: list[tuple[str, str, str]] = []

    def get_core(self, resource: str, name: str, namespace: str) -> dict[str, Any] | None:
        self.read.append((resource, name, namespace))
        return self.objects.get((resource, name))


def test_an_object_the_job_controls_is_returned_and_an_absent_one_is_none() -> None:
    genuine = _configmap(_owner(JOB_UID))
    stored = _Stored({("configmaps", "j-results"): genuine})
    assert owned_object(stored, _job(), "configmaps", "j-results") is genuine  # type: ignore[arg-type]
    assert owned_object(stored, _job(), "pods", "j-pod") is None  # type: ignore[arg-type]
    assert stored.read == [("configmaps", "j-results", "ns"), ("pods", "j-pod", "ns")]


@pytest.mark.parametrize(
    ("owners", "shown"),
    [
        ((), "none"),
        ((_owner("other-uid", name="k"),), "LMEvalJob k (uid other-uid)"),
        # An earlier job of the same name: the name matches, the UID does not.
        ((_owner("old-uid"),), "LMEvalJob j (uid old-uid)"),
        # The job as a mere owner is no claim: anyone may add one without the policy.
        ((_owner(JOB_UID, controller=False),), "none"),
        (
            (
                _owner(JOB_UID, controller=False),
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "d",
                    "uid": "d1",
                    "controller": True,
                },
            ),
            "Deployment d (uid d1)",
        ),
    ],
)
def test_an_object_the_job_does_not_control_is_refused_with_its_controller(
    owners: tuple[dict[str, Any], ...], shown: str
) -> None:
    squatter = _configmap(*owners)
    assert controller_text(squatter) == shown
    stored = _Stored({("configmaps", "j-results"): squatter})
    with pytest.raises(CliError) as refused:
        owned_object(stored, _job(), "configmaps", "j-results")  # type: ignore[arg-type]
    assert refused.value.code == ExitCode.NOT_OWNED == 8
    message = refused.value.message
    assert message.startswith(
        f"ConfigMap j-results in namespace ns is not LMEvalJob j's: its controller "
        f"ownerReference is {shown}, not the job (uid {JOB_UID})"
    )
    assert "the job's full results" in message and "are unavailable" in message
    assert "kubectl delete configmaps j-results -n ns" in message
    assert "lmeval rerun j" in message
    assert "0.99" not in message


def test_a_pod_the_job_does_not_control_is_refused_in_its_own_words() -> None:
    stored = _Stored({("pods", "j-pod"): {"metadata": {"name": "j-pod"}}})
    with pytest.raises(CliError) as refused:
        owned_object(stored, _job(), "pods", "j-pod")  # type: ignore[arg-type]
    assert refused.value.code == ExitCode.NOT_OWNED
    assert refused.value.message.startswith(
        "pod j-pod in namespace ns is not LMEvalJob j's: its controller ownerReference is none"
    )
    assert "its log is not shown" in refused.value.message


def test_the_results_configmap_is_the_one_status_names() -> None:
    assert results_configmap_of(_job()) == "j-results"
    assert results_configmap_of(_job(resultsConfigMap="elsewhere")) == "elsewhere"
    assert results_configmap_of({"metadata": {"name": "j"}, "status": "junk"}) == "j-results"


# -- 403s ------------------------------------------------------------------------

POLICY_DENIAL = (
    f'lmevaljobs.{api.API_GROUP} "j" is forbidden: ValidatingAdmissionPolicy '
    "'lmevaljob-requester-rights' with binding 'lmevaljob-requester-rights' denied request: "
    "spec: carol may not create pods in namespace ns, and an LMEvalJob runs a pod on its "
    "creator's behalf"
)


def _forbidden(message: str, verb: str = "create", resource: str = api.PLURAL, **kw: Any) -> Any:
    group = kw.pop("group", api.API_GROUP)
    error = ApiError(
        403,
        {"reason": "Forbidden", "message": message},
        verb=verb,
        resource=resource,
        group=group,
        namespace=kw.pop("namespace", "ns"),
    )
    return explain(error)


def test_an_admission_policy_denial_is_passed_through_verbatim_without_advice() -> None:
    mapped = _forbidden(POLICY_DENIAL)
    assert mapped.code == ExitCode.FORBIDDEN
    assert mapped.message == POLICY_DENIAL
    assert "lmeval-jobs" not in mapped.message and "ClusterRole" not in mapped.message
    # A policy message that quotes an RBAC sentence is still the policy's.
    quoting = (
        "pods is forbidden: ValidatingAdmissionPolicy 'p' denied request: spec: "
        'User "carol" cannot get resource "secrets" in API group "" in the namespace "ns"'
    )
    assert _forbidden(quoting).message == quoting
    webhook = 'admission webhook "v.example" denied the request: spec.model: not allowed'
    assert _forbidden(webhook).message == webhook
    terminating = "unable to create new content in namespace ns because it is being terminated"
    assert _forbidden(terminating).message == terminating
    silent = _forbidden("")
    assert silent.message == (
        f"permission denied: the API server refused to create lmevaljobs.{api.API_GROUP} "
        'in namespace "ns" (403 Forbidden, without a reason)'
    )


def _rbac(verb: str, resource: str, group: str, where: str = ' in the namespace "ns"') -> str:
    return (
        f'{resource} is forbidden: User "carol" cannot {verb} resource "{resource}" '
        f'in API group "{group}"{where}'
    )


def test_an_rbac_denial_advises_only_a_role_that_grants_what_was_refused() -> None:
    created = _forbidden(_rbac("create", api.PLURAL, api.API_GROUP)).message
    assert created.startswith(
        f'permission denied: user "carol" may not create lmevaljobs.{api.API_GROUP} '
        'in namespace "ns"; ask a cluster admin to bind the lmeval-jobs-edit ClusterRole to you'
    )
    assert f"(check with: kubectl auth can-i create lmevaljobs.{api.API_GROUP} -n ns)" in created
    read = _forbidden(_rbac("get", api.PLURAL, api.API_GROUP), verb="get").message
    assert "bind the lmeval-jobs-view ClusterRole" in read
    # The status is the poller's to write: no role of people grants it.
    status = _forbidden(_rbac("update", f"{api.PLURAL}/status", api.API_GROUP)).message
    assert "may not update lmevaljobs." in status and "ClusterRole" not in status
    assert "--subresource=status" in status
    # Core resources: no role advised (view and edit are not the CLI's to know).
    pods = _forbidden(_rbac("get", "pods", ""), verb="get", resource="pods", group="").message
    assert pods.startswith('permission denied: user "carol" may not get pods in namespace "ns"')
    assert "ClusterRole" not in pods and "kubectl auth can-i get pods -n ns" in pods


def test_the_authorizers_reason_is_shown_and_a_role_it_names_is_not_advised() -> None:
    missing = (
        _rbac("list", api.PLURAL, api.API_GROUP)
        + ': RBAC: clusterrole.rbac.authorization.k8s.io "lmeval-jobs-view" not found'
    )
    text = _forbidden(missing, verb="list").message
    assert '(RBAC: clusterrole.rbac.authorization.k8s.io "lmeval-jobs-view" not found)' in text
    assert "ask a cluster admin to bind" not in text


def test_at_the_cluster_scope_the_advice_is_a_cluster_role_binding() -> None:
    text = _forbidden(
        _rbac("list", api.PLURAL, api.API_GROUP, " at the cluster scope"), verb="list"
    ).message
    assert f"may not list lmevaljobs.{api.API_GROUP} at the cluster scope" in text
    assert "ClusterRoleBinding to the lmeval-jobs-view ClusterRole" in text
    assert "-n" in text and "--all-namespaces" in text


def test_the_role_table_is_what_the_user_roles_grant() -> None:
    documents = list(yaml.safe_load_all((REPO / "deploy/base/user-roles.yaml").read_text()))
    granted = {}
    for role in documents:
        grants = set()
        for rule in role["rules"]:
            assert rule["apiGroups"] == [api.API_GROUP]
            grants |= {(v, r) for v in rule["verbs"] for r in rule["resources"]}
        granted[role["metadata"]["name"]] = grants
    assert {name: set(grants) for name, grants in USER_ROLES} == granted
    # Least first: the view role is advised for reads, though edit grants them too.
    assert role_for("watch", api.PLURAL, api.API_GROUP) == "lmeval-jobs-view"
    assert role_for("delete", api.PLURAL, api.API_GROUP) == "lmeval-jobs-edit"
    assert role_for("get", "secrets", "") is None
