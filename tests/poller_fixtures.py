"""Fixtures for the poller's integration tests on the real control plane.

The poller runs in-process but *as its own ServiceAccount*, bound to the
ClusterRole from ``deploy/``, so every test doubles as a least-privilege
check. Its settings ConfigMap lives in ``lmeval-system``. Job pods land on
kwok nodes; what their main container "printed" is a real driver run of
real lm_eval, captured once per session and served as the pod's log.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from lmeval_sandbox import kwok
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.crd import CRD_PATHS
from lmeval_sandbox.identities import service_account_kubeconfig

from driver.protocol import encode_marker, encode_results
from poller import api
from poller.api.settings import CONFIGMAP_NAME
from poller.cycle.reconciler import CycleReport, Reconciler
from poller.kube.client import Kube
from poller.kube.transport import ApiTransport
from tests.driver.conftest import child_env, plain_rows, write_tasks
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
POLLER_NS = "lmeval-system"
POLLER_USER = f"system:serviceaccount:{POLLER_NS}:lmeval-poller"
JOB_SA_MANIFEST = REPO / "deploy" / "components" / "job-namespace" / "job-serviceaccount.yaml"


@pytest.fixture(scope="session")
def poller_installed(control_plane: ControlPlane) -> ControlPlane:
    """The CRD and the poller's RBAC from the repository, applied as an admin."""
    for crd_path in CRD_PATHS:
        control_plane.kubectl("apply", "--server-side", "-f", str(crd_path))
    control_plane.kubectl("apply", "-f", str(REPO / "deploy" / "base" / "namespace.yaml"))
    control_plane.kubectl("apply", "-f", str(REPO / "deploy" / "base" / "rbac.yaml"))
    control_plane.kubectl(
        "wait",
        "--for=condition=Established",
        f"crd/{api.PLURAL}.{api.API_GROUP}",
        f"crd/{api.SUITE_PLURAL}.{api.API_GROUP}",
    )
    return control_plane


@pytest.fixture(scope="session")
def poller_kube(poller_installed: ControlPlane) -> Iterator[Kube]:
    """The API layer authenticated as the poller's ServiceAccount."""
    path = service_account_kubeconfig(poller_installed, POLLER_NS, "lmeval-poller")
    with ApiTransport.from_kubeconfig(path) as transport:
        yield Kube(transport)


def set_settings(admin_api: client.ApiClient, data: dict[str, str]) -> None:
    """Create or replace the poller's settings ConfigMap."""
    core = client.CoreV1Api(admin_api)
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=CONFIGMAP_NAME), data=data)
    try:
        core.replace_namespaced_config_map(CONFIGMAP_NAME, POLLER_NS, body)
    except client.exceptions.ApiException as error:
        if error.status != 404:
            raise
        core.create_namespaced_config_map(POLLER_NS, body)


BASE_SETTINGS = {"pod-image": "registry.example/lmeval-job:test", "poll-interval": "1s"}


@pytest.fixture
def poller(poller_kube: Kube, admin_api: client.ApiClient, namespace: str) -> Reconciler:
    """A poller limited to this test's namespace (other tests' jobs stay untouched)."""
    set_settings(admin_api, dict(BASE_SETTINGS))
    return Reconciler(poller_kube, settings_namespace=POLLER_NS, namespaces=[namespace])


@pytest.fixture
def job_namespace(control_plane: ControlPlane, namespace: str) -> str:
    """The test namespace with the rights-free job ServiceAccount applied."""
    control_plane.kubectl("apply", "-n", namespace, "-f", str(JOB_SA_MANIFEST))
    return namespace


def job_body(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {"model": "dummy", "tasks": ["toy_mc"], **spec},
    }


class Jobs:
    """LMEvalJob CRUD as an admin, for one namespace."""

    def __init__(self, admin_api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(admin_api)
        self.core = client.CoreV1Api(admin_api)
        self.namespace = namespace

    def create(self, name: str, **spec: Any) -> dict[str, Any]:
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            api.API_GROUP, api.API_VERSION, self.namespace, api.PLURAL, job_body(name, **spec)
        )
        return created

    def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            api.API_GROUP, api.API_VERSION, self.namespace, api.PLURAL, name
        )
        return found

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def pods(self) -> list[client.V1Pod]:
        return list(self.core.list_namespaced_pod(self.namespace).items)

    def pod(self, name: str) -> client.V1Pod:
        return self.core.read_namespaced_pod(name, self.namespace)


@pytest.fixture
def jobs(admin_api: client.ApiClient, job_namespace: str) -> Jobs:
    return Jobs(admin_api, job_namespace)


def cycle_until(
    poller: Reconciler, probe: Callable[[], Any], *, timeout: float = 30.0, what: str = ""
) -> Any:
    """Run poller cycles until `probe` is truthy; no cycle may raise or count errors."""

    def step() -> Any:
        report: CycleReport = poller.run_cycle()
        assert report.errors == 0, report.error_messages
        return probe()

    return wait_for(step, timeout=timeout, interval=0.2, what=what)


# Perfect scores, as a hostile pod's log would claim them.
FORGED_RESULTS = {"results": {"toy_mc": {"acc,none": 1.0}}, "configs": {}}


def forged_log(results: dict[str, Any] = FORGED_RESULTS) -> str:
    """A complete driver log claiming `results`, made with the real encoder."""
    lines = [encode_marker("started", run_id="forged")]
    lines += encode_results(json.dumps(results).encode(), "forged")
    lines.append(encode_marker("completed", run_id="forged", exit_code=0, results_path="/x"))
    return "\n".join(lines) + "\n"


def cycle_until_state(poller: Reconciler, jobs: Jobs, name: str, state: str) -> dict[str, Any]:
    """Run poller cycles until job `name` is in `state`; its status then."""
    status: dict[str, Any] = cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == state and jobs.status(name),
        what=f"{name} {state}",
    )
    return status


def wait_pod_gone(jobs: Jobs, uid: str, what: str = "the pod deleted") -> None:
    """Wait until no pod of `jobs`' namespace has UID `uid`."""
    wait_for(
        lambda: not [p for p in jobs.pods() if p.metadata and p.metadata.uid == uid],
        timeout=30,
        what=what,
    )


@dataclass(frozen=True)
class CapturedRun:
    """A real driver + lm_eval run: its combined output and what it wrote."""

    log: str
    exit_code: int
    results: dict[str, Any] | None


def _capture(workdir: Path, lm_eval_args: list[str]) -> CapturedRun:
    tasks = write_tasks(workdir / "tasks", plain_rows())
    out_root = workdir / "out"
    argv = [
        sys.executable,
        "-m",
        "driver",
        f"--output-root={out_root}",
        "--",
        sys.executable,
        "-m",
        "lm_eval",
        "--include_path",
        str(tasks.path),
        *lm_eval_args,
    ]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=child_env(workdir / "hf"),
        timeout=300,
        cwd=workdir,
        check=False,
    )
    found = sorted(out_root.rglob("results_*.json"))
    results = json.loads(found[-1].read_text()) if found else None
    return CapturedRun(proc.stderr + proc.stdout, proc.returncode, results)


@pytest.fixture(scope="session")
def succeeded_run(tmp_path_factory: pytest.TempPathFactory) -> CapturedRun:
    run = _capture(
        tmp_path_factory.mktemp("run-ok"),
        ["--model", "dummy", "--model_args", "pretrained=dummy", "--tasks", "toy_mc"],
    )
    assert run.exit_code == 0 and run.results is not None, run.log[-3000:]
    return run


@pytest.fixture(scope="session")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> CapturedRun:
    run = _capture(
        tmp_path_factory.mktemp("run-bad"),
        ["--model", "dummy", "--model_args", "pretrained=dummy", "--tasks", "no_such_task"],
    )
    assert run.exit_code != 0, run.log[-3000:]
    return run


def serve_log(
    admin_api: client.ApiClient, namespace: str, pod: str, text: str, directory: Path
) -> None:
    """Make `text` the pod's container log (kwok Logs object, CRI format)."""
    path = directory / f"{pod}.log"
    path.write_text(kwok.cri_log_lines(text.splitlines()))
    client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
        "kwok.x-k8s.io", "v1alpha1", namespace, "logs", kwok.logs_body(namespace, pod, path)
    )


def terminate(
    admin_api: client.ApiClient,
    namespace: str,
    pod: str,
    code: int,
    message: str = "",
    reason: str = "",
) -> None:
    """Make the pod's containers terminate now with `code` (kwok stage)."""
    annotations = {kwok.ANNOTATION_EXIT_CODE: str(code)}
    if message:
        annotations[kwok.ANNOTATION_EXIT_MESSAGE] = message
    if reason:
        annotations[kwok.ANNOTATION_EXIT_REASON] = reason
    client.CoreV1Api(admin_api).patch_namespaced_pod(
        pod, namespace, {"metadata": {"annotations": annotations}}
    )


def fixed_clock(moment: dt.datetime) -> Callable[[], dt.datetime]:
    return lambda: moment


def dump_yaml(obj: Any) -> str:
    return yaml.safe_dump(obj)
