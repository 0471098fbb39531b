"""Results pushed to a real OCI registry, end to end (issue 18, item 6).

A real registry (Debian's ``docker-registry``, the CNCF distribution) serves
plain HTTP on 127.0.0.1 and asks for Basic auth (htpasswd, bcrypt). Jobs run
through the poller, the local runner (the job pod as local processes), the
real driver and real lm_eval against the sample model server:

- a job with ``spec.outputs.oci`` naming the registry (``plainHTTP``, allowed
  for loopback only) and a ``kubernetes.io/dockerconfigjson`` Secret with
  the credentials: it Succeeds, ``status.resultsArtifact`` names the digest,
  condition ResultsPushed is True, and skopeo (a real client) reads the
  artifact back under its default tag; its results blob is exactly the
  results file lm_eval wrote, and the results in status are the same JSON;
- the same job without credentials: the registry refuses the push, the job
  still Succeeds with its results, and status says why the push failed
  (``resultsArtifactError``, condition ResultsPushed False, reason PushFailed).
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import LocalRunner

from poller.cycle.reconciler import Reconciler
from poller.jobpod import ocioutput
from tests import ociregistry
from tests.e2e.conftest import results_file, sample, submit
from tests.poller_fixtures import Jobs, cycle_until

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.lmeval,
    pytest.mark.skipif(not ociregistry.available(), reason="docker-registry/skopeo"),
]

LMEVAL_TIMEOUT = 240.0
USERS = {"pusher": "e2e-registry-pass"}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ociregistry.Registry]:
    with ociregistry.running(tmp_path_factory.mktemp("registry"), USERS) as running:
        yield running


def _job(name: str, server: ModelServer, oci: dict[str, Any]) -> dict[str, Any]:
    _, job = sample("served-model", server.port)
    job = copy.deepcopy(job)
    job["metadata"]["name"] = name
    job["spec"].update(limit="2", outputs={"oci": oci})
    return job


def _finished(poller: Reconciler, jobs: Jobs, name: str) -> dict[str, Any]:
    def complete() -> dict[str, Any] | None:
        status = jobs.status(name)
        return status if status.get("state") == "Complete" else None

    found: dict[str, Any] = cycle_until(
        poller, complete, timeout=LMEVAL_TIMEOUT, what=f"{name} Complete"
    )
    return found


def _condition(status: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(
        c for c in status.get("conditions", []) if c["type"] == "ResultsPushed"
    )
    return found


def test_results_pushed_with_basic_auth_and_read_back_with_skopeo(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    model_server: ModelServer,
    registry: ociregistry.Registry,
    tmp_path: Path,
) -> None:
    config = registry.docker_config(tmp_path / "config.json").read_bytes()
    jobs.core.create_namespaced_secret(
        jobs.namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="registry-creds"),
            type="kubernetes.io/dockerconfigjson",
            data={".dockerconfigjson": base64.b64encode(config).decode()},
        ),
    )
    repository = f"{registry.address}/team/evals"
    oci = {"repository": repository, "plainHTTP": True, "credentialsSecret": "registry-creds"}
    created = submit(admin_api, jobs.namespace, _job("oci-push", model_server, oci))
    final = _finished(poller, jobs, "oci-push")
    assert final["reason"] == "Succeeded", final.get("message")
    artifact = final["resultsArtifact"]
    assert artifact.startswith(f"{repository}@sha256:"), final
    assert "resultsArtifactError" not in final
    assert _condition(final)["status"] == "True"

    tag = ocioutput.default_tag("oci-push", created["metadata"]["uid"])
    manifest = registry.skopeo_raw(f"team/evals:{tag}")
    assert manifest["artifactType"] == "application/vnd.lmeval.results.v1+json"
    digest = artifact.split("@")[1]
    assert registry.skopeo_raw(f"team/evals@{digest}") == manifest
    layers = manifest["layers"]
    assert isinstance(layers, list)
    blob = registry.get(f"/v2/team/evals/blobs/{layers[0]['digest']}")
    root = runner.pod_root(jobs.namespace, final["podName"])
    assert root is not None
    assert json.loads(blob) == results_file(root) == json.loads(final["results"])
    provenance = json.loads(registry.get(f"/v2/team/evals/blobs/{layers[1]['digest']}"))
    assert provenance["lm_eval_version"] and "--model=local-completions" in provenance["argv"]
    # The credentials reached the pod as a read-only file, never its command line.
    pod = jobs.pod(final["podName"])
    assert USERS["pusher"] not in json.dumps(pod.spec.containers[0].command)
    mount = next(m for m in pod.spec.containers[0].volume_mounts if m.name == "oci-credentials")
    assert (mount.mount_path, mount.read_only) == (ocioutput.CREDENTIALS_DIR, True)


def test_a_refused_push_keeps_the_results_and_says_why(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    model_server: ModelServer,
    registry: ociregistry.Registry,
) -> None:
    oci = {"repository": f"{registry.address}/team/evals", "plainHTTP": True, "tag": "anon"}
    submit(admin_api, jobs.namespace, _job("oci-anonymous", model_server, oci))
    final = _finished(poller, jobs, "oci-anonymous")
    assert final["reason"] == "Succeeded", final.get("message")
    assert json.loads(final["results"])["results"]
    assert "resultsArtifact" not in final
    assert "HTTP 401" in final["resultsArtifactError"], final
    condition = _condition(final)
    assert (condition["status"], condition["reason"]) == ("False", "PushFailed")
