"""The poller's RBAC in ``deploy/base/rbac.yaml`` is exactly what its code uses.

The poller runs in-process but authenticated as its own ServiceAccount, bound
to the rules of ``rbac.yaml`` (the ``poller_installed`` fixture applies that
file; ``test_manifests`` proves the kustomize rendering carries the same
rules). This test first drives every kind of work through it itself, so that
it does not depend on which other tests ran: a job that runs to Succeeded
with its results read from the log and stored in a ConfigMap that already
exists (create, then update), then deleted by its ``ttlSecondsAfterFinished``;
a job cancelled while running (its pod deleted, its log archived); a job
whose results are read with exec (``results-source: exec``); and a
leader-election Lease acquired and renewed; a job's managed outputs claim made, and
released when the job ends (``keep: true``), and another's found taken by someone
else's claim; Kueue's workloads; and an LMEvalSuite asked for a run by hand,
whose model trigger names an InferenceService, cycled until its run exists and
its status records it (list the suites, get the InferenceService, create the
run, patch the suite's status). Then it reads the apiserver's
audit log (which the poller cannot influence) for the whole session so far:

- every (API group, resource, verb) the rules grant was used at least once,
  except the rules listed in ``UNUSED_ON_PURPOSE`` with the reason that
  INSTALL.md gives too;
- every request the poller made is covered by a rule, and none was refused
  (no 401 or 403 at all in the session).

A request counts as used whatever its outcome but 401 and 403: a 404 was
authorized first. So the InferenceService read counts where KServe's CRD is
not installed (as here, unless another test installed it): the apiserver
authorizes a request on an unknown API group like any other, records it in the
audit log with its group and resource, and only then answers 404, which the
poller reads as "no such InferenceService".

Named ``test_zz_*`` so that in a full run it comes after the other suites and
also sees what they made the poller do.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox import kwok
from lmeval_sandbox.controlplane import ControlPlane

from poller import api
from poller.cycle.reconciler import Reconciler
from poller.jobpod import offline
from poller.kube.client import Kube
from poller.leader import LeaderElector
from poller.results import lmeval
from tests.deploy.conftest import DEPLOY, yaml_file
from tests.kueue_fixtures import Queues
from tests.poller_fixtures import (
    BASE_SETTINGS,
    POLLER_NS,
    POLLER_USER,
    CapturedRun,
    Jobs,
    cycle_until,
    serve_log,
    set_settings,
    terminate,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

Rule = tuple[str, str, str]  # (API group, resource[/subresource], verb)

UNUSED_ON_PURPOSE: dict[Rule, str] = {
    (api.API_GROUP, "lmevaljobs/finalizers", "update"): (
        "never called: authorizes the blockOwnerDeletion ownerReferences of job pods and "
        "results ConfigMaps where OwnerReferencesPermissionEnforcement is on (OpenShift)"
    ),
    ("", "pods/exec", "create"): (
        "the websocket exec is authorized as get up to Kubernetes 1.34 (the sandbox's "
        "version); 1.35 and newer also check create"
    ),
}


def granted_rules() -> set[Rule]:
    """Every (group, resource, verb) that rbac.yaml grants the poller."""
    rules: set[Rule] = set()
    for doc in yaml_file(DEPLOY / "base" / "rbac.yaml"):
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    rules |= {(group, resource, verb) for verb in rule["verbs"]}
    return rules


def used_rules(plane: ControlPlane) -> dict[Rule, set[int]]:
    """What the poller's ServiceAccount did this session, with the response codes."""
    used: dict[Rule, set[int]] = {}
    for call in plane.audit.calls_by(POLLER_USER):
        if not call.resource:
            continue  # discovery and other non-resource URLs
        resource = f"{call.resource}/{call.subresource}" if call.subresource else call.resource
        used.setdefault((call.api_group, resource, call.verb), set()).add(call.code)
    return used


def _serve_exec(admin_api: client.ApiClient, namespace: str, pod: str, work_dir: Path) -> None:
    """Let `kubectl exec` into the pod run locally (kwok), with this Python on PATH."""
    client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
        "kwok.x-k8s.io",
        "v1alpha1",
        namespace,
        "execs",
        kwok.exec_body(
            namespace, pod, work_dir, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
        ),
    )


def _job_exists(jobs: Jobs, name: str) -> bool:
    items = jobs.custom.list_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL
    )["items"]
    return any(item["metadata"]["name"] == name for item in items)


def _pod_of(poller: Reconciler, jobs: Jobs, name: str) -> str:
    status = cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == "Running" and jobs.status(name),
        what=f"{name} Running",
    )
    pod: str = status["podName"]
    return pod


def _suite_run(jobs: Jobs, suite: str) -> str | None:
    """The name of the LMEvalJob carrying `suite`'s label (its run), if any."""
    listed: dict[str, Any] = jobs.custom.list_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        label_selector=f"{api.SUITE_LABEL}={suite}",
    )
    items = listed["items"]
    return str(items[0]["metadata"]["name"]) if items else None


def _suite_status(jobs: Jobs, suite: str) -> dict[str, Any]:
    found: dict[str, Any] = jobs.custom.get_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.SUITE_PLURAL, suite
    )
    status: dict[str, Any] = found.get("status") or {}
    return status


def _complete(poller: Reconciler, jobs: Jobs, name: str) -> dict:
    status: dict = cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == "Complete" and jobs.status(name),
        what=f"{name} Complete",
    )
    return status


def test_every_rule_is_used_and_nothing_is_refused(
    poller: Reconciler,
    jobs: Jobs,
    queues: Queues,
    poller_kube: Kube,
    admin_api: client.ApiClient,
    control_plane: ControlPlane,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    # 1. A job that succeeds; its results ConfigMap already exists (a retried
    #    cycle made it, owned by the job), so the poller creates, meets a
    #    conflict and updates; its TTL of 0 then has the poller delete the job.
    created = jobs.create("audited", ttlSecondsAfterFinished=0)
    pod = _pod_of(poller, jobs, "audited")
    owner = client.V1OwnerReference(
        api_version=f"{api.API_GROUP}/{api.API_VERSION}",
        kind=api.KIND,
        name="audited",
        uid=created["metadata"]["uid"],
        controller=True,
    )
    jobs.core.create_namespaced_config_map(
        jobs.namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name=lmeval.results_configmap_name("audited"), owner_references=[owner]
            )
        ),
    )
    serve_log(admin_api, jobs.namespace, pod, succeeded_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, pod, 0)
    cycle_until(poller, lambda: not _job_exists(jobs, "audited"), what="deleted by its TTL")

    # 2. A job cancelled while it runs: its pod is deleted, its log archived.
    jobs.create("cancelled")
    pod = _pod_of(poller, jobs, "cancelled")
    serve_log(admin_api, jobs.namespace, pod, succeeded_run.log, tmp_path)
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "cancelled",
        {"spec": {"cancel": True}},
    )
    assert _complete(poller, jobs, "cancelled")["reason"] == "Cancelled"
    cycle_until(poller, lambda: not jobs.pods(), what="the cancelled job's pod deleted")

    # 3. A job whose results are read with exec (`cat` in its held container).
    #    The poller learns that results are held from a progress read of the
    #    pod log, every progress-interval: its default, 30 s, is all of
    #    cycle_until's time-out (the step took 30.2 s and barely passed).
    set_settings(admin_api, {**BASE_SETTINGS, "results-source": "exec", "progress-interval": "1s"})
    jobs.create("exec-read")
    pod = _pod_of(poller, jobs, "exec-read")
    _serve_exec(admin_api, jobs.namespace, pod, tmp_path)
    serve_log(admin_api, jobs.namespace, pod, succeeded_run.log, tmp_path)
    held = cycle_until(
        poller,
        lambda: jobs.status("exec-read").get("results") and jobs.status("exec-read"),
        what="results read by exec",
    )
    assert held["resultsSource"] == "exec"
    set_settings(admin_api, dict(BASE_SETTINGS))

    # 4. Leader election, as the poller's ServiceAccount: acquire (get, create),
    #    then renew (get, update). A Lease of its own, so no real poller minds.
    lease = f"rbac-usage-{uuid.uuid4().hex[:6]}"
    elector = LeaderElector(poller_kube, namespace=POLLER_NS, identity="rbac-usage", name=lease)
    try:
        assert elector.try_acquire_or_renew()
        assert elector.try_acquire_or_renew()
    finally:
        client.CoordinationV1Api(admin_api).delete_namespaced_lease(lease, POLLER_NS)

    # 5. Managed outputs claims (spec.outputs.pvcManaged): one made before its
    #    job's pod (create) and kept, so released when the job ends (patch);
    #    one whose name a claim of someone else's already holds (create meets
    #    a conflict, get shows it is not the job's).
    jobs.create("claimed", outputs={"pvcManaged": {"size": "1Gi", "keep": True}})
    cycle_until(poller, lambda: bool(jobs.status("claimed").get("podName")), what="claim made")
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "claimed",
        {"spec": {"cancel": True}},
    )
    assert _complete(poller, jobs, "claimed")["reason"] == "Cancelled"
    squatted = jobs.create("squatted", outputs={"pvcManaged": {"size": "1Gi"}})
    jobs.core.create_namespaced_persistent_volume_claim(
        jobs.namespace,
        {
            "metadata": {
                "name": offline.managed_claim_name("squatted", squatted["metadata"]["uid"])
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    failed = _complete(poller, jobs, "squatted")
    assert "is not this job's outputs claim" in failed["message"], failed["message"]

    # 6. Kueue: a labelled job at a priority class, admitted to a flavor, runs
    #    and finishes; another, suspended while it waits, gives its workload up.
    priority = f"audit-{jobs.namespace}"[:63]
    queues.create({"a100": 1}, priority_classes={priority: 10})
    queues.job(jobs, "kueued", priority=priority)
    pod = _pod_of(poller, jobs, "kueued")
    serve_log(admin_api, jobs.namespace, pod, succeeded_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, pod, 0)
    assert _complete(poller, jobs, "kueued")["reason"] == "Succeeded"
    waiting = queues.job(jobs, "kueue-suspended", gpus=2)  # more than the quota
    cycle_until(poller, lambda: queues.workload(waiting) is not None, what="its workload")
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "kueue-suspended",
        {"spec": {"suspend": True}},
    )
    cycle_until(poller, lambda: queues.workload(waiting) is None, what="its workload deleted")

    # 7. A suite (poller/cycle/suites.py): each cycle lists the suites; its model
    #    trigger reads the InferenceService it names (get; 404 without KServe's
    #    CRD, authorized all the same); the run asked for by hand is created from
    #    the template (create) and recorded in the suite's status (patch).
    jobs.custom.create_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.SUITE_PLURAL,
        {
            "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
            "kind": api.SUITE_KIND,
            "metadata": {
                "name": "audited-suite",
                "annotations": {api.RUN_REQUESTED_ANNOTATION: "audit"},
            },
            "spec": {
                "template": {"model": "dummy", "tasks": ["toy_mc"]},
                "criteria": [{"task": "toy_mc", "maxDrop": 0.1}],
                "triggers": {"modelChange": {"inferenceService": {"name": "audited-model"}}},
            },
        },
    )
    run = cycle_until(poller, lambda: _suite_run(jobs, "audited-suite"), what="the suite's run")
    recorded = cycle_until(
        poller,
        lambda: _suite_status(jobs, "audited-suite").get("runs"),
        what="the run in the suite's status",
    )
    assert [entry["name"] for entry in recorded] == [run], recorded

    granted = granted_rules()
    assert set(UNUSED_ON_PURPOSE) <= granted, "an allowed-unused rule is no longer granted"
    expected = granted - set(UNUSED_ON_PURPOSE)

    # The audit log is written as requests complete: wait until it shows them.
    def all_seen() -> bool:
        return expected <= set(used_rules(control_plane))

    with contextlib.suppress(AssertionError):  # reported precisely below
        wait_for(all_seen, timeout=15, what="every granted rule in the audit log")
    used = used_rules(control_plane)

    unused = sorted(expected - set(used))
    assert not unused, (
        f"rules granted in rbac.yaml that the poller never used: {unused}; drop them, exercise "
        "them above, or list them in UNUSED_ON_PURPOSE with the reason INSTALL.md gives"
    )
    outside = sorted(set(used) - granted)
    assert not outside, f"calls no rule grants (refused, surely): {outside}"
    refused = sorted(rule for rule, codes in used.items() if codes & {401, 403})
    assert not refused, f"the poller was refused: {refused}"
