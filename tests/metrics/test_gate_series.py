"""The regression gate's series (`lmeval_job_regressed`, its difference and p-value).

Checks, on a fresh registry without a cluster: a job whose gate reached a
verdict has `lmeval_job_regressed` 1 (Regressed) or 0 (NotRegressed) with
its baseline, task and metric as labels, and its difference and p-value; a
gate that is Unknown (e.g. the baseline is missing) has no series at all, so
an alert on the value never fires on a job without a verdict; and the series
vanish with the job.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from poller.cycle.reconciler import CycleReport
from poller.decisions.views import JobView
from poller.metrics import PollerMetrics


def gated(name: str, verdict: str, **numbers: Any) -> JobView:
    gate = {
        "baseline": "base",
        "task": "arith",
        "metric": "exact_match,none",
        "verdict": verdict,
        "reason": verdict if verdict != "Unknown" else "BaselineMissing",
        **numbers,
    }
    return JobView.from_object(
        {
            "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "generation": 1},
            "spec": {"model": "dummy", "tasks": ["arith"], "baseline": "base", "gate": {}},
            "status": {"state": "Complete", "reason": "Succeeded", "gate": gate},
        }
    )


def snapshot(metrics: PollerMetrics, *jobs: JobView) -> None:
    metrics.observe_cycle(CycleReport(jobs=len(jobs), snapshot=list(jobs)), None, interval=1.0)


def test_verdicts_have_series_and_unknown_has_none() -> None:
    registry = CollectorRegistry()
    metrics = PollerMetrics(registry)
    snapshot(
        metrics,
        gated("worse", "Regressed", difference=-0.3, pValue=1e-12),
        gated("same", "NotRegressed", difference=0.0, pValue=1.0),
        gated("waiting", "Unknown"),
    )
    labels = {"namespace": "ns", "baseline": "base", "task": "arith", "metric": "exact_match,none"}

    def value(name: str, job: str) -> float | None:
        return registry.get_sample_value(name, {**labels, "lmevaljob": job})

    assert value("lmeval_job_regressed", "worse") == 1.0
    assert value("lmeval_job_regressed", "same") == 0.0
    assert value("lmeval_job_regressed", "waiting") is None
    assert value("lmeval_job_gate_difference", "worse") == -0.3
    assert value("lmeval_job_gate_p_value", "worse") == 1e-12
    assert value("lmeval_job_gate_p_value", "waiting") is None
    snapshot(metrics, gated("same", "NotRegressed"))
    assert value("lmeval_job_regressed", "worse") is None
    assert value("lmeval_job_regressed", "same") == 0.0
