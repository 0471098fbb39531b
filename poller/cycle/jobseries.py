"""One job's metrics series, compact enough to keep for every finished job.

Why this module exists: the per-job families (`poller.jobmetrics`) are built
at scrape time from the last cycle's views and from what `poller.cycle.retained`
keeps of finished jobs, 100,000 of them and more. So a job's series is a
small frozen object: repeated strings interned, its score names a layout
shared by every job of the same suite (a suite's jobs all have the same one),
its values packed doubles. Pure: no I/O, no clock.
"""

from __future__ import annotations

import array
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from sys import intern

from poller import api
from poller.decisions.views import JobView
from poller.results.lmeval import Score
from poller.timefmt import timestamp

__all__ = ["GateSeries", "JobSeries", "ScoreKey", "series_of"]

# One score's name: (task, metric, filter, stderr), as in `poller.results.lmeval.Score`.
ScoreKey = tuple[str, str, str, bool]

# Score layouts are shared between jobs (a suite's jobs all have the same
# one); past this many distinct layouts a new one is kept unshared (correct,
# only larger), so that jobs with made-up task names cannot grow the table.
_MAX_LAYOUTS = 4096
_layouts: dict[tuple[ScoreKey, ...], tuple[ScoreKey, ...]] = {}


def _layout(scores: tuple[Score, ...]) -> tuple[ScoreKey, ...]:
    """The names of `scores`, one tuple shared by every job with the same ones."""
    keys = tuple([(s.task, s.metric, s.filter, s.stderr) for s in scores])
    shared = _layouts.get(keys)
    if shared is not None:
        return shared
    keys = tuple([(intern(t), intern(m), intern(f), e) for t, m, f, e in keys])
    if len(_layouts) >= _MAX_LAYOUTS:
        return keys
    # setdefault is atomic: two threads sharing out the same layout agree.
    return _layouts.setdefault(keys, keys)


def _pack(values: Iterable[float]) -> bytes:
    """Scores as native doubles: 8 bytes each instead of a 24-byte float object."""
    return array.array("d", values).tobytes()


@dataclass(frozen=True, slots=True)
class GateSeries:
    """The regression gate's verdict as the metrics expose it (of status.gate)."""

    baseline: str
    task: str
    metric: str
    verdict: str  # Regressed or NotRegressed
    difference: float | None
    p_value: float | None


@dataclass(frozen=True, slots=True)
class JobSeries:
    """What the metrics expose for one job (`poller.jobmetrics`), computed once per
    job view: the whole of what a finished job keeps in memory between sweeps
    besides its `FinishedRecord`'s few fields.

    The scores are `score_layout` (their names, one tuple shared by every job
    with the same ones) and `score_values` (packed doubles in that order);
    `scores()` pairs them up and `results` gives them as `Score`s.
    """

    uid: str
    namespace: str
    name: str
    model: str
    state: str
    reason: str
    started: float | None
    completed: float | None
    progress: float | None
    score_layout: tuple[ScoreKey, ...] = ()
    score_values: bytes = b""
    # The regression gate's verdict (status.gate), when one was computed.
    gate: GateSeries | None = None

    def scores(self) -> Iterator[tuple[ScoreKey, float]]:
        """((task, metric, filter, stderr), value) of every score, in order."""
        if not self.score_layout:
            return iter(())
        return zip(self.score_layout, memoryview(self.score_values).cast("d"), strict=True)

    @property
    def results(self) -> tuple[Score, ...]:
        """The scores as `poller.results.lmeval.Score`s (built on each call)."""
        return tuple(
            Score(task, metric, filter_name, value, stderr)
            for (task, metric, filter_name, stderr), value in self.scores()
        )


def _gate_series(gate: api.GateStatus | None) -> GateSeries | None:
    """status.gate when it holds a verdict (Regressed or NotRegressed), else None:
    an Unknown gate has no series, so an alert on 1 never fires on a missing baseline."""
    if gate is None or gate.verdict not in ("Regressed", "NotRegressed"):
        return None
    return GateSeries(
        baseline=intern(gate.baseline),
        task=intern(gate.task),
        metric=intern(gate.metric),
        verdict=intern(gate.verdict),
        difference=gate.difference,
        p_value=gate.p_value,
    )


def _progress_ratio(job: JobView) -> float | None:
    status = job.status
    percent = status.progress.percent if status.progress else None
    if percent is not None and math.isfinite(percent):
        ratio = percent / 100.0
        # The constants, not equal copies: most finished jobs share them.
        return 1.0 if ratio >= 1.0 else 0.0 if ratio <= 0.0 else ratio
    if status.state == api.JobState.COMPLETE and status.reason == api.JobReason.SUCCEEDED:
        return 1.0
    return None


def series_of(job: JobView) -> JobSeries:
    """The series of `job` as it stands."""
    status = job.status
    scores = job.scores  # parsed once, when the view was built (see JobView.scores)
    return JobSeries(
        uid=job.uid,
        namespace=intern(job.namespace),
        name=job.name,
        model=intern(str(job.spec.get("model") or "")),
        state=(status.state or api.JobState.NEW).value,
        reason=(status.reason or api.JobReason.NO_REASON).value,
        started=timestamp(status.last_schedule_time),
        completed=timestamp(status.complete_time),
        progress=_progress_ratio(job),
        score_layout=_layout(scores) if scores else (),
        score_values=_pack([s.value for s in scores]) if scores else b"",
        gate=_gate_series(status.gate),
    )
