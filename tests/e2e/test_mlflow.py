"""Jobs logged to a real MLflow tracking server, end to end (issue 34, item 1).

A real ``mlflow server`` (the mlflow package's, ``tests.mlflowserver``) on
127.0.0.1 with its basic-auth app, a SQLite backend store and artifacts it
serves itself. Jobs run through the poller, the local runner (the job pod as
local processes), the real driver and real lm_eval against the sample model
server, with an API key among their model arguments:

- a job with ``spec.outputs.mlflow`` and a ``kubernetes.io/basic-auth``
  Secret of a user of the server: it Succeeds, condition ResultsExported is
  True, ``status.mlflowRun`` names the run, and MLflow's own client reads
  back what the server stored: the params (model, redacted model arguments,
  tasks, limit, versions), one metric per task, metric and filter equal to
  ``status.results``' scores, the tags that link the run to the job, and
  the artifacts (the results, equal to ``status.results``; the per-item
  scores; the provenance). The API key is in none of it;
- the same job with a wrong password: the server refuses it, the job still
  Succeeds with its results, and status says why in the server's words
  (``mlflowRunError``, condition ResultsExported False, reason ExportFailed).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import LocalRunner

from driver.mlflowexport import metric_key
from driver.protocol import decode_item_scores
from poller.cycle.reconciler import Reconciler
from poller.jobpod import mlflowoutput
from tests import mlflowserver
from tests.e2e.conftest import sample, submit
from tests.poller_fixtures import Jobs, cycle_until

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.lmeval,
    pytest.mark.skipif(not mlflowserver.available(), reason="mlflow server"),
    # MLflow's client, read back in this process, imports its SQL store (SQLAlchemy warns).
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

LMEVAL_TIMEOUT = 300.0
SECRET = "sk-e2e-mlflow-SECRET-5678"
USER, PASSWORD = "e2e-evaluator", "e2e-evaluator-password"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mlflowserver.Server]:
    running = mlflowserver.shared(tmp_path_factory.mktemp("mlflow"))
    running.add_user(USER, PASSWORD)
    yield running


def _secret(jobs: Jobs, name: str, password: str) -> None:
    jobs.core.create_namespaced_secret(
        jobs.namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=name),
            type="kubernetes.io/basic-auth",
            string_data={"username": USER, "password": password},
        ),
    )


def _job(name: str, server: ModelServer, mlflow: dict[str, Any]) -> dict[str, Any]:
    _, job = sample("served-model", server.port)
    job = copy.deepcopy(job)
    job["metadata"]["name"] = name
    job["spec"]["modelArgs"].append({"name": "api_key", "value": SECRET})
    job["spec"].update(limit="2", logSamples=True, outputs={"mlflow": mlflow})
    return job


def _finished(poller: Reconciler, jobs: Jobs, name: str) -> dict[str, Any]:
    def complete() -> dict[str, Any] | None:
        status = jobs.status(name)
        return status if status.get("state") == "Complete" else None

    found: dict[str, Any] = cycle_until(
        poller, complete, timeout=LMEVAL_TIMEOUT, what=f"{name} Complete"
    )
    return found


def _condition(status: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(
        c for c in status.get("conditions", []) if c["type"] == "ResultsExported"
    )
    return found


def _scores(results: dict[str, Any]) -> dict[str, float]:
    """status.results' numbers by their MLflow key, as the export names them."""
    return {
        metric_key(task, name): float(value)
        for task, entry in results["results"].items()
        for name, value in entry.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def test_a_job_is_logged_and_read_back_with_mlflows_client(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    model_server: ModelServer,
    server: mlflowserver.Server,
    tmp_path: Path,
) -> None:
    _secret(jobs, "mlflow-creds", PASSWORD)
    _secret(jobs, "mlflow-wrong", "not-the-password")
    mlflow = {
        "trackingUri": server.uri,
        "experiment": "e2e evaluations",
        "tags": {"team": "evals"},
        "credentialsSecret": "mlflow-creds",
    }
    created = submit(admin_api, jobs.namespace, _job("mlflow-export", model_server, mlflow))
    wrong = {**mlflow, "credentialsSecret": "mlflow-wrong"}
    submit(admin_api, jobs.namespace, _job("mlflow-refused", model_server, wrong))

    final = _finished(poller, jobs, "mlflow-export")
    assert final["reason"] == "Succeeded", final.get("message")
    assert "mlflowRunError" not in final, final["mlflowRunError"]
    run = final["mlflowRun"]
    condition = _condition(final)
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "True",
        "Exported",
        run["url"],
    )
    assert run["url"] == f"{server.uri}/#/experiments/{run['experimentId']}/runs/{run['id']}"
    results = json.loads(final["results"])

    with server.admin():
        reader = server.client()
        logged = reader.get_run(run["id"])
        assert reader.get_experiment(run["experimentId"]).name == "e2e evaluations"
        assert logged.info.run_name == "mlflow-export" and logged.info.status == "FINISHED"
        names = sorted(f.path for f in reader.list_artifacts(run["id"]))
        local = Path(reader.download_artifacts(run["id"], "", str(tmp_path / "artifacts")))

    # Params: what the job asked, its secret hidden as everywhere else.
    params = logged.data.params
    assert params["model"] == "local-completions"
    assert "api_key=***" in params["model_args"] and "base_url=" in params["model_args"]
    assert (params["tasks"], params["limit"]) == ("sample_arith_mc,sample_arith_gen", "2")
    assert params["lm_eval_version"] and params["driver_version"]
    # Metrics: one per task, metric and filter, the status' own numbers.
    assert logged.data.metrics == _scores(results)
    assert "sample_arith_mc/acc/none" in logged.data.metrics
    # Tags: the job's, and the run's link back to its LMEvalJob.
    tags = logged.data.tags
    assert tags["team"] == "evals"
    assert [tags[k] for k in mlflowoutput.JOB_TAGS] == [
        jobs.namespace,
        "mlflow-export",
        created["metadata"]["uid"],
    ]
    # Artifacts: the results as status holds them, the per-item scores, the provenance.
    assert names == ["items.json", "provenance.json", "results.json"]
    assert json.loads((local / "results.json").read_text()) == results
    items = decode_item_scores((local / "items.json").read_bytes())
    assert set(items.tasks) == {"sample_arith_mc", "sample_arith_gen"}
    provenance = json.loads((local / "provenance.json").read_text())
    assert provenance["lm_eval_version"] == params["lm_eval_version"]
    stored = json.dumps([params, tags, logged.data.metrics]) + "".join(
        path.read_text() for path in local.iterdir()
    )
    assert SECRET not in stored

    refused = _finished(poller, jobs, "mlflow-refused")
    assert refused["reason"] == "Succeeded", refused.get("message")
    assert json.loads(refused["results"])["results"]
    assert "mlflowRun" not in refused
    error = refused["mlflowRunError"]
    assert "401" in error and "You are not authenticated" in error, error
    condition = _condition(refused)
    assert (condition["status"], condition["reason"]) == ("False", "ExportFailed")
    assert condition["message"] == error
