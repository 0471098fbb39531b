"""The oldest Kubernetes the project claims (its floor) runs what the project ships.

The project is developed on one release (deploy/sandbox/controlplane) and
claims an older minor as its floor (deploy/sandbox/controlplane-floor, whose
go.mod says why that minor). A claim nobody runs drifts: a new CEL function
in a rule, a new field in a manifest, and the floor is silently raised. So
this module starts a control plane of the floor release
(``ControlPlane(kubernetes="floor")``) and checks against it:

- ``/version`` reports the floor release, older than the current one;
- ``deploy/overlays/kubernetes`` (the CRD, RBAC, the poller's Deployment and
  the ValidatingAdmissionPolicies) applies server-side, as INSTALL.md says;
- a user with the jobs-edit role creates a valid LMEvalJob; invalid ones are
  refused by the CRD's CEL rules (one of them uses the strings library) and,
  for a Secret the user may not read, by the admission policy's
  ``authorizer`` check;
- LMEvalJobs are listed by their selectable field ``status.state``, with
  kubectl and with the poller's own query as the poller's ServiceAccount:
  the feature that sets the floor (1.30 drops ``selectableFields``).

And, on the real node (marked ``node``: root, Debian's containerd 1.6), a
kubelet and kube-proxy of the floor release join a floor plane, become
Ready and run one pod to completion, whose log is read through the
apiserver.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lmeval_sandbox import build, images
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import service_account_kubeconfig, user_kubeconfig
from lmeval_sandbox.nodeconfig import NODE_NAME
from lmeval_sandbox.realnode import NodeImage, RealNode

from poller import api
from poller.cycle.observe import HOT_JOBS
from poller.kube.client import Kube
from poller.kube.transport import ApiTransport
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "deploy" / "overlays" / "kubernetes"
CRD_NAME = f"{api.PLURAL}.{api.API_GROUP}"
AUTHOR = "floor-author"
POLICY = "lmevaljob-requester-rights"


@pytest.fixture(scope="module")
def floor_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the floor release (kwok nodes), for this module only."""
    plane = ControlPlane(tmp_path_factory.mktemp("floor-plane"), kubernetes="floor")
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def installed(floor_plane: ControlPlane) -> ControlPlane:
    """The whole Kubernetes overlay applied server-side, as a user installs it."""
    floor_plane.kubectl("apply", "--server-side", "-k", str(OVERLAY), timeout=120)
    floor_plane.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}")
    return floor_plane


@pytest.fixture(scope="module")
def namespace(installed: ControlPlane) -> str:
    """A namespace where `AUTHOR` may edit LMEvalJobs and nothing else."""
    name = f"floor-{uuid.uuid4().hex[:6]}"
    installed.kubectl("create", "namespace", name)
    installed.kubectl(
        "create",
        "rolebinding",
        "author-jobs",
        "-n",
        name,
        "--clusterrole=lmeval-jobs-edit",
        f"--user={AUTHOR}",
    )
    return name


@pytest.fixture(scope="module")
def author(installed: ControlPlane) -> Path:
    return user_kubeconfig(installed, AUTHOR)


def _job(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {"model": "dummy", "tasks": ["toy_mc"], **spec},
    }


def _create(
    plane: ControlPlane, namespace: str, body: dict[str, Any], kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return plane.kubectl(
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        kubeconfig=kubeconfig,
        check=False,
        input_text=yaml.safe_dump(body),
    )


def _set_state(plane: ControlPlane, namespace: str, name: str, state: str) -> None:
    plane.kubectl(
        "patch",
        api.PLURAL,
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"state": state}}),
    )


def test_version_is_the_floor(floor_plane: ControlPlane) -> None:
    info = json.loads(floor_plane.kubectl("get", "--raw", "/version").stdout)
    assert info["gitVersion"] == build.kubernetes_version("floor")
    assert int(info["minor"]) == build.kubernetes_minor("floor")
    assert build.kubernetes_minor("floor") < build.kubernetes_minor("current")
    assert floor_plane.binaries == build.ensure_binaries("floor")


def test_the_overlay_applies_with_selectable_fields_kept(installed: ControlPlane) -> None:
    crd = json.loads(installed.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    (version,) = crd["spec"]["versions"]
    # 1.30 accepts the CRD too, but silently drops this field.
    assert version.get("selectableFields") == [{"jsonPath": ".status.state"}]
    policies = json.loads(
        installed.kubectl("get", "validatingadmissionpolicies", "-o", "json").stdout
    )["items"]
    names = {policy["metadata"]["name"] for policy in policies}
    assert POLICY in names, names


def test_a_valid_job_is_admitted(installed: ControlPlane, namespace: str, author: Path) -> None:
    done = _create(installed, namespace, _job("valid"), author)
    assert done.returncode == 0, done.stderr
    out = installed.kubectl("get", api.PLURAL, "valid", "-n", namespace, "-o", "json")
    assert json.loads(out.stdout)["spec"]["model"] == "dummy"


def test_cel_rules_refuse_invalid_jobs(
    installed: ControlPlane, namespace: str, author: Path
) -> None:
    itself = _create(installed, namespace, _job("itself", baseline="itself"), author)
    assert itself.returncode != 0
    assert "spec.baseline names this job itself" in itself.stderr, itself.stderr
    # trim() and lowerAscii() come from CEL's strings library.
    remote = _create(
        installed,
        namespace,
        _job("remote", modelArgs=[{"name": "trust_remote_code", "value": " True "}]),
        author,
    )
    assert remote.returncode != 0
    assert "trust_remote_code other than false or 0" in remote.stderr, remote.stderr


def test_the_admission_policy_refuses_an_unreadable_secret(
    installed: ControlPlane, namespace: str, author: Path
) -> None:
    secret = {"env": "API_KEY", "secretRef": {"name": "not-yours", "key": "token"}}
    body = _job("secretive", envSecrets=[secret])

    def refusal() -> subprocess.CompletedProcess[str] | None:
        # Bindings reach the apiserver's policy cache asynchronously: until
        # then the job is admitted, and deleted for the next try.
        done = _create(installed, namespace, body, author)
        if done.returncode == 0:
            installed.kubectl("delete", api.PLURAL, "secretive", "-n", namespace)
            return None
        return done

    refused = wait_for(refusal, timeout=30, what=f"{POLICY} in force")
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in refused.stderr, refused.stderr
    assert f"{AUTHOR} may not get Secret not-yours" in refused.stderr, refused.stderr
    # The admin may read every Secret: the same job is admitted.
    admitted = _create(installed, namespace, body)
    assert admitted.returncode == 0, admitted.stderr


def test_jobs_are_listed_by_their_selectable_field(installed: ControlPlane, namespace: str) -> None:
    for name, state in (("hot", "Running"), ("done", "Complete")):
        created = _create(installed, namespace, _job(name))
        assert created.returncode == 0, created.stderr
        _set_state(installed, namespace, name, state)
    listed = installed.kubectl(
        "get", api.PLURAL, "-n", namespace, "--field-selector=status.state=Running", "-o", "name"
    ).stdout.split()
    assert listed == [f"{api.KIND.lower()}.{api.API_GROUP}/hot"], listed
    # What the poller asks every cycle, as the poller's ServiceAccount.
    kubeconfig = service_account_kubeconfig(installed, "lmeval-system", "lmeval-poller")
    with ApiTransport.from_kubeconfig(kubeconfig) as transport:
        jobs = Kube(transport).list_jobs(namespace, field_selector=HOT_JOBS)
        hot = [job["metadata"]["name"] for job in jobs]
    assert "hot" in hot and "done" not in hot, hot


@pytest.mark.node
def test_a_floor_kubelet_runs_a_pod(tmp_path: Path) -> None:
    built = images.ensure_images()
    plane = ControlPlane(tmp_path / "plane", real_node=True, kubernetes="floor")
    node = RealNode(plane, tmp_path / "node")
    try:
        plane.start()
        node.start(
            [NodeImage(image.archive, image.ref) for image in (built.pause, built.git)],
            pause=built.pause.ref,
        )
        info = json.loads(plane.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
        assert info["status"]["nodeInfo"]["kubeletVersion"] == build.kubernetes_version("floor")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "git-version", "namespace": "default"},
            "spec": {
                "restartPolicy": "Never",
                "nodeName": NODE_NAME,
                "containers": [
                    {"name": "git", "image": node.image(built.git.ref), "args": ["--version"]}
                ],
            },
        }
        plane.kubectl("apply", "-f", "-", input_text=json.dumps(pod))

        def phase() -> str | None:
            out = plane.kubectl("get", "pod", "git-version", "-o", "json", check=False)
            found = json.loads(out.stdout)["status"].get("phase") if out.returncode == 0 else None
            return found if found in ("Succeeded", "Failed") else None

        assert wait_for(phase, timeout=120, interval=0.5, what="the pod's end") == "Succeeded"
        assert plane.kubectl("logs", "git-version").stdout.startswith("git version ")
    finally:
        try:
            node.stop()
        finally:
            plane.stop()
    assert node.leftovers() == [], node.leftovers()
