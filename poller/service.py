"""Run the polling cycle on an APScheduler interval, and change the interval live.

One interval job, never overlapping (``max_instances=1``) and never dropped
for starting late (``misfire_grace_time=None``; ``coalesce`` folds a backlog
into one run). After every cycle the effective ``poll-interval`` is compared
with the trigger's, and a change reschedules the job at once, so an operator
who edits the ConfigMap sees the new spacing within one old interval, without
a restart. `stop()` lets the running cycle finish: SIGTERM never cuts a cycle
in half.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from poller import timefmt
from poller.reconciler import CycleReport, Reconciler

__all__ = ["JOB_ID", "PollingService"]

log = logging.getLogger(__name__)

JOB_ID = "lmeval-poll-cycle"


class PollingService:
    """The scheduler around a `Reconciler`."""

    def __init__(
        self,
        poller: Reconciler,
        *,
        on_cycle: Callable[[CycleReport | None, BaseException | None], None] | None = None,
    ) -> None:
        self.poller = poller
        self.on_cycle = on_cycle
        self.scheduler = BackgroundScheduler(timezone="UTC")
        self.interval = poller.refresh_settings().poll_interval
        self.stopped = threading.Event()

    def _cycle(self) -> None:
        report: CycleReport | None = None
        failure: BaseException | None = None
        try:
            report = self.poller.run_cycle()
            log.info(
                "cycle: %d jobs, %d pods, %d status patches, %d pods created, %d errors in %.3f s",
                report.jobs,
                report.pods,
                report.patches,
                report.pods_created,
                report.errors,
                report.duration,
            )
        except Exception as error:  # the scheduler must keep going
            failure = error
            log.exception("poll cycle failed")
        if self.on_cycle is not None:
            self.on_cycle(report, failure)
        self._follow_interval()

    def _follow_interval(self) -> None:
        wanted = self.poller.settings.poll_interval
        if wanted == self.interval or self.stopped.is_set():
            return
        log.info("poll-interval changed from %.1f s to %.1f s", self.interval, wanted)
        self.interval = wanted
        self.scheduler.reschedule_job(JOB_ID, trigger=IntervalTrigger(seconds=wanted))

    def start(self) -> None:
        """Start cycling now, then every poll-interval."""
        self.scheduler.add_job(
            self._cycle,
            trigger=IntervalTrigger(seconds=self.interval),
            id=JOB_ID,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            # The first cycle runs right away rather than one interval after start.
            next_run_time=timefmt.now(),
        )
        self.scheduler.start()

    def stop(self) -> None:
        """Stop scheduling and wait for a running cycle to finish."""
        self.stopped.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
