"""The sweep of finished jobs: the slow half of the cycle, its cost bounded whatever the history.

The hot cycle lists only jobs that are not Complete (`poller.cycle.observe`), so
a finished job costs nothing per cycle; what the poller still needs of it
lives in the store (`poller.cycle.retained`). Two things can happen to a finished
job that the hot cycle would not see: someone deletes it (its metrics
series must vanish) or changes it (a spec edit that matters: a new
ttlSecondsAfterFinished, a new gate). The sweep finds both by listing the
finished jobs again, on its own cadence and at a bounded rate: each step
lists the next `finished-sweep-jobs` of them (fieldSelector
status.state=Complete, pages of 500, the continue token kept from one step
to the next), every `finished-sweep-interval`. So the apiserver's work per
minute is bounded by the settings whatever the number of finished jobs; a
round over N of them takes N / finished-sweep-jobs steps, which is how long
a deletion or a change can take to be seen.

The first round after start reads whole objects, without pause, to build
every record (metrics and TTLs need them; a gated job whose gate has no
final outcome is marked to be decided by the cycle); later rounds read metadata only
(uid, name, resourceVersion: about a quarter of the bytes). A record whose
resourceVersion changed is marked to be read again by the hot cycle, which
decides on the fresh object; a finished job the store lacks is noted for
reading; at the end of a round the records it did not see are removed (the
jobs were deleted). The sweep only reads and marks: deciding and acting stay
in the cycle, on objects read in that cycle.

A continue token older than the apiserver's compaction (5 minutes by
default) is answered 410 Expired with a token that goes on from the same
place in the newest state (`Kube.list_jobs_page`): a round spread over
minutes is then not one snapshot, which the sweep does not need, since a job
deleted or made during the round is seen by the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from poller import api
from poller.api.settings import Settings
from poller.cycle.retained import RetainedJobs, compact_version, record_of
from poller.decisions.views import JobView
from poller.kube.client import PAGE_SIZE, Kube

__all__ = ["FINISHED_JOBS", "FinishedSweep", "SweepReport"]

log = logging.getLogger(__name__)

FINISHED_JOBS = f"status.state={api.JobState.COMPLETE.value}"


@dataclass
class SweepReport:
    """What one step did (for logs and tests)."""

    listed: int = 0
    pages: int = 0
    # Records marked to be read again (changed), or noted (unknown to the store).
    changed: int = 0
    unknown: int = 0
    added: int = 0
    # Records removed at the end of a round (their jobs were deleted).
    removed: int = 0
    # Whether a round ended in this step, and whether it read whole objects.
    round_ended: bool = False
    full: bool = False


class FinishedSweep:
    """Steps of the sweep over finished jobs; one step at a time (a lock)."""

    def __init__(self, kube: Kube, store: RetainedJobs, namespaces: Sequence[str] = ()) -> None:
        self.kube = kube
        self.store = store
        self.scopes: list[str | None] = [*namespaces] or [None]
        self._lock = threading.Lock()
        # Where the current round is: its number, the scope and the token.
        self._round: int | None = None
        self._scope = 0
        self._token: str | None = None
        # Whether a round has ended since start: until then, whole objects.
        self.warm = False
        self._last_step: float | None = None

    def due(self, settings: Settings, now: float) -> bool:
        """Whether a step is due at monotonic time `now` (always, until warm)."""
        last = self._last_step
        return not self.warm or last is None or now - last >= settings.finished_sweep_interval

    def step(self, settings: Settings, now: float, *, whole_round: bool = False) -> SweepReport:
        """List the next finished jobs (all of them until the first round ended,
        or with `whole_round`), mark the store, end the round when it is done."""
        with self._lock:
            self._last_step, began = now, time.monotonic()
            report = SweepReport(full=not self.warm)
            budget = settings.finished_sweep_jobs
            while True:
                if self._round is None:
                    self._round, self._scope, self._token = self.store.begin_round(), 0, None
                limit = PAGE_SIZE if report.full or whole_round else min(PAGE_SIZE, budget)
                self._page(report, self._round, limit)
                budget -= limit
                if self._token is None:
                    self._scope += 1
                if self._scope >= len(self.scopes):
                    report.removed = len(self.store.end_round(self._round))
                    report.round_ended, self.warm, self._round = True, True, None
                    break
                if budget <= 0 and not (report.full or whole_round):
                    break
            if report.full and report.round_ended:
                log.info(
                    "sweep of finished jobs: first round, %d read in %.1f s",
                    report.listed,
                    time.monotonic() - began,
                )
            elif report.removed or report.changed or report.unknown:
                log.info(
                    "sweep of finished jobs: %d listed, %d changed, %d unknown, %d removed",
                    report.listed,
                    report.changed,
                    report.unknown,
                    report.removed,
                )
            return report

    def _page(self, report: SweepReport, round_number: int, limit: int) -> None:
        page = self.kube.list_jobs_page(
            self.scopes[self._scope],
            field_selector=FINISHED_JOBS,
            token=self._token,
            limit=limit,
            metadata_only=not report.full,
        )
        self._token = page.continue_token
        report.pages += 1
        for item in page.items:
            meta = item.get("metadata") or {}
            uid, version = meta.get("uid"), meta.get("resourceVersion")
            if not isinstance(uid, str) or not isinstance(version, str):
                continue
            report.listed += 1
            known = self.store.get(uid)
            if self.store.saw(round_number, uid, version):
                changed = known is not None and known.resource_version != compact_version(version)
                report.changed += changed
                continue
            if not report.full:
                self.store.note_unknown(str(meta.get("namespace")), str(meta.get("name")), uid)
                report.unknown += 1
                continue
            try:
                record = record_of(JobView.from_object(item))
                # A gate without a final outcome is decided by the cycle (the
                # store's other reasons to read a job come from the cycle).
                record.follow = record.baseline is not None
                self.store.add(record)
            except Exception as error:  # unreadable: the cycle reads it and decides
                log.warning(
                    "finished job %s/%s: %s", meta.get("namespace"), meta.get("name"), error
                )
                self.store.note_unknown(str(meta.get("namespace")), str(meta.get("name")), uid)
                report.unknown += 1
                continue
            report.added += 1
