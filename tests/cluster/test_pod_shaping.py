"""Job pod shaping on the real control plane: size presets, device, sidecars.

Checks: a job with `size: large` gets the preset's resources from the
settings ConfigMap, explicit spec.pod.resources win key by key, an unknown
size ends Failed listing the known sizes; a job requesting a GPU gets
`--device=cuda` and one without gets `--device=cpu`; a sidecar runs beside
the evaluation container under the same restricted security context (the
namespace enforces Pod Security `restricted`, so the apiserver checks it).
"""

from __future__ import annotations

import pytest
from kubernetes import client

from poller.cycle.reconciler import Reconciler
from tests.poller_fixtures import BASE_SETTINGS, Jobs, cycle_until, set_settings

pytestmark = pytest.mark.cluster

PRESETS = """\
small: {requests: {cpu: "1", memory: 2Gi}, limits: {memory: 2Gi}}
large: {requests: {cpu: "8", memory: 32Gi}, limits: {memory: 32Gi}}
gpu: {requests: {cpu: "4", memory: 16Gi}, limits: {nvidia.com/gpu: "1", memory: 16Gi}}
"""


@pytest.fixture
def sized(admin_api: client.ApiClient) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, "size-presets": PRESETS})


def _pod_spec(poller: Reconciler, jobs: Jobs, name: str) -> client.V1PodSpec:
    status = cycle_until(
        poller, lambda: jobs.status(name).get("podName") and jobs.status(name), what=f"{name} pod"
    )
    return jobs.pod(status["podName"]).spec


def test_size_preset_and_override(poller: Reconciler, jobs: Jobs, sized: None) -> None:
    jobs.create("big", size="large")
    jobs.create("tuned", size="large", pod={"resources": {"requests": {"cpu": "3"}}})
    big = _pod_spec(poller, jobs, "big").containers[0].resources
    assert big.requests == {"cpu": "8", "memory": "32Gi"} and big.limits == {"memory": "32Gi"}
    tuned = _pod_spec(poller, jobs, "tuned").containers[0].resources
    assert tuned.requests == {"cpu": "3", "memory": "32Gi"}


def test_unknown_size_fails_with_known_names(poller: Reconciler, jobs: Jobs, sized: None) -> None:
    jobs.create("huge", size="huge")
    final = cycle_until(
        poller,
        lambda: jobs.status("huge").get("state") == "Complete" and jobs.status("huge"),
        what="Complete",
    )
    assert final["reason"] == "Failed"
    assert "unknown size 'huge'; known sizes: gpu, large, small" in final["message"]
    assert jobs.pods() == []


def test_device_follows_gpu_requests(poller: Reconciler, jobs: Jobs, sized: None) -> None:
    jobs.create("on-gpu", size="gpu")
    jobs.create("on-cpu", size="small")
    jobs.create("chosen", device="cuda:1")
    gpu_argv = _pod_spec(poller, jobs, "on-gpu").containers[0].command
    assert "--device=cuda" in gpu_argv
    assert "--device=cpu" in _pod_spec(poller, jobs, "on-cpu").containers[0].command
    assert "--device=cuda:1" in _pod_spec(poller, jobs, "chosen").containers[0].command


def test_sidecar_runs_restricted_beside_the_evaluation(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    client.CoreV1Api(admin_api).patch_namespace(
        jobs.namespace,
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    jobs.create(
        "with-sidecar",
        pod={
            "sidecars": [
                {
                    "name": "storage",
                    "image": "registry.example/storage-proxy:1",
                    "args": ["--listen=127.0.0.1:9000"],
                    "ports": [{"containerPort": 9000}],
                }
            ]
        },
    )
    status = cycle_until(
        poller,
        lambda: (
            jobs.status("with-sidecar").get("state") == "Running" and jobs.status("with-sidecar")
        ),
        what="Running",
    )
    pod = jobs.pod(status["podName"])
    names = [c.name for c in pod.spec.containers]
    assert names == ["lmeval", "storage"]
    sidecar = pod.spec.containers[1]
    assert sidecar.security_context.run_as_non_root is True
    assert sidecar.security_context.allow_privilege_escalation is False
    assert sidecar.security_context.capabilities.drop == ["ALL"]
    assert sidecar.security_context.read_only_root_filesystem is True
    running = {s.name: bool(s.state.running) for s in pod.status.container_statuses}
    assert running == {"lmeval": True, "storage": True}


def test_openshift_uid_range_sets_the_job_pod_user(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    client.CoreV1Api(admin_api).patch_namespace(
        jobs.namespace,
        {"metadata": {"annotations": {"openshift.io/sa.scc.uid-range": "1000680000/10000"}}},
    )
    jobs.create("on-openshift")
    context = _pod_spec(poller, jobs, "on-openshift").security_context
    assert context.run_as_user == 1000680000 and context.run_as_group == 0
    assert context.run_as_non_root is True
