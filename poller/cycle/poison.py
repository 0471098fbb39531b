"""When handling one job keeps failing: retry a bounded number of times, then end it.

A job's data is untrusted (its pod's log, its results, what users wrote into
its status), and a job that raises every cycle would otherwise stay Running
for ever, or, Complete, never reach its TTL. So every exception while
handling one job is judged here:

* **Transient** (the API or the node answered 5xx, the connection broke, a
  request timed out): the job is retried next cycle, and ends Failed only
  once it has failed `TRANSIENT_ATTEMPTS` cycles in a row over at least
  `TRANSIENT_WINDOW` seconds, so a short outage fails nothing.
* **Waiting** (409 Conflict, 429 Too Many Requests): someone else wrote
  first, or the apiserver asks us to slow down. Retried without counting.
* **Poison** (anything else: a decoder error, a value the apiserver refuses
  for good, a bug meeting unexpected data): the job ends Failed at once
  with the error in its message.

The ledger lives in memory (a restarted poller starts counting again; the
counts are per job and forgotten as soon as the job is handled once without
error). `failure_patch` is the smallest status write that ends a job, for
when the ordinary failure patch is itself refused. Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
import socket
from dataclasses import dataclass, field
from typing import Any

import urllib3.exceptions

from poller import api
from poller.kube.errors import ApiError, Conflict
from poller.timefmt import format_time

__all__ = [
    "TRANSIENT_ATTEMPTS",
    "TRANSIENT_WINDOW",
    "FailureLedger",
    "classify",
    "failure_patch",
]

# A job whose handling failed this many cycles in a row, over at least this
# many seconds, ends Failed (a log endpoint that errors for ever, ...).
TRANSIENT_ATTEMPTS = 10
TRANSIENT_WINDOW = 300.0
# Jobs remembered at once: bounded even if every job fails every cycle.
MAX_LEDGER_ENTRIES = 100_000


def classify(error: BaseException) -> str:
    """``"transient"``, ``"waiting"`` or ``"poison"``."""
    if isinstance(error, Conflict):
        return "waiting"
    if isinstance(error, ApiError):
        if error.status == 429:  # transient too, but asks us to slow down: not counted
            return "waiting"
        return "transient" if error.transient else "poison"
    if isinstance(error, urllib3.exceptions.HTTPError | TimeoutError | socket.timeout):
        return "transient"
    if isinstance(error, ConnectionError):
        return "transient"
    return "poison"


@dataclass
class _Failures:
    first: float
    count: int = 0


@dataclass
class FailureLedger:
    """Consecutive failed cycles per job UID, with the monotonic time of the first."""

    attempts: int = TRANSIENT_ATTEMPTS
    window: float = TRANSIENT_WINDOW
    _jobs: dict[str, _Failures] = field(default_factory=dict)

    def succeeded(self, uid: str) -> None:
        self._jobs.pop(uid, None)

    def failed(self, uid: str, error: BaseException, now: float) -> str | None:
        """Record a failure; the message to end the job with, or None to retry."""
        kind = classify(error)
        detail = f"{type(error).__name__}: {error}"
        if kind == "poison":
            self._jobs.pop(uid, None)
            return f"the poller cannot handle this job: {detail}"
        if kind == "waiting":
            return None
        entry = self._jobs.get(uid)
        if entry is None:
            if len(self._jobs) >= MAX_LEDGER_ENTRIES:
                return None  # counting resumes once entries are forgotten
            entry = self._jobs[uid] = _Failures(now)
        entry.count += 1
        spent = now - entry.first
        if entry.count < self.attempts or spent < self.window:
            return None
        self._jobs.pop(uid, None)
        return (
            f"the poller failed to handle this job {entry.count} cycles in a row over "
            f"{int(spent)} s; last error: {detail}"
        )

    def forget_except(self, uids: set[str]) -> None:
        """Drop the jobs that no longer exist."""
        for uid in [u for u in self._jobs if u not in uids]:
            del self._jobs[uid]


def failure_patch(message: str, now: dt.datetime) -> dict[str, Any]:
    """A merge patch of status that ends a job Failed, touching as little as possible.

    It drops `progress` (written from a driver's untrusted markers) and
    writes no results; the Finished and Succeeded conditions go with it so
    that `kubectl wait` still returns.
    """
    stamp = format_time(now)
    conditions = [
        {
            "type": kind.value,
            "status": status,
            "reason": "PollerError",
            "message": message[:1024],
            "lastTransitionTime": stamp,
        }
        for kind, status in (
            (api.ConditionType.FINISHED, "True"),
            (api.ConditionType.SUCCEEDED, "False"),
            (api.ConditionType.RUNNING, "False"),
        )
    ]
    return {
        "state": api.JobState.COMPLETE.value,
        "reason": api.JobReason.FAILED.value,
        "message": message[:4096],
        "completeTime": stamp,
        "progress": None,
        "conditions": conditions,
    }
