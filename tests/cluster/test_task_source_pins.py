"""A run whose reported task commit is not the pinned one fails, on the real control plane.

A job pins ``spec.customTasks[0].git.commit``; its pod (kwok: the init
containers that would clone report success) exits 0 after printing a log
whose driver markers report another commit for that source, with results.
Checks: the job ends Failed with a message naming
``spec.customTasks[0].git.commit``, the pinned and the reported commit; the
Finished condition says TaskSourceMismatch; no results are in status or in a
results ConfigMap, and no status.taskSources; no cycle counts an error. A
second job whose log reports the pinned commit succeeds with it recorded in
status.taskSources, so the failure is the check's, not the forged log's
shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from driver.protocol import encode_marker, encode_results
from poller.cycle.reconciler import Reconciler
from poller.decisions import outcome
from poller.results import lmeval
from tests.cluster.test_hostile_logs import _terminated, finish_within, running_pod, serve
from tests.poller_fixtures import BASE_SETTINGS, Jobs, set_settings, terminate
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

PIN = "1f" * 20
OTHER = "e7" * 20
URL = "http://127.0.0.1:9/tasks.git"
RESULTS = {"results": {"git_arith": {"acc,none": 1.0}}, "versions": {"git_arith": 1}}


def _log(commit: str) -> str:
    sources = [{"name": "0", "commit": commit}]
    lines = [
        encode_marker("started", run_id="r", task_sources=sources),
        *encode_results(json.dumps(RESULTS).encode(), "r"),
        encode_marker(
            "completed", run_id="r", exit_code=0, message="lm_eval completed", task_sources=sources
        ),
    ]
    return "\n".join(lines) + "\n"


def _run(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, where: Path, name: str, log: str
) -> dict[str, Any]:
    """A job pinned to PIN whose pod prints `log` and exits 0; its final status."""
    git = {"url": URL, "commit": PIN, "path": "tasks"}
    spec = {"tasks": ["git_arith"], "customTasks": [{"git": git}], "allowCodeExecution": True}
    pod = running_pod(poller, jobs, name, **spec)
    serve(admin_api, jobs.namespace, pod, log, where)
    terminate(admin_api, jobs.namespace, pod, 0)
    wait_for(lambda: _terminated(jobs, pod), what=f"{pod} terminated")
    return finish_within(poller, jobs, name, cycles=3)


def test_a_run_reporting_another_commit_than_the_pin_fails(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, tmp_path: Path
) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, "allow-code-execution": "true"})
    final = _run(poller, jobs, admin_api, tmp_path, "forged-commit", _log(OTHER))
    assert final["reason"] == "Failed", final
    assert final["message"] == (
        f"spec.customTasks[0].git.commit: expected {PIN}, the run reported {OTHER}: "
        "its results are not the pinned code's"
    )
    finished = next(c for c in final["conditions"] if c["type"] == "Finished")
    assert finished["reason"] == outcome.TASK_SOURCE_MISMATCH
    assert "results" not in final and "taskSources" not in final
    stored = jobs.core.list_namespaced_config_map(jobs.namespace).items
    named = lmeval.results_configmap_name("forged-commit")
    kept = [c for c in stored if c.metadata is not None and c.metadata.name == named]
    assert all(lmeval.RESULTS_KEY not in (c.data or {}) for c in kept), kept

    # The same pod log with the pinned commit: Succeeded, the commit recorded.
    honest = _run(poller, jobs, admin_api, tmp_path, "pinned-commit", _log(PIN))
    assert honest["reason"] == "Succeeded", honest["message"]
    assert honest["taskSources"] == [{"name": "customTasks[0]", "url": URL, "commit": PIN}]
    assert json.loads(honest["results"])["results"] == RESULTS["results"]
