"""A release as a platform team installs, upgrades and removes it, on fresh real-node planes.

The release is built from this checkout by `lmeval_sandbox.release` (the
images from the Dockerfile, pushed to a registry on loopback, the manifests
naming them by digest, the chart), and the previous release from the commit
its section of deploy/CHANGELOG.md names (a ``git worktree``). Each scenario
gets a plane and a real node of its own (containerd pulls the release's
images from the registry by digest), and acts only as a user would, with
kubectl and helm. Checks:

- the artifacts: every image by digest in the manifests, the version label on
  every object, the images' OCI labels, ``checksums.txt`` true, and a second
  build of the same commit byte-identical;
- install with the README's commands (kubectl, then Helm), pointed at the
  release folder, and with kubectl on the oldest supported Kubernetes
  (plane and kubelet of deploy/SUPPORT.md's floor): a job without any
  ``spec.pod`` reaches Succeeded with results, ``kubectl wait
  --for=condition=Succeeded`` exits 0, and a real Prometheus scrapes the
  poller through its Service (``lmeval_build_info`` names the release's
  version, and so does ``lmeval version``);
- upgrade from the previous release, with ``kubectl apply`` and with
  ``helm upgrade``: a job the old poller started and that is held running
  (its model server answers nothing until released) finishes with its
  results under the new poller; its pod is created exactly once (the
  apiserver's audit log); no job fails; the operator's settings survive;
- uninstall: ``kubectl delete -f manifests.yaml`` removes everything,
  including the CRD and with it every LMEvalJob; ``helm uninstall`` keeps
  the CRD and the jobs (``helm.sh/resource-policy: keep``) and leaves the
  namespace with the poller's own Lease and key Secret, which deleting the
  namespace removes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from lmeval_sandbox import build, krewplugin, release
from lmeval_sandbox.prometheus import PrometheusServer

from poller import api
from tests.node.conftest import (
    JOBS_NS,
    POLLER_NS,
    LocalRelease,
    NodeCluster,
    NodeSlot,
    build_local_release,
    job_body,
    release_plane,
    release_registry,
    run_helm,
    run_readme_install,
    served_job,
    wait_poller_ready,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.node, pytest.mark.fresh_plane, pytest.mark.lmeval]

REPO_ROOT = Path(__file__).resolve().parents[2]
POLLER_USER = f"system:serviceaccount:{POLLER_NS}:lmeval-poller"
# The operator's own edit of a setting, which an upgrade must keep.
KEPT_SETTING = ("log-archive-bytes", "12345")
HOLD_FILE = "/tmp/release-the-answers"


@dataclass(frozen=True)
class Releases:
    current: release.Release
    previous: release.Release
    rebuilt: release.Release  # the current one built a second time
    registry_port: int
    labels: dict[str, dict[str, str]]  # each current image's OCI labels, read back


def previous_commit() -> tuple[str, str]:
    """(version, commit) of the newest changelog section before the current
    version that names its commit."""
    text = (REPO_ROOT / release.CHANGELOG).read_text()
    current = release.tree_version(REPO_ROOT)
    for version, body in re.findall(r"^## \[([^\]]+)\][^\n]*\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        found = re.search(r"^Commit: ([0-9a-f]{7,40})$", body, re.M)
        if version != current and found:
            return version, found.group(1)
    raise AssertionError(f"{release.CHANGELOG} names no earlier release's commit")


def _labels(ref: str) -> dict[str, str]:
    """An image's labels as a registry client reads them."""
    inspected = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", f"docker://{ref}"],
        capture_output=True,
        text=True,
        check=True,
    )
    labels: dict[str, str] = json.loads(inspected.stdout)["Labels"]
    return labels


@pytest.fixture(scope="module")
def releases(
    node_slot: NodeSlot, current_release: LocalRelease, tmp_path_factory: pytest.TempPathFactory
) -> Releases:
    node_slot.stop_shared()  # its registry and ours share their storage
    work = tmp_path_factory.mktemp("releases")
    current, port = current_release.release, current_release.registry_port
    _, commit = previous_commit()
    with release_registry(port, work) as registry:
        rebuilt = build_local_release(registry, work / "rebuilt")
        # Upgrades install the previous release's manifests and chart: its
        # kubectl plugin (a minute or more of wheels per build) is not used.
        previous = build_local_release(registry, work / "previous", commit, krew=False)
        labels = {name: _labels(image.ref) for name, image in current.images.items()}
    print(
        f"\nrebuilt {current.version}: {json.dumps(rebuilt.seconds)}; "
        f"previous {previous.version}: {json.dumps(previous.seconds)}"
    )
    return Releases(current, previous, rebuilt, port, labels)


@contextlib.contextmanager
def fresh_plane(
    node_slot: NodeSlot,
    releases: Releases,
    workdir: Path,
    kubernetes: build.Kubernetes = "current",
) -> Iterator[NodeCluster]:
    """A plane and a real node of their own, the registry holding the releases."""
    with release_plane(node_slot, releases.registry_port, workdir, kubernetes) as cluster:
        yield cluster


# -- as a user -------------------------------------------------------------------------------


def submit_dummy(cluster: NodeCluster, name: str) -> None:
    configmap, job = job_body("dummy-model", name)
    assert "pod" not in job["spec"]
    cluster.apply(configmap, job, namespace=JOBS_NS)


def assert_succeeded_with_results(cluster: NodeCluster, name: str) -> dict[str, Any]:
    status = cluster.wait_final(JOBS_NS, name, timeout=420)
    assert status.get("reason") == "Succeeded", (status.get("message"), status.get("reason"))
    scores = json.loads(status["results"])["results"]
    assert "sample_arith_mc" in scores, scores
    # What a user's script does: kubectl wait on the condition, exit code 0.
    waited = cluster.plane.kubectl(
        "wait",
        "--for=condition=Succeeded",
        f"lmevaljob/{name}",
        "-n",
        JOBS_NS,
        "--timeout=30s",
        check=False,
    )
    assert waited.returncode == 0, waited.stderr
    return status


def assert_scraped(cluster: NodeCluster, version: str) -> None:
    """A real Prometheus scrapes the poller through its Service's cluster IP."""
    service = json.loads(
        cluster.kubectl("get", "service", "lmeval-poller-metrics", "-n", POLLER_NS, "-o", "json")
    )
    target = f"{service['spec']['clusterIP']}:8080"
    with PrometheusServer(cluster.workdir / f"prometheus-{uuid.uuid4().hex[:6]}", [target]) as p:

        def build_info() -> list[dict[str, Any]] | None:
            return p.query("lmeval_build_info") or None

        (series,) = wait_for(build_info, timeout=90, interval=1, what="lmeval_build_info scraped")
        assert series["metric"]["version"] == version, series


def images_of(cluster: NodeCluster) -> dict[str, str]:
    deployment = json.loads(
        cluster.kubectl("get", "deployment", "lmeval-poller", "-n", POLLER_NS, "-o", "json")
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    return {"poller": container["image"], "job": env.get(release.POD_IMAGE_ENV, "")}


def pod_creates(cluster: NodeCluster, namespace: str) -> list[str]:
    """The names in every create of a pod in `namespace` the apiserver answered."""
    return [
        call.name or call.uri
        for call in cluster.plane.audit.events()
        if call.verb == "create"
        and call.resource == "pods"
        and call.namespace == namespace
        and not call.subresource
    ]


def poller_leftovers(cluster: NodeCluster) -> list[str]:
    """Every object still labelled part-of lmeval-poller, cluster-wide."""
    kinds = cluster.kubectl("api-resources", "--verbs=list", "-o", "name").split()
    wanted = [k for k in kinds if not k.startswith(("events", "componentstatuses"))]
    out = cluster.kubectl(
        "get",
        ",".join(wanted),
        "-A",
        "-l",
        "app.kubernetes.io/part-of=lmeval-poller",
        "-o",
        "name",
        check=False,
    )
    return sorted(line for line in out.split() if line)


# -- the artifacts ---------------------------------------------------------------------------


def test_the_artifacts_name_images_by_digest_and_rebuild_identically(releases: Releases) -> None:
    current = releases.current
    files = sorted(p.name for p in current.directory.iterdir())
    expected = {
        "manifests.yaml",
        "manifests-openshift.yaml",
        "crd.yaml",
        "job-namespace.yaml",
        f"lmeval-poller-{current.version}.tgz",
        "release.json",
        "NOTES.md",
        "checksums.txt",
        # `kubectl lmeval` for krew: its manifest and one archive per platform.
        krewplugin.MANIFEST_NAME,
        *(krewplugin.archive_name(current.version, p) for p in krewplugin.PLATFORMS),
    }
    assert set(files) == expected, files
    # checksums.txt is `sha256sum -c`'s format and true.
    for line in (current.directory / "checksums.txt").read_text().splitlines():
        digest, name = line.split("  ")
        assert hashlib.sha256((current.directory / name).read_bytes()).hexdigest() == digest, name
    documents = [d for d in yaml.safe_load_all(current.manifests.read_text()) if d]
    kinds = {d["kind"] for d in documents}
    assert {
        "CustomResourceDefinition",
        "Namespace",
        "Deployment",
        "Service",
        "ConfigMap",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ServiceAccount",
    } <= kinds, kinds
    for document in documents:
        labels = document["metadata"].get("labels", {})
        assert labels.get(release.VERSION_LABEL) == current.version, document["metadata"]
    text = current.manifests.read_text()
    for name in ("poller", "job"):
        assert current.images[name].ref in text
    assert ":latest" not in text and "quay.io/lmeval-poller" not in text
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    assert re.fullmatch(
        r"\S+@sha256:[0-9a-f]{64}",
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
    )
    assert "data" not in next(d for d in documents if d["kind"] == "ConfigMap")
    assert current.version in (current.directory / "NOTES.md").read_text().splitlines()[0]
    # Building the same commit twice gives the same images, so the same files.
    for name in expected:
        again = (releases.rebuilt.directory / name).read_bytes()
        assert again == (current.directory / name).read_bytes(), f"{name} differs on a rebuild"
    # The images' OCI labels name the version and the revision.
    for name in current.images:
        labels = releases.labels[name]
        assert labels["org.opencontainers.image.version"] == current.version, labels
        assert labels["org.opencontainers.image.revision"] == current.revision, labels
        assert labels["org.opencontainers.image.created"] == current.created, labels
        assert labels["org.opencontainers.image.source"], labels


# -- install ---------------------------------------------------------------------------------


def test_install_with_kubectl_as_the_readme_says(
    node_slot: NodeSlot, releases: Releases, tmp_path: Path
) -> None:
    current = releases.current
    with fresh_plane(node_slot, releases, tmp_path) as cluster:
        started = time.monotonic()
        run_readme_install(cluster, "kubectl", current)
        assert images_of(cluster) == {
            "poller": current.images["poller"].ref,
            "job": current.images["job"].ref,
        }
        submit_dummy(cluster, "first")
        wait_poller_ready(cluster)
        status = assert_succeeded_with_results(cluster, "first")
        print(f"\nkubectl: install to first Succeeded {time.monotonic() - started:.1f} s")
        assert status["provenance"]["image"] == current.images["job"].ref
        assert_scraped(cluster, current.version)
        # `lmeval version` sees the installed release.
        shown = subprocess.run(
            [sys.executable, "-m", "lmeval_cli", "version", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "KUBECONFIG": str(cluster.plane.kubeconfig)},
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        poller = json.loads(shown.stdout)["pollerVersion"]
        assert (poller["version"], poller["image"]) == (
            current.version,
            current.images["poller"].ref,
        ), poller
        # Uninstall: everything goes, the CRD and with it every LMEvalJob.
        cluster.plane.kubectl("delete", "-f", str(current.manifests), "--wait=true", timeout=300)
        wait_for(
            lambda: not poller_leftovers(cluster), timeout=180, what="nothing of the poller left"
        )
        crds = cluster.kubectl("get", "crd", "-o", "name")
        assert f"{api.PLURAL}.{api.API_GROUP}" not in crds
        gone = cluster.kubectl("get", "namespace", POLLER_NS, check=False)
        assert not gone.strip() or "Terminating" in gone


def test_install_on_the_oldest_supported_kubernetes(
    node_slot: NodeSlot, releases: Releases, tmp_path: Path
) -> None:
    # deploy/SUPPORT.md's floor: plane and kubelet of that minor, built from
    # its Go modules (deploy/sandbox/controlplane-floor).
    current = releases.current
    with fresh_plane(node_slot, releases, tmp_path, kubernetes="floor") as cluster:
        version = json.loads(cluster.kubectl("version", "-o", "json"))["serverVersion"]
        assert version["minor"].rstrip("+") == str(build.kubernetes_minor("floor")), version
        node_version = cluster.kubectl(
            "get", "nodes", "-o", "jsonpath={.items[*].status.nodeInfo.kubeletVersion}"
        )
        assert build.kubernetes_version("floor") in node_version.split(), node_version
        run_readme_install(cluster, "kubectl", current)
        submit_dummy(cluster, "first")
        wait_poller_ready(cluster)
        assert_succeeded_with_results(cluster, "first")
        # The poller's own list by the selectable field that sets the floor.
        listed = cluster.kubectl(
            "get", api.PLURAL, "-A", "--field-selector", "status.state=Complete", "-o", "name"
        )
        assert listed.split() == [f"{api.KIND.lower()}.{api.API_GROUP}/first"], listed


def test_install_with_helm_as_the_readme_says(
    node_slot: NodeSlot, releases: Releases, tmp_path: Path
) -> None:
    current = releases.current
    with fresh_plane(node_slot, releases, tmp_path) as cluster:
        started = time.monotonic()
        run_readme_install(cluster, "helm", current)
        assert images_of(cluster) == {
            "poller": current.images["poller"].ref,
            "job": current.images["job"].ref,
        }
        wait_for(
            lambda: cluster.get("serviceaccount", "lmeval-job", JOBS_NS),
            timeout=30,
            what="the job namespace prepared by the chart",
        )
        submit_dummy(cluster, "first")
        wait_poller_ready(cluster)
        assert_succeeded_with_results(cluster, "first")
        print(f"\nhelm: install to first Succeeded {time.monotonic() - started:.1f} s")
        assert_scraped(cluster, current.version)
        # Uninstall: the chart's objects go; the CRDs (both kinds) and the jobs stay.
        run_helm(cluster, "uninstall", "lmeval-poller", "-n", POLLER_NS, "--wait")
        left = poller_leftovers(cluster)
        crds = {
            f"customresourcedefinition.apiextensions.k8s.io/{plural}.{api.API_GROUP}"
            for plural in (api.PLURAL, api.SUITE_PLURAL)
        }
        assert crds <= set(left) <= {*crds, f"namespace/{JOBS_NS}"}, left
        assert cluster.job_status(JOBS_NS, "first").get("state") == "Complete"
        # What the poller made for itself stays with its namespace until that goes.
        inside = cluster.kubectl("get", "secrets,leases", "-n", POLLER_NS, "-o", "name")
        assert "secret/lmeval-poller-identity" in inside, inside
        cluster.plane.kubectl("delete", "namespace", POLLER_NS, "--wait=true", timeout=180)
        assert cluster.kubectl("get", "namespace", POLLER_NS, check=False).strip() == ""


# -- upgrade ---------------------------------------------------------------------------------


def _held_job(cluster: NodeCluster, name: str) -> str:
    """A served job whose model server holds every answer; its pod's UID once Running."""
    configmap, job = served_job(cluster, name, hold_file=HOLD_FILE)
    cluster.apply(configmap, job, namespace=JOBS_NS)

    def running() -> str | None:
        status = cluster.job_status(JOBS_NS, name)
        pod = cluster.pod_of(JOBS_NS, name) if status.get("state") == "Running" else {}
        return pod.get("metadata", {}).get("uid") if pod else None

    return wait_for(running, timeout=300, interval=1, what=f"{name} running")


def _release_held(cluster: NodeCluster, name: str) -> None:
    pod = cluster.job_status(JOBS_NS, name)["podName"]
    cluster.plane.kubectl(
        "exec",
        "-n",
        JOBS_NS,
        pod,
        "-c",
        "model",
        "--",
        "python",
        "-c",
        f"open({HOLD_FILE!r}, 'w').close()",
    )


def _after_upgrade(
    cluster: NodeCluster, current: release.Release, held: str, held_uid: str
) -> None:
    """The new poller runs the release's images, keeps the operator's setting, and
    finishes the held job from the pod the old poller made."""
    wait_poller_ready(cluster)
    assert images_of(cluster)["poller"] == current.images["poller"].ref

    def only_new_pollers() -> bool:
        listed = cluster.kubectl(
            "get",
            "pods",
            "-n",
            POLLER_NS,
            "-l",
            "app.kubernetes.io/name=lmeval-poller",
            "-o",
            "json",
        )
        images = [p["spec"]["containers"][0]["image"] for p in json.loads(listed)["items"]]
        return bool(images) and set(images) == {current.images["poller"].ref}

    wait_for(only_new_pollers, timeout=120, what="only pollers of the new release")
    settings = cluster.get("configmap", "lmeval-poller-config", POLLER_NS).get("data", {})
    assert settings.get(KEPT_SETTING[0]) == KEPT_SETTING[1], settings
    # Still held: the new poller takes over a job that is running, not one
    # that finished meanwhile.
    assert cluster.job_status(JOBS_NS, held).get("state") == "Running"
    _release_held(cluster, held)
    status = cluster.wait_final(JOBS_NS, held, timeout=420)
    assert status.get("reason") == "Succeeded", status.get("message")
    assert "sample_arith_gen" in json.loads(status["results"])["results"]
    assert cluster.pod_of(JOBS_NS, held).get("metadata", {}).get("uid") in (held_uid, None)
    creates = [n for n in pod_creates(cluster, JOBS_NS) if held in n]
    assert len(creates) == 1, f"the held job's pod was created {len(creates)} times: {creates}"
    # A job submitted after the upgrade runs on the new release's job image.
    submit_dummy(cluster, "after")
    after = assert_succeeded_with_results(cluster, "after")
    assert after["provenance"]["image"] == current.images["job"].ref
    for item in json.loads(cluster.kubectl("get", api.PLURAL, "-n", JOBS_NS, "-o", "json"))[
        "items"
    ]:
        assert item["status"].get("reason") == "Succeeded", item["status"]


def test_upgrade_with_kubectl_apply(
    node_slot: NodeSlot, releases: Releases, tmp_path: Path
) -> None:
    previous, current = releases.previous, releases.current
    with fresh_plane(node_slot, releases, tmp_path) as cluster:
        cluster.plane.kubectl("apply", "--server-side", "-f", str(previous.manifests), timeout=180)
        cluster.plane.kubectl(
            "apply", "--server-side", "-f", str(previous.directory / "job-namespace.yaml")
        )
        wait_poller_ready(cluster)
        # The operator's own edit, as the settings page tells them.
        cluster.plane.kubectl(
            "-n",
            POLLER_NS,
            "patch",
            "configmap",
            "lmeval-poller-config",
            "--type=merge",
            "-p",
            json.dumps({"data": dict([KEPT_SETTING])}),
        )
        uid = _held_job(cluster, "held")
        cluster.plane.kubectl("apply", "--server-side", "-f", str(current.manifests), timeout=180)
        _after_upgrade(cluster, current, "held", uid)


def test_upgrade_with_helm(node_slot: NodeSlot, releases: Releases, tmp_path: Path) -> None:
    previous, current = releases.previous, releases.current
    values = tmp_path / "my-values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "settings": dict([KEPT_SETTING]),
                "jobNamespaces": [JOBS_NS],
                "createJobNamespaces": True,
            }
        )
    )
    with fresh_plane(node_slot, releases, tmp_path) as cluster:
        run_helm(
            cluster,
            "install",
            "lmeval-poller",
            str(previous.chart),
            "-n",
            POLLER_NS,
            "--create-namespace",
            "-f",
            str(values),
            "--wait",
            "--timeout=5m",
        )
        uid = _held_job(cluster, "held")
        run_helm(
            cluster,
            "upgrade",
            "lmeval-poller",
            str(current.chart),
            "-n",
            POLLER_NS,
            "-f",
            str(values),
            "--wait",
            "--timeout=5m",
        )
        _after_upgrade(cluster, current, "held", uid)
