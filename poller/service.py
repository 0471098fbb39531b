"""The polling cycle, the check for new jobs and the sweep, on APScheduler intervals changed live.

Three interval jobs, each never overlapping itself (``max_instances=1``) and
never dropped for starting late (``misfire_grace_time=None``; ``coalesce``
folds a backlog into one run): the cycle every ``poll-interval``; the check
for new jobs every ``new-job-check-interval``; and the sweep of finished jobs
(`poller.cycle.sweep`) every ``finished-sweep-interval``, on a thread of its
own so that a step listing thousands of finished jobs never delays the cycle
that sees a pod end. After every run the effective interval is compared
with the trigger's, and a change reschedules the job at once, so an operator
who edits the ConfigMap sees the new spacing within one old interval,
without a restart. `stop()` lets running jobs finish: SIGTERM never cuts a
cycle in half.

The check for new jobs is how a job created while the poller is idle starts
without waiting out the interval, and the poller stays a poller: one LIST of
the jobs that have no status yet (usually empty; `Reconciler.new_job_waits`)
and, when one of them is new to the last cycle, the next cycle is moved to
now. It decides nothing and keeps nothing: the cycle it brings forward is an
ordinary one (one decision per job, never two cycles at once, the interval
counted again from it), and a check that fails or finds nothing changes
nothing. While a cycle runs the check waits for the next tick: that cycle
may have listed the job already, and if not, the next check sees it again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from poller import timefmt
from poller.cycle.reconciler import CycleReport, Reconciler
from poller.malloc import release_freed_memory

__all__ = ["JOB_ID", "NEW_JOBS_ID", "SWEEP_ID", "PollingService"]

log = logging.getLogger(__name__)

JOB_ID = "lmeval-poll-cycle"
SWEEP_ID = "lmeval-finished-sweep"
NEW_JOBS_ID = "lmeval-new-job-check"


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
        # 0: the check for new jobs is off (its job is paused).
        self.check_interval = settings.new_job_check_interval
        self.stopped = threading.Event()
        # Set while a cycle runs: the check for new jobs then waits.
        self.cycling = threading.Event()
        # Cycles the check brought forward (for logs and tests).
        self.brought_forward = 0
        # Whether the last check failed: a failing check warns once, not every tick.
        self.check_failing = False
        # The sweep runs on its own job (see the module docstring).
        poller.sweep_in_cycle = False

    def _cycle(self) -> None:
        report: CycleReport | None = None
        failure: BaseException | None = None
        self.cycling.set()
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
        finally:
            self.cycling.clear()
        if self.on_cycle is not None:
            self.on_cycle(report, failure)
        self._follow_interval()
        self._follow_check_interval()

    def _check_new_jobs(self) -> None:
        """Bring the next cycle forward to now when a new job waits (see the module
        docstring); a failed LIST is logged and the next check tries again."""
        if self.cycling.is_set() or self.stopped.is_set():
            return
        try:
            waits = self.poller.new_job_waits()
        except Exception as error:  # the scheduler must keep going
            # Once per outage, not every second: the cycle's own errors say the rest.
            if not self.check_failing:
                log.warning("check for new jobs failed (said once until it works): %s", error)
            self.check_failing = True
            return
        if self.check_failing:
            log.info("check for new jobs works again")
            self.check_failing = False
        if not waits or self.cycling.is_set() or self.stopped.is_set():
            return
        log.debug("a new job waits: cycling now")
        self.brought_forward += 1
        with contextlib.suppress(JobLookupError):  # stopping
            self.scheduler.modify_job(JOB_ID, next_run_time=timefmt.now())

    def _follow_check_interval(self) -> None:
        wanted = self.poller.settings.new_job_check_interval
        if wanted == self.check_interval or self.stopped.is_set():
            return
        log.info(
            "new-job-check-interval changed from %.1f s to %.1f s", self.check_interval, wanted
        )
        self.check_interval = wanted
        with contextlib.suppress(JobLookupError):
            if wanted == 0:
                self.scheduler.pause_job(NEW_JOBS_ID)
            else:
                self.scheduler.reschedule_job(NEW_JOBS_ID, trigger=IntervalTrigger(seconds=wanted))

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
        """Start cycling and sweeping now, then every poll-interval and
        finished-sweep-interval; check for new jobs every new-job-check-interval."""
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
        check = self.scheduler.add_job(
            self._check_new_jobs,
            # Off (0): scheduled all the same, paused until the setting turns it on.
            trigger=IntervalTrigger(seconds=self.check_interval or self.interval),
            id=NEW_JOBS_ID,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
        )
        if self.check_interval == 0:
            check.pause()
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
