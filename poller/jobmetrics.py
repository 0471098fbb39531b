"""Per-job Prometheus series: every LMEvalJob's state, times, progress and scores.

Built at scrape time from the last cycle's snapshot (the jobs it read), an
immutable tuple replaced as a whole after each cycle, and the series of the
finished jobs kept between sweeps (`poller.retained`), which the cycle no
longer lists: a job in both is exposed from the snapshot. Nothing else per
job is remembered, so a deleted job's series are gone from the next scrape
after it leaves both (the sweep removes a deleted finished job from the
store) instead of lingering at their last value. A job's scores were parsed
from its results JSON once, when its view was built
(`poller.views.JobView.scores`), not on every scrape; and a scrape builds one
metric family at a time, so exposing 100,000 jobs never holds all their
samples at once. `poller.metrics` registers the collector
next to the poller's own health metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from poller import api
from poller.retained import JobSeries, series_of
from poller.views import JobView

__all__ = ["STATES", "JobCollector"]

STATES = tuple(state.value for state in api.JobState)


class JobCollector(Collector):
    """Per-job series from the last cycle's snapshot and the retained finished jobs.

    A family of many jobs is yielded in parts of `chunk_jobs` jobs, one after
    the other under the same name; `poller.metrics.exposition_app` writes
    them as one family (a plain ``make_wsgi_app`` would repeat its header).
    """

    # About 1 MiB of samples per part with a few scores a job.
    chunk_jobs = 500

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: tuple[JobSeries, ...] = ()
        self._uids: frozenset[str] = frozenset()
        self._retained: Sequence[JobSeries] = ()

    def update(self, jobs: Iterable[JobView], retained: Sequence[JobSeries] = ()) -> None:
        """Replace the snapshot; the next scrape sees exactly these jobs.

        `retained` are the finished jobs kept between sweeps
        (`poller.retained.RetainedJobs.series`); a job among `jobs` too is
        exposed from `jobs` (read this cycle). The two are merged at scrape
        time, so a cycle does no work per retained job.
        """
        series = [series_of(job) for job in jobs]
        snapshot = tuple(sorted(series, key=lambda s: (s.namespace, s.name)))
        uids = frozenset(s.uid for s in snapshot)
        with self._lock:
            self._series, self._uids, self._retained = snapshot, uids, retained

    def exposed(self) -> Sequence[JobSeries]:
        """The series a scrape exposes: the snapshot, then the retained jobs not in it."""
        with self._lock:
            snapshot, uids, retained = self._series, self._uids, self._retained
        if not retained:
            return snapshot
        return [*snapshot, *(s for s in retained if s.uid not in uids)]

    def describe(self) -> Iterable[Metric]:
        return list(self._families((), self.chunk_jobs))

    def collect(self) -> Iterable[Metric]:
        series = self.exposed()
        # A generator: the exposition writes each family before the next is
        # built, so a scrape holds the samples of `chunk_jobs` jobs at a time.
        return self._families(series, self.chunk_jobs)

    @staticmethod
    def _families(series: Sequence[JobSeries], chunk: int) -> Iterator[Metric]:
        """The families; one with many jobs comes as consecutive parts of one name."""
        ids = ["namespace", "lmevaljob"]
        counts = GaugeMetricFamily(
            "lmeval_jobs", "LMEvalJobs by namespace and state.", labels=["namespace", "state"]
        )
        per_namespace: dict[str, dict[str, int]] = {}
        for job in series:
            states = per_namespace.setdefault(job.namespace, dict.fromkeys(STATES, 0))
            states[job.state] = states.get(job.state, 0) + 1
        for namespace, states in sorted(per_namespace.items()):
            for state, count in states.items():
                counts.add_metric([namespace, state], count)
        yield counts
        for part in _parts(series, chunk):
            info = InfoMetricFamily(
                "lmeval_job",
                "One series per LMEvalJob (value 1) carrying its model, state and reason.",
                labels=[*ids, "model", "state", "reason"],
            )
            for job in part:
                info.add_metric(
                    [job.namespace, job.name],
                    {"model": job.model, "state": job.state, "reason": job.reason},
                )
            yield info
        for name, text, value_of in (
            (
                "lmeval_job_start_timestamp_seconds",
                "When the job's pod was last scheduled (status.lastScheduleTime).",
                attrgetter("started"),
            ),
            (
                "lmeval_job_completion_timestamp_seconds",
                "When the job finished (status.completeTime).",
                attrgetter("completed"),
            ),
            (
                "lmeval_job_progress_ratio",
                "Share of the evaluation done, 0 to 1, as the driver last reported it.",
                attrgetter("progress"),
            ),
        ):
            for part in _parts(series, chunk):
                family = GaugeMetricFamily(name, text, labels=ids)
                for job in part:
                    if (value := value_of(job)) is not None:
                        family.add_metric([job.namespace, job.name], value)
                yield family
        for name, text, stderr in (
            (
                "lmeval_job_result",
                "Evaluation score of a finished job: lm_eval results[task]['metric,filter'].",
                False,
            ),
            (
                "lmeval_job_result_stderr",
                "Standard error of lmeval_job_result: "
                "lm_eval results[task]['metric_stderr,filter'].",
                True,
            ),
        ):
            for part in _parts(series, chunk):
                family = GaugeMetricFamily(name, text, labels=[*ids, "task", "metric", "filter"])
                for job in part:
                    for (task, metric, filter_name, is_stderr), score in job.scores():
                        if is_stderr == stderr:
                            family.add_metric(
                                [job.namespace, job.name, task, metric, filter_name], score
                            )
                yield family
        yield from _gate_families(series, chunk)


def _gate_families(series: Sequence[JobSeries], chunk: int) -> Iterator[Metric]:
    """The regression gate's outcome (status.gate) of each job that has a verdict."""
    labels = ["namespace", "lmevaljob", "baseline", "task", "metric"]
    for name, text, value_of in (
        (
            "lmeval_job_regressed",
            "1 when the job's score dropped against spec.baseline by more than maxDrop with "
            "p < alpha (condition Regressed True), 0 when not; absent while Unknown.",
            lambda gate: 1.0 if gate.verdict == "Regressed" else 0.0,
        ),
        (
            "lmeval_job_gate_difference",
            "The gate's paired difference of means, job minus baseline (status.gate.difference).",
            attrgetter("difference"),
        ),
        (
            "lmeval_job_gate_p_value",
            "The gate's paired test p-value (status.gate.pValue).",
            attrgetter("p_value"),
        ),
    ):
        for part in _parts(series, chunk):
            family = GaugeMetricFamily(name, text, labels=labels)
            for job in part:
                gate = job.gate
                if gate is not None and (value := value_of(gate)) is not None:
                    family.add_metric(
                        [job.namespace, job.name, gate.baseline, gate.task, gate.metric], value
                    )
            yield family


def _parts(series: Sequence[JobSeries], size: int) -> Iterator[Sequence[JobSeries]]:
    """`series` in slices of `size` (one empty slice when there is none)."""
    for start in range(0, max(len(series), 1), size):
        yield series[start : start + size]
