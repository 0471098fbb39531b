"""Whom the job pod trusts, on the real node: the cluster's CA bundles and each endpoint's own.

Checks, with the poller deployed in-cluster and job pods run by the kubelet:

- **a service-serving certificate, as OpenShift issues them**: a model server
  Pod behind a Service ``model`` presents a certificate for
  ``model.<namespace>.svc`` signed by an intermediate CA under a root that
  only the namespace's ``openshift-service-ca.crt`` ConfigMap holds. The job
  dials ``https://model.<namespace>.svc:8443`` (resolved by the node's
  cluster DNS through the kubelet's search path, reached through
  kube-proxy) and names no CA at all. Before the ConfigMap exists, the job
  ends Failed saying the certificate was not trusted; once it exists, the
  poller setting ``trusted-ca-bundles`` (OpenShift's two ConfigMaps, the
  other one absent from the namespace) makes the same job Succeed;
- **an S3 endpoint, a registry and a Git server, each with a CA of its own**
  (servers on the node's bridge address: versitygw, Debian's
  docker-registry, ``git http-backend``): one job naming each CA in the
  part's ``caBundle`` Succeeds with the prefix fetched by the job image's
  init container, the commit cloned by the git image's and the results
  pushed by the driver; the same job without each CA, once per part, is
  refused with a message naming that part's field (the S3 fetch and the Git
  clone end the job Failed; the push, which never fails a job, leaves
  ``resultsArtifactError``).
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox import pki
from lmeval_sandbox.nodeconfig import NODE_IP
from lmeval_sandbox.s3server import S3Server

from poller.api.settings import Settings
from tests import ociregistry
from tests.e2e.gitserver import GitHttp, commit_files, git
from tests.node.conftest import NodeCluster, job_body
from tests.waiting import wait_for

pytestmark = [pytest.mark.node, pytest.mark.lmeval]

SERVICE_PORT = 8443
# OpenShift's two, as deploy/samples documents them; only the second exists here.
OPENSHIFT_BUNDLES = "odh-trusted-ca-bundle/ca-bundle.crt, openshift-service-ca.crt/service-ca.crt"
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _model_service(cluster: NodeCluster, namespace: str, chain: pki.ServiceChain) -> None:
    """The sample model server as a Pod behind Service ``model``, serving `chain`'s leaf."""
    labels = {"app": "model"}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "model-tls"},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": _b64(chain.served), "tls.key": _b64(chain.key)},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "model", "labels": labels},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "model",
                    "image": cluster.image_refs["model_server"],
                    # The pod's own address, behind the Service (never the machine's).
                    "env": [
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                    "args": [
                        "--pod-ip",
                        "--host=$(POD_IP)",
                        f"--port={SERVICE_PORT}",
                        "--tls-cert=/tls/tls.crt",
                        "--tls-key=/tls/tls.key",
                    ],
                    "ports": [{"containerPort": SERVICE_PORT}],
                    "securityContext": RESTRICTED,
                    "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": True}],
                    "readinessProbe": {
                        "tcpSocket": {"port": SERVICE_PORT},
                        "periodSeconds": 1,
                    },
                }
            ],
            "volumes": [{"name": "tls", "secret": {"secretName": "model-tls"}}],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "model"},
        "spec": {
            "selector": labels,
            "ports": [{"port": SERVICE_PORT, "targetPort": SERVICE_PORT}],
        },
    }
    cluster.apply(secret, pod, service, namespace=namespace)

    def ready() -> bool:
        conditions = cluster.get("pod", "model", namespace).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    try:
        wait_for(ready, timeout=120, interval=0.5, what=f"model server pod in {namespace}")
    except AssertionError as error:
        pod_state = cluster.kubectl("describe", "pod", "model", "-n", namespace, check=False)
        logs = cluster.kubectl("logs", "model", "-n", namespace, "--tail=20", check=False)
        raise AssertionError(f"{error}\n{pod_state[-3000:]}\n{logs}") from None


def _served_over_service(name: str, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    configmap, job = job_body("served-model", name)
    job = copy.deepcopy(job)
    for pair in job["spec"]["modelArgs"]:
        if pair["name"] == "base_url":
            pair["value"] = f"https://model.{namespace}.svc:{SERVICE_PORT}/v1/completions"
        if pair["name"] == "model":
            pair["value"] = "toy"
    return configmap, job


def test_service_serving_certificate_trusted_through_the_picked_up_bundle(
    node_cluster: NodeCluster, job_namespace: str, tmp_path: Path
) -> None:
    namespace = job_namespace
    chain = pki.service_serving_chain(
        tmp_path / "service-ca",
        dns_names=(f"model.{namespace}.svc", f"model.{namespace}.svc.cluster.local"),
    )
    _model_service(node_cluster, namespace, chain)
    before = node_cluster.settings.get("trusted-ca-bundles", "")
    node_cluster.set_settings(trusted_ca_bundles=OPENSHIFT_BUNDLES)
    try:
        # Without the service CA's ConfigMap, the bundle's sources are absent:
        # the job runs, and the model server's certificate is not trusted.
        configmap, job = _served_over_service("untrusted", namespace)
        node_cluster.apply(configmap, job, namespace=namespace)
        refused = node_cluster.wait_final(namespace, "untrusted")
        assert refused["reason"] == "Failed", refused
        assert "certificate" in refused["message"].lower(), refused["message"]

        service_ca = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "openshift-service-ca.crt"},
            "data": {"service-ca.crt": chain.root.read_text()},
        }
        _, job = _served_over_service("trusted", namespace)
        node_cluster.apply(service_ca, job, namespace=namespace)
        status = node_cluster.wait_final(namespace, "trusted")
        assert status["reason"] == "Succeeded", status.get("message")
        assert "sample_arith_mc" in status["results"]
        # The job itself named no CA: the trust came from the setting.
        assert "modelTLS" not in node_cluster.get("lmevaljob", "trusted", namespace)["spec"]
    finally:
        node_cluster.set_settings(trusted_ca_bundles=before)


USER, PASSWORD = "alice", "node-trust-pass"


def _chain(directory: Path) -> pki.ServiceChain:
    return pki.service_serving_chain(directory, ips=(NODE_IP,))


def _storage_job(
    name: str, s3: S3Server, registry: ociregistry.Registry, git_url: str, *, without: str
) -> dict[str, Any]:
    """The dummy-model sample fetching from `s3`, cloning `git_url`, pushing to
    `registry`: each part names its CA, except the one `without` names."""
    storage: dict[str, Any] = {
        "accessKeyId": {"name": "s3", "key": "id"},
        "secretAccessKey": {"name": "s3", "key": "secret"},
        "bucket": {"name": "s3", "key": "bucket"},
        "endpoint": {"name": "s3", "key": "endpoint"},
        "path": "team",
    }
    oci: dict[str, Any] = {"repository": f"{registry.address}/team/evals", "tag": name}
    source: dict[str, Any] = {"url": git_url, "credentialsSecret": "git-auth"}
    if without != "s3":
        storage["caBundle"] = {"secretKeyRef": {"name": "s3", "key": "ca.pem"}}
    if without != "registry":
        oci["caBundle"] = {"configMapKeyRef": {"name": "registry-ca", "key": "ca.crt"}}
    if without != "git":
        source["caBundle"] = {"configMapKeyRef": {"name": "git-ca", "key": "ca.crt"}}
    _, job = job_body(
        "dummy-model",
        name,
        limit="4",
        offline={"storage": {"s3": storage}},
        outputs={"oci": oci},
        allowCodeExecution=True,  # task files from Git
    )
    job["spec"]["customTasks"] = [*job["spec"].get("customTasks", []), {"git": source}]
    return job


def test_s3_registry_and_git_each_trusted_through_their_own_ca_and_refused_without(
    node_cluster: NodeCluster, job_namespace: str, tmp_path: Path
) -> None:
    namespace = job_namespace
    s3_chain, registry_chain = _chain(tmp_path / "s3-ca"), _chain(tmp_path / "registry-ca")
    git_chain = _chain(tmp_path / "git-ca")
    work, served = tmp_path / "work", tmp_path / "served"
    git("init", "-q", "-b", "main", str(work))
    commit = commit_files(work, {"README": "no tasks here\n"}, "1")
    git("clone", "-q", "--bare", str(work), str(served / "tasks.git"))
    defaults = Settings()
    node_cluster.set_settings(git_image=node_cluster.image_refs["git"], allow_code_execution="true")
    try:
        with (
            S3Server(tmp_path / "s3", host=NODE_IP, tls=(s3_chain.served, s3_chain.key)) as s3,
            ociregistry.running(
                tmp_path / "registry",
                host=NODE_IP,
                tls=(registry_chain.served, registry_chain.key),
                ca=registry_chain.root,
            ) as registry,
            GitHttp(
                served, USER, PASSWORD, host=NODE_IP, tls=(git_chain.served, git_chain.key)
            ) as git_http,
        ):
            (s3.bucket("evals") / "team" / "note.txt").parent.mkdir(parents=True)
            (s3.bucket("evals") / "team" / "note.txt").write_text("fetched\n")
            url = git_http.url("tasks.git")
            secrets = [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "s3"},
                    "stringData": {
                        "id": s3.access_key,
                        "secret": s3.secret_key,
                        "bucket": "evals",
                        "endpoint": s3.endpoint,
                        "ca.pem": s3_chain.root.read_text(),
                    },
                },
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "git-auth"},
                    "stringData": {
                        ".git-credentials": f"https://{USER}:{PASSWORD}@{NODE_IP}:{git_http.port}\n"
                    },
                },
                *(
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": name},
                        "data": {"ca.crt": chain.root.read_text()},
                    }
                    for name, chain in (("registry-ca", registry_chain), ("git-ca", git_chain))
                ),
            ]
            configmap, _ = job_body("dummy-model", "unused")
            jobs = {
                without: _storage_job(f"without-{without}", s3, registry, url, without=without)
                for without in ("nothing", "s3", "registry", "git")
            }
            node_cluster.apply(*secrets, configmap, *jobs.values(), namespace=namespace)
            final = {
                without: node_cluster.wait_final(namespace, f"without-{without}")
                for without in jobs
            }
    finally:
        node_cluster.set_settings(git_image=defaults.git_image, allow_code_execution="false")

    trusted = final["nothing"]
    assert trusted["reason"] == "Succeeded", trusted.get("message")
    assert trusted["taskSources"][-1] == {"name": "customTasks[1]", "url": url, "commit": commit}
    assert trusted["resultsArtifact"].startswith(f"{registry.address}/team/evals@"), trusted
    assert "resultsArtifactError" not in trusted

    refused = final["git"]
    assert refused["reason"] == "Failed", refused
    assert refused["message"].startswith(f"spec.customTasks[1].git: fetching {url} failed"), (
        refused["message"]
    )
    assert "certificate is not trusted" in refused["message"]
    assert "spec.customTasks[1].git.caBundle" in refused["message"]

    refused = final["s3"]
    assert refused["reason"] == "Failed", refused
    assert (
        "spec.offline.storage.s3: the S3 endpoint's certificate is not trusted"
        in (refused["message"])
    ), refused["message"]
    assert "spec.offline.storage.s3.caBundle" in refused["message"]

    pushed = final["registry"]
    assert pushed["reason"] == "Succeeded", pushed.get("message")
    assert "resultsArtifact" not in pushed
    assert pushed["resultsArtifactError"].startswith(
        "spec.outputs.oci: the registry's certificate is not trusted"
    ), pushed
    assert "spec.outputs.oci.caBundle" in pushed["resultsArtifactError"]
