"""CA bundles wherever a job talks TLS, end to end (issue 34, items 2 and 3).

Four servers on 127.0.0.1, each behind a CA of its own that nothing else
trusts, each chain shaped like an OpenShift service-serving certificate
(`lmeval_sandbox.pki.service_serving_chain`: root, intermediate, leaf): an S3
server (versitygw), an OCI registry (docker-registry), a Git server (``git
http-backend`` behind basic auth) and the sample model server. Jobs run
through the poller, the local runner (the job pod as local processes), the
real driver, real git and real lm_eval (the dummy model where possible):

- one job whose S3 storage, registry and Git source each name their CA in
  their ``caBundle`` (one a Secret's key, two ConfigMaps'): it Succeeds, the
  fetch copied the prefix, the clone recorded its commit, the push named its
  digest; the setting ``trusted-ca-bundles`` names OpenShift's two
  ConfigMaps, which this namespace lacks, and the job runs all the same;
- the same parts without their CA, once each: the Git clone and the S3 fetch
  end the job Failed, the push (which never fails a job) leaves the job
  Succeeded with ``resultsArtifactError``; each message names the field and
  the setting;
- ``verifySSL: false`` ends the job Failed before any pod exists, naming the
  field and the setting ``allow-insecure-storage-endpoints``;
- a model endpoint trusted through the setting alone: the job names no CA,
  its namespace's ``openshift-service-ca.crt`` holds the root, the setting
  picks it up, and ``local-completions`` over HTTPS Succeeds; the absent
  ``odh-trusted-ca-bundle`` is noted in the pod log, not fatal.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.pki import ServiceChain, service_serving_chain
from lmeval_sandbox.runner import LocalRunner
from lmeval_sandbox.s3server import S3Server

from poller.cycle.reconciler import Reconciler
from poller.jobpod import gittasks, offline, trust
from tests import ociregistry
from tests.e2e.conftest import sample, submit
from tests.e2e.gitserver import GitHttp, commit_files, git
from tests.poller_fixtures import BASE_SETTINGS, Jobs, cycle_until, set_settings

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

LMEVAL_TIMEOUT = 240.0
OPENSHIFT = "odh-trusted-ca-bundle/ca-bundle.crt, openshift-service-ca.crt/service-ca.crt"
USER, PASSWORD = "alice", "ca-bundles-pass"
FIX = "or ask for it in the poller setting trusted-ca-bundles"


def _chain(tmp_path_factory: pytest.TempPathFactory, name: str) -> ServiceChain:
    return service_serving_chain(
        tmp_path_factory.mktemp(name), dns_names=("localhost",), ips=("127.0.0.1",)
    )


class Servers:
    """The four servers and their chains."""

    def __init__(
        self,
        s3: tuple[ServiceChain, S3Server],
        registry: tuple[ServiceChain, ociregistry.Registry],
        git: tuple[ServiceChain, GitHttp, str],
        model: tuple[ServiceChain, ModelServer],
    ) -> None:
        self.s3, self.registry, self.git, self.model = s3, registry, git, model


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    if not ociregistry.available():
        pytest.skip("docker-registry/skopeo")
    s3_chain, registry_chain = _chain(tmp_path_factory, "s3-pki"), _chain(tmp_path_factory, "oci")
    git_chain, model_chain = _chain(tmp_path_factory, "git-pki"), _chain(tmp_path_factory, "model")
    repos = tmp_path_factory.mktemp("git")
    git("init", "-q", "-b", "main", str(repos / "work"))
    commit = commit_files(repos / "work", {"README": "no tasks here\n"}, "1")
    git("clone", "-q", "--bare", str(repos / "work"), str(repos / "served" / "tasks.git"))
    with (
        S3Server(tmp_path_factory.mktemp("s3") / "data", tls=(s3_chain.served, s3_chain.key)) as s3,
        ociregistry.running(
            tmp_path_factory.mktemp("registry"),
            tls=(registry_chain.served, registry_chain.key),
            ca=registry_chain.root,
        ) as registry,
        GitHttp(
            repos / "served", USER, PASSWORD, tls=(git_chain.served, git_chain.key)
        ) as git_http,
        ModelServer(tls=(str(model_chain.served), str(model_chain.key))) as model,
    ):
        (s3.bucket("evals") / "team" / "hub").mkdir(parents=True)
        (s3.bucket("evals") / "team" / "hub" / "note.txt").write_text("fetched\n")
        yield Servers(
            (s3_chain, s3),
            (registry_chain, registry),
            (git_chain, git_http, commit),
            (model_chain, model),
        )


def _objects(jobs: Jobs, servers: Servers) -> None:
    """The CAs as a job's author keeps them, and the Secrets of the S3 and Git access."""
    s3_chain, s3 = servers.s3
    registry_chain, git_chain = servers.registry[0], servers.git[0]
    core = jobs.core
    core.create_namespaced_secret(
        jobs.namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="s3"),
            string_data={
                "id": s3.access_key,
                "secret": s3.secret_key,
                "bucket": "evals",
                "endpoint": s3.endpoint,
                "ca.pem": s3_chain.root.read_text(),
            },
        ),
    )
    for name, chain in (("registry-ca", registry_chain), ("git-ca", git_chain)):
        core.create_namespaced_config_map(
            jobs.namespace,
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=name), data={"ca.crt": chain.root.read_text()}
            ),
        )
    line = f"https://{USER}:{PASSWORD}@127.0.0.1:{servers.git[1].port}\n"
    core.create_namespaced_secret(
        jobs.namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="git-auth"), string_data={".git-credentials": line}
        ),
    )


def _s3(ca: bool) -> dict[str, Any]:
    s3: dict[str, Any] = {
        "accessKeyId": {"name": "s3", "key": "id"},
        "secretAccessKey": {"name": "s3", "key": "secret"},
        "bucket": {"name": "s3", "key": "bucket"},
        "endpoint": {"name": "s3", "key": "endpoint"},
        "path": "team",
    }
    if ca:
        s3["caBundle"] = {"secretKeyRef": {"name": "s3", "key": "ca.pem"}}
    return {"storage": {"s3": s3}}


def _oci(servers: Servers, ca: bool) -> dict[str, Any]:
    oci: dict[str, Any] = {"repository": f"{servers.registry[1].address}/team/evals"}
    if ca:
        oci["caBundle"] = {"configMapKeyRef": {"name": "registry-ca", "key": "ca.crt"}}
    return {"oci": oci}


def _git(servers: Servers, ca: bool) -> dict[str, Any]:
    source: dict[str, Any] = {
        "url": servers.git[1].url("tasks.git"),
        "credentialsSecret": "git-auth",
    }
    if ca:
        source["caBundle"] = {"configMapKeyRef": {"name": "git-ca", "key": "ca.crt"}}
    return {"git": source}


def _dummy(admin_api: client.ApiClient, jobs: Jobs, name: str, **spec: Any) -> None:
    """The dummy-model sample (its tasks ConfigMap) with `spec` added, as `name`."""
    _, job = sample("dummy-model")
    job = copy.deepcopy(job)
    job["metadata"]["name"] = name
    job["spec"].update(limit="4", **spec)
    if "customTasks" in spec:
        job["spec"]["customTasks"] = [{"configMap": "lmeval-sample-tasks"}, *spec["customTasks"]]
        job["spec"]["allowCodeExecution"] = True  # task files from Git
    submit(admin_api, jobs.namespace, job)


def _finished(poller: Reconciler, jobs: Jobs, name: str) -> dict[str, Any]:
    def complete() -> dict[str, Any] | None:
        status = jobs.status(name)
        return status if status.get("state") == "Complete" else None

    found: dict[str, Any] = cycle_until(
        poller, complete, timeout=LMEVAL_TIMEOUT, what=f"{name} Complete"
    )
    return found


@pytest.fixture
def settings(admin_api: client.ApiClient, poller: Reconciler) -> Reconciler:
    # Git task sources need code execution; the cluster's bundles are OpenShift's two.
    set_settings(
        admin_api,
        {**BASE_SETTINGS, "allow-code-execution": "true", "trusted-ca-bundles": OPENSHIFT},
    )
    return poller


def test_s3_registry_and_git_each_trusted_through_their_own_ca(
    settings: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    servers: Servers,
) -> None:
    _objects(jobs, servers)
    _dummy(
        admin_api,
        jobs,
        "trusted",
        offline=_s3(ca=True),
        outputs=_oci(servers, ca=True),
        customTasks=[_git(servers, ca=True)],
    )
    final = _finished(settings, jobs, "trusted")
    assert final["reason"] == "Succeeded", final.get("message")
    # The clone, the fetch and the push all went through.
    url, commit = servers.git[1].url("tasks.git"), servers.git[2]
    assert final["taskSources"] == [{"name": "customTasks[1]", "url": url, "commit": commit}]
    assert final["resultsArtifact"].startswith(f"{servers.registry[1].address}/team/evals@"), final
    assert "resultsArtifactError" not in final
    pod = jobs.pod(final["podName"])
    fetch_log = jobs.core.read_namespaced_pod_log(
        final["podName"], jobs.namespace, container=offline.FETCH_CONTAINER
    )
    assert "fetched 1 object(s)" in fetch_log, fetch_log
    # OpenShift's two ConfigMaps are absent here: noted, and skipped.
    assert "openshift-service-ca.crt/service-ca.crt is not in this namespace" in fetch_log
    names = [c.name for c in pod.spec.init_containers]
    assert names[:3] == ["git-1-ca", "git-1-init", "git-1-fetch"], names
    volume = next(v for v in pod.spec.volumes if v.name == trust.CLUSTER_VOLUME)
    assert all(s.config_map.optional for s in volume.projected.sources)
    root = runner.pod_root(jobs.namespace, final["podName"])
    assert root is not None
    written = (root / gittasks.CA_ROOT.lstrip("/") / "1.pem").read_bytes()
    assert written.endswith(servers.git[0].root.read_bytes())


def test_each_part_without_its_ca_is_refused_naming_its_field(
    settings: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    servers: Servers,
) -> None:
    _objects(jobs, servers)
    _dummy(admin_api, jobs, "untrusted-git", customTasks=[_git(servers, ca=False)])
    _dummy(admin_api, jobs, "untrusted-s3", offline=_s3(ca=False))
    _dummy(admin_api, jobs, "untrusted-registry", outputs=_oci(servers, ca=False))

    failed = _finished(settings, jobs, "untrusted-git")
    assert failed["reason"] == "Failed"
    assert failed["message"].startswith(
        f"spec.customTasks[1].git: fetching {servers.git[1].url('tasks.git')} failed, its "
        "certificate is not trusted ("
    ), failed["message"]
    assert failed["message"].endswith(f"spec.customTasks[1].git.caBundle, {FIX}")

    failed = _finished(settings, jobs, "untrusted-s3")
    assert failed["reason"] == "Failed"
    assert "init container fetch-storage exited 1" in failed["message"], failed["message"]
    assert (
        "spec.offline.storage.s3: the S3 endpoint's certificate is not trusted (certificate "
        "verify failed: unable to get local issuer certificate): give its CA in "
        f"spec.offline.storage.s3.caBundle, {FIX}"
    ) in failed["message"]

    # A push that fails never fails the job: status says why.
    pushed = _finished(settings, jobs, "untrusted-registry")
    assert pushed["reason"] == "Succeeded", pushed.get("message")
    assert "resultsArtifact" not in pushed
    assert pushed["resultsArtifactError"] == (
        "spec.outputs.oci: the registry's certificate is not trusted (certificate verify "
        "failed: unable to get local issuer certificate): give its CA in "
        f"spec.outputs.oci.caBundle, {FIX}"
    )


def test_verification_off_needs_the_setting(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, servers: Servers
) -> None:
    s3 = _s3(ca=False)
    s3["storage"]["s3"]["verifySSL"] = False
    _dummy(admin_api, jobs, "insecure-s3", offline=s3)
    failed = _finished(poller, jobs, "insecure-s3")
    assert failed["reason"] == "Failed"
    assert failed["message"].startswith("spec.offline.storage.s3.verifySSL: false turns TLS"), (
        failed["message"]
    )
    assert "allow-insecure-storage-endpoints: false" in failed["message"]
    assert not jobs.pods()


def test_a_model_endpoint_trusted_through_the_picked_up_bundle(
    settings: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    servers: Servers,
) -> None:
    chain, model = servers.model
    jobs.core.create_namespaced_config_map(
        jobs.namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="openshift-service-ca.crt"),
            data={"service-ca.crt": chain.root.read_text()},
        ),
    )
    _, job = sample("served-model", model.port)
    job = copy.deepcopy(job)
    job["metadata"]["name"] = "service-ca"
    for pair in job["spec"]["modelArgs"]:
        if pair["name"] == "base_url":
            pair["value"] = model.completions_url
    job["spec"]["limit"] = "2"
    assert model.completions_url.startswith("https://127.0.0.1:")
    assert "modelTLS" not in job["spec"]
    before = model.count("POST /v1/completions")
    submit(admin_api, jobs.namespace, job)
    final = _finished(settings, jobs, "service-ca")
    assert final["reason"] == "Succeeded", final.get("message")
    assert model.count("POST /v1/completions") > before
    log = jobs.core.read_namespaced_pod_log(final["podName"], jobs.namespace, container="lmeval")
    assert "trusted-ca-bundles: odh-trusted-ca-bundle/ca-bundle.crt is not in this namespace" in (
        log
    )
