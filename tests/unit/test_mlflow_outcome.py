"""status.mlflowRun, mlflowRunError and condition ResultsExported, from fake final markers.

The pod's log is the pod's word: a run ID that is not MLflow's, or a run
page outside the job's tracking server, is not recorded as the job's run.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from driver import protocol
from driver.decoder import Outcome
from driver.protocol import encode_marker, encode_results
from poller import api
from poller.api.settings import Settings
from poller.decisions import decide, outcome
from poller.decisions.draft import StatusDraft
from poller.decisions.observed import Observed
from poller.decisions.views import ExecView, JobView
from tests.unit.test_decide import RESULTS, job, log_view, pod, running_status, status_of

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
URI = "https://mlflow.example.com/ml"
RUN = "0123456789abcdef0123456789abcdef"
URL = f"{URI}/#/experiments/7/runs/{RUN}"
SPEC = {"outputs": {"mlflow": {"trackingUri": URI, "experiment": "evals"}}}


def _record(spec: dict[str, Any], done: Outcome | None) -> api.LMEvalJobStatus:
    job = JobView.from_object(
        {
            "metadata": {"namespace": "ns", "name": "j", "uid": "u", "generation": 1},
            "spec": {"model": "m", "tasks": ["t"], **spec},
            "status": {"state": "Running"},
        }
    )
    draft = StatusDraft(job, NOW)
    outcome.record_mlflow_run(job, done, draft)
    draft.fields["conditions"] = draft.conditions
    return api.LMEvalJobStatus.model_validate(draft.fields)


def _outcome(event: str = protocol.EVENT_COMPLETED, **fields: Any) -> Outcome:
    return Outcome(event=event, exit_code=0, signal=None, message="", results_path=None, **fields)


def _condition(status: api.LMEvalJobStatus) -> tuple[str, str, str, str]:
    (condition,) = status.conditions or []
    return condition.type, condition.status, condition.reason, condition.message


def test_an_exported_run_is_recorded_with_its_page() -> None:
    status = _record(
        SPEC, _outcome(mlflow_run_id=RUN, mlflow_run_url=URL, mlflow_experiment_id="7")
    )
    assert status.mlflow_run == api.MlflowRunStatus(id=RUN, url=URL, experiment_id="7")
    assert status.mlflow_run_error is None
    assert _condition(status) == ("ResultsExported", "True", "Exported", URL)
    dumped = status.model_dump(by_alias=True, exclude_none=True)
    assert dumped["mlflowRun"] == {"id": RUN, "url": URL, "experimentId": "7"}


def test_a_failed_export_says_why_in_the_servers_words() -> None:
    said = "API request to endpoint /api/2.0/mlflow/runs/create failed with error code 401"
    status = _record(SPEC, _outcome(mlflow_error=said))
    assert status.mlflow_run is None and status.mlflow_run_error == said
    assert _condition(status) == ("ResultsExported", "False", "ExportFailed", said)
    long = _record(SPEC, _outcome(mlflow_error="x" * 5000))
    assert len(long.mlflow_run_error or "") == outcome.MAX_ARTIFACT_CHARS
    silent = _record(SPEC, _outcome())
    assert silent.mlflow_run_error == "the driver did not report the export"


def test_the_pods_word_is_checked() -> None:
    forged = _record(SPEC, _outcome(mlflow_run_id=RUN, mlflow_run_url=f"https://evil/#/runs/{RUN}"))
    assert forged.mlflow_run is None
    assert "outside spec.outputs.mlflow.trackingUri" in (forged.mlflow_run_error or "")
    # A page on another server whose name starts like the job's is not the job's.
    prefix = _record(
        SPEC, _outcome(mlflow_run_id=RUN, mlflow_run_url=f"{URI}.evil.example/#/x/{RUN}")
    )
    assert prefix.mlflow_run is None
    bad_id = _record(SPEC, _outcome(mlflow_run_id="../../x", mlflow_run_url=URL))
    assert "not MLflow's" in (bad_id.mlflow_run_error or "")
    odd_experiment = _record(
        SPEC, _outcome(mlflow_run_id=RUN, mlflow_run_url=URL, mlflow_experiment_id="7 or 1=1")
    )
    assert odd_experiment.mlflow_run == api.MlflowRunStatus(id=RUN, url=URL)


def test_nothing_without_mlflow_or_a_completed_run() -> None:
    done = _outcome(mlflow_run_id=RUN, mlflow_run_url=URL)
    assert _record({}, done).mlflow_run is None and not _record({}, done).conditions
    failed = _record(SPEC, _outcome(protocol.EVENT_FAILED, mlflow_error="x"))
    assert failed.mlflow_run_error is None and not failed.conditions
    assert not _record(SPEC, None).conditions


def test_exec_mode_records_the_run_while_the_driver_holds() -> None:
    """With results-source exec the results are read while the driver holds its
    container, and the terminated container's log is not read again: the run
    (and an OCI artifact alike) is recorded from the holding driver's marker."""
    digest = "sha256:" + "b" * 64
    lines = [
        encode_marker("started", run_id="r"),
        *encode_results(b'{"results": {"toy": {"acc,none": 0.5}}}', "r"),
        encode_marker(
            "completed",
            run_id="r",
            exit_code=0,
            results_path="/x",
            results_artifact=f"r.example.com/e@{digest}",
            mlflow_run_id=RUN,
            mlflow_run_url=URL,
            mlflow_experiment_id="7",
        ),
    ]
    spec = {**SPEC["outputs"], "oci": {"repository": "r.example.com/e"}}
    running = job(running_status(), outputs=spec)
    exec_settings = Settings(**{"results-source": "exec"})
    held = decide.decide(
        Observed(running, pod(), log=log_view(lines), exec_view=ExecView(json.dumps(RESULTS))),
        exec_settings,
        NOW,
    )
    status = status_of(held)
    assert status.mlflow_run == api.MlflowRunStatus(id=RUN, url=URL, experiment_id="7")
    assert status.results_artifact == f"r.example.com/e@{digest}"
    kinds = {c.type: c.status for c in status.conditions or []}
    assert kinds["ResultsExported"] == "True" and kinds["ResultsPushed"] == "True"
    # The container's end keeps them (its log is not read again).
    stored = job(status.model_dump(by_alias=True, exclude_none=True, mode="json"), outputs=spec)
    final = status_of(
        decide.decide(Observed(stored, pod("terminated", exit_code=0)), exec_settings, NOW)
    )
    assert final.reason == api.JobReason.SUCCEEDED and final.mlflow_run == status.mlflow_run
