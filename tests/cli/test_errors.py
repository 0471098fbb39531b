"""Errors a person can act on, and the kubeconfig rules, on the real control plane.

Checks: a 404 for the LMEvalJob collection (the apiserver's real answer for
an unserved version of our group, i.e. what a cluster without the CRD
answers) maps to "LMEvalJob API not found ... is the lmeval poller
installed?" (exit 5), while a 404 naming a job maps to "not found" (exit 4).
The missing CRD is tested on the mapping function with that captured body,
not end to end: the CRD is cluster-wide and installed for the whole test
session. A user without RBAC gets exit 6 and a message naming the user, the
verb, the resource and the namespace; a viewer may list but not cancel, and
``get`` still works without the right to read events. A mistyped job name
gets "did you mean", a job in another namespace is pointed at. The context
and namespace come from ``$KUBECONFIG`` (several files) like kubectl; an
unknown context or an unreachable server is exit 7; bad flags are exit 3.
The console scripts work as ``lmeval`` and as a kubectl plugin.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from lmeval_cli.client import JOBS_PREFIX, Cluster
from lmeval_cli.errors import API_NOT_FOUND, ApiError, ExitCode, explain
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.identities import user_kubeconfig

from poller import api
from tests.cli.conftest import REPO, Cli, cli_env
from tests.poller_fixtures import Jobs

pytestmark = pytest.mark.cluster

USER_ROLES = REPO / "deploy" / "base" / "user-roles.yaml"


def _captured(cluster: Cluster, path: str, name: str | None = None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        cluster.request(
            "GET",
            path,
            verb="get" if name else "list",
            resource=api.PLURAL,
            group=api.API_GROUP,
            namespace="default",
            name=name,
        )
    return caught.value


def test_missing_crd_and_missing_job_are_told_apart(admin_api: client.ApiClient, cli: Cli) -> None:
    cluster = Cluster(admin_api, "default")
    # What a cluster without the CRD answers: our group/version is not served.
    unserved = _captured(cluster, f"/apis/{api.API_GROUP}/v0alpha0/namespaces/default/{api.PLURAL}")
    assert unserved.status == 404 and "name" not in unserved.details
    mapped = explain(unserved)
    assert mapped.code == ExitCode.NOT_INSTALLED == 5
    assert mapped.message == API_NOT_FOUND
    assert "is the lmeval poller installed? (kubectl apply -k deploy/overlays/kubernetes)" in (
        mapped.message
    )

    missing_job = _captured(
        cluster, f"{JOBS_PREFIX}/namespaces/default/{api.PLURAL}/nothing", name="nothing"
    )
    assert explain(missing_job).code == ExitCode.NOT_FOUND


def test_user_without_rights_is_told_which_verb_on_what(
    cli: Cli, control_plane: ControlPlane, jobs: Jobs
) -> None:
    kubeconfig = user_kubeconfig(control_plane, "alice")
    listed = cli("list", kubeconfig=kubeconfig)
    assert listed.returncode == ExitCode.FORBIDDEN == 6
    assert (
        f'error: permission denied: user "alice" may not list '
        f'lmevaljobs.foundation-model-stack.github.com in namespace "{jobs.namespace}"'
    ) in listed.stderr
    assert "lmeval-jobs-view ClusterRole" in listed.stderr
    assert f"kubectl auth can-i list lmevaljobs.{api.API_GROUP} -n {jobs.namespace}" in (
        listed.stderr
    )

    submitted = cli("submit", "--model=dummy", "--task=toy_mc", kubeconfig=kubeconfig)
    assert submitted.returncode == 6
    assert 'user "alice" may not create lmevaljobs' in submitted.stderr
    assert "lmeval-jobs-edit" in submitted.stderr


def test_viewer_may_read_but_not_cancel(
    cli: Cli, control_plane: ControlPlane, admin_api: client.ApiClient, jobs: Jobs
) -> None:
    control_plane.kubectl("apply", "-f", str(USER_ROLES))
    client.RbacAuthorizationV1Api(admin_api).create_namespaced_role_binding(
        jobs.namespace,
        {
            "metadata": {"name": "bob-views"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "lmeval-jobs-view",
            },
            "subjects": [{"kind": "User", "name": "bob", "apiGroup": "rbac.authorization.k8s.io"}],
        },
    )
    jobs.create("watched")
    kubeconfig = user_kubeconfig(control_plane, "bob")

    listed = cli("list", kubeconfig=kubeconfig)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[:2] == ["watched", "New"]

    shown = cli("get", "watched", kubeconfig=kubeconfig)
    assert shown.returncode == 0, shown.stderr
    assert 'not shown: permission denied: user "bob" may not list events' in shown.stdout

    cancelled = cli("cancel", "watched", kubeconfig=kubeconfig)
    assert cancelled.returncode == 6
    assert (
        f'user "bob" may not patch lmevaljobs.{api.API_GROUP} in namespace "{jobs.namespace}"'
        in cancelled.stderr
    )
    assert "lmeval-jobs-edit" in cancelled.stderr
    assert "cancel" not in jobs.get("watched")["spec"]


def test_job_not_found_suggests_names(cli: Cli, jobs: Jobs) -> None:
    jobs.create("llama-3-mmlu")
    jobs.create("llama-3-arc")
    typo = cli("get", "llama-3-mmul")
    assert typo.returncode == ExitCode.NOT_FOUND == 4
    assert (
        f'error: LMEvalJob "llama-3-mmul" not found in namespace "{jobs.namespace}": '
        'did you mean "llama-3-mmlu"?'
    ) in typo.stderr

    for command in (["logs", "nothing-like-it"], ["wait", "nothing-like-it"]):
        result = cli(*command)
        assert result.returncode == 4, result.stderr
        assert 'LMEvalJob "nothing-like-it" not found' in result.stderr

    elsewhere = cli("results", "llama-3-arc", "-n", "default")
    assert elsewhere.returncode == 4
    assert f"a job of that name exists in namespace {jobs.namespace}: use -n" in elsewhere.stderr


def _kubeconfig_with(source: Path, target: Path, **context: str) -> Path:
    config = yaml.safe_load(source.read_text())
    config["contexts"][0]["context"].update(context)
    target.write_text(yaml.safe_dump(config))
    return target


def test_kubeconfig_context_and_namespace_like_kubectl(
    cli: Cli, control_plane: ControlPlane, jobs: Jobs, tmp_path: Path
) -> None:
    jobs.create("here")
    scoped = _kubeconfig_with(
        control_plane.kubeconfig, tmp_path / "scoped", namespace=jobs.namespace
    )
    env = {
        **cli_env(),
        "KUBECONFIG": os.pathsep.join([str(tmp_path / "absent"), str(scoped)]),
    }
    # No --kubeconfig, no -n: both come from $KUBECONFIG and its context.
    listed = subprocess.run(
        [sys.executable, "-m", "lmeval_cli", "list"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[0] == "here"

    unknown = cli("list", "--context", "nope")
    assert unknown.returncode == ExitCode.CLUSTER == 7
    assert 'context "nope" not found' in unknown.stderr and "(contexts: sandbox)" in unknown.stderr

    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    dead = tmp_path / "dead"
    dead.write_text(yaml.safe_dump(config))
    unreachable = cli("list", kubeconfig=dead)
    assert unreachable.returncode == 7
    assert "cannot reach the API server at https://127.0.0.1:1" in unreachable.stderr

    absent = cli("list", kubeconfig=tmp_path / "absent")
    assert absent.returncode == 7 and "does not exist" in absent.stderr


def test_usage_errors_and_console_scripts(cli: Cli, control_plane: ControlPlane) -> None:
    bad_flag = cli("list", "--bogus")
    assert bad_flag.returncode == ExitCode.USAGE == 3
    assert "unrecognized arguments: --bogus" in bad_flag.stderr
    bad_timeout = cli("wait", "x", "--timeout", "soon")
    assert bad_timeout.returncode == 3 and "--timeout: not a duration" in bad_timeout.stderr

    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "kubectl-lmeval").exists():
        pytest.skip("console scripts not installed: pip install -e . first")
    for script, prog in (("lmeval", "usage: lmeval"), ("kubectl-lmeval", "usage: kubectl lmeval")):
        shown = subprocess.run(
            [str(bin_dir / script), "--help"], capture_output=True, text=True, check=False
        )
        assert shown.returncode == 0 and shown.stdout.startswith(prog), shown.stderr
        assert "exit codes:" in shown.stdout
    # kubectl finds the plugin on PATH: `kubectl lmeval ...`.
    kubectl = shutil.which("kubectl", path=str(control_plane.binaries))
    assert kubectl is not None
    plugin = subprocess.run(
        [kubectl, "lmeval", f"--kubeconfig={cli.kubeconfig}", "-n", cli.namespace, "list"],
        capture_output=True,
        text=True,
        env={**cli_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
        timeout=60,
        check=False,
    )
    assert plugin.returncode == 0, plugin.stderr
    assert f"No LMEvalJobs found in namespace {cli.namespace}." in plugin.stderr
