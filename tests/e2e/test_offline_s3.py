"""Models and datasets from S3, offline: a real S3 server on loopback, on the real plane.

The server is Versity's S3 gateway built from its Go module
(deploy/sandbox/lmeval_sandbox/s3server.py), serving a bucket whose prefix ``team/hf`` holds
a hub cache as ``aws s3 sync`` leaves one (S3 has no symlinks: the snapshot
holds file copies) with ``allenai/ai2_arc``'s ARC-Easy (tests/hubcache.py),
plus an object outside the prefix. The job names the prefix in
``spec.offline.storage.s3`` with its credentials, bucket and endpoint in a
Secret (TrustyAI LMES's shape). Checks: the ``fetch-storage`` init
container (the driver's ``fetch-s3``, signed SigV4 requests) copies exactly
the prefix into the pod's storage emptyDir, then lm_eval's standard
``arc_easy`` task runs offline from it against the sample model server and
the job ends Complete/Succeeded; with a wrong secret key the server refuses
the copy, the evaluation never starts and the job ends Failed.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import LocalRunner
from lmeval_sandbox.s3server import S3Server

from poller.cycle.reconciler import Reconciler
from poller.jobpod import offline
from tests.e2e.conftest import sample, submit
from tests.hubcache import ARC_ROWS, write_arc_easy
from tests.poller_fixtures import Jobs, cycle_until

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

LMEVAL_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    root = tmp_path_factory.mktemp("s3") / "data"
    with S3Server(root) as server:
        bucket = server.bucket("evals")
        staged = tmp_path_factory.mktemp("staged") / "hub"
        write_arc_easy(staged)
        # As `aws s3 sync` uploads a hub cache: symlinks become file copies.
        shutil.copytree(staged, bucket / "team" / "hf" / "hub", symlinks=False)
        (bucket / "other").mkdir()
        (bucket / "other" / "secret.txt").write_text("not in the prefix")
        yield server


def _job(
    jobs: Jobs, admin_api: client.ApiClient, s3: S3Server, port: int, name: str, secret_key: str
) -> Any:
    client.CoreV1Api(admin_api).create_namespaced_secret(
        jobs.namespace,
        {
            "metadata": {"name": f"{name}-s3"},
            "stringData": {
                "id": s3.access_key,
                "secret": secret_key,
                "bucket": "evals",
                "endpoint": s3.endpoint,
            },
        },
    )
    _, served = sample("served-model", port)
    job = copy.deepcopy(served)
    job["metadata"]["name"] = name
    job["spec"]["tasks"] = ["arc_easy"]
    del job["spec"]["customTasks"]
    ref = f"{name}-s3"
    job["spec"]["offline"] = {
        "storage": {
            "s3": {
                "accessKeyId": {"name": ref, "key": "id"},
                "secretAccessKey": {"name": ref, "key": "secret"},
                "bucket": {"name": ref, "key": "bucket"},
                "endpoint": {"name": ref, "key": "endpoint"},
                "path": "team/hf",
            }
        }
    }
    submit(admin_api, jobs.namespace, job)

    def complete() -> dict[str, Any] | None:
        status = jobs.status(name)
        return status if status.get("state") == "Complete" else None

    return complete


def test_standard_task_with_its_dataset_from_s3_offline(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    model_server: ModelServer,
    s3: S3Server,
) -> None:
    complete = _job(jobs, admin_api, s3, model_server.port, "arc-s3", s3.secret_key)
    final = cycle_until(poller, complete, timeout=LMEVAL_TIMEOUT, what="arc-s3 Complete")
    assert final["reason"] == "Succeeded", final.get("message")
    results = json.loads(final["results"])
    assert set(results["results"]) == {"arc_easy"}
    assert results["n-samples"]["arc_easy"]["effective"] == len(ARC_ROWS["test"])

    pod = jobs.pod(final["podName"])
    [fetch] = pod.status.init_container_statuses
    assert fetch.name == offline.FETCH_CONTAINER
    assert (fetch.state.terminated.exit_code, fetch.state.terminated.reason) == (0, "Completed")
    prefix = s3.root / "evals" / "team" / "hf"
    expected = sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*") if p.is_file())
    fetch_log = jobs.core.read_namespaced_pod_log(
        final["podName"], jobs.namespace, container=offline.FETCH_CONTAINER
    )
    assert f"fetched {len(expected)} object(s)" in fetch_log, fetch_log
    assert "s3://evals/team/hf" in fetch_log
    root = runner.pod_root(jobs.namespace, final["podName"])
    assert root is not None
    storage = root / "cache" / "storage"
    copied = sorted(str(p.relative_to(storage)) for p in storage.rglob("*") if p.is_file())
    assert copied == expected
    assert all(not name.startswith("other") for name in copied)
    main_env = {e.name for e in pod.spec.containers[0].env}
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & main_env


def test_refused_credentials_fail_the_job_before_the_evaluation(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    model_server: ModelServer,
    s3: S3Server,
) -> None:
    complete = _job(jobs, admin_api, s3, model_server.port, "arc-s3-denied", "not-the-key")
    final = cycle_until(poller, complete, timeout=LMEVAL_TIMEOUT, what="arc-s3-denied Complete")
    assert final["reason"] == "Failed"
    # The pod is gone (archived and deleted); the copy's own words are in status.
    assert "init container fetch-storage exited 1" in final["message"], final["message"]
    assert "SignatureDoesNotMatch" in final["message"], final["message"]
    assert "arc_easy" not in (final.get("results") or "")
