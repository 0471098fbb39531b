"""Fixtures of the end-to-end suite on a real node.

One control plane (``real_node=True``, kwok nodes tainted out of reach) and
one real node (containerd, runc, CNI, kubelet, kube-proxy; images from a
registry on loopback) per session; the images are built from our Dockerfile
(`lmeval_sandbox.images`, cached by their inputs); the poller is deployed by
``kubectl apply -k`` of ``deploy/`` with its own image and runs in-cluster.
Each test gets a job namespace made from ``deploy/components/job-namespace``
(Pod Security ``restricted`` enforced) and sees jobs as a user does: through
their status.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shlex
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from lmeval_sandbox import build, demo, helm, images, nodeconfig, release
from lmeval_sandbox.components import free_port
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.deployed import apply_job_namespace, apply_poller
from lmeval_sandbox.nodeconfig import NODE_NAME
from lmeval_sandbox.realdemo import model_server_sidecar
from lmeval_sandbox.realnode import NodeImage, RealNode
from lmeval_sandbox.supervise import http_ok, terminate

from poller import api
from tests import docs
from tests.waiting import wait_for

# The kubelet's default; test_rotated_log_still_yields_results lowers it.
CONTAINER_LOG_MAX_SIZE = "10Mi"
# The suite's pod-pending-timeout: a pod of a pulled image starts in seconds.
SUITE_PENDING = "90s"
FINAL_STATES = ("Complete", "Cancelled")


@dataclass
class NodeCluster:
    """The plane, the node, the images by role, and helpers to act as a user."""

    plane: ControlPlane
    node: RealNode
    image_refs: dict[str, str]
    workdir: Path
    settings: dict[str, str] = field(default_factory=dict)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        return self.plane.kubectl(*args, check=check, timeout=timeout).stdout

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        out = self.plane.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def job_status(self, namespace: str, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.get(api.PLURAL, name, namespace).get("status", {})
        return status

    def wait_final(self, namespace: str, name: str, timeout: float = 300) -> dict[str, Any]:
        """The job's status once it is Complete or Cancelled."""

        def final() -> dict[str, Any] | None:
            status = self.job_status(namespace, name)
            return status if status.get("state") in FINAL_STATES else None

        try:
            return wait_for(final, timeout=timeout, interval=0.5, what=f"{namespace}/{name} final")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.diagnostics(namespace)}") from None

    def apply(self, *documents: Mapping[str, Any], namespace: str) -> None:
        self.plane.kubectl(
            "apply",
            "-n",
            namespace,
            "-f",
            "-",
            input_text=yaml.safe_dump_all([dict(d) for d in documents]),
        )

    def set_settings(self, **values: str) -> None:
        """Patch the live settings ConfigMap (the poller re-reads it every cycle)."""
        data = {key.replace("_", "-"): value for key, value in values.items()}
        self.settings.update(data)
        self.plane.kubectl(
            "-n",
            "lmeval-system",
            "patch",
            "configmap",
            "lmeval-poller-config",
            "--type=merge",
            "-p",
            json.dumps({"data": data}),
        )

    def pod_of(self, namespace: str, job: str) -> dict[str, Any]:
        name = self.job_status(namespace, job).get("podName", "")
        return self.get("pod", name, namespace) if name else {}

    def watch_pod(self, namespace: str, pod: str) -> PodWatch:
        """Start recording every version of `pod` (``kubectl get -w``) until `stop`."""
        assert self.plane.binaries is not None
        argv = [
            str(self.plane.binaries / "kubectl"),
            f"--kubeconfig={self.plane.kubeconfig}",
            "get",
            "pod",
            pod,
            "-n",
            namespace,
            "-w",
            "-o",
            "json",
        ]
        return PodWatch(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))

    def diagnostics(self, namespace: str) -> str:
        parts = [
            self.kubectl("get", "lmevaljobs,pods", "-n", namespace, "-o", "wide", check=False),
            self.kubectl("get", "events", "-n", namespace, check=False)[-3000:],
            self.kubectl(
                "-n", "lmeval-system", "logs", "deployment/lmeval-poller", "--tail=30", check=False
            ),
            self.node.log_tail("kubelet", 15),
        ]
        return "\n".join(parts)


class PodWatch:
    """A running ``kubectl get pod -w -o json``; `stop` returns every version it saw."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def stop(self) -> list[dict[str, Any]]:
        self.process.terminate()
        out, _ = self.process.communicate(timeout=30)
        decoder, at = json.JSONDecoder(), 0
        versions: list[dict[str, Any]] = []
        while True:
            while at < len(out) and out[at].isspace():
                at += 1
            if at >= len(out):
                return versions
            try:
                version, at = decoder.raw_decode(out, at)
            except json.JSONDecodeError:
                return versions  # the last one, cut short by `terminate`
            versions.append(version)


def job_body(sample_name: str, name: str, **spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tasks ConfigMap, LMEvalJob) from deploy/samples, without its sandbox `pod` block."""
    documents = demo.sample_documents(sample_name, demo.MODEL_SERVER_PORT)
    configmap = next(d for d in documents if d["kind"] == "ConfigMap")
    job = copy.deepcopy(next(d for d in documents if d["kind"] == api.KIND))
    job["spec"].pop("pod", None)
    job["metadata"] = {"name": name}
    job["spec"].update(spec)
    return configmap, job


def served_job(
    cluster: NodeCluster, name: str, *, delay: str = "", hold_file: str = ""
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The served-model sample with the model server as a sidecar (slowed by
    `delay` s; holding every answer until `hold_file` exists in its /tmp)."""
    configmap, job = job_body("served-model", name)
    sidecar = model_server_sidecar(
        cluster.image_refs["model_server"], delay=delay, hold_file=hold_file
    )
    job["spec"]["pod"] = {"sidecars": [sidecar]}
    return configmap, job


def start_node_plane(
    workdir: Path,
    *,
    registry_port: int | None = None,
    kubernetes: build.Kubernetes | None = None,
) -> tuple[ControlPlane, RealNode, images.ImageSet]:
    """A fresh plane (``real_node=True``) and the real node joined to it, both of
    `kubernetes` (default: the current pin), with the development images in
    the node's registry; the caller stops both."""
    built = images.ensure_images()
    plane = ControlPlane(workdir / "plane", real_node=True, kubernetes=kubernetes)
    plane.start()
    node = RealNode(
        plane,
        workdir / "node",
        container_log_max_size=CONTAINER_LOG_MAX_SIZE,
        registry_port=registry_port,
    )
    try:
        node.start(
            [NodeImage(image.archive, image.ref) for image in built.all()],
            pause=built.pause.ref,
        )
    except BaseException:
        node.stop()
        plane.stop()
        raise
    return plane, node, built


def stop_node_plane(plane: ControlPlane, node: RealNode) -> None:
    """Stop both; whatever the tests did, the machine is as the node found it."""
    try:
        node.stop()
    finally:
        plane.stop()
    assert node.leftovers() == [], node.leftovers()


def _start_shared(workdir: Path) -> NodeCluster:
    plane, node, built = start_node_plane(workdir)
    try:
        # As a node's image cache would: the first job pod then does not
        # spend its pending time pulling 940 MiB.
        node.prepull([built.job.ref, built.poller.ref])
        refs = {image.name: node.image(image.ref) for image in built.all()}
        cluster = NodeCluster(plane, node, refs, workdir)
        settings = {
            "poll-interval": "1s",
            "pod-image": refs["job"],
            "image-pull-policy": "IfNotPresent",
            "pod-pending-timeout": SUITE_PENDING,
            "progress-interval": "2s",
            "results-source": "log",
        }
        cluster.settings.update(settings)
        apply_poller(plane, workdir / "overlay", poller_image=refs["poller"], settings=settings)
    except BaseException:
        stop_node_plane(plane, node)
        raise
    print(f"\nreal node ready: {json.dumps({k: round(v, 1) for k, v in node.times.items()})}")
    return cluster


class NodeSlot:
    """The machine's one real node (`RealNode` takes a machine-wide lock).

    Most tests share one cluster (plane, node, deployed poller), started on
    first use; a test that needs a fresh plane of its own (an install, an
    upgrade) calls `stop_shared` first, and the next test that wants the
    shared cluster starts a new one. The release tests run after the others
    (`pytest_collection_modifyitems`), so the shared cluster starts once.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.shared: NodeCluster | None = None
        self.starts = 0

    def shared_cluster(self) -> NodeCluster:
        if self.shared is None:
            self.starts += 1
            self.shared = _start_shared(self.root / f"shared-{self.starts}")
        return self.shared

    def stop_shared(self) -> None:
        if self.shared is not None:
            cluster, self.shared = self.shared, None
            stop_node_plane(cluster.plane, cluster.node)


@pytest.fixture(scope="session")
def node_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeSlot]:
    root = Path(os.environ.get("LMEVAL_TEST_NODE_DIR", tmp_path_factory.mktemp("node")))
    slot = NodeSlot(root)
    try:
        yield slot
    finally:
        slot.stop_shared()


@pytest.fixture
def node_cluster(node_slot: NodeSlot) -> NodeCluster:
    """The shared plane + real node + images + deployed poller."""
    return node_slot.shared_cluster()


# Tests that start planes of their own run last, after every user of the
# shared cluster.
FRESH_PLANE_MARK = "fresh_plane"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    fresh = [item for item in items if item.get_closest_marker(FRESH_PLANE_MARK)]
    if fresh:
        others = [item for item in items if not item.get_closest_marker(FRESH_PLANE_MARK)]
        items[:] = others + fresh


@pytest.fixture
def job_namespace(node_cluster: NodeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace made ready for jobs with deploy/components/job-namespace."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:5]}"
    annotations: dict[str, str] = getattr(request, "param", {}) or {}
    apply_job_namespace(
        node_cluster.plane,
        node_cluster.workdir / "namespaces" / name,
        name,
        annotations=annotations,
    )
    wait_for(
        lambda: node_cluster.get("serviceaccount", "lmeval-job", name),
        timeout=30,
        what=f"lmeval-job in {name}",
    )
    yield name
    node_cluster.plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


# -- a release as users get it ---------------------------------------------------------------
# Shared by tests/node/test_release.py and tests/node/test_readme.py: the
# release built from this checkout (images pushed to a registry on loopback,
# manifests naming them by digest), a fresh plane whose node pulls from that
# registry, and the README's install commands run against it.

README = docs.REPO_ROOT / "README.md"
POLLER_NS = "lmeval-system"
JOBS_NS = "lmeval-jobs"  # what job-namespace.yaml and the README's Helm line prepare
PUBLISHED = "https://github.com/lmeval-poller/lmeval-poller/releases/download/v{version}"


@dataclass(frozen=True)
class LocalRelease:
    """The current release, and the loopback port of the registry holding its images."""

    release: release.Release
    registry_port: int


@contextlib.contextmanager
def release_registry(port: int, workdir: Path) -> Iterator[str]:
    """The nodes' registry (its storage) on `port`, while no node runs."""
    storage = build.cache_root() / "node" / "registry"
    storage.mkdir(parents=True, exist_ok=True)
    config = workdir / "registry.yaml"
    config.write_text(nodeconfig.registry_config(storage, port))
    log = (workdir / "registry.log").open("w")
    process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log)
    try:
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/v2/"), timeout=30, what="registry")
        yield f"127.0.0.1:{port}"
    finally:
        terminate(process.pid)
        process.wait(timeout=30)
        log.close()


def build_local_release(
    registry: str, out: Path, commit: str | None = None, *, krew: bool = True
) -> release.Release:
    """A release of this checkout (or of `commit`) pushed to `registry` on loopback."""
    # allow_dirty: a developer's run tests their uncommitted work too.
    return release.build_release(
        registry=f"{registry}/lmeval",
        out=out,
        commit=commit,
        plain_http=True,
        allow_dirty=True,
        krew=krew,
    )


@pytest.fixture(scope="session")
def current_release(node_slot: NodeSlot, tmp_path_factory: pytest.TempPathFactory) -> LocalRelease:
    """This checkout's release, built once per session for every test that installs it."""
    node_slot.stop_shared()  # its registry and ours share their storage
    work = tmp_path_factory.mktemp("release")
    port = free_port()
    with release_registry(port, work) as registry:
        current = build_local_release(registry, work / "current")
    print(f"\nrelease {current.version}: {json.dumps(current.seconds)}")
    for image in current.images.values():
        print(f"  {image.ref} {image.compressed_bytes / 2**20:.1f} MiB compressed")
    return LocalRelease(current, port)


@contextlib.contextmanager
def release_plane(
    node_slot: NodeSlot,
    registry_port: int,
    workdir: Path,
    kubernetes: build.Kubernetes = "current",
) -> Iterator[NodeCluster]:
    """A plane and a real node of their own, the node's registry holding the releases."""
    node_slot.stop_shared()
    plane, node, built = start_node_plane(
        workdir, registry_port=registry_port, kubernetes=kubernetes
    )
    try:
        refs = {image.name: node.image(image.ref) for image in built.all()}
        yield NodeCluster(plane, node, refs, workdir)
    finally:
        stop_node_plane(plane, node)


def run_helm(cluster: NodeCluster, *args: str, check: bool = True) -> str:
    done = helm.run_helm(
        *args,
        home=cluster.workdir / "helm",
        check=check,
        timeout=300,
        env={"KUBECONFIG": str(cluster.plane.kubeconfig)},
    )
    return done.stdout


def readme_commands(tool: str) -> list[str]:
    """The README's install block for `tool` (``<!-- install: TOOL -->``), line by line."""
    found = docs.marked_blocks(f"install: {tool}", [README], "bash")
    assert found, f"README.md has no install block for {tool}"
    return [line.strip() for line in found[0].text.splitlines() if line.strip()]


def run_readme_install(cluster: NodeCluster, tool: str, built: release.Release) -> None:
    """The README's commands, as written, with $RELEASE the local release folder."""
    lines = readme_commands(tool)
    assert lines[0] == f"RELEASE={PUBLISHED.format(version=built.version)}", lines[0]
    assert 1 <= len(lines) - 1 <= 3, f"the README's {tool} install is {len(lines) - 1} commands"
    for line in lines[1:]:
        argv = shlex.split(line.replace("$RELEASE", str(built.directory)))
        assert argv[0] in ("kubectl", "helm"), line
        if argv[0] == "kubectl":
            cluster.plane.kubectl(*argv[1:], timeout=180)
        else:
            run_helm(cluster, *argv[1:])


def wait_poller_ready(cluster: NodeCluster) -> None:
    cluster.kubectl(
        "-n",
        POLLER_NS,
        "rollout",
        "status",
        "deployment/lmeval-poller",
        "--timeout=240s",
        timeout=250,
    )


__all__ = [
    "JOBS_NS",
    "NODE_NAME",
    "POLLER_NS",
    "PUBLISHED",
    "README",
    "LocalRelease",
    "NodeCluster",
    "NodeSlot",
    "build_local_release",
    "job_body",
    "readme_commands",
    "release_plane",
    "release_registry",
    "run_helm",
    "run_readme_install",
    "served_job",
    "start_node_plane",
    "stop_node_plane",
    "wait_poller_ready",
]
