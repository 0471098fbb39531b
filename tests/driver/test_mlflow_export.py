"""The driver logs a completed run to a real MLflow tracking server (spec.outputs.mlflow).

A real ``mlflow server`` on loopback with its basic-auth app
(``tests.mlflowserver``); the driver runs as a process, as in the pod, with
a fake lm_eval child that writes a results file and whose command line
carries lm_eval's options (an API key in ``--model_args`` among them).
What the server stores is read back with MLflow's own client: params,
metrics, tags and artifacts, and none of them holds the key. An export that
fails (a wrong password, a Secret without the keys, no server) never fails
the run: the final marker says why, in the server's words when it answered.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox import pki

from driver import mlflowexport
from driver.protocol import EXIT_OK
from tests import mlflowserver
from tests.driver.conftest import WRITE_RESULTS, fake_child, run_driver
from tests.driver.test_outcomes import only_final

pytestmark = [
    pytest.mark.skipif(not mlflowserver.available(), reason="mlflow server"),
    # MLflow's client, read back in this process, imports its SQL store (SQLAlchemy warns).
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

SECRET = "sk-driver-test-SECRET-1234"
RESULTS = {
    "results": {
        "arc": {"alias": "arc", "acc,none": 0.5, "acc_stderr,none": 0.25},
        "gsm": {"exact_match,strict-match": 0.125, "exact_match_stderr,strict-match": "N/A"},
    },
    "config": {"model": "local-completions", "model_args": f"base_url=http://m,api_key={SECRET}"},
}
LM_EVAL_OPTIONS = [
    "--model=local-completions",
    f"--model_args=base_url=http://127.0.0.1:1/v1,api_key={SECRET}",
    "--tasks=arc,gsm",
    "--num_fewshot=0",
    "--limit=2",
]
USER, PASSWORD = "driver-evaluator", "driver-evaluator-password"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> mlflowserver.Server:
    running = mlflowserver.shared(tmp_path_factory.mktemp("mlflow"))
    running.add_user(USER, "an-earlier-password")
    running.add_user(USER, PASSWORD)  # an existing user gets the password (tests' own rule)
    return running


def _credentials(path: Path, **keys: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for key, value in keys.items():
        (path / key).write_text(value + "\n")  # as --from-file Secrets often end
    return path


def _run(
    tmp_path: Path, env: dict[str, str], *options: str
) -> tuple[int, dict[str, Any], float, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    results = tmp_path / "results.json"
    results.write_text(json.dumps(RESULTS))
    env["FAKE_RESULTS"] = str(results)
    env["TMPDIR"] = str(tmp_path)
    started = time.monotonic()
    run = run_driver(
        ["--output-root", str(tmp_path / "root"), "--run-id", "run-1", *options],
        [*fake_child(WRITE_RESULTS), *LM_EVAL_OPTIONS],
        env,
    )
    return run.returncode, only_final(run), time.monotonic() - started, run.out + run.err


def test_a_completed_run_is_logged_and_read_back_with_mlflows_client(
    tmp_path: Path, env: dict[str, str], server: mlflowserver.Server
) -> None:
    creds = _credentials(tmp_path / "creds", username=USER, password=PASSWORD)
    tags = {"team": "evals", "lmeval.job.name": "job-1"}
    code, final, _elapsed, output = _run(
        tmp_path,
        env,
        f"--mlflow-tracking-uri={server.uri}",
        "--mlflow-experiment=driver tests",
        "--mlflow-run-name=run one",
        f"--mlflow-tags={json.dumps(tags)}",
        f"--mlflow-credentials={creds}",
    )
    assert code == EXIT_OK, output
    assert final["event"] == "completed"
    assert "mlflow_error" not in final, final
    run_id, url = final["mlflow_run_id"], final["mlflow_run_url"]
    assert isinstance(run_id, str) and len(run_id) == 32
    experiment = final["mlflow_experiment_id"]
    assert url == f"{server.uri}/#/experiments/{experiment}/runs/{run_id}"
    assert "View run" not in output  # MLflow's own prints stay off the marker channel

    with server.admin():
        client = server.client()
        run = client.get_run(run_id)
        assert run.info.run_name == "run one" and run.info.status == "FINISHED"
        assert client.get_experiment(experiment).name == "driver tests"
        assert run.data.metrics == {
            "arc/acc/none": 0.5,
            "arc/acc_stderr/none": 0.25,
            "gsm/exact_match/strict-match": 0.125,
        }
        params = run.data.params
        assert params["model"] == "local-completions"
        assert params["model_args"] == "base_url=http://127.0.0.1:1/v1,api_key=***"
        assert (params["tasks"], params["num_fewshot"], params["limit"]) == ("arc,gsm", "0", "2")
        assert params["driver_version"] and "lm_eval_version" in params
        assert run.data.tags["team"] == "evals" and run.data.tags["lmeval.job.name"] == "job-1"
        assert run.data.tags["lmeval.run_id"] == "run-1"
        names = sorted(f.path for f in client.list_artifacts(run_id))
        assert names == ["provenance.json", "results.json"]
        local = Path(client.download_artifacts(run_id, "", str(tmp_path / "download")))
    stored = json.loads((local / "results.json").read_text())
    assert stored["results"] == RESULTS["results"]
    assert stored["config"]["model_args"] == "base_url=http://m,api_key=***"
    provenance = json.loads((local / "provenance.json").read_text())
    assert provenance["run_id"] == "run-1" and provenance["results_size"] > 0
    everything = json.dumps([run.data.params, run.data.tags, run.data.metrics]) + "".join(
        p.read_text() for p in local.iterdir()
    )
    assert SECRET not in everything


def test_a_wrong_password_is_refused_in_the_servers_words(
    tmp_path: Path, env: dict[str, str], server: mlflowserver.Server
) -> None:
    creds = _credentials(tmp_path / "creds", username=USER, password="not-the-password")
    code, final, _elapsed, output = _run(
        tmp_path,
        env,
        f"--mlflow-tracking-uri={server.uri}",
        "--mlflow-experiment=driver tests",
        f"--mlflow-credentials={creds}",
    )
    assert code == EXIT_OK and final["event"] == "completed", output
    assert "mlflow_run_id" not in final
    error = final["mlflow_error"]
    assert isinstance(error, str) and "401" in error and "not authenticated" in error, error
    assert "not-the-password" not in output
    assert final["results_sha256"]  # the evaluation is not lost


def test_a_secret_without_the_keys_is_named(
    tmp_path: Path, env: dict[str, str], server: mlflowserver.Server
) -> None:
    creds = _credentials(tmp_path / "creds", username=USER)
    code, final, _elapsed, output = _run(
        tmp_path,
        env,
        f"--mlflow-tracking-uri={server.uri}",
        f"--mlflow-credentials={creds}",
    )
    assert code == EXIT_OK, output
    assert final["mlflow_error"] == (
        "spec.outputs.mlflow.credentialsSecret: the Secret has no key password (HTTP Basic "
        "needs both username and password)"
    )
    empty = _credentials(tmp_path / "empty")
    _code, final, _elapsed, _output = _run(
        tmp_path / "again",
        env,
        f"--mlflow-tracking-uri={server.uri}",
        f"--mlflow-credentials={empty}",
    )
    assert str(final["mlflow_error"]).startswith(
        "spec.outputs.mlflow.credentialsSecret: the Secret has none of the keys token, "
    )


def test_a_server_that_is_down_costs_seconds_and_says_so(
    tmp_path: Path, env: dict[str, str]
) -> None:
    code, final, elapsed, output = _run(
        tmp_path, env, f"--mlflow-tracking-uri={mlflowserver.free_loopback_uri()}"
    )
    assert code == EXIT_OK and final["event"] == "completed", output
    error = str(final["mlflow_error"])
    assert "Connection refused" in error or "Max retries" in error, error
    assert len(error) <= mlflowexport.MAX_ERROR_CHARS
    assert elapsed < 90, elapsed


def test_https_trusts_the_servers_ca_bundle_and_names_it_when_missing(
    tmp_path: Path, env: dict[str, str], server: mlflowserver.Server
) -> None:
    ca, pair = pki.serving_ca(tmp_path / "pki")
    creds = _credentials(tmp_path / "creds", username=USER, password=PASSWORD)
    with mlflowserver.tls_front(server, pair.cert, pair.key) as uri:
        code, final, _elapsed, output = _run(
            tmp_path / "trusted",
            env,
            f"--mlflow-tracking-uri={uri}",
            "--mlflow-experiment=driver tests",
            f"--mlflow-credentials={creds}",
            f"--mlflow-ca-bundle={ca}",
        )
        assert code == EXIT_OK and "mlflow_error" not in final, output
        assert str(final["mlflow_run_url"]).startswith(f"{uri}/#/experiments/")
        _code, final, _elapsed, output = _run(
            tmp_path / "untrusted",
            env,
            f"--mlflow-tracking-uri={uri}",
            f"--mlflow-credentials={creds}",
        )
    error = str(final["mlflow_error"])
    assert error.startswith(
        "spec.outputs.mlflow: the tracking server's certificate is not trusted"
    ), error
    assert "spec.outputs.mlflow.caBundle" in error and "trusted-ca-bundles" in error
    no_pem = tmp_path / "not-a-ca.crt"
    no_pem.write_text("not a certificate\n")
    _code, final, _elapsed, _output = _run(
        tmp_path / "no-pem",
        env,
        f"--mlflow-tracking-uri={uri}",
        f"--mlflow-ca-bundle={no_pem}",
    )
    assert str(final["mlflow_error"]).startswith("spec.outputs.mlflow.caBundle: "), final
