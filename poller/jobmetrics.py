"""Per-job Prometheus series: every LMEvalJob's state, times, progress and scores.

Built at scrape time from the last cycle's snapshot (the jobs it read), an
immutable tuple replaced as a whole after each cycle, and the series of the
finished jobs kept between sweeps (`poller.cycle.retained`), which the cycle no
longer lists: a job in both is exposed from the snapshot. Nothing else per
job is remembered, so a deleted job's series are gone from the next scrape
after it leaves both (the sweep removes a deleted finished job from the
store) instead of lingering at their last value. A job's scores were parsed
from its results JSON once, when its view was built
(`poller.decisions.views.JobView.scores`), not on every scrape; and a scrape builds one
metric family at a time, so exposing 100,000 jobs never holds all their
samples at once. A plain scrape has each part written straight to text
(`JobFamilyPart.text`): at 100,000 finished jobs that is most of what the
poller does, and prometheus_client's generic path (a `Sample` per line, each
formatted on its own) cost it 11 s of CPU a scrape, written directly 3.1 s.
`poller.metrics` registers the collector next to the poller's own health
metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from poller import api
from poller.cycle.jobseries import GateSeries, JobSeries, series_of
from poller.decisions.views import JobView

__all__ = ["STATES", "JobCollector", "JobFamilyPart", "family_labels"]

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
        (`poller.cycle.retained.RetainedJobs.series`); a job among `jobs` too is
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
        # A generator: the exposition writes each part before the next is
        # built, so a scrape holds the samples of `chunk_jobs` jobs at a time.
        return self._families(series, self.chunk_jobs)

    @staticmethod
    def _families(series: Sequence[JobSeries], chunk: int) -> Iterator[Metric]:
        """The families; one with many jobs comes as consecutive parts of one name."""
        counts = GaugeMetricFamily(
            "lmeval_jobs", "LMEvalJobs by namespace and state.", labels=list(_COUNT_LABELS)
        )
        per_namespace: dict[str, dict[str, int]] = {}
        for job in series:
            states = per_namespace.setdefault(job.namespace, dict.fromkeys(STATES, 0))
            states[job.state] = states.get(job.state, 0) + 1
        for namespace, states in sorted(per_namespace.items()):
            for state, count in states.items():
                counts.add_metric([namespace, state], count)
        yield counts
        for family in FAMILIES:
            for start in range(0, max(len(series), 1), chunk):
                yield JobFamilyPart(family, series[start : start + chunk])


# As prometheus_client writes a value (Go's formatting: +Inf, NaN, 1.76e+09).
_go_float: Callable[[float], str] = floatToGoString


@dataclass(frozen=True, slots=True)
class _Family:
    """One per-job metric family: its name, help, type, labels and each job's rows."""

    name: str
    documentation: str
    type: str  # "gauge" or "info" (prometheus_client's names)
    # Sorted by name, as every exposition writes them, so a row is written in order.
    labels: tuple[str, ...]
    # (label values in `labels` order, value) of each of a job's samples.
    rows: Callable[[JobSeries], Iterable[tuple[tuple[str, ...], float]]]

    def __post_init__(self) -> None:
        if list(self.labels) != sorted(self.labels):
            raise ValueError(f"{self.name}: labels {self.labels} are not sorted")


class JobFamilyPart(Metric):
    """`jobs`' samples of one per-job family, in the two forms an exposition uses.

    A plain scrape (Prometheus text or OpenMetrics, names not re-escaped, no
    ``name[]`` filter) asks `text`, which writes the lines straight from the
    series: a fifth of the CPU of building prometheus_client's `Sample`s and
    formatting them one by one, which is what a scrape of 100,000 finished
    jobs is made of. Anything else (another escaping, a ``name[]`` filter,
    `get_sample_value`) reads `samples`, built on first use. Both give the
    same bytes (tests/metrics/test_collector.py compares them with the
    library's own).
    """

    def __init__(self, family: _Family, jobs: Sequence[JobSeries]) -> None:
        self._family = family
        self._jobs = jobs
        self._samples: list[Sample] | None = None
        super().__init__(family.name, family.documentation, family.type)

    @property
    def samples(self) -> list[Sample]:
        if self._samples is None:
            family = self._family
            name = family.name + "_info" if family.type == "info" else family.name
            self._samples = [
                Sample(name, dict(zip(family.labels, values, strict=True)), value)
                for job in self._jobs
                for values, value in family.rows(job)
            ]
        return self._samples

    @samples.setter
    def samples(self, samples: list[Sample]) -> None:
        # Metric.__init__ sets an empty list: the samples are built when read.
        self._samples = samples or None

    def text(self, *, openmetrics: bool = False) -> bytes:
        """This part in the Prometheus text format (or OpenMetrics), header
        included, byte for byte as prometheus_client's ``generate_latest``
        writes it: labels sorted by name, values by ``floatToGoString``."""
        family = self._family
        name = family.name + "_info" if family.type == "info" else family.name
        if openmetrics:
            header = (
                f"# HELP {family.name} {_escape(family.documentation)}\n"
                f"# TYPE {family.name} {family.type}\n"
            )
        else:
            help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
            header = f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"
        # One %-template per family; label values escaped once per distinct
        # value (a job's name recurs on each of its lines, a task on every job's).
        template = name + "{" + ",".join(f'{label}="%s"' for label in family.labels) + "} %s\n"
        escaped = _Escaped()
        lines = [header]
        add, rows = lines.append, family.rows
        for job in self._jobs:
            for values, value in rows(job):
                number = repr(value)
                if number.find(".") > 6 or number[-1] in "fn" or type(value) is not float:
                    number = _go_float(value)  # large, infinite, NaN or not a float
                add(template % (*map(escaped.__getitem__, values), number))
        return "".join(lines).encode()


class _Escaped(dict[str, str]):
    """Label values as the text formats quote them, each escaped on first use."""

    def __missing__(self, value: str) -> str:
        quoted = self[value] = _escape(value)
        return quoted


def _escape(value: str) -> str:
    """A label value as the text format quotes it (backslash, newline, double quote)."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


# Every family's labels, sorted by name (see `_Family.labels`).
_COUNT_LABELS = ("namespace", "state")
_IDS = ("lmevaljob", "namespace")
_INFO_LABELS = ("lmevaljob", "model", "namespace", "reason", "state")
_SCORE_LABELS = ("filter", "lmevaljob", "metric", "namespace", "task")
_GATE_LABELS = ("baseline", "lmevaljob", "metric", "namespace", "task")


def _info_rows(job: JobSeries) -> Iterable[tuple[tuple[str, ...], float]]:
    return (((job.name, job.model, job.namespace, job.reason, job.state), 1.0),)


def _value_rows(
    value_of: Callable[[JobSeries], float | None],
) -> Callable[[JobSeries], Iterable[tuple[tuple[str, ...], float]]]:
    def rows(job: JobSeries) -> Iterable[tuple[tuple[str, ...], float]]:
        value = value_of(job)
        return () if value is None else (((job.name, job.namespace), value),)

    return rows


def _score_rows(stderr: bool) -> Callable[[JobSeries], Iterable[tuple[tuple[str, ...], float]]]:
    def rows(job: JobSeries) -> Iterable[tuple[tuple[str, ...], float]]:
        return [
            ((filter_name, job.name, metric, job.namespace, task), value)
            for (task, metric, filter_name, is_stderr), value in job.scores()
            if is_stderr == stderr
        ]

    return rows


def _gate_rows(
    value_of: Callable[[GateSeries], float | None],
) -> Callable[[JobSeries], Iterable[tuple[tuple[str, ...], float]]]:
    """The regression gate's outcome (status.gate) of a job that has a verdict."""

    def rows(job: JobSeries) -> Iterable[tuple[tuple[str, ...], float]]:
        gate = job.gate
        if gate is None or (value := value_of(gate)) is None:
            return ()
        return (((gate.baseline, job.name, gate.metric, job.namespace, gate.task), value),)

    return rows


# Every per-job family, in the order a scrape shows them.
FAMILIES: tuple[_Family, ...] = (
    _Family(
        "lmeval_job",
        "One series per LMEvalJob (value 1) carrying its model, state and reason.",
        "info",
        _INFO_LABELS,
        _info_rows,
    ),
    _Family(
        "lmeval_job_start_timestamp_seconds",
        "When the job's pod was last scheduled (status.lastScheduleTime).",
        "gauge",
        _IDS,
        _value_rows(attrgetter("started")),
    ),
    _Family(
        "lmeval_job_completion_timestamp_seconds",
        "When the job finished (status.completeTime).",
        "gauge",
        _IDS,
        _value_rows(attrgetter("completed")),
    ),
    _Family(
        "lmeval_job_progress_ratio",
        "Share of the evaluation done, 0 to 1, as the driver last reported it.",
        "gauge",
        _IDS,
        _value_rows(attrgetter("progress")),
    ),
    _Family(
        "lmeval_job_result",
        "Evaluation score of a finished job: lm_eval results[task]['metric,filter'].",
        "gauge",
        _SCORE_LABELS,
        _score_rows(stderr=False),
    ),
    _Family(
        "lmeval_job_result_stderr",
        "Standard error of lmeval_job_result: lm_eval results[task]['metric_stderr,filter'].",
        "gauge",
        _SCORE_LABELS,
        _score_rows(stderr=True),
    ),
    _Family(
        "lmeval_job_regressed",
        "1 when the job's score dropped against spec.baseline by more than maxDrop with "
        "p < alpha (condition Regressed True), 0 when not; absent while Unknown.",
        "gauge",
        _GATE_LABELS,
        _gate_rows(lambda gate: 1.0 if gate.verdict == "Regressed" else 0.0),
    ),
    _Family(
        "lmeval_job_gate_difference",
        "The gate's paired difference of means, job minus baseline (status.gate.difference).",
        "gauge",
        _GATE_LABELS,
        _gate_rows(attrgetter("difference")),
    ),
    _Family(
        "lmeval_job_gate_p_value",
        "The gate's paired test p-value (status.gate.pValue).",
        "gauge",
        _GATE_LABELS,
        _gate_rows(attrgetter("p_value")),
    ),
)


def family_labels() -> dict[str, tuple[str, ...]]:
    """Each per-job family's label names, by family name.

    prometheus_client's families carry no label names until they hold
    samples: this says them without a cluster, for the generated metrics
    reference (`lmeval_sandbox.docs`).
    """
    return {"lmeval_jobs": _COUNT_LABELS, **{family.name: family.labels for family in FAMILIES}}
