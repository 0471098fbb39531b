"""The Reconciler: one polling cycle over the jobs that can change; observe, decide once, act.

The service (`poller.service`) calls `Reconciler.run_cycle` on every tick of
its interval. A cycle reads the settings ConfigMap, lists the LMEvalJobs that
are not Complete and the live pods the poller manages, reads by name the few
finished jobs due for a decision, and joins each job to its pod
(`poller.cycle.observe`). Then,
for each job: the pure `decide.what_to_observe` names what its decision
needs beyond that (the namespace's UID range, a log window, the results
file a holding driver keeps); the cycle reads it (`poller.cycle.observe`); the
pure `decide` runs once, on complete observations; and its actions are
carried out (`poller.cycle.act`). A job that needs nothing more is decided at
once (deciding is pure and cheap) and, when that yields nothing to do, is
left exactly as listed.

Jobs with something to read or do run on a few threads at once, since one
job's requests never depend on another's. Log reads for a running job's
progress only come after every other job's transitions, within a budget
that accrues per minute (capped per cycle, so that a short poll-interval
makes cycles more frequent, not log reads) and a per-job rate limit, so
that a job whose pod just ended never waits behind dozens of them. Jobs
are independent: an exception while handling one is counted, retried
within bounds, and then ends that job (`poller.cycle.poison`); the cycle
goes on with the next.

After the cycle, every job decided in it that is Complete goes to the store
of finished jobs (`poller.cycle.retained`) and every other one leaves it; a
finished job that had something to read or do is read again next cycle, to
confirm it is settled. The store gives the metrics their finished jobs and
the cycle its due TTLs; the sweep (`poller.cycle.sweep`, its own cadence, see
`sweep_finished`) keeps it true to the cluster: jobs deleted or changed.

The cluster is the state. Between cycles the poller keeps only the
settings' last good values, when each running job's progress was last read
and the progress reads accrued per minute and not yet made (rate
limiters), each job's view by resourceVersion (`poller.cycle.observe`),
the count of each job's consecutive failures and the store of finished
jobs, which a restart rebuilds from the first sweep.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from poller import api, timefmt
from poller.api.settings import CONFIGMAP_NAME, Settings, SettingsTracker
from poller.cycle import poison
from poller.cycle.act import Actuator
from poller.cycle.jobseries import JobSeries
from poller.cycle.observe import Observer
from poller.cycle.podio import PodIO
from poller.cycle.podproof import PodProof, load_pod_proof
from poller.cycle.retained import RetainedJobs, record_of
from poller.cycle.statuswrites import StatusWrites
from poller.cycle.suites import SuiteLoop, SuitesReport
from poller.cycle.sweep import FinishedSweep, SweepReport
from poller.decisions import decide as decisions
from poller.decisions.actions import Decision, Needs
from poller.decisions.concurrency import plan_queue
from poller.decisions.observed import Observed
from poller.decisions.views import JobView, PodView
from poller.kube.client import Kube

__all__ = ["ACTION_WORKERS", "CycleReport", "Reconciler"]

log = logging.getLogger(__name__)

# Jobs acting at once in a cycle (each one's own requests stay in order).
ACTION_WORKERS = 4


@dataclass
class CycleReport:
    """What one cycle saw and did (for logs, metrics and tests)."""

    jobs: int = 0
    pods: int = 0
    # Reads by name (`poller.cycle.observe`): finished jobs, and pods that ended.
    jobs_read: int = 0
    pods_read: int = 0
    patches: int = 0
    pods_created: int = 0
    errors: int = 0
    duration: float = 0.0
    error_messages: list[str] = field(default_factory=list)
    # True when this replica was not (or stopped being) the leader.
    skipped: bool = False
    # Every job as it stands after this cycle (status as written), for the
    # metrics collector: an immutable picture of the last cycle.
    snapshot: list[JobView] = field(default_factory=list)
    # The finished jobs kept between sweeps (`poller.cycle.retained`), as the metrics
    # expose them; a job also in `snapshot` (read this cycle) is exposed from there.
    retained: Sequence[JobSeries] = ()
    # The jobs this cycle moved to Complete (their durations are observed once).
    finished: list[JobView] = field(default_factory=list)
    # The suites' half of the cycle (`poller.cycle.suites`), None when not run.
    suites: SuitesReport | None = None
    # Jobs act on several threads (see Reconciler.run_cycle): counts go through it.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, *, patches: int = 0, pods_created: int = 0) -> None:
        with self._lock:
            self.patches += patches
            self.pods_created += pods_created

    def add_error(self, message: str) -> None:
        with self._lock:
            self.errors += 1
            self.error_messages.append(message)


# What the cycle's first look at a job found: what to read before deciding,
# or the decision itself (nothing to read), or the error meeting it raised
# (recorded for that job like any other, on a worker).
FirstLook = Needs | Decision | Exception


class Reconciler:
    """The polling cycle, with its dependencies injected."""

    def __init__(
        self,
        kube: Kube,
        *,
        settings_namespace: str,
        namespaces: Sequence[str] = (),
        clock: Callable[[], dt.datetime] = timefmt.now,
        tracker: SettingsTracker | None = None,
        may_act: Callable[[], bool] = lambda: True,
        proof: PodProof | None = None,
        sweep_in_cycle: bool = True,
    ) -> None:
        self.kube = kube
        self.reads = PodIO(kube)
        self.writes = StatusWrites(kube)
        # What is kept of finished jobs, and the sweep that keeps it true.
        self.retained = RetainedJobs()
        self.sweep = FinishedSweep(kube, self.retained, namespaces)
        # True: `run_cycle` runs the sweep's steps itself when they are due (one
        # process, scripts, tests); the service runs them on a job of its own.
        self.sweep_in_cycle = sweep_in_cycle
        self.observer = Observer(kube, self.reads, namespaces, self.retained)
        self.actuator = Actuator(kube, self.reads, self.writes, self.pod_proof)
        self.suites = SuiteLoop(
            kube, self.observer, self.pod_proof, namespaces, lambda: self.settings
        )
        self.settings_namespace = settings_namespace
        self.clock = clock
        self.tracker = tracker or SettingsTracker()
        # Leader election's verdict, asked before the cycle and before each
        # job: a replica that lost its lease stops acting at once.
        self.may_act = may_act
        # When each running job's log was last read for progress (monotonic
        # seconds): a rate limiter only, so losing it on restart is harmless.
        self._progress_read_at: dict[str, float] = {}
        # Progress reads accrued at progress-reads-per-minute and not yet made,
        # and when they were last counted (monotonic): a rate limiter too.
        self._progress_credit = 0.0
        self._progress_counted_at: float | None = None
        # Consecutive failures per job (poller.cycle.poison): bounded retries, then Failed.
        self._failures = poison.FailureLedger()
        # The key that proves which pods this poller made (poller.cycle.podproof);
        # read from its Secret on the first cycle unless injected.
        self._proof = proof

    @property
    def settings(self) -> Settings:
        return self.tracker.current

    def pod_proof(self) -> PodProof:
        """The pod-identity key, read (or made) once; a cycle cannot judge pods without it."""
        if self._proof is None:
            self._proof = load_pod_proof(self.kube, self.settings_namespace)
        return self._proof

    def refresh_settings(self) -> Settings:
        """Re-read the ConfigMap; on any error keep what we had."""
        try:
            data = self.kube.read_configmap_data(self.settings_namespace, CONFIGMAP_NAME)
        except Exception as error:  # the API may be briefly unreachable
            log.warning(
                "cannot read ConfigMap %s/%s: %s; keeping current settings",
                self.settings_namespace,
                CONFIGMAP_NAME,
                error,
            )
            return self.tracker.current
        return self.tracker.update(data)

    def run_cycle(self) -> CycleReport:
        """One full cycle. Raises only when the LISTs themselves fail."""
        started = time.monotonic()
        report = CycleReport()
        if not self.may_act():
            report.skipped = True
            return report
        settings = self.refresh_settings()
        if self.sweep_in_cycle and self.sweep.due(settings, time.monotonic()):
            self.sweep.step(settings, time.monotonic())
        listing = self.observer.list_cluster(
            self.pod_proof().attempt_of, settings, self.clock().timestamp()
        )
        report.jobs, report.pods = listing.jobs_listed, listing.pods_listed
        report.jobs_read, report.pods_read = listing.jobs_read, listing.pods_read
        for meta, error in listing.unreadable:
            self._count_error(report, meta, error)
        jobs, pods_by_job = listing.jobs, listing.pods_by_job
        # Jobs with something to read or do: a finished one is read again next cycle.
        acted: set[str] = set()
        if listing.kueue_error is not None:
            problem = RuntimeError(listing.kueue_error)
            self._count_error(report, {"namespace": "*", "name": "workloads"}, problem)
        # Jobs under Kueue: its quotas govern them, not max-running-jobs.
        gated = {job.uid: view for job in jobs if (view := listing.kueue_view(job)) is not None}
        free_jobs = [job for job in jobs if job.uid not in gated]
        queue = plan_queue(free_jobs, pods_by_job, settings.max_running_jobs)
        # Transitions first, progress reads after: each progress read is a log
        # GET, and a job whose pod just ended must not wait behind dozens of
        # them. A job with nothing to read is decided here (pure and cheap);
        # the jobs with something to read or do run on a few threads at once.
        outcomes: list[JobView | Future[JobView]] = []
        # Jobs whose only need is a progress read (within the budget), for after
        # the transitions: (index into outcomes, as listed, when first looked at, needs).
        progress: list[tuple[int, Observed, dt.datetime, Needs]] = []
        budget = self._progress_budget(settings, time.monotonic())
        with ThreadPoolExecutor(ACTION_WORKERS, thread_name_prefix="lmeval-act") as pool:
            for job in jobs:
                if not self.may_act():
                    report.skipped = True
                    break
                if job.queue_name and listing.kueue_error is not None:
                    outcomes.append(job)  # never started without knowing its workload
                    continue
                pod, now = pods_by_job.get(job.uid), self.clock()
                kueue, gate = gated.get(job.uid), listing.gate_view(job)
                shard_pods = listing.shards_by_job.get(job.uid, ())
                listed = Observed(
                    job, pod, queue.get(job.uid), kueue=kueue, gate=gate, shards=shard_pods
                )
                progress_due = budget > len(progress) and self._progress_due(job, pod, settings)
                looked = self._first_look(listed, settings, now, progress_due)
                if isinstance(looked, Decision) and not looked.actions:
                    outcomes.append(job)
                elif isinstance(looked, Needs) and _progress_only(looked):
                    progress.append((len(outcomes), listed, now, looked))
                    outcomes.append(job)
                else:
                    acted.add(job.uid)
                    work = (listed, settings, now, looked, report)
                    outcomes.append(pool.submit(self._handle_safely, *work))
        report.snapshot = [i if isinstance(i, JobView) else i.result() for i in outcomes]
        for index, listed, now, needs in progress:
            if report.skipped:
                break
            if not self.may_act():
                report.skipped = True
                break
            report.snapshot[index] = self._handle_safely(listed, settings, now, needs, report)
        self._progress_credit = max(0.0, self._progress_credit - len(progress))
        self._forget_progress(pods_by_job)
        self._failures.forget_except({job.uid for job in jobs})
        self._keep_finished(report, jobs, acted)
        if not report.skipped and self.may_act():
            self._run_suites(report)
        report.duration = time.monotonic() - started
        return report

    def _run_suites(self, report: CycleReport) -> None:
        """The suites' half (`poller.cycle.suites`), after the jobs: a failed LIST of
        suites is counted, and the jobs' half stands."""
        try:
            report.suites = self.suites.run(self.clock())
        except Exception as error:
            self._count_error(report, {"namespace": "*", "name": "lmevalsuites"}, error)
            return
        for message in report.suites.errors:
            report.add_error(message)
        report.add(patches=report.suites.patches)

    def _keep_finished(self, report: CycleReport, listed: list[JobView], acted: set[str]) -> None:
        """The store of finished jobs after this cycle: each job decided that is
        Complete is kept (read again next cycle when it had something to read or
        do), each other one leaves it. A skipped cycle changes nothing."""
        if report.skipped:
            return
        was_complete = {job.uid for job in listed if job.status.state == api.JobState.COMPLETE}
        for job in report.snapshot:
            if job.status.state != api.JobState.COMPLETE or not job.uid:
                self.retained.drop(job.uid)
                continue
            if job.uid not in was_complete:
                report.finished.append(job)
            try:
                self.retained.put(record_of(job, follow=job.uid in acted))
            except Exception as error:  # one bad object never stops the others
                self._count_error(report, {"namespace": job.namespace, "name": job.name}, error)
        report.retained = self.retained.series()

    def sweep_finished(self, *, whole_round: bool = False) -> SweepReport:
        """One step of the sweep of finished jobs (`poller.cycle.sweep`), with the settings
        the last cycle read (the settings tracker is the cycle's: the sweep's own
        thread never updates it); `whole_round` goes on until a round ends.
        Raises when a LIST fails."""
        return self.sweep.step(self.settings, time.monotonic(), whole_round=whole_round)

    def _first_look(
        self, listed: Observed, settings: Settings, now: dt.datetime, progress_due: bool
    ) -> FirstLook:
        """What the job `listed` needs read before deciding; when nothing, its decision
        (the one call of `decide` for it in this cycle, `listed` being complete)."""
        try:
            needs = decisions.what_to_observe(listed, settings, now, progress_due=progress_due)
            if needs.any:
                return needs
            return decisions.decide(listed, settings, now)
        except Exception as error:  # recorded for this job by _handle_safely
            return error

    def _handle_safely(
        self,
        listed: Observed,
        settings: Settings,
        now: dt.datetime,
        looked: FirstLook,
        report: CycleReport,
    ) -> JobView:
        """`_handle`, with an error counted for this job; a job that keeps failing,
        or meets poison, ends Failed (`poller.cycle.poison`) instead of staying as it was."""
        job, pod = listed.job, listed.pod
        if not self.may_act():  # the lease may be lost while jobs wait for a thread
            report.skipped = True
            return job
        try:
            current = self._handle(listed, settings, now, looked, report)
        except Exception as error:  # one job never stops the others
            self._count_error(report, {"namespace": job.namespace, "name": job.name}, error)
            with report._lock:
                message = self._failures.failed(job.uid, error, time.monotonic())
            if message is None:
                return job
            try:
                self.actuator.end_failed(job, pod, message, self.clock(), report)
            except Exception as failure:  # counted; the next cycle tries again
                self._count_error(report, {"namespace": job.namespace, "name": job.name}, failure)
            return job
        with report._lock:
            self._failures.succeeded(job.uid)
        return current

    def _handle(
        self,
        listed: Observed,
        settings: Settings,
        now: dt.datetime,
        looked: FirstLook,
        report: CycleReport,
    ) -> JobView:
        """Observe what `looked` names, decide once (on `listed` completed with what was
        read), act; returns the job as it now stands."""
        job = listed.job
        if isinstance(looked, Exception):
            raise looked
        if isinstance(looked, Decision):
            decision = looked
        else:
            if looked.log is not None and looked.log.purpose == "progress":
                self._progress_read_at[job.uid] = time.monotonic()
            observed = self.observer.gather(listed, settings, looked)
            decision = decisions.decide(observed, settings, now)
        return self.actuator.carry_out(job, decision, settings, now, report)

    @staticmethod
    def _count_error(report: CycleReport, meta: dict[str, Any], error: Exception) -> None:
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        report.add_error(f"{where}: {error}")
        log.error("error handling LMEvalJob %s: %s", where, error, exc_info=error)

    def _progress_budget(self, settings: Settings, now: float) -> int:
        """Progress reads this cycle may make: what progress-reads-per-minute accrued
        since the last cycle (a first cycle: a whole cycle's worth), at most
        progress-reads-per-cycle. Per minute rather than per cycle, so that a
        shorter poll-interval makes cycles more frequent, not log reads."""
        cap = float(settings.progress_reads_per_cycle)
        if settings.progress_reads_per_minute == 0:
            credit = 0.0
        elif self._progress_counted_at is None:
            credit = cap
        else:
            accrued = (now - self._progress_counted_at) * settings.progress_reads_per_minute / 60
            credit = self._progress_credit + accrued
        self._progress_credit = min(cap, credit)
        self._progress_counted_at = now
        return math.floor(self._progress_credit)

    def new_job_waits(self) -> bool:
        """Whether a job has appeared since the last cycle that the next one would
        start (`Observer.new_job_waits`); False on a replica that may not act.
        Raises when the LIST fails."""
        return self.may_act() and self.observer.new_job_waits()

    def _progress_due(self, job: JobView, pod: PodView | None, settings: Settings) -> bool:
        if pod is None or pod.main.state != "running":
            return False
        last = self._progress_read_at.get(job.uid)
        return last is None or time.monotonic() - last >= settings.progress_interval

    def _forget_progress(self, pods: dict[str, PodView]) -> None:
        # The rate limiter only remembers jobs that still have a running pod.
        for uid in [u for u in self._progress_read_at if u not in pods]:
            del self._progress_read_at[uid]


def _progress_only(needs: Needs) -> bool:
    """A running job whose decision needs only a progress read: it waits for the
    transitions of every other job (its budget is counted by the cycle)."""
    return needs.log is not None and needs.log.purpose == "progress" and not needs.namespace_uid
