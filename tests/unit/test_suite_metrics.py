"""The per-suite Prometheus series (poller.suitemetrics), read through a real registry.

Checks: a suite's latest verdict is 1 in its own series and 0 in the
others'; a suite without a verdict has no verdict series; runs are counted
by state; the latest run's start is a Unix time; each criterion of the
latest finished run has its regressed flag (an Inconclusive criterion that
was compared counts as not regressed, one never compared has no series) and
its minimum detectable drop; the series follow the last snapshot only (a
suite gone from it is gone from the scrape); the poller's registry exposes
the families even with no suite (the metrics reference lists them).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from prometheus_client import CollectorRegistry

from poller.metrics import PollerMetrics
from poller.suitemetrics import SUITE_VERDICTS, SuiteCollector, SuiteSeries

NS = "team-a"


def _run(name: str, state: str, started: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "state": state, "started": started, "trigger": "Manual", **extra}


def _criterion(task: str, verdict: str, **extra: Any) -> dict[str, Any]:
    return {"task": task, "metric": "acc,none", "tier": "Must", "verdict": verdict, **extra}


def _registry(*series: SuiteSeries) -> tuple[CollectorRegistry, SuiteCollector]:
    registry = CollectorRegistry()
    collector = SuiteCollector()
    registry.register(collector)
    collector.update(series)
    return registry, collector


def test_the_latest_verdict_runs_and_criteria_are_exposed() -> None:
    status = {
        "lastVerdict": "Regressed",
        "runs": [
            _run("ci-1", "Finished", "2026-12-01T03:00:00Z", verdict="Passed"),
            _run(
                "ci-2",
                "Finished",
                "2026-12-02T03:00:00Z",
                verdict="Regressed",
                criteria=[
                    _criterion("arc", "Regressed", pValue=1e-9, minimumDetectableDrop=0.04),
                    _criterion("mmlu", "Inconclusive", pValue=0.4, minimumDetectableDrop=0.2),
                    _criterion("gsm", "Inconclusive", reason="NoItemScores"),
                ],
            ),
            _run("ci-3", "Active", "2026-12-03T03:00:00Z"),
        ],
    }
    registry, _ = _registry(SuiteSeries(NS, "ci", status))
    where = {"namespace": NS, "lmevalsuite": "ci"}
    for verdict in SUITE_VERDICTS:
        expected = 1.0 if verdict == "Regressed" else 0.0
        value = registry.get_sample_value("lmeval_suite_verdict", {**where, "verdict": verdict})
        assert value == expected, verdict
    runs = {
        state: registry.get_sample_value("lmeval_suite_runs", {**where, "state": state})
        for state in ("Active", "Finished", "Failed")
    }
    assert runs == {"Active": 1.0, "Finished": 2.0, "Failed": 0.0}
    started = registry.get_sample_value("lmeval_suite_last_run_timestamp_seconds", where)
    assert started == dt.datetime(2026, 12, 3, 3, tzinfo=dt.UTC).timestamp()

    def criterion(name: str, task: str) -> float | None:
        labels = {**where, "task": task, "metric": "acc,none", "tier": "Must"}
        return registry.get_sample_value(name, labels)

    assert criterion("lmeval_suite_criterion_regressed", "arc") == 1.0
    assert criterion("lmeval_suite_criterion_regressed", "mmlu") == 0.0
    assert criterion("lmeval_suite_criterion_regressed", "gsm") is None
    assert criterion("lmeval_suite_criterion_minimum_detectable_drop", "arc") == 0.04
    assert criterion("lmeval_suite_criterion_minimum_detectable_drop", "gsm") is None


def test_no_verdict_no_verdict_series_and_a_gone_suite_is_gone() -> None:
    fresh = SuiteSeries(NS, "fresh", {"runs": [_run("f-1", "Active", "2026-12-03T03:00:00Z")]})
    registry, collector = _registry(fresh)
    labels = {"namespace": NS, "lmevalsuite": "fresh", "verdict": "Passed"}
    assert registry.get_sample_value("lmeval_suite_verdict", labels) is None
    where = {"namespace": NS, "lmevalsuite": "fresh", "state": "Active"}
    assert registry.get_sample_value("lmeval_suite_runs", where) == 1.0
    collector.update(())
    assert registry.get_sample_value("lmeval_suite_runs", where) is None


def test_a_failed_latest_run_reads_failed() -> None:
    status = {"lastVerdict": "Failed", "runs": [_run("x-1", "Failed", "2026-12-03T03:00:00Z")]}
    registry, _ = _registry(SuiteSeries(NS, "x", status))
    labels = {"namespace": NS, "lmevalsuite": "x", "verdict": "Failed"}
    assert registry.get_sample_value("lmeval_suite_verdict", labels) == 1.0


def test_the_pollers_registry_has_the_suite_families_with_no_suite() -> None:
    registry = CollectorRegistry()
    PollerMetrics(registry, version="", revision="")
    names = {family.name for family in registry.collect()}
    assert {
        "lmeval_suite_verdict",
        "lmeval_suite_runs",
        "lmeval_suite_last_run_timestamp_seconds",
        "lmeval_suite_criterion_regressed",
        "lmeval_suite_criterion_minimum_detectable_drop",
    } <= names
