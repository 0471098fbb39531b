"""``lmeval version`` and ``lmeval --version`` on the real control plane.

Checks: the client's version is the installed metadata's and its revision
``$LMEVAL_REVISION``; the server's is the apiserver's own ``GET /version``;
the poller's is read from Deployment ``lmeval-poller`` (its
``app.kubernetes.io/version`` label and the image of its ``poller``
container) in ``--poller-namespace`` (default ``lmeval-system``). A missing
Deployment reads "not found", a user who may not read it gets the RBAC
refusal in one line, and both exit 0, while the server's version is still
shown (every user may read it). ``-o json`` and ``-o yaml`` give one
document with ``clientVersion``, ``serverVersion`` and ``pollerVersion``;
``--client`` contacts no cluster at all (a kubeconfig that does not exist is
fine), while without it a cluster that cannot be reached is exit 7 after the
client's line.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import user_kubeconfig

from poller import buildinfo
from tests.cli.conftest import REPO, Cli, cli_env

pytestmark = pytest.mark.cluster

SHA = "0123456789abcdef0123456789abcdef01234567"
IMAGE = "registry.example/lmeval-poller:9.8.7"


def run(cli: Cli, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as `cli` runs it, with a known revision."""
    return subprocess.run(
        cli.argv(*args, kubeconfig=kubeconfig),
        capture_output=True,
        text=True,
        timeout=60,
        env={**cli_env(), buildinfo.REVISION_ENV: SHA},
        cwd=REPO,
        check=False,
    )


def poller_deployment(admin_api: client.ApiClient, namespace: str, **labels: str) -> None:
    """Deployment lmeval-poller as deploy/ makes it, scaled to zero (no pod is needed)."""
    selector = {"app.kubernetes.io/name": "lmeval-poller"}
    client.AppsV1Api(admin_api).create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "lmeval-poller", "labels": {**selector, **labels}},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": selector},
                    "spec": {
                        "containers": [
                            {"name": "sidecar", "image": "registry.example/other:1"},
                            {"name": "poller", "image": IMAGE},
                        ]
                    },
                },
            },
        },
    )


def server_version(admin_api: client.ApiClient) -> dict[str, Any]:
    code = client.VersionApi(admin_api).get_code()
    return {"gitVersion": code.git_version, "major": code.major, "minor": code.minor}


@pytest.fixture
def cli(control_plane: ControlPlane, namespace: str) -> Cli:
    return Cli(control_plane.kubeconfig, namespace)


def test_client_server_and_poller_versions(
    cli: Cli, admin_api: client.ApiClient, control_plane: ControlPlane, namespace: str
) -> None:
    poller_deployment(admin_api, namespace, **{"app.kubernetes.io/version": "9.8.7"})
    shown = run(cli, "version", "--poller-namespace", namespace)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        f"Client Version: {buildinfo.version()} (revision 0123456)",
        f"Server Version: {server_version(admin_api)['gitVersion']} ({control_plane.server})",
        f"Poller Version: 9.8.7 (image {IMAGE}, Deployment {namespace}/lmeval-poller)",
    ]
    assert shown.stderr == ""

    as_json = run(cli, "version", "--poller-namespace", namespace, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["clientVersion"] == {"version": buildinfo.version(), "revision": SHA}
    assert server_version(admin_api).items() <= document["serverVersion"].items()
    assert document["pollerVersion"] == {
        "namespace": namespace,
        "deployment": "lmeval-poller",
        "version": "9.8.7",
        "image": IMAGE,
    }
    as_yaml = run(cli, "version", "--poller-namespace", namespace, "-o", "yaml")
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout) == document


def test_poller_without_the_version_label(
    cli: Cli, admin_api: client.ApiClient, namespace: str
) -> None:
    poller_deployment(admin_api, namespace)
    shown = run(cli, "version", "--poller-namespace", namespace)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[2] == (
        f"Poller Version: unknown (image {IMAGE}, Deployment {namespace}/lmeval-poller "
        "has no app.kubernetes.io/version label)"
    )


def test_missing_poller_reads_not_found(cli: Cli, namespace: str) -> None:
    shown = run(cli, "version", "--poller-namespace", namespace)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert len(lines) == 3 and lines[1].startswith("Server Version: v")
    assert lines[2] == (
        f"Poller Version: not found: no Deployment lmeval-poller in namespace {namespace}"
    )
    document = json.loads(run(cli, "version", "--poller-namespace", namespace, "-o=json").stdout)
    assert document["pollerVersion"] == {
        "namespace": namespace,
        "deployment": "lmeval-poller",
        "error": "NotFound",
        "message": f"no Deployment lmeval-poller in namespace {namespace}",
    }
    # Where deploy/ installs it, unless told otherwise.
    default = json.loads(run(cli, "version", "-o", "json").stdout)
    assert default["pollerVersion"]["namespace"] == "lmeval-system"


def test_user_who_may_not_read_it_is_told_in_one_line(
    cli: Cli, admin_api: client.ApiClient, control_plane: ControlPlane, namespace: str
) -> None:
    poller_deployment(admin_api, namespace, **{"app.kubernetes.io/version": "9.8.7"})
    alice = user_kubeconfig(control_plane, "alice")
    shown = run(cli, "version", "--poller-namespace", namespace, kubeconfig=alice)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    # The server's version is everyone's to read (system:public-info-viewer).
    assert lines[1].startswith(f"Server Version: {server_version(admin_api)['gitVersion']} ")
    assert lines[2:] == [
        f'Poller Version: not shown: permission denied: user "alice" may not get '
        f'deployments.apps in namespace "{namespace}" '
        f"(check with: kubectl auth can-i get deployments.apps -n {namespace})"
    ]
    document = json.loads(
        run(cli, "version", "--poller-namespace", namespace, "-o", "json", kubeconfig=alice).stdout
    )
    assert document["pollerVersion"]["error"] == "Forbidden"
    assert "version" not in document["pollerVersion"]


def test_client_only_and_an_unreachable_cluster(cli: Cli, tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    client_only = run(cli, "version", "--client", kubeconfig=absent)
    assert client_only.returncode == 0, client_only.stderr
    assert client_only.stdout == f"Client Version: {buildinfo.version()} (revision 0123456)\n"
    as_json = run(cli, "version", "--client", "-o", "json", kubeconfig=absent)
    assert json.loads(as_json.stdout) == {
        "clientVersion": {"version": buildinfo.version(), "revision": SHA}
    }

    # The client's version first, then the error, as kubectl does.
    unreachable = run(cli, "version", kubeconfig=absent)
    assert unreachable.returncode == 7
    assert unreachable.stdout == client_only.stdout
    assert unreachable.stderr.startswith("error: ") and "does not exist" in unreachable.stderr
    partial = run(cli, "version", "-o", "json", kubeconfig=absent)
    assert partial.returncode == 7
    assert json.loads(partial.stdout) == json.loads(as_json.stdout)

    flag = run(cli, "--version", kubeconfig=absent)
    assert flag.returncode == 0, flag.stderr
    assert flag.stdout == f"lmeval {buildinfo.version()} (revision 0123456)\n"
