"""driver.mlflowexport's pure pieces: metric keys, metrics, params, redaction, credentials.

MLflow itself is not needed here; the export against a real server is in
tests/driver/test_mlflow_export.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from driver import mlflowexport
from driver.mlflowexport import MlflowExportError, metric_key

# MLflow's rule for metric, param and tag keys (mlflow.utils.validation).
MLFLOW_KEY = re.compile(r"^[/\w.\- :]*$")


def test_metric_keys_are_task_metric_filter_and_mlflow_accepts_them() -> None:
    assert metric_key("arc_easy", "acc,none") == "arc_easy/acc/none"
    assert metric_key("arc_easy", "acc_stderr,none") == "arc_easy/acc_stderr/none"
    assert metric_key("gsm8k", "exact_match,strict-match") == "gsm8k/exact_match/strict-match"
    assert metric_key("mmlu", "acc") == "mmlu/acc"
    # Every character MLflow refuses (and a slash inside a part) becomes "_".
    assert metric_key("a/b", "f1,a,b") == "a_b/f1/a_b"
    assert metric_key("t", "bleu,(x)!") == "t/bleu/_x__"
    long = metric_key("t" * 300, "acc,none")
    assert len(long) == 250 and long.startswith("t" * 241 + "-")
    assert long != metric_key("t" * 301, "acc,none")  # the digest keeps them apart
    for key in ("arc_easy/acc/none", long, metric_key("é", "ä,ö")):
        assert MLFLOW_KEY.match(key) and len(key) <= 250


def test_metrics_are_the_finite_numbers_of_the_results_section() -> None:
    results = {
        "results": {
            "arc": {"alias": "arc", "acc,none": 0.5, "acc_stderr,none": "N/A", "n": 2},
            "nan": {"acc,none": float("nan"), "ok,none": True},
            "bad": "not a mapping",
        },
        "groups": {"g": {"acc,none": 0.1}},
    }
    assert mlflowexport.metrics_of(results) == {"arc/acc/none": 0.5, "arc/n": 2.0}
    assert mlflowexport.metrics_of({"results": []}) == {}
    many = {"results": {f"t{i}": {"acc,none": 1.0} for i in range(mlflowexport.MAX_METRICS + 5)}}
    assert len(mlflowexport.metrics_of(many)) == mlflowexport.MAX_METRICS


def test_params_are_lm_evals_options_redacted_and_the_versions() -> None:
    argv = [
        "python",
        "-P",
        "-m",
        "lm_eval",
        "--model=local-completions",
        "--model_args=base_url=http://u:pw@h/v1,api_key=sk-123,num_concurrent=2",
        "--tasks",
        "arc_easy,gsm8k",
        "--limit=0.5",
        "--batch_size=4",
        "--output_path",
        "/x",
    ]
    params = mlflowexport.params_of(argv, {"lm_eval_version": "0.4.13", "driver_version": None})
    assert params == {
        "model": "local-completions",
        "model_args": "base_url=http://u:***@h/v1,api_key=***,num_concurrent=2",
        "tasks": "arc_easy,gsm8k",
        "limit": "0.5",
        "lm_eval_version": "0.4.13",
    }
    long = mlflowexport.params_of(["--tasks=" + "t," * 4000], {})
    assert len(long["tasks"]) == 6000 and long["tasks"].endswith("...")


def test_results_keep_their_scores_and_lose_their_secrets() -> None:
    results = {
        "results": {"t": {"token_f1,none": 0.5}},
        "config": {"model_args": "pretrained=x,hf_token=hf_abc", "api_key": "k"},
        "configs": {"t": {"dataset_kwargs": {"data_files": "https://u:pw@host/d.json"}}},
    }
    cleaned = mlflowexport.results_without_secrets(results)
    assert cleaned["results"] == results["results"]  # "token_f1" is a score, not a secret
    assert cleaned["config"] == {"model_args": "pretrained=x,hf_token=***", "api_key": "***"}
    assert cleaned["configs"]["t"]["dataset_kwargs"]["data_files"] == "https://u:***@host/d.json"


def test_run_url_is_mlflows_own() -> None:
    assert (
        mlflowexport.run_url("https://m.example.com/ml/", "3", "ab" * 16)
        == f"https://m.example.com/ml/#/experiments/3/runs/{'ab' * 16}"
    )


def test_credentials_are_a_token_or_a_username_and_password(tmp_path: Path) -> None:
    assert mlflowexport.credentials_env(None) == {}
    basic = tmp_path / "basic"
    basic.mkdir()
    (basic / "username").write_text("me\n")
    (basic / "password").write_text("pw with spaces \r\n")
    assert mlflowexport.credentials_env(str(basic)) == {
        "MLFLOW_TRACKING_USERNAME": "me",
        "MLFLOW_TRACKING_PASSWORD": "pw with spaces ",
    }
    (basic / "token").write_text("tok")
    assert mlflowexport.credentials_env(str(basic)) == {"MLFLOW_TRACKING_TOKEN": "tok"}
    half = tmp_path / "half"
    half.mkdir()
    (half / "password").write_text("pw")
    with pytest.raises(
        MlflowExportError, match="credentialsSecret: the Secret has no key username"
    ):
        mlflowexport.credentials_env(str(half))
    with pytest.raises(MlflowExportError, match="has none of the keys token, username"):
        mlflowexport.credentials_env(str(tmp_path / "missing"))


def test_the_export_never_raises_and_says_why(tmp_path: Path) -> None:
    notes: list[str] = []
    request = mlflowexport.ExportRequest("http://127.0.0.1:9", "e", tags="not json")
    found = mlflowexport.export_run(
        request,
        b'{"results": {}}',
        child_argv=["x"],
        versions={},
        run_id="r",
        provenance=b"{}",
        items_path=None,
        temp_dir=str(tmp_path),
        note=notes.append,
    )
    assert str(found.get("mlflow_error")).startswith("spec.outputs.mlflow.tags: not a JSON object")
    assert notes and "logging the run to MLflow failed" in notes[-1]
    assert list(tmp_path.iterdir()) == []  # its working directory is gone
