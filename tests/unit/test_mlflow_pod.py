"""spec.outputs.mlflow in the API and the job pod: the schema, the volumes, the driver's options.

The export against a real tracking server is in tests/driver/test_mlflow_export.py
and, through the whole system, tests/e2e/test_mlflow.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from driver import protocol
from poller import api
from poller.api.settings import Settings
from poller.jobpod import mlflowoutput, podspec

URI = "https://mlflow.example.com/tracking"


def _spec(**mlflow: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate(
        {
            "model": "hf",
            "tasks": ["arc_easy"],
            "outputs": {"mlflow": {"trackingUri": URI, "experiment": "evals", **mlflow}},
        }
    )


def _refusal(**mlflow: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        _spec(**mlflow)
    return str(caught.value)


def test_the_schema_takes_a_server_an_experiment_tags_and_references() -> None:
    spec = _spec(
        runName="nightly run",
        tags={"team": "evals", "model/family": "granite"},
        credentialsSecret="mlflow-creds",
        caBundle={"configMapKeyRef": {"name": "mlflow-ca", "key": "ca.crt"}},
    )
    mlflow = spec.outputs.mlflow if spec.outputs else None
    assert mlflow is not None and mlflow.run_name == "nightly run"
    for uri in ("http://127.0.0.1:5000", "http://localhost:5000/", "https://[fd00::1]:8443/m"):
        assert _spec(trackingUri=uri)
    assert "http:// is allowed only for a loopback server" in _refusal(
        trackingUri="http://mlflow.mlflow.svc:5000"
    )
    for uri in ("https://user:pw@mlflow.example.com", "https://h/?x=1", "ftp://h", "https://-h"):
        assert "trackingUri" in _refusal(trackingUri=uri)
    assert "tag keys may not start with mlflow. or lmeval." in _refusal(
        tags={"lmeval.job.name": "other", "ok": "1"}
    )
    assert "tags" in _refusal(tags={"bad,key": "1"})
    assert "tags" in _refusal(tags={f"k{i}": "v" for i in range(65)})
    assert "experiment" in _refusal(experiment="two\nlines")
    assert "at most 16384 bytes (UTF-8) together; these take 40050" in _refusal(
        tags={f"k{i}": "é" * 1000 for i in range(20)}
    )
    assert "configMapKeyRef" in _refusal(
        caBundle={
            "configMapKeyRef": {"name": "a", "key": "k"},
            "secretKeyRef": {"name": "b", "key": "k"},
        }
    )


def _pod(spec: api.LMEvalJobSpec, shard: int | None = None) -> dict[str, Any]:
    return podspec.build_pod(
        name="eval-1", namespace="team-a", uid="uid-1", spec=spec, settings=Settings(), shard=shard
    )


def _options(command: list[str]) -> dict[str, str]:
    options = command[: command.index(protocol.END_OF_OPTIONS)]
    return dict(word.split("=", 1) for word in options if word.startswith("--mlflow-"))


def test_the_pod_gives_the_driver_the_server_the_run_and_the_jobs_identity() -> None:
    spec = _spec(tags={"team": "evals"}, credentialsSecret="mlflow-creds")
    pod = _pod(spec)
    main = pod["spec"]["containers"][0]
    options = _options(main["command"])
    assert options == {
        "--mlflow-tracking-uri": URI,
        "--mlflow-experiment": "evals",
        "--mlflow-run-name": "eval-1",
        "--mlflow-tags": options["--mlflow-tags"],
        "--mlflow-credentials": mlflowoutput.CREDENTIALS_DIR,
    }
    assert json.loads(options["--mlflow-tags"]) == {
        "team": "evals",
        "lmeval.job.namespace": "team-a",
        "lmeval.job.name": "eval-1",
        "lmeval.job.uid": "uid-1",
    }
    # The Secret is files read by the driver, never a variable lm_eval inherits.
    assert not any("valueFrom" in item for item in main["env"])
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "mlflow-credentials"]
    assert volume["secret"] == {
        "secretName": "mlflow-creds",
        "items": [{"key": k, "path": k} for k in ("username", "password", "token")],
        "defaultMode": 0o444,
        "optional": True,
    }
    (mount,) = [m for m in main["volumeMounts"] if m["name"] == "mlflow-credentials"]
    assert mount == {
        "name": "mlflow-credentials",
        "mountPath": "/opt/lmeval/mlflow-credentials",
        "readOnly": True,
    }


def test_the_servers_ca_is_mounted_for_the_driver() -> None:
    spec = _spec(caBundle={"secretKeyRef": {"name": "mlflow-tls", "key": "ca.crt"}}, runName="r")
    pod = _pod(spec)
    main = pod["spec"]["containers"][0]
    options = _options(main["command"])
    assert options["--mlflow-ca-bundle"] == "/opt/lmeval/mlflow-ca/ca.crt"
    assert options["--mlflow-run-name"] == "r"
    assert "--mlflow-credentials" not in options
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "mlflow-ca"]
    assert volume["secret"] == {
        "secretName": "mlflow-tls",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert {"name": "mlflow-ca", "mountPath": "/opt/lmeval/mlflow-ca", "readOnly": True} in main[
        "volumeMounts"
    ]


def test_only_the_merge_pod_of_a_sharded_job_exports() -> None:
    raw = _spec(credentialsSecret="mlflow-creds").model_dump(by_alias=True, exclude_none=True)
    raw.update(parallelism=2)
    raw["outputs"]["pvcManaged"] = {"size": "1Gi"}
    spec = api.LMEvalJobSpec.model_validate(raw)
    for shard in (0, 1):
        pod = _pod(spec, shard)
        main = pod["spec"]["containers"][0]
        assert _options(main["command"]) == {}
        assert all(not v["name"].startswith("mlflow-") for v in pod["spec"]["volumes"])
    merge = _pod(spec)
    assert _options(merge["spec"]["containers"][0]["command"])["--mlflow-tracking-uri"] == URI
    assert any(v["name"] == "mlflow-credentials" for v in merge["spec"]["volumes"])


def test_a_job_without_mlflow_has_none_of_it() -> None:
    spec = api.LMEvalJobSpec.model_validate({"model": "hf", "tasks": ["arc_easy"]})
    pod = _pod(spec)
    assert _options(pod["spec"]["containers"][0]["command"]) == {}
    assert all(not v["name"].startswith("mlflow-") for v in pod["spec"]["volumes"])
    assert mlflowoutput.driver_options(spec, "ns", "j", "u") == mlflowoutput.ExportOptions()


def test_a_suite_template_may_carry_mlflow() -> None:
    suite = api.LMEvalSuiteSpec.model_validate(
        {
            "template": {
                "model": "hf",
                "tasks": ["arc_easy"],
                "outputs": {"mlflow": {"trackingUri": URI, "experiment": "nightly"}},
            },
            "criteria": [{"task": "arc_easy", "metric": "acc,none", "maxDrop": 0.05}],
        }
    )
    assert suite.template.outputs is not None and suite.template.outputs.mlflow is not None
