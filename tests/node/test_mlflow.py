"""MLflow export from the job image on the real node (issue 34, item 1).

The e2e suite proves the export through the local runner; this proves the
job image itself: MLflow's client as the Dockerfile installs it (the
driver's ``mlflow`` extra), run by the kubelet under the restricted profile
with no API rights. A real ``mlflow server`` (``tests.mlflowserver``) sits
behind a TLS front on the node's bridge address, its certificate from an
intermediate CA that only the job's ``outputs.mlflow.caBundle`` names. A
dummy-model job logs its run there: it Succeeds, condition ResultsExported
is True, and MLflow's own client reads back one metric per task, metric
and filter equal to ``status.results``' scores, and the tags that link the
run to the job.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox import pki
from lmeval_sandbox.nodeconfig import NODE_IP

from driver.mlflowexport import metric_key
from tests import mlflowserver
from tests.node.conftest import NodeCluster, job_body

pytestmark = [
    pytest.mark.node,
    pytest.mark.lmeval,
    pytest.mark.skipif(not mlflowserver.available(), reason="mlflow server"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

USER, PASSWORD = "node-evaluator", "node-evaluator-password"


def _scores(results: dict[str, Any]) -> dict[str, float]:
    return {
        metric_key(task, name): float(value)
        for task, entry in results["results"].items()
        for name, value in entry.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def test_the_job_image_logs_its_run_over_https_behind_an_internal_ca(
    node_cluster: NodeCluster, job_namespace: str, tmp_path: Path
) -> None:
    server = mlflowserver.shared(tmp_path / "mlflow")
    server.add_user(USER, PASSWORD)
    chain = pki.service_serving_chain(tmp_path / "mlflow-ca", ips=(NODE_IP,))
    with mlflowserver.tls_front(server, chain.served, chain.key, host=NODE_IP) as uri:
        configmap, job = job_body(
            "dummy-model",
            "to-mlflow",
            limit="4",
            outputs={
                "mlflow": {
                    "trackingUri": uri,
                    "experiment": "node evaluations",
                    "credentialsSecret": "mlflow-creds",
                    "caBundle": {"configMapKeyRef": {"name": "mlflow-ca", "key": "ca.crt"}},
                }
            },
        )
        objects = [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "mlflow-creds"},
                "type": "kubernetes.io/basic-auth",
                "stringData": {"username": USER, "password": PASSWORD},
            },
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "mlflow-ca"},
                "data": {"ca.crt": chain.root.read_text()},
            },
        ]
        node_cluster.apply(*objects, configmap, job, namespace=job_namespace)
        status = node_cluster.wait_final(job_namespace, "to-mlflow")

    assert status["reason"] == "Succeeded", status.get("message")
    assert "mlflowRunError" not in status, status["mlflowRunError"]
    (exported,) = [c for c in status["conditions"] if c["type"] == "ResultsExported"]
    assert (exported["status"], exported["reason"]) == ("True", "Exported"), exported
    run = status["mlflowRun"]
    assert run["url"].startswith(f"{uri}/#/experiments/")
    job_uid = node_cluster.get("lmevaljob", "to-mlflow", job_namespace)["metadata"]["uid"]
    with server.admin():
        logged = server.client().get_run(run["id"])
    assert logged.data.metrics == _scores(json.loads(status["results"]))
    assert logged.data.tags["lmeval.job.uid"] == job_uid
    assert logged.data.params["model"] == "dummy"
