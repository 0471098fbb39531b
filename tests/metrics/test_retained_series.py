"""Per-job series of the finished jobs the poller retains between sweeps.

Checks, on a fresh registry without a cluster: a finished job that the cycle
no longer lists but the store retains (`poller.cycle.retained`) keeps all its
series (info, counts by state, timestamps, scores with stderr, the gate's
verdict); a job both in the cycle's snapshot and in the store is exposed
once, from the snapshot (the newer view); a job dropped from the store and
absent from the snapshot vanishes, with its namespace's counts; and a cycle
hands the store's series over without going through them (the merge is
done by the scrape).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

from prometheus_client import CollectorRegistry, generate_latest

from poller.cycle.jobseries import JobSeries
from poller.cycle.reconciler import CycleReport
from poller.cycle.retained import RetainedJobs, record_of
from poller.decisions.views import JobView
from poller.metrics import PollerMetrics
from tests.metrics.conftest import TOY_RESULTS, make_job


def cycle(metrics: PollerMetrics, jobs: list[JobView], retained: Sequence[JobSeries]) -> None:
    report = CycleReport(jobs=len(jobs), snapshot=jobs, retained=retained)
    metrics.observe_cycle(report, None, interval=10.0)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def done(name: str, **kwargs: Any) -> JobView:
    return make_job(
        name,
        state="Complete",
        reason=kwargs.pop("reason", "Succeeded"),
        completed="2030-01-01T00:10:00Z",
        results=kwargs.pop("results", TOY_RESULTS),
        **kwargs,
    )


def test_a_retained_job_keeps_its_series() -> None:
    registry, store = CollectorRegistry(), RetainedJobs()
    metrics = PollerMetrics(registry)
    store.put(record_of(done("old", namespace="team-r")))
    gated = JobView.from_object(
        {
            "metadata": {"namespace": "team-r", "name": "gated", "uid": "uid-gated"},
            "spec": {"model": "dummy", "baseline": "old", "gate": {}},
            "status": {
                "state": "Complete",
                "reason": "Succeeded",
                "gate": {
                    "baseline": "old",
                    "task": "toy_mc",
                    "metric": "acc,none",
                    "verdict": "Regressed",
                    "reason": "Regressed",
                    "difference": -0.25,
                    "pValue": 0.001,
                },
            },
        }
    )
    store.put(record_of(gated))
    cycle(metrics, [make_job("running")], store.series())
    ids = {"namespace": "team-r", "lmevaljob": "old"}
    assert value(registry, "lmeval_jobs", namespace="team-r", state="Complete") == 2
    assert value(registry, "lmeval_jobs", namespace="team-a", state="Running") == 1
    info = {"model": "dummy", "state": "Complete", "reason": "Succeeded"}
    assert value(registry, "lmeval_job_info", **ids, **info) == 1
    assert value(registry, "lmeval_job_progress_ratio", **ids) == 1.0
    assert value(registry, "lmeval_job_completion_timestamp_seconds", **ids) is not None
    score = {**ids, "task": "toy_mc", "metric": "acc", "filter": "none"}
    assert value(registry, "lmeval_job_result", **score) == 0.5
    assert value(registry, "lmeval_job_result_stderr", **score) == 0.25
    assert value(registry, "lmeval_job_result", **ids, task="toy", metric="acc", filter="none")
    gate = {"baseline": "old", "task": "toy_mc", "metric": "acc,none"}
    assert value(registry, "lmeval_job_regressed", namespace="team-r", lmevaljob="gated", **gate)
    assert (
        value(registry, "lmeval_job_gate_p_value", namespace="team-r", lmevaljob="gated", **gate)
        == 0.001
    )


def test_a_job_in_the_snapshot_and_the_store_is_exposed_once_from_the_snapshot() -> None:
    registry, store = CollectorRegistry(), RetainedJobs()
    metrics = PollerMetrics(registry)
    store.put(record_of(done("j")))
    # The cycle read it again (its results were rewritten since).
    newer = done("j", results={"results": {"toy_mc": {"acc,none": 0.9}}})
    cycle(metrics, [newer], store.series())
    text = generate_latest(registry).decode()
    assert text.count('lmeval_job_info{lmevaljob="j"') == 1
    assert text.count('lmeval_job_completion_timestamp_seconds{lmevaljob="j"') == 1
    assert value(registry, "lmeval_jobs", namespace="team-a", state="Complete") == 1
    ids = {"namespace": "team-a", "lmevaljob": "j", "task": "toy_mc", "filter": "none"}
    assert value(registry, "lmeval_job_result", **ids, metric="acc") == 0.9
    assert value(registry, "lmeval_job_result", **ids, metric="acc_norm") is None


def test_a_job_dropped_from_both_vanishes() -> None:
    registry, store = CollectorRegistry(), RetainedJobs()
    metrics = PollerMetrics(registry)
    store.put(record_of(done("kept")))
    store.put(record_of(done("gone", namespace="team-z")))
    cycle(metrics, [], store.series())
    assert b'lmevaljob="gone"' in generate_latest(registry)
    store.drop("uid-team-z-gone")  # the sweep found it deleted, or its TTL ran out
    cycle(metrics, [], store.series())
    text = generate_latest(registry).decode()
    assert 'lmevaljob="gone"' not in text
    assert 'namespace="team-z"' not in text  # not even a zero count
    assert 'lmevaljob="kept"' in text


class Watched(Sequence[JobSeries]):
    """The store's series, counting the times anyone went through them."""

    def __init__(self, series: Sequence[JobSeries]) -> None:
        self.series, self.passes = series, 0

    def __len__(self) -> int:
        return len(self.series)

    @overload
    def __getitem__(self, index: int) -> JobSeries: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[JobSeries]: ...
    def __getitem__(self, index: int | slice) -> JobSeries | Sequence[JobSeries]:
        self.passes += 1
        return self.series[index]

    def __iter__(self) -> Iterator[JobSeries]:
        self.passes += 1
        return iter(self.series)


def test_a_cycle_does_not_go_through_the_retained_series() -> None:
    registry, store = CollectorRegistry(), RetainedJobs()
    metrics = PollerMetrics(registry)
    for i in range(50):
        store.put(record_of(done(f"j{i}")))
    watched = Watched(store.series())
    cycle(metrics, [make_job("running")], watched)
    assert watched.passes == 0
    assert value(registry, "lmeval_jobs", namespace="team-a", state="Complete") == 50
    assert watched.passes == 1  # the scrape merged them, once
