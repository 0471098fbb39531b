"""Helpers for the metrics tests: jobs as the poller sees them, and promtool.

`make_job` builds the `JobView` a cycle would put in its snapshot (from
the object a LIST returns), so the
collector is tested without any cluster. Prometheus and promtool are built
(or found) once per session by `lmeval_sandbox.prometheus`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox.prometheus import ensure_prometheus

from poller import api
from poller.decisions.views import JobView

TOY_RESULTS: dict[str, Any] = {
    "results": {
        "toy_mc": {
            "name": "toy_mc",
            "alias": "toy_mc",
            "sample_len": 6,
            "acc,none": 0.5,
            "acc_stderr,none": 0.25,
            "acc_norm,none": 0.75,
            "acc_norm_stderr,none": "N/A",
        },
        "toy_gen": {
            "alias": " - toy_gen",
            "exact_match,strict-match": 0.125,
            "exact_match_stderr,strict-match": 0.0625,
            "exact_match,flexible-extract": 1,
            "bleu,none": True,
        },
    },
    "groups": {"toy": {"alias": "toy", "acc,none": 0.4}},
    "configs": {"toy_mc": {"task": "toy_mc"}},
}


def make_job(
    name: str,
    *,
    namespace: str = "team-a",
    uid: str | None = None,
    model: str = "dummy",
    state: str | None = "Running",
    reason: str | None = None,
    results: dict[str, Any] | str | None = None,
    percent: float | None = None,
    scheduled: str | None = "2030-01-01T00:00:00Z",
    completed: str | None = None,
    created: str = "2029-12-31T23:59:00Z",
) -> JobView:
    status: dict[str, Any] = {}
    if state is not None:
        status["state"] = state
    if reason is not None:
        status["reason"] = reason
    if results is not None:
        status["results"] = results if isinstance(results, str) else json.dumps(results)
    if percent is not None:
        status["progress"] = {"percent": percent}
    if scheduled is not None:
        status["lastScheduleTime"] = scheduled
    if completed is not None:
        status["completeTime"] = completed
    # Built the way a cycle builds it from a listed object (finished jobs compact).
    api.LMEvalJobStatus.model_validate(status)  # only statuses the poller could write
    return JobView.from_object(
        {
            "metadata": {
                "namespace": namespace,
                "name": name,
                "uid": uid or f"uid-{namespace}-{name}",
                "generation": 1,
                "resourceVersion": "1",
                "creationTimestamp": created,
            },
            "spec": {"model": model, "tasks": ["toy_mc"]},
            "status": status,
        }
    )


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    """The directory with `prometheus` and `promtool` (built on first use)."""
    return ensure_prometheus()
