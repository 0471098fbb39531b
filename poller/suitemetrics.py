"""Per-suite Prometheus series: each LMEvalSuite's latest verdict, its runs, its criteria.

Why beside the jobs' series: an alert on a model that regressed reads one
series per suite (``lmeval_suite_verdict{verdict="Regressed"} == 1``), not
the runs' job series, which come and go with the history limits. Built at
scrape time from the last cycle's snapshot of the suites
(`poller.cycle.suites`), replaced whole after each cycle, so a deleted suite's
series are gone from the next scrape. Suites are few (one per model and
team), so the families are built the plain way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from poller.timefmt import parse_time

__all__ = ["SUITE_VERDICTS", "SuiteCollector", "SuiteSeries", "suite_family_labels"]

# The Verdict column's values: a run that failed has no verdict, and says Failed.
SUITE_VERDICTS = ("Passed", "Regressed", "Inconclusive", "Failed")
_RUN_STATES = ("Active", "Finished", "Failed")

_SUITE = ("namespace", "lmevalsuite")
_FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "lmeval_suite_verdict": (
        "1 for the suite's latest verdict (Passed, Regressed, Inconclusive, or Failed when its "
        "latest run failed), 0 for the others; no series before a first verdict.",
        (*_SUITE, "verdict"),
    ),
    "lmeval_suite_runs": (
        "The suite's runs kept in its status (history limits), by state (Active, Finished, "
        "Failed).",
        (*_SUITE, "state"),
    ),
    "lmeval_suite_last_run_timestamp_seconds": (
        "When the suite's latest run was started (Unix time).",
        _SUITE,
    ),
    "lmeval_suite_criterion_regressed": (
        "Per criterion of the suite's latest verdict: 1 if it regressed, 0 if not; no series "
        "for a criterion without a comparison.",
        (*_SUITE, "task", "metric", "tier"),
    ),
    "lmeval_suite_criterion_minimum_detectable_drop": (
        "Per criterion of the suite's latest verdict: the smallest drop its paired test "
        "detects with the criterion's power at the documents compared (compare with maxDrop).",
        (*_SUITE, "task", "metric", "tier"),
    ),
}


def suite_family_labels() -> dict[str, tuple[str, ...]]:
    """Each suite family's label names (for the generated metrics reference)."""
    return {name: labels for name, (_, labels) in _FAMILIES.items()}


class SuiteSeries:
    """What one suite exposes, read once from its status when the snapshot is taken."""

    __slots__ = ("criteria", "last_started", "name", "namespace", "runs", "verdict")

    def __init__(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.namespace, self.name = namespace, name
        verdict = status.get("lastVerdict")
        self.verdict = verdict if isinstance(verdict, str) else None
        listed = status.get("runs")
        runs = [r for r in listed if isinstance(r, dict)] if isinstance(listed, list) else []
        self.runs = {s: sum(1 for r in runs if r.get("state") == s) for s in _RUN_STATES}
        started = parse_time(runs[-1].get("started")) if runs else None
        self.last_started = started.timestamp() if started is not None else None
        ended = [r for r in runs if r.get("state") != "Active"]
        self.criteria: list[tuple[str, str, str, float | None, float | None]] = []
        for item in (ended[-1].get("criteria") or []) if ended else []:
            if not isinstance(item, dict):
                continue
            regressed = {"Regressed": 1.0, "Passed": 0.0}.get(str(item.get("verdict")))
            if item.get("verdict") == "Inconclusive" and item.get("pValue") is not None:
                regressed = 0.0  # compared, not regressed, without enough power
            drop = item.get("minimumDetectableDrop")
            self.criteria.append(
                (
                    str(item.get("task", "")),
                    str(item.get("metric", "")),
                    str(item.get("tier", "")),
                    regressed,
                    float(drop) if isinstance(drop, int | float) else None,
                )
            )


class SuiteCollector(Collector):
    """The suites' series from the last cycle's snapshot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: tuple[SuiteSeries, ...] = ()

    def update(self, suites: Sequence[SuiteSeries]) -> None:
        with self._lock:
            self._series = tuple(suites)

    def describe(self) -> Iterable[Metric]:
        return self._families(())

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            series = self._series
        return self._families(series)

    @staticmethod
    def _families(series: Sequence[SuiteSeries]) -> list[Metric]:
        families = {
            name: GaugeMetricFamily(name, text, labels=list(labels))
            for name, (text, labels) in _FAMILIES.items()
        }
        for suite in series:
            where = [suite.namespace, suite.name]
            if suite.verdict is not None:
                for verdict in SUITE_VERDICTS:
                    value = 1.0 if verdict == suite.verdict else 0.0
                    families["lmeval_suite_verdict"].add_metric([*where, verdict], value)
            for state, count in suite.runs.items():
                families["lmeval_suite_runs"].add_metric([*where, state], float(count))
            if suite.last_started is not None:
                families["lmeval_suite_last_run_timestamp_seconds"].add_metric(
                    where, suite.last_started
                )
            for task, metric, tier, regressed, drop in suite.criteria:
                labels = [*where, task, metric, tier]
                if regressed is not None:
                    families["lmeval_suite_criterion_regressed"].add_metric(labels, regressed)
                if drop is not None:
                    families["lmeval_suite_criterion_minimum_detectable_drop"].add_metric(
                        labels, drop
                    )
        return list(families.values())
