"""A newcomer following the README on a real node; then every runnable block and every
real-cluster sample, against that same installation.

One fresh plane and real node, with this checkout's release in a registry on
loopback (``current_release``, shared with tests/node/test_release.py), and
one install, done with the README's ``<!-- install: kubectl -->`` commands
($RELEASE pointed at the local release folder). Then, as a newcomer would:

- the README's ``<!-- first-job -->`` YAML is saved as ``first-job.yaml`` and
  applied with ``kubectl apply -f first-job.yaml``; the
  ``<!-- first-job: results -->`` block runs in bash (``-e -o pipefail``),
  with the sandbox's kubectl and this environment's ``lmeval`` first on PATH
  and KUBECONFIG naming the cluster. It must exit 0, the job must end
  Succeeded, and its output must show each task of the job with one of its
  scores (as the status holds them);
- every ``<!-- runnable -->`` bash block of every Markdown file runs the same
  way, from the root of the checkout (as a reader in a clone would), and must
  exit 0, one test per block (``deploy/INSTALL.md:40``). The marker exists so
  that examples are run, so at least one block must carry it: with none,
  ``test_the_docs_have_runnable_blocks`` fails saying so (an empty set would
  otherwise pass by checking nothing);
- every ``deploy/samples/*.yaml`` whose jobs need nothing outside the cluster
  is applied, with the ConfigMaps from the samples that its jobs name, and each
  of its jobs must end Succeeded. "Nothing outside" is read from each job's
  spec (`outside_needs`): no model endpoint (``base_url``/``baseUrl`` or any
  URL), no Git, no storage (``storage``, ``s3``, claims), no OCI registry, no
  image to pull (a sidecar's), no ``allowOnline`` and no ``allowCodeExecution``
  (which needs the operator's setting). At least one sample must qualify.

The jobs run with the release's defaults (10 s poll interval); this module
adds about four minutes to a warm run, most of it the release's build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from poller import api
from tests import docs
from tests.node.conftest import (
    JOBS_NS,
    README,
    LocalRelease,
    NodeCluster,
    NodeSlot,
    release_plane,
    run_readme_install,
)

pytestmark = [pytest.mark.node, pytest.mark.fresh_plane, pytest.mark.lmeval]

SAMPLES_DIR = docs.REPO_ROOT / "deploy" / "samples"
SHELLS = ("bash", "sh")
RUNNABLE = docs.marked_blocks("runnable")
# What a job's spec may hold that reaches outside the cluster, and what that is.
OUTSIDE = {
    "base_url": "a model endpoint",
    "baseUrl": "a model endpoint",
    "git": "a Git server",
    "storage": "storage outside the cluster",
    "s3": "an S3 bucket",
    "oci": "an OCI registry",
    "pvcName": "a claim made beforehand",
    "pvcManaged": "a StorageClass",
    "image": "an image to pull",
    "allowOnline": "the network",
    "allowCodeExecution": "the operator's allow-code-execution setting",
}


@dataclass(frozen=True)
class Installed:
    cluster: NodeCluster
    env: dict[str, str]  # PATH with the sandbox's kubectl and lmeval; KUBECONFIG
    workdir: Path


@pytest.fixture(scope="module")
def installed(
    node_slot: NodeSlot, current_release: LocalRelease, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    """A fresh real-node cluster with the release installed as the README says."""
    work = tmp_path_factory.mktemp("readme")
    with release_plane(node_slot, current_release.registry_port, work / "cluster") as cluster:
        started = time.monotonic()
        run_readme_install(cluster, "kubectl", current_release.release)
        print(f"\nREADME install: {time.monotonic() - started:.1f} s")
        # Only these two, ahead of the machine's own PATH (which may hold another kubectl).
        tools = work / "bin"
        tools.mkdir()
        assert cluster.plane.binaries is not None
        (tools / "kubectl").symlink_to(cluster.plane.binaries / "kubectl")
        (tools / "lmeval").symlink_to(Path(sysconfig.get_path("scripts")) / "lmeval")
        env = {
            **os.environ,
            "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(cluster.plane.kubeconfig),
        }
        yield Installed(cluster, env, work)


def run(
    installed: Installed, argv: list[str], cwd: Path, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=installed.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def bash(installed: Installed, script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A documented block as a reader pastes it, stopping at the first failing command."""
    return run(installed, ["bash", "-e", "-o", "pipefail", "-c", script], cwd)


def shown(value: float) -> set[str]:
    """How a score may be printed: as JSON holds it, or rounded for a table."""
    return {json.dumps(value), f"{value:.4f}", f"{value:.3f}", f"{value:.2f}"}


# -- the README, as a newcomer -----------------------------------------------------------------


# The first test bears the module's setup: the release's build and, when the
# tree changed since the last run, the development images the node starts with
# (each several minutes cold; a warm setup takes about two).
@pytest.mark.timeout(1800)
def test_first_job_as_the_readme_says(installed: Installed) -> None:
    cluster = installed.cluster
    firsts = docs.marked_blocks("first-job", [README], "yaml")
    readers = docs.marked_blocks("first-job: results", [README], "bash")
    assert len(firsts) == 1, f"README.md: {len(firsts)} <!-- first-job --> yaml blocks"
    assert len(readers) == 1, f"README.md: {len(readers)} <!-- first-job: results --> blocks"
    documents = [d for d in yaml.safe_load_all(firsts[0].text) if d]
    (job,) = [d for d in documents if d.get("kind") == api.KIND]
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    assert "pod" not in job["spec"], "the first job must run on any cluster as written"

    started = time.monotonic()
    (installed.workdir / "first-job.yaml").write_text(firsts[0].text)
    applied = run(installed, ["kubectl", "apply", "-f", "first-job.yaml"], installed.workdir)
    assert applied.returncode == 0, applied.stderr
    done = bash(installed, readers[0].text, installed.workdir)
    output = done.stdout + done.stderr
    print(f"\nfirst job, applied to results read: {time.monotonic() - started:.1f} s\n{output}")
    assert done.returncode == 0, f"{readers[0].where} exited {done.returncode}:\n{output}"

    status = cluster.job_status(namespace, name)
    assert status.get("reason") == "Succeeded", (status, cluster.diagnostics(namespace))
    scores = json.loads(status["results"])["results"]
    for task in job["spec"]["tasks"]:
        assert task in done.stdout, f"{task} not in the output of {readers[0].where}"
        values = {
            printed
            for metric, value in scores[task].items()
            if isinstance(value, float) and "stderr" not in metric
            for printed in shown(value)
        }
        assert values, scores[task]
        assert any(v in done.stdout for v in values), (task, sorted(values), done.stdout)


# -- every runnable block ----------------------------------------------------------------------


def test_the_docs_have_runnable_blocks() -> None:
    assert RUNNABLE, (
        "no Markdown file marks a shell block <!-- runnable -->: the docs' examples "
        "would go unexecuted"
    )


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_runnable_block_exits_0(installed: Installed, block: docs.Block) -> None:
    assert block.language in SHELLS, f"{block.where}: runnable, but a {block.language!r} block"
    done = bash(installed, block.text, docs.REPO_ROOT)
    assert done.returncode == 0, (
        f"{block.where} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )


# -- the samples that run on any cluster -------------------------------------------------------


def outside_needs(spec: Any, path: str = "spec") -> list[str]:
    """What of `spec` reaches outside the cluster, as ``field (what)``."""
    found: list[str] = []
    if isinstance(spec, dict):
        for key, value in spec.items():
            if key in OUTSIDE and value not in (None, False):
                found.append(f"{path}.{key} ({OUTSIDE[key]})")
            found += outside_needs(value, f"{path}.{key}")
    elif isinstance(spec, list):
        for index, item in enumerate(spec):
            # modelArgs and genArgs: [{name, value}]
            if isinstance(item, dict) and item.get("name") in OUTSIDE:
                found.append(f"{path}[{index}] {item['name']} ({OUTSIDE[item['name']]})")
            found += outside_needs(item, f"{path}[{index}]")
    elif isinstance(spec, str) and "://" in spec:
        found.append(f"{path} ({spec})")
    return found


def test_outside_needs() -> None:
    assert outside_needs({"model": "dummy", "tasks": ["t"], "pod": {"nodeSelector": {}}}) == []
    assert outside_needs(
        {"modelArgs": [{"name": "base_url", "value": "http://m:8000/v1"}], "outputs": {"oci": {}}}
    ) == [
        "spec.modelArgs[0] base_url (a model endpoint)",
        "spec.modelArgs[0].value (http://m:8000/v1)",
        "spec.outputs.oci (an OCI registry)",
    ]
    assert outside_needs({"allowCodeExecution": False, "logSamples": True}) == []


def _sample_documents() -> dict[str, list[dict[str, Any]]]:
    return {
        path.name: [d for d in yaml.safe_load_all(path.read_text()) if d]
        for path in sorted(SAMPLES_DIR.glob("*.yaml"))
    }


def _strings(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set().union(*(_strings(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_strings(v) for v in value))
    return {value} if isinstance(value, str) else set()


def test_real_cluster_samples_run_to_succeeded(installed: Installed) -> None:
    cluster = installed.cluster
    samples = _sample_documents()
    config_maps = {
        d["metadata"]["name"]: d
        for documents in samples.values()
        for d in documents
        if d.get("kind") == "ConfigMap"
    }
    chosen: dict[str, list[str]] = {}  # file -> its jobs
    left_out: dict[str, list[str]] = {}
    applied: list[dict[str, Any]] = []
    for name, documents in samples.items():
        jobs = [d for d in documents if d.get("kind") == api.KIND]
        needs = [n for job in jobs for n in outside_needs(job.get("spec", {}))]
        if not jobs or needs:
            left_out[name] = needs or ["no LMEvalJob"]
            continue
        chosen[name] = [job["metadata"]["name"] for job in jobs]
        own = {d["metadata"]["name"] for d in documents if d.get("kind") == "ConfigMap"}
        named = set().union(*(_strings(job["spec"]) for job in jobs)) & set(config_maps)
        applied += [config_maps[n] for n in sorted(named - own)] + documents
    print(f"\nsamples run: {chosen}\nleft out: {json.dumps(left_out, indent=1)}")
    assert chosen, f"no sample in deploy/samples runs on a cluster alone: {left_out}"
    names = [job for jobs in chosen.values() for job in jobs]
    assert len(set(names)) == len(names), f"two samples share a job name: {names}"

    started = time.monotonic()
    cluster.plane.kubectl(
        "apply", "-n", JOBS_NS, "-f", "-", input_text=yaml.safe_dump_all(applied), timeout=120
    )
    failed = {}
    for job in names:
        status = cluster.wait_final(JOBS_NS, job, timeout=420)
        if status.get("reason") != "Succeeded":
            failed[job] = f"{status.get('reason')}: {status.get('message')}"
    print(f"samples to their end: {time.monotonic() - started:.1f} s")
    assert not failed, f"{failed}\n{cluster.diagnostics(JOBS_NS)}"
