"""Fixtures shared by every test group.

The real control plane is started at most once per test run, and only when a
test asks for it (`control_plane`), so the pure unit tests stay fast and need
no binaries. Each cluster test gets its own namespace, deleted afterwards.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import api_client
from lmeval_sandbox.kueue import KueueServer

from tests.waiting import wait_for

# Poller fixtures (CRD and RBAC installed, the poller's ServiceAccount, jobs,
# captured lm_eval runs) are shared by every test group that needs them.
pytest_plugins = ["tests.poller_fixtures", "tests.kueue_fixtures"]


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One real control plane (etcd, apiserver, controller-manager, scheduler, kwok)."""
    workdir = Path(os.environ.get("LMEVAL_TEST_SANDBOX_DIR", tmp_path_factory.mktemp("plane")))
    plane = ControlPlane(workdir)
    plane.start()
    times = plane.times
    print(
        f"\ncontrol plane ready in {times.total:.1f} s "
        f"(binaries {times.binaries:.1f} s, etcd {times.etcd:.1f} s, "
        f"apiserver {times.apiserver:.1f} s, rest {times.others:.1f} s)"
    )
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def kueue(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KueueServer]:
    """A real Kueue (built from its Go module) on the control plane, started on first use."""
    server = KueueServer(control_plane, tmp_path_factory.mktemp("kueue"))
    server.start()
    print(f"\nKueue ready in {server.startup_seconds:.1f} s")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def admin_api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """An ApiClient with cluster-admin rights (system:masters)."""
    with api_client(control_plane.kubeconfig) as api:
        yield api


@pytest.fixture
def namespace(admin_api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-")
    # Parametrized tests share their stem, and a namespace stays "being deleted"
    # for a while: 5 hex digits once collided with one (a 409 AlreadyExists).
    name = f"{stem}-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(admin_api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def default_account() -> bool:
        # Pods are refused until the service-account controller made "default".
        names = [sa.metadata.name for sa in core.list_namespaced_service_account(name).items]
        return "default" in names

    wait_for(default_account, timeout=30, what=f"default ServiceAccount in {name}")
    yield name
    core.delete_namespace(name)
