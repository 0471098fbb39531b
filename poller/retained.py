"""Finished jobs between sweeps: what the poller keeps of each, instead of listing them.

A cycle lists only the jobs that can still change (status.state!=Complete,
`poller.observe`); a finished job leaves that listing in the cycle that
finishes it. What the poller still needs of it (its metrics series, when its
TTL expires, whether its regression gate waits for a baseline) is kept here
as a compact record, and `poller.sweep` re-lists finished jobs on a slower
cadence of its own to notice the ones deleted or changed since.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from poller import api
from poller.results import Score
from poller.timefmt import timestamp
from poller.views import JobView

__all__ = ["JobSeries", "series_of"]


@dataclass(frozen=True, slots=True)
class JobSeries:
    """What the metrics expose for one job (`poller.jobmetrics`), computed once per
    job view: the whole of what a finished job keeps in memory between sweeps."""

    namespace: str
    name: str
    model: str
    state: str
    reason: str
    started: float | None
    completed: float | None
    progress: float | None
    results: tuple[Score, ...]
    # The regression gate's verdict (status.gate), when one was computed.
    gate: api.GateStatus | None = None


def _verdict(gate: api.GateStatus | None) -> api.GateStatus | None:
    """status.gate when it holds a verdict (Regressed or NotRegressed), else None:
    an Unknown gate has no series, so an alert on 1 never fires on a missing baseline."""
    return gate if gate is not None and gate.verdict in ("Regressed", "NotRegressed") else None


def _progress_ratio(job: JobView) -> float | None:
    status = job.status
    percent = status.progress.percent if status.progress else None
    if percent is not None and math.isfinite(percent):
        return min(max(percent / 100.0, 0.0), 1.0)
    if status.state == api.JobState.COMPLETE and status.reason == api.JobReason.SUCCEEDED:
        return 1.0
    return None


def series_of(job: JobView) -> JobSeries:
    """The series of `job` as it stands."""
    status = job.status
    return JobSeries(
        namespace=job.namespace,
        name=job.name,
        model=str(job.spec.get("model") or ""),
        state=(status.state or api.JobState.NEW).value,
        reason=(status.reason or api.JobReason.NO_REASON).value,
        started=timestamp(status.last_schedule_time),
        completed=timestamp(status.complete_time),
        progress=_progress_ratio(job),
        # Parsed once, when the view was built (see JobView.scores).
        results=job.scores,
        gate=_verdict(status.gate),
    )
