"""Every LMEvalJob sample of the documentation is accepted by the API server as written.

The samples are found, not listed: every fenced ``yaml`` block of every
Markdown file that holds ``kind: LMEvalJob`` (all its documents, e.g. a
ConfigMap then the job), and every ``deploy/samples/*.yaml``. Each is
applied with ``kubectl apply --dry-run=server`` on the real control plane,
with the CRD (its schema, CEL rules and kubectl's strict field validation)
and every admission policy of ``deploy/admission`` in force, one test per
block or file (``README.md:62``), so a failure names the sample.

The requester is the one the documentation writes for: a namespace editor
(the built-in ``edit`` ClusterRole, into which ``lmeval-jobs-edit`` of
``deploy/base/user-roles.yaml`` aggregates) in a namespace made ready for
jobs by ``deploy/components/job-namespace``. Cluster-scoped documents are
applied by the admin. A namespace a sample names is replaced by that test
namespace: where jobs run is the installer's choice, the objects are the
sample's.

The policies are bound here to that namespace only (the plane is shared
with modules that make, as the admin, objects the claims policy would
refuse). Negative controls prove they are live: a sample's job with
``allowCodeExecution`` added is refused by the requester-rights policy for
an author who holds ``lmeval-jobs-edit`` and ``view`` (no pod rights) and admitted
for the editor; a sample's ConfigMap claiming to be the poller's is refused
by the claims policy; a misspelt field is refused by strict validation.
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.deployed import apply_job_namespace
from lmeval_sandbox.identities import user_kubeconfig

from poller import api
from tests import docs
from tests.deploy.conftest import DEPLOY, documents
from tests.deploy.policies import apply_policy, bound_to
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

SAMPLES_DIR = DEPLOY / "samples"
POLICY_FILES = sorted((DEPLOY / "admission").glob("*.yaml"))
REQUESTER_RIGHTS = "lmevaljob-requester-rights"
CLAIMS = "lmeval-poller-claims"
JOB_KIND_LINE = re.compile(r"^\s*kind:\s*[\"']?LMEvalJob[\"']?\s*$", re.M)


@dataclass(frozen=True)
class Sample:
    where: str  # README.md:62 or deploy/samples/dummy-model.yaml
    text: str


def samples() -> list[Sample]:
    """Every job sample of the docs, by block, then every file of deploy/samples."""
    blocks = [
        Sample(block.where, block.text)
        for path in docs.markdown_files()
        for block in docs.blocks(path)
        if block.language in ("yaml", "yml") and JOB_KIND_LINE.search(block.text)
    ]
    files = [
        Sample(str(path.relative_to(docs.REPO_ROOT)), path.read_text())
        for path in sorted(SAMPLES_DIR.glob("*.yaml"))
    ]
    return blocks + files


SAMPLES = samples()


@dataclass
class Namespace:
    plane: ControlPlane
    name: str
    editor: Path  # kubeconfig of a namespace editor
    author: Path  # kubeconfig of an author with lmeval-jobs-edit and view: no pod rights
    cluster_scoped: frozenset[str]  # kinds the API server serves cluster-scoped

    def dry_run(self, docs_: list[dict[str, Any]], kubeconfig: Path) -> tuple[int, str]:
        done = self.plane.kubectl(
            "apply",
            "--dry-run=server",
            "-n",
            self.name,
            "-f",
            "-",
            kubeconfig=kubeconfig,
            input_text=yaml.safe_dump_all(docs_),
            check=False,
        )
        return done.returncode, done.stderr + done.stdout


def _policy_names() -> list[tuple[Path, str]]:
    found = []
    for path in POLICY_FILES:
        for doc in documents(path.read_text()):
            if doc.get("kind") == "ValidatingAdmissionPolicy":
                found.append((path, str(doc["metadata"]["name"])))
    return found


KSERVE_READER = "doc-samples-inferenceservice-reader"


def _grant(plane: ControlPlane, namespace: str, user: str, cluster_role: str) -> None:
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{user}-{cluster_role}", "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": cluster_role,
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    plane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(binding))


def _cluster_scoped_kinds(plane: ControlPlane) -> frozenset[str]:
    out = plane.kubectl("api-resources", "--namespaced=false", "--no-headers").stdout
    return frozenset(line.split()[-1] for line in out.splitlines() if line.strip())


def _probe_job(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {"name": "probe"},
        "spec": {"model": "dummy", "tasks": ["t"], **spec},
    }


@pytest.fixture(scope="module")
def ns(
    poller_installed: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Namespace]:
    """A job namespace with every admission policy bound to it, an editor and an author."""
    plane = poller_installed
    plane.kubectl("apply", "-f", str(DEPLOY / "base" / "user-roles.yaml"))
    name = f"doc-samples-{uuid.uuid4().hex[:5]}"
    apply_job_namespace(plane, tmp_path_factory.mktemp("doc-samples"), name)
    _grant(plane, name, "doc-editor", "edit")
    # On a KServe cluster, whoever edits a namespace's suites reads its
    # InferenceServices (a suite's model trigger names one); this plane has no
    # KServe, hence no role of KServe's that says so: this one does.
    reader = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": KSERVE_READER},
        "rules": [
            {
                "apiGroups": ["serving.kserve.io"],
                "resources": ["inferenceservices"],
                "verbs": ["get", "list", "watch"],
            }
        ],
    }
    plane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(reader))
    _grant(plane, name, "doc-editor", KSERVE_READER)
    _grant(plane, name, "doc-author", "lmeval-jobs-edit")
    _grant(plane, name, "doc-author", "view")  # reads the ConfigMaps, creates no pods
    here = Namespace(
        plane,
        name,
        user_kubeconfig(plane, "doc-editor"),
        user_kubeconfig(plane, "doc-author"),
        _cluster_scoped_kinds(plane),
    )
    policies = _policy_names()
    assert {REQUESTER_RIGHTS, CLAIMS} <= {p for _, p in policies}, policies

    def in_force() -> bool:
        # RBAC's aggregation and the bindings reach the caches asynchronously.
        editor, _ = here.dry_run([_probe_job(allowCodeExecution=True)], here.editor)
        author, message = here.dry_run([_probe_job(allowCodeExecution=True)], here.author)
        return editor == 0 and author != 0 and REQUESTER_RIGHTS in message

    with ExitStack() as bindings:
        for path, policy in policies:
            apply_policy(plane, path, policy)
            # Each binding waits on the last: the requester-rights one is the probe.
            bindings.enter_context(bound_to(plane, policy, name, lambda: True))
        wait_for(in_force, timeout=60, interval=0.5, what="RBAC and the policies in force")
        yield here
    plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _in_namespace(ns: Namespace, loaded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    placed = copy.deepcopy(loaded)
    for doc in placed:
        if doc.get("kind") not in ns.cluster_scoped:
            doc.setdefault("metadata", {})["namespace"] = ns.name
    return placed


def _load(sample: Sample) -> list[dict[str, Any]]:
    try:
        loaded = [d for d in yaml.safe_load_all(sample.text) if d is not None]
    except yaml.YAMLError as error:
        raise AssertionError(f"{sample.where} is not valid YAML: {error}") from None
    assert all(isinstance(d, dict) for d in loaded), f"{sample.where}: a document is not a mapping"
    return loaded


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.where for s in SAMPLES])
def test_sample_is_accepted_by_a_server_side_dry_run(ns: Namespace, sample: Sample) -> None:
    loaded = _in_namespace(ns, _load(sample))
    cluster = [d for d in loaded if d.get("kind") in ns.cluster_scoped]
    if cluster:
        code, out = ns.dry_run(cluster, ns.plane.kubeconfig)
        assert code == 0, f"{sample.where} (cluster-scoped part, as the admin):\n{out}"
    namespaced = [d for d in loaded if d.get("kind") not in ns.cluster_scoped]
    code, out = ns.dry_run(namespaced, ns.editor)
    assert code == 0, f"{sample.where} (as a namespace editor):\n{out}"
    kinds = [d.get("kind") for d in namespaced]
    # kubectl names each object it would have made: none went unapplied.
    assert out.count("(server dry run)") == len(namespaced), (kinds, out)


def _first_job_sample() -> tuple[Sample, list[dict[str, Any]]]:
    for sample in SAMPLES:
        try:
            loaded = _load(sample)
        except AssertionError:
            continue
        if any(d.get("kind") == api.KIND for d in loaded):
            return sample, loaded
    raise AssertionError("no sample with an LMEvalJob found in the docs or deploy/samples")


def test_samples_were_found() -> None:
    wheres = [s.where for s in SAMPLES]
    assert any(w.startswith("README.md:") for w in wheres), wheres
    assert any(w.startswith("deploy/samples/") for w in wheres), wheres


def test_the_policies_refuse_a_sample_made_forbidden(ns: Namespace) -> None:
    sample, loaded = _first_job_sample()
    job = copy.deepcopy(next(d for d in loaded if d.get("kind") == api.KIND))
    job["spec"]["allowCodeExecution"] = True
    (job,) = _in_namespace(ns, [job])
    code, message = ns.dry_run([job], ns.author)
    assert code != 0 and REQUESTER_RIGHTS in message, (sample.where, message)
    assert "spec.allowCodeExecution" in message and "create pods" in message, message
    # The same job is the editor's to run: the refusal is about rights.
    assert ns.dry_run([job], ns.editor)[0] == 0

    claimed = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "claims-to-be-the-pollers",
            "labels": {"app.kubernetes.io/managed-by": "lmeval-poller"},
        },
        "data": {"k": "v"},
    }
    code, message = ns.dry_run(_in_namespace(ns, [claimed]), ns.editor)
    assert code != 0 and CLAIMS in message, message


def test_strict_validation_refuses_a_misspelt_field(ns: Namespace) -> None:
    _, loaded = _first_job_sample()
    job = copy.deepcopy(next(d for d in loaded if d.get("kind") == api.KIND))
    job["spec"]["modle"] = job["spec"].pop("model")
    code, message = ns.dry_run(_in_namespace(ns, [job]), ns.editor)
    assert code != 0 and 'unknown field "spec.modle"' in message, message


def test_dry_run_changes_nothing(ns: Namespace) -> None:
    listed = ns.plane.kubectl(
        "get", f"{api.PLURAL},configmaps", "-n", ns.name, "-o", "name"
    ).stdout.split()
    # Only what every namespace gets (the CA bundle): no sample was made for real.
    assert listed == ["configmap/kube-root-ca.crt"], listed
