"""Air-gapped sources on the real node: a read-only claim and Git clones, as a kubelet runs them.

The end-to-end tests of these features (tests/e2e) run pods on the sandbox's
local runner, which plays the kubelet but cannot enforce what a kubelet
enforces. Here the kubelet, containerd and runc run them, and the checks read
the OCI runtime spec containerd was given for each container:

- a standard lm_eval task (``arc_easy``, its YAML unchanged) is evaluated
  offline with its dataset from a claim: a static hostPath PersistentVolume
  holding a Hugging Face hub cache the test writes (tests/hubcache.py), bound
  by the controller-manager, mounted by the kubelet **read-only** at
  ``/cache/storage`` (``ro`` in the runtime's mount options), with the
  sample model server as a sidecar; the job succeeds on the rows written
  here and nothing on the claim changed;
- the same task from S3: versitygw (built from its Go module) on the node's
  bridge address serves a bucket; the ``fetch-storage`` init container (the
  job image's ``lmeval-driver fetch-s3``) copies the prefix into the pod's
  emptyDir with credentials the kubelet took from a Secret into that
  container's environment only, under the job's restricted profile;
- task files from Git: ``git daemon`` on the node's bridge address serves a
  repository; the job pod's init containers (Debian's git, images.py's
  ``git`` image) clone the pinned commit under the restricted profile, as
  UID 65532 with no capabilities, no new privileges, a read-only root and no
  service-account token mounted; lm_eval evaluates the cloned task and
  ``status.taskSources`` records the commit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox.nodeconfig import NODE_IP
from lmeval_sandbox.s3server import S3Server

from poller.api.settings import Settings
from poller.jobpod import gittasks, offline
from tests.e2e.gitserver import GitDaemon, commit_files, git
from tests.e2e.test_git_tasks import ROWS, TASK
from tests.hubcache import ARC_ROWS, static_claim_manifests, tree_state, write_arc_easy
from tests.node.conftest import NodeCluster, job_body, served_job
from tests.waiting import wait_for

pytestmark = [pytest.mark.node, pytest.mark.lmeval]

TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def _readable_by_anyone(root: Path) -> None:
    """The job runs as the image's UID (or any UID in group 0), not as the
    owner of the files the test wrote: directories 0755, files 0644."""
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


def _static_claim(cluster: NodeCluster, namespace: str, name: str, path: Path) -> None:
    """A hostPath PV at `path`, pre-bound to claim `namespace/name`, and the claim, Bound."""
    cluster.apply(*static_claim_manifests(namespace, path=path, name=name), namespace=namespace)
    wait_for(
        lambda: cluster.get("pvc", name, namespace).get("status", {}).get("phase") == "Bound",
        timeout=60,
        what=f"claim {name} Bound",
    )


def _kept_pod(cluster: NodeCluster, namespace: str, job: str) -> dict[str, Any]:
    """The finished job's pod (jobs without a TTL keep it)."""
    pod: dict[str, Any] = wait_for(
        lambda: cluster.pod_of(namespace, job), timeout=30, what=f"the pod of {job}"
    )
    return pod


def _runtime_specs(
    cluster: NodeCluster, pod: dict[str, Any], kind: str
) -> dict[str, dict[str, Any]]:
    """The OCI runtime spec of each of the pod's containers of `kind`
    (``containerStatuses`` or ``initContainerStatuses``), by container name."""
    return {
        status["name"]: cluster.node.runtime_spec(status["containerID"])
        for status in pod["status"][kind]
    }


def _mount(spec: dict[str, Any], destination: str) -> dict[str, Any] | None:
    return next((m for m in spec["mounts"] if m["destination"] == destination), None)


def test_standard_task_offline_from_a_read_only_claim(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    storage = node_cluster.workdir / "storage" / job_namespace
    write_arc_easy(storage / "hub")
    _readable_by_anyone(storage)
    before = tree_state(storage)
    _static_claim(node_cluster, job_namespace, "hf-cache", storage)

    job = _arc_job(node_cluster, "arc-offline", {"pvcName": "hf-cache"})
    node_cluster.apply(job, namespace=job_namespace)
    _assert_arc_easy(node_cluster.wait_final(job_namespace, "arc-offline"))

    pod = _kept_pod(node_cluster, job_namespace, "arc-offline")
    main = _runtime_specs(node_cluster, pod, "containerStatuses")["lmeval"]
    claim = _mount(main, offline.STORAGE_ROOT)
    assert claim is not None, main["mounts"]
    # The kubelet bind-mounted the PV's directory, read-only: runc refuses
    # every write below it, whatever the job's code tries.
    assert Path(claim["source"]).resolve() == storage.resolve(), claim
    assert "ro" in claim["options"], claim
    _assert_restricted("lmeval", main)
    env = dict(entry.split("=", 1) for entry in main["process"]["env"])
    assert env["HF_HUB_CACHE"] == offline.HUB_CACHE
    assert env["HF_HUB_OFFLINE"] == env["HF_DATASETS_OFFLINE"] == "1"
    # Read, never written: datasets' Arrow cache went to the pod's HF_HOME.
    assert tree_state(storage) == before


def _assert_restricted(name: str, spec: dict[str, Any], uid: int | None = None) -> None:
    """What the restricted profile asks, as runc was told to run container `name`."""
    process = spec["process"]
    if uid is not None:
        assert process["user"]["uid"] == uid, (name, process["user"])
    assert process["user"]["uid"] != 0, (name, process["user"])
    assert process["noNewPrivileges"] is True, name
    assert not process["capabilities"].get("bounding"), (name, process["capabilities"])
    assert spec["root"].get("readonly") is True, name
    assert _mount(spec, TOKEN_PATH) is None, (name, spec["mounts"])


def _arc_job(cluster: NodeCluster, name: str, storage: dict[str, Any]) -> dict[str, Any]:
    """The served-model sample on lm_eval's standard arc_easy, from `storage`."""
    _, job = served_job(cluster, name)
    job["spec"]["tasks"] = ["arc_easy"]
    del job["spec"]["customTasks"]
    job["spec"]["offline"] = {"storage": storage}
    return job


def _assert_arc_easy(status: dict[str, Any]) -> None:
    assert status["reason"] == "Succeeded", status.get("message")
    results = json.loads(status["results"])
    assert set(results["results"]) == {"arc_easy"}
    assert results["configs"]["arc_easy"]["dataset_path"] == "allenai/ai2_arc"
    assert results["n-samples"]["arc_easy"]["effective"] == len(ARC_ROWS["test"])


def test_standard_task_offline_from_s3_fetched_by_an_init_container(
    node_cluster: NodeCluster, job_namespace: str, tmp_path: Path
) -> None:
    with S3Server(tmp_path / "s3", host=NODE_IP) as s3:
        staged = tmp_path / "staged" / "hub"
        write_arc_easy(staged)
        # As `aws s3 sync` uploads a hub cache: symlinks become file copies.
        shutil.copytree(staged, s3.bucket("evals") / "team" / "hf" / "hub", symlinks=False)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "arc-s3"},
            "stringData": {
                "id": s3.access_key,
                "secret": s3.secret_key,
                "bucket": "evals",
                "endpoint": s3.endpoint,
            },
        }
        keys = {"accessKeyId": "id", "secretAccessKey": "secret"}
        keys |= {"bucket": "bucket", "endpoint": "endpoint"}
        source = {field: {"name": "arc-s3", "key": key} for field, key in keys.items()}
        job = _arc_job(node_cluster, "arc-s3", {"s3": {**source, "path": "team/hf"}})
        node_cluster.apply(secret, job, namespace=job_namespace)
        status = node_cluster.wait_final(job_namespace, "arc-s3")
    _assert_arc_easy(status)

    pod = _kept_pod(node_cluster, job_namespace, "arc-s3")
    (fetched,) = pod["status"]["initContainerStatuses"]
    assert fetched["name"] == offline.FETCH_CONTAINER
    assert fetched["state"]["terminated"]["exitCode"] == 0, fetched
    fetch = _runtime_specs(node_cluster, pod, "initContainerStatuses")[offline.FETCH_CONTAINER]
    main = _runtime_specs(node_cluster, pod, "containerStatuses")["lmeval"]
    _assert_restricted(offline.FETCH_CONTAINER, fetch)
    _assert_restricted("lmeval", main)
    # The kubelet resolved the Secret's keys into the fetch container alone.
    fetch_env = dict(entry.split("=", 1) for entry in fetch["process"]["env"])
    assert fetch_env["AWS_SECRET_ACCESS_KEY"] == s3.secret_key
    assert not any(entry.startswith("AWS_") for entry in main["process"]["env"])
    assert s3.secret_key not in json.dumps(main)


def test_tasks_cloned_by_git_init_containers_under_the_restricted_profile(
    node_cluster: NodeCluster, job_namespace: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    git("init", "-q", "-b", "main", str(work))
    files = {"tasks/data.jsonl": ROWS, "tasks/task.yaml": TASK.format(index=0, version=1)}
    pinned = commit_files(work, files, "1")
    commit_files(work, {"tasks/task.yaml": TASK.format(index=0, version=2)}, "2")
    served = tmp_path / "served"
    git("clone", "-q", "--bare", str(work), str(served / "tasks.git"))

    # The pods reach the node's bridge address, nothing beyond it; git://
    # to a host other than loopback needs the setting.
    defaults = Settings()
    node_cluster.set_settings(
        git_image=node_cluster.image_refs["git"],
        git_allow_plaintext="true",
        allow_code_execution="true",
    )
    try:
        with GitDaemon(served, host=NODE_IP) as daemon:
            url = daemon.url("tasks.git")
            source = {"url": url, "commit": pinned, "path": "tasks"}
            _, job = job_body(
                "dummy-model",
                "from-git",
                tasks=["git_arith"],
                customTasks=[{"git": source}],
                allowCodeExecution=True,
                limit="4",
            )
            node_cluster.apply(job, namespace=job_namespace)
            status = node_cluster.wait_final(job_namespace, "from-git")
    finally:
        node_cluster.set_settings(
            git_image=defaults.git_image, git_allow_plaintext="false", allow_code_execution="false"
        )

    assert status["reason"] == "Succeeded", status.get("message")
    assert status["taskSources"] == [{"name": "customTasks[0]", "url": url, "commit": pinned}]
    results = json.loads(status["results"])
    # The pinned commit's task file, not main's (version 2).
    assert str(results["versions"]["git_arith"]) in ("1", "1.0"), results["versions"]

    pod = _kept_pod(node_cluster, job_namespace, "from-git")
    inits = _runtime_specs(node_cluster, pod, "initContainerStatuses")
    steps = ("init", "sparse", "fetch", "checkout", "record")
    assert sorted(inits) == sorted(f"{gittasks.CONTAINER_PREFIX}0-{step}" for step in steps)
    for status_entry in pod["status"]["initContainerStatuses"]:
        assert status_entry["state"]["terminated"]["exitCode"] == 0, status_entry
        assert status_entry["imageID"], status_entry
    for name, spec in inits.items():
        assert spec["process"]["args"][0] == "git", (name, spec["process"]["args"])
        _assert_restricted(name, spec, uid=gittasks.GIT_UID)
