"""A job pod changed after admission is not the job's pod: the poller's own check.

Without the job-pods admission policy (`deploy/admission/job-pods-policy.yaml`,
tested in `tests/deploy/test_job_pods_policy.py`; not bound on this shared
control plane), whoever may patch pods can replace a running job pod's image
or add an ephemeral container. The poller must then never take what that pod
reports as the job's. Checks, on the real apiserver with kwok's pods:

- the pod's fingerprint as the apiserver admitted it is recorded in
  ``status.podFingerprint`` and equals the digest of the pod as read back;
- a replaced image: the job ends Failed (cause AlteredPod) with a message
  naming the pod and the change, the pod is deleted, and the forged results
  its log would carry are never read;
- an added ephemeral container: the same;
- an untouched pod is never taken for altered (the job Succeeds).

The restart the kubelet makes after an image patch is checked on the real
node (`tests/node/test_altered_pod.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from poller.cycle.reconciler import Reconciler
from poller.decisions.views import pod_fingerprint
from tests.poller_fixtures import (
    CapturedRun,
    Jobs,
    cycle_until_state,
    forged_log,
    serve_log,
    terminate,
    wait_pod_gone,
)

pytestmark = pytest.mark.cluster


def _running(poller: Reconciler, jobs: Jobs, name: str) -> dict[str, Any]:
    return cycle_until_state(poller, jobs, name, "Running")


def _failed(poller: Reconciler, jobs: Jobs, name: str) -> dict[str, Any]:
    return cycle_until_state(poller, jobs, name, "Complete")


def test_the_admitted_fingerprint_is_recorded(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    jobs.create("fingerprinted")
    status = _running(poller, jobs, "fingerprinted")
    raw = admin_api.sanitize_for_serialization(jobs.pod(status["podName"]))
    assert status["podFingerprint"] == pod_fingerprint(raw["spec"])
    assert status["podFingerprint"].startswith("sha256:")


def test_a_replaced_image_fails_the_job_and_deletes_the_pod(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, tmp_path: Path
) -> None:
    jobs.create("hijacked")
    status = _running(poller, jobs, "hijacked")
    name = status["podName"]
    core = client.CoreV1Api(admin_api)
    uid = core.read_namespaced_pod(name, jobs.namespace).metadata.uid
    patch = {"spec": {"containers": [{"name": "lmeval", "image": "registry.example/evil:1"}]}}
    core.patch_namespaced_pod(name, jobs.namespace, patch)
    # What the new image would say: perfect scores, a clean exit.
    serve_log(admin_api, jobs.namespace, name, forged_log(), tmp_path)
    terminate(admin_api, jobs.namespace, name, 0)
    final = _failed(poller, jobs, "hijacked")
    assert final["reason"] == "Failed", final
    assert f"pod {name} was changed after the poller created it" in final["message"]
    assert "not the ones the apiserver admitted" in final["message"]
    assert "results" not in final and "resultsConfigMap" not in final
    failed = [c for c in final["conditions"] if c["type"] == "Succeeded"]
    assert failed and failed[0]["reason"] == "AlteredPod", final["conditions"]
    wait_pod_gone(jobs, uid, "the altered pod deleted")


def test_an_ephemeral_container_fails_the_job_and_deletes_the_pod(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    jobs.create("debugged")
    status = _running(poller, jobs, "debugged")
    name = status["podName"]
    core = client.CoreV1Api(admin_api)
    uid = core.read_namespaced_pod(name, jobs.namespace).metadata.uid
    debug = {
        "spec": {"ephemeralContainers": [{"name": "peek", "image": "registry.example/shell:1"}]}
    }
    core.patch_namespaced_pod_ephemeralcontainers(name, jobs.namespace, debug)
    final = _failed(poller, jobs, "debugged")
    assert final["reason"] == "Failed", final
    assert "ephemeral container peek was added to it" in final["message"]
    wait_pod_gone(jobs, uid, "the altered pod deleted")


def test_an_untouched_pod_is_never_taken_for_altered(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    jobs.create("honest")
    name = _running(poller, jobs, "honest")["podName"]
    for _ in range(3):
        assert poller.run_cycle().errors == 0
    serve_log(admin_api, jobs.namespace, name, succeeded_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, name, 0)
    final = _failed(poller, jobs, "honest")
    assert final["reason"] == "Succeeded", final
    assert json.loads(final["results"]) == succeeded_run.results
