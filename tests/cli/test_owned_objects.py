"""``lmeval`` shows nothing of an object its job does not control, and 403s in the server's words.

On the real control plane, as real users. ``mallory`` may create ConfigMaps
and pods in the namespace (as every job author may create pods); she makes
a *squatting* ConfigMap under the name a finished job's status gives for its
full results (``cand-results``), holding forged scores, forged per-item
scores, a forged provenance and a forged log tail, without a controller
ownerReference; and one (``other-results``) whose controller is a ConfigMap
of her own. Whether the claims admission policy is bound in the namespace
does not matter: both squatters are ones it admits (only an owner reference
to an LMEvalJob is a claim). The genuine ConfigMaps are the poller's own
manifest (`poller.results.lmeval.results_configmap`), created with the poller's
ServiceAccount.

Checks: ``results`` (table, CSV, JSON), ``compare`` (the paired test, which
reads the per-item scores and the provenance, and the side-by-side scores)
and ``logs`` (the archived tail) refuse the squatter with exit code 8 and a
message naming the ConfigMap and its actual controller (none, or mallory's
ConfigMap), print nothing on stdout, and never print a forged value; ``get``
(which reads only the job) shows no forged value either; the genuine
ConfigMaps are still read (scores only they hold, the paired table). A pod
mallory made under a job's pod name, with a log kwok really serves, is
refused by ``logs`` the same way before a line of it is printed.

403s: under the real ``lmevaljob-requester-rights`` policy, ``carol`` (bound
to ``lmeval-jobs-edit``, without the right to create pods) submitting a job
that runs code of hers (``--allow-code-execution``, which needs pod rights)
gets the policy's own message first and verbatim (it names
``spec.allowCodeExecution``), exit 6,
and no role advised (she has the role); her RBAC denial on a pod names the
verb and resource and advises no role either.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_cli.errors import ExitCode
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import api_client, user_kubeconfig

from driver.itemscores import ItemScores, TaskItems, docs_digest, encode_item_scores, metric_items
from poller import api
from poller.jobpod import podspec
from poller.kube.client import Kube
from poller.results import lmeval
from tests.cli.conftest import REPO, Cli
from tests.poller_fixtures import Jobs, serve_log
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

FORGED = "0.4242"  # every score the squatter holds; no genuine value is this
FORGED_VERSION = "6.6.6-forged"
FORGED_LOG = "FORGED LOG LINE: all tests passed"
N = 40
GENUINE_ACC = [1.0 if i % 4 else 0.0 for i in range(N)]  # mean 0.75
POLICY_FILE = REPO / "deploy" / "admission" / "lmevaljob-policy.yaml"
USER_ROLES = REPO / "deploy" / "base" / "user-roles.yaml"


# -- users ---------------------------------------------------------------------------


def _grant(admin_api: client.ApiClient, namespace: str, user: str, role: dict[str, Any]) -> None:
    """Bind `user` to `role` (a Role body, or {"clusterRole": name}) in `namespace`."""
    rbac = client.RbacAuthorizationV1Api(admin_api)
    if "clusterRole" in role:
        ref = {"kind": "ClusterRole", "name": role["clusterRole"]}
    else:
        rbac.create_namespaced_role(namespace, {"metadata": {"name": user}, "rules": role["rules"]})
        ref = {"kind": "Role", "name": user}
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": f"{user}-{ref['name']}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", **ref},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        },
    )


@pytest.fixture
def mallory(
    control_plane: ControlPlane, admin_api: client.ApiClient, jobs: Jobs
) -> Iterator[client.CoreV1Api]:
    """A co-tenant who may create, replace and delete ConfigMaps and pods in the namespace."""
    verbs = ["create", "get", "update", "patch", "delete"]
    rules = [{"apiGroups": [""], "resources": ["configmaps", "pods"], "verbs": verbs}]
    _grant(admin_api, jobs.namespace, "mallory", {"rules": rules})
    with api_client(user_kubeconfig(control_plane, "mallory")) as api_:
        core = client.CoreV1Api(api_)

        def allowed() -> bool:
            # RBAC reaches the apiserver's authorizer cache asynchronously.
            probe = {"metadata": {"name": "probe"}}
            try:
                core.create_namespaced_config_map(jobs.namespace, probe, dry_run="All")
            except ApiException as error:
                if error.status == 403:
                    return False
                raise
            return True

        wait_for(allowed, timeout=30, what="mallory's Role in force")
        yield core


# -- jobs and their ConfigMaps ----------------------------------------------------------


def _items(acc: list[float]) -> bytes:
    """Per-item scores of toy_mc, encoded as the driver does."""
    task = TaskItems(
        tuple(range(N)),
        docs_digest((i, f"doc{i}") for i in range(N)),
        {"acc,none": metric_items(acc)},
    )
    return encode_item_scores(ItemScores(tasks={"toy_mc": task}, server={"models": "m1"}))


def _full_results(acc: float, gen: float) -> dict[str, Any]:
    return {
        "results": {
            "toy_mc": {"alias": "toy_mc", "acc,none": acc, "acc_stderr,none": 0.05},
            "toy_gen": {"alias": "toy_gen", "exact_match,none": gen},
        },
        "task_hashes": {"toy_mc": "mc-hash", "toy_gen": "gen-hash"},
        "n-shot": {"toy_mc": 0, "toy_gen": 0},
        "versions": {"toy_mc": 1.0, "toy_gen": 1.0},
        "higher_is_better": {"toy_mc": {"acc": True}, "toy_gen": {"exact_match": True}},
    }


def _provenance(version: str) -> dict[str, Any]:
    return {"lmEvalVersion": version, "driverVersion": "0.1.0", "imageID": "sha256:aaa"}


def _finished(jobs: Jobs, name: str) -> dict[str, Any]:
    """A Complete job whose status holds only part of its scores (truncated, reduced):
    the rest, the per-item scores and the full provenance are in its results ConfigMap."""
    job = jobs.create(name, tasks=["toy_mc", "toy_gen"])
    truncated = {"results": {"toy_mc": {"acc,none": 0.75}}, "truncated": True}
    status = {
        "state": "Complete",
        "reason": "Succeeded",
        "message": "evaluation finished",
        "results": json.dumps(truncated),
        "resultsReduced": True,
        "resultsConfigMap": lmeval.results_configmap_name(name),
        "provenance": _provenance("0.4.13"),
    }
    jobs.custom.patch_namespaced_custom_object_status(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, name, {"status": status}
    )
    return job


def _genuine(poller_kube: Kube, jobs: Jobs, name: str) -> None:
    """A finished job and its results ConfigMap as the poller makes it, by the poller."""
    job = _finished(jobs, name)
    manifest = lmeval.results_configmap(
        namespace=jobs.namespace,
        job_name=name,
        job_uid=job["metadata"]["uid"],
        results=_full_results(0.75, 0.5),
        labels={podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY},
        items=_items(GENUINE_ACC),
        provenance=json.dumps(_provenance("0.4.13")),
    )
    poller_kube.apply_configmap(manifest)


def _squatter(name: str, owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Forged content under a results ConfigMap's name (what the squatter wants shown)."""
    metadata: dict[str, Any] = {"name": lmeval.results_configmap_name(name)}
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "metadata": metadata,
        "data": {
            lmeval.RESULTS_KEY: json.dumps(_full_results(float(FORGED), float(FORGED))),
            lmeval.PROVENANCE_KEY: json.dumps(_provenance(FORGED_VERSION)),
            lmeval.LOG_ARCHIVE_KEY: FORGED_LOG + "\n",
        },
        "binaryData": {
            lmeval.ITEMS_KEY: base64.b64encode(gzip.compress(_items([0.0] * N))).decode()
        },
    }


def _refused(done: Any, configmap: str, namespace: str, controller: str) -> None:
    """Exit 8, nothing on stdout, the message naming the ConfigMap and its controller."""
    assert done.returncode == ExitCode.NOT_OWNED == 8, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.startswith(
        f"error: ConfigMap {configmap} in namespace {namespace} is not LMEvalJob "
    ), done.stderr
    assert f"its controller ownerReference is {controller}, not the job" in done.stderr
    assert "the job's full results" in done.stderr and "unavailable" in done.stderr
    for forged in (FORGED, FORGED_VERSION, FORGED_LOG):
        assert forged not in done.stderr


def test_a_squatting_results_configmap_is_never_shown(
    cli: Cli, jobs: Jobs, poller_kube: Kube, mallory: client.CoreV1Api
) -> None:
    namespace = jobs.namespace
    _genuine(poller_kube, jobs, "base")
    _genuine(poller_kube, jobs, "again")
    # The squatter is there before the poller would write its ConfigMap.
    mallory.create_namespaced_config_map(namespace, _squatter("cand"))
    _finished(jobs, "cand")
    anchor = mallory.create_namespaced_config_map(namespace, {"metadata": {"name": "anchor"}})
    mallory.create_namespaced_config_map(
        namespace,
        _squatter(
            "other",
            [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "anchor",
                    "uid": anchor.metadata.uid,
                    "controller": True,
                }
            ],
        ),
    )
    _finished(jobs, "other")

    # The genuine ConfigMaps are read: toy_gen's score is only there, and so
    # are the per-item scores the paired test needs.
    table = cli("results", "base")
    assert table.returncode == 0, table.stderr
    assert ["toy_gen", "exact_match", "none", "0.5000", "-"] in [
        line.split() for line in table.stdout.splitlines()
    ]
    assert json.loads(cli("results", "base", "-o", "json").stdout) == _full_results(0.75, 0.5)
    paired = cli("compare", "base", "again")
    assert paired.returncode == 0, paired.stderr
    assert "A = base (baseline), B = again (candidate)" in paired.stdout
    assert "no significant difference" in paired.stdout

    for command in (
        ["results", "cand"],
        ["results", "cand", "-o", "json"],
        ["results", "cand", "-o", "csv"],
        ["compare", "base", "cand"],
        ["compare", "cand", "base", "-o", "json"],
        ["compare", "base", "cand", "--task", "toy_mc", "-o", "markdown"],
        ["logs", "cand"],
    ):
        _refused(cli(*command), "cand-results", namespace, "none")

    shown = cli("get", "cand")
    assert shown.returncode == 0, shown.stderr
    assert "0.7500" in shown.stdout  # the status's own (truncated) scores
    for forged in (FORGED, FORGED_VERSION, FORGED_LOG):
        assert forged not in shown.stdout + shown.stderr

    _refused(
        cli("results", "other", "-o", "json"),
        "other-results",
        namespace,
        f"ConfigMap anchor (uid {anchor.metadata.uid})",
    )


def test_a_pod_squatting_the_jobs_pod_name_is_never_read(
    cli: Cli,
    jobs: Jobs,
    admin_api: client.ApiClient,
    mallory: client.CoreV1Api,
    tmp_path: Path,
) -> None:
    job = jobs.create("squatted")  # no poller runs: the pod name is free
    pod = podspec.pod_name("squatted", job["metadata"]["uid"])
    container = {"name": podspec.MAIN_CONTAINER, "image": "registry.example/none:1"}
    mallory.create_namespaced_pod(
        jobs.namespace, {"metadata": {"name": pod}, "spec": {"containers": [container]}}
    )
    serve_log(admin_api, jobs.namespace, pod, FORGED_LOG, tmp_path)
    core = client.CoreV1Api(admin_api)

    def served() -> bool:
        # The forged log is really there to read: refusing it is the CLI's doing.
        try:
            text = core.read_namespaced_pod_log(pod, jobs.namespace, container="lmeval")
        except ApiException as error:
            if error.status in (400, 404):  # not running yet
                return False
            raise
        return FORGED_LOG in text

    wait_for(served, timeout=30, what="the squatting pod's log served")

    for command in (["logs", "squatted"], ["logs", "squatted", "-f", "--interval", "0.2"]):
        done = cli(*command)
        assert done.returncode == ExitCode.NOT_OWNED, (done.stdout, done.stderr)
        assert done.stdout == ""
        assert done.stderr.startswith(
            f"error: pod {pod} in namespace {jobs.namespace} is not LMEvalJob squatted's: "
            "its controller ownerReference is none, not the job"
        ), done.stderr
        assert "its log is not shown" in done.stderr
        assert FORGED_LOG not in done.stderr


# -- 403s --------------------------------------------------------------------------------


def test_a_policy_denial_is_the_policys_words_and_rbac_names_the_verb(
    cli: Cli, control_plane: ControlPlane, admin_api: client.ApiClient, jobs: Jobs
) -> None:
    # The policy as the install applies it (cluster-wide, as tests/deploy does).
    control_plane.kubectl("apply", "--server-side", "-f", str(POLICY_FILE))
    control_plane.kubectl("apply", "-f", str(USER_ROLES))
    _grant(admin_api, jobs.namespace, "carol", {"clusterRole": "lmeval-jobs-edit"})
    kubeconfig = user_kubeconfig(control_plane, "carol")
    body = {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {"name": "probe"},
        "spec": {"model": "dummy", "tasks": ["toy_mc"], "allowCodeExecution": True},
    }
    with api_client(kubeconfig) as carol:
        custom = client.CustomObjectsApi(carol)

        def refused_by_policy() -> str | None:
            # RBAC and the policy reach the apiserver's caches asynchronously.
            try:
                custom.create_namespaced_custom_object(
                    api.API_GROUP,
                    api.API_VERSION,
                    jobs.namespace,
                    api.PLURAL,
                    body,
                    dry_run="All",
                )
            except ApiException as error:
                said = str(json.loads(error.body).get("message", ""))
                return said if error.status == 403 and "ValidatingAdmissionPolicy" in said else None
            return None

        said = wait_for(refused_by_policy, timeout=30, what="the policy refusing carol")

    submitted = cli(
        "submit",
        "--model=dummy",
        "--task=toy_mc",
        "--allow-code-execution",
        "--name=probe",
        kubeconfig=kubeconfig,
    )
    assert submitted.returncode == ExitCode.FORBIDDEN == 6
    assert submitted.stderr == f"error: {said}\n"
    assert "ValidatingAdmissionPolicy 'lmevaljob-requester-rights'" in submitted.stderr
    assert "spec.allowCodeExecution" in submitted.stderr  # the policy names the field
    assert "create pods" in submitted.stderr
    assert "ClusterRole" not in submitted.stderr and "lmeval-jobs-edit" not in submitted.stderr

    jobs.create("visible")  # carol may read it, not its pod
    logs = cli("logs", "visible", kubeconfig=kubeconfig)
    assert logs.returncode == ExitCode.FORBIDDEN, logs.stderr
    assert logs.stderr.startswith(
        f'error: permission denied: user "carol" may not get pods in namespace "{jobs.namespace}"'
    )
    assert f"kubectl auth can-i get pods -n {jobs.namespace}" in logs.stderr
    assert "ClusterRole" not in logs.stderr
