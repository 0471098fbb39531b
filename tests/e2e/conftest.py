"""Fixtures for the end-to-end tests: job pods that really run, on the session's plane.

The local pod runner serves node ``lmeval-sandbox`` of the session's control
plane from a background thread of the test process: pods bound there run
the real driver and real lm_eval as local processes, their output is served
through the apiserver's ``pods/log`` path by kwok, and their status is
reported like a kubelet's. The poller runs in-process as its own
ServiceAccount (``tests/poller_fixtures.py``), so each test drives it one
cycle at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox import demo
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import LocalRunner, placement

from poller import api


@pytest.fixture(scope="session")
def runner(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalRunner]:
    """The local pod runner, serving node lmeval-sandbox for the whole session."""
    local = LocalRunner(
        control_plane.kubeconfig,
        tmp_path_factory.mktemp("runner"),
        control_plane.ports.kwok_server,
        interval=0.2,
    ).start()
    yield local
    local.stop()


@pytest.fixture(scope="session")
def model_server() -> Iterator[ModelServer]:
    """The toy OpenAI-compatible server the served-model sample evaluates."""
    with ModelServer() as server:
        yield server


def sample(name: str, port: int = demo.MODEL_SERVER_PORT) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tasks ConfigMap, LMEvalJob) of a sample in deploy/samples/, placed on
    the session's runner node.

    The samples carry no placement (they are written for a real cluster);
    this session's runner node is tainted and its kwok nodes are not, so the
    job asks for the runner's node, as `placement` spells it.
    """
    documents = demo.sample_documents(name, port)
    configmap = next(d for d in documents if d["kind"] == "ConfigMap")
    job = next(d for d in documents if d["kind"] == api.KIND)
    job["spec"]["pod"] = {**job["spec"].get("pod", {}), **placement()}
    return configmap, job


def submit(admin_api: client.ApiClient, namespace: str, job: dict[str, Any]) -> dict[str, Any]:
    """Create the tasks ConfigMap (once) and `job` in `namespace`, as the admin."""
    configmap, _ = sample("dummy-model")
    core = client.CoreV1Api(admin_api)
    names = [c.metadata.name for c in core.list_namespaced_config_map(namespace).items]
    if configmap["metadata"]["name"] not in names:
        core.create_namespaced_config_map(namespace, configmap)
    created: dict[str, Any] = client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, namespace, api.PLURAL, job
    )
    return created


def results_file(root: Path) -> dict[str, Any]:
    """The results JSON lm_eval wrote under the pod's /outputs."""
    found = sorted((root / "outputs").rglob("results_*.json"))
    assert len(found) == 1, found
    loaded: dict[str, Any] = json.loads(found[0].read_text())
    return loaded
