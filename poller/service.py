"""Run the polling cycle and the sweep of finished jobs on APScheduler intervals, changed live.

Two interval jobs, each never overlapping itself (``max_instances=1``) and
never dropped for starting late (``misfire_grace_time=None``; ``coalesce``
folds a backlog into one run): the cycle every ``poll-interval``, and the
sweep of finished jobs (`poller.cycle.sweep`) every ``finished-sweep-interval``, on
a thread of its own so that a step listing thousands of finished jobs never
delays the cycle that sees a pod end. After every run the effective interval
is compared with the trigger's, and a change reschedules the job at once, so
an operator who edits the ConfigMap sees the new spacing within one old
interval, without a restart. `stop()` lets running jobs finish: SIGTERM
never cuts a cycle in half.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from poller import timefmt
from poller.cycle.reconciler import CycleReport, Reconciler
from poller.malloc import release_freed_memory

__all__ = ["JOB_ID", "SWEEP_ID", "PollingService"]

log = logging.getLogger(__name__)

JOB_ID = "lmeval-poll-cycle"
SWEEP_ID = "lmeval-finished-sweep"


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
        settings = poller.refresh_settings()
        self.interval = settings.poll_interval
        self.sweep_interval = settings.finished_sweep_interval
        self.stopped = threading.Event()
        # The sweep runs on its own job (see the module docstring).
        poller.sweep_in_cycle = False

    def _cycle(self) -> None:
        report: CycleReport | None = None
        failure: BaseException | None = None
        try:
            report = self.poller.run_cycle()
            log.info(
                "cycle: %d jobs, %d pods (+%d, %d read by name), %d status patches, "
                "%d pods created, %d errors in %.3f s",
                report.jobs,
                report.pods,
                report.jobs_read,
                report.pods_read,
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

    def _sweep(self) -> None:
        if self.poller.may_act():  # only the leader keeps its store of finished jobs true
            try:
                self.poller.sweep_finished()
                # After the first round (every finished job parsed whole), then
                # once a step: what the cycles, log reads and scrapes freed since.
                release_freed_memory()
            except Exception:  # the scheduler must keep going; the next step retries
                log.exception("sweep of finished jobs failed")
        wanted = self.poller.settings.finished_sweep_interval
        if wanted == self.sweep_interval or self.stopped.is_set():
            return
        log.info(
            "finished-sweep-interval changed from %.1f s to %.1f s", self.sweep_interval, wanted
        )
        self.sweep_interval = wanted
        self.scheduler.reschedule_job(SWEEP_ID, trigger=IntervalTrigger(seconds=wanted))

    def start(self) -> None:
        """Start cycling and sweeping now, then every poll-interval and finished-sweep-interval."""
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
        self.scheduler.add_job(
            self._sweep,
            trigger=IntervalTrigger(seconds=self.sweep_interval),
            id=SWEEP_ID,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=timefmt.now(),
        )
        self.scheduler.start()

    def stop(self) -> None:
        """Stop scheduling and wait for a running cycle to finish."""
        self.stopped.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
