"""One polling cycle: list, join, decide, act.

A cycle reads the settings ConfigMap, lists every LMEvalJob and every pod
the poller manages (two paged LISTs whatever the number of jobs), joins each
job to the pod under its deterministic pod name in its own namespace (whose
proof of origin `decide` judges: `poller.ownership`), and for each job runs
the pure `decide` and carries out its actions through `Kube`: the reads of
the pod's log and files in `poller.podreads`, status and events in
`poller.statuswrites`. Each page of a LIST is turned into views as it
arrives, so raw objects never pile up. Jobs are independent: an exception
while handling one is counted, retried within bounds, and then ends that job
(`poller.poison`); the cycle goes on with the next.

The cluster is the state. Between cycles the poller keeps only the settings'
last good values, when each running job's progress was last read (a rate
limiter), and each job's view keyed by the resourceVersion it was built
from: a view is a pure function of the object, and the apiserver changes
the resourceVersion with every change to it, so reusing the view of an
unchanged job saves validating its status again and alters nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from poller import decide as decisions
from poller import podspec, poison, tasksnapshot
from poller.api import JobState
from poller.identity import PodProof, load_pod_proof
from poller.kube import ApiError, Conflict, Kube, NotOwned
from poller.model import (
    ArchiveLog,
    CreatePod,
    Decision,
    DeleteJob,
    DeletePod,
    ExecView,
    JobView,
    LogView,
    PatchStatus,
    PodView,
    PostEvent,
    QueueSlot,
    ReleaseHold,
    StoreResults,
)
from poller.ownership import PodTrust, foreign_pod_message, judge_pod
from poller.podreads import PodReads
from poller.queue import plan_queue
from poller.settings import CONFIGMAP_NAME, Settings, SettingsTracker
from poller.statuswrites import StatusWrites, with_outcome_of_actions

__all__ = ["CycleReport", "Poller", "utc_now"]

log = logging.getLogger(__name__)

MANAGED_SELECTOR = f"{podspec.LABEL_MANAGED_BY}={podspec.MANAGED_BY}"
# A decision may ask for the log, then for a longer tail when the results
# were cut off; each round is one log read.
MAX_LOG_ROUNDS = 4
OPENSHIFT_UID_RANGE = "openshift.io/sa.scc.uid-range"
# Jobs acting at once in a cycle (each one's own requests stay in order).
ACTION_WORKERS = 4


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class CycleReport:
    """What one cycle saw and did (for logs, metrics and tests)."""

    jobs: int = 0
    pods: int = 0
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
    # Jobs act on several threads (see Poller.run_cycle): counts go through it.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, *, patches: int = 0, pods_created: int = 0) -> None:
        with self._lock:
            self.patches += patches
            self.pods_created += pods_created

    def add_error(self, message: str) -> None:
        with self._lock:
            self.errors += 1
            self.error_messages.append(message)


class Poller:
    """The polling cycle, with its dependencies injected."""

    def __init__(
        self,
        kube: Kube,
        *,
        settings_namespace: str,
        namespaces: Sequence[str] = (),
        clock: Callable[[], dt.datetime] = utc_now,
        tracker: SettingsTracker | None = None,
        may_act: Callable[[], bool] = lambda: True,
        proof: PodProof | None = None,
    ) -> None:
        self.kube = kube
        self.reads = PodReads(kube)
        self.writes = StatusWrites(kube)
        self.settings_namespace = settings_namespace
        self.namespaces = list(namespaces)
        self.clock = clock
        self.tracker = tracker or SettingsTracker()
        # Leader election's verdict, asked before the cycle and before each
        # job: a replica that lost its lease stops acting at once.
        self.may_act = may_act
        # When each running job's log was last read for progress (monotonic
        # seconds): a rate limiter only, so losing it on restart is harmless.
        self._progress_read_at: dict[str, float] = {}
        # Consecutive failures per job (poller.poison): bounded retries, then Failed.
        self._failures = poison.FailureLedger()
        # The last cycle's view of every job by UID; reused while the job's
        # resourceVersion is unchanged (see the module docstring).
        self._views: dict[str, JobView] = {}
        # The key that proves which pods this poller made (poller.identity);
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

    def _observe(
        self, report: CycleReport, proof: PodProof
    ) -> tuple[list[JobView], dict[str, PodView]]:
        """List jobs and pods (page by page) into views; each job's pod by job UID.

        A job's pod is the pod under the job's deterministic pod name in the
        job's namespace, whatever claims other pods make (labels and
        ownerReferences can be copied by anyone who may create pods); whether
        it really is the job's is judged by `decide` from its proof of origin.
        """
        jobs: list[JobView] = []
        by_name: dict[tuple[str, str], PodView] = {}
        views: dict[str, JobView] = {}
        scopes: list[str | None] = [*self.namespaces] or [None]
        for namespace in scopes:
            for obj in self.kube.list_jobs(namespace):
                report.jobs += 1
                try:
                    job = self._job_view(obj)
                except Exception as error:  # one bad object never stops the others
                    self._count_error(report, obj.get("metadata") or {}, error)
                    # Kept, so that it is ended or expires instead of being skipped for ever.
                    job = JobView.unreadable(obj, error)
                jobs.append(job)
                views[job.uid] = job
            for obj in self.kube.list_pods(MANAGED_SELECTOR, namespace):
                report.pods += 1
                view = PodView.from_object(obj, podspec.MAIN_CONTAINER, proof.attempt_of)
                by_name[(view.namespace, view.name)] = view
        self._views = views
        by_job: dict[str, PodView] = {}
        for job in jobs:
            pod = by_name.get((job.namespace, podspec.pod_name(job.name, job.uid)))
            if pod is not None:
                by_job[job.uid] = pod
        return jobs, by_job

    def _job_view(self, obj: dict[str, Any]) -> JobView:
        meta = obj.get("metadata") or {}
        known = self._views.get(meta.get("uid") or "")
        version = meta.get("resourceVersion")
        if known is not None and version and known.resource_version == version:
            return known
        return JobView.from_object(obj)

    def run_cycle(self) -> CycleReport:
        """One full cycle. Raises only when the LISTs themselves fail."""
        started = time.monotonic()
        report = CycleReport()
        if not self.may_act():
            report.skipped = True
            return report
        settings = self.refresh_settings()
        jobs, pods_by_job = self._observe(report, self.pod_proof())
        queue = plan_queue(jobs, pods_by_job, settings.max_running_jobs)
        # Transitions first, progress reads after: each progress read is a log
        # GET, and a job whose pod just ended must not wait behind dozens of them.
        # Deciding is pure and cheap; the jobs with something to do act on a
        # few threads at once, since one job's requests (log read, results,
        # status, event) never depend on another's.
        outcomes: list[JobView | Future[JobView]] = []
        with ThreadPoolExecutor(ACTION_WORKERS, thread_name_prefix="lmeval-act") as pool:
            for job in jobs:
                if not self.may_act():
                    report.skipped = True
                    break
                pod, slot = pods_by_job.get(job.uid), queue.get(job.uid)
                if self._has_work(job, pod, settings, slot):
                    outcomes.append(
                        pool.submit(self._reconcile_safely, job, pod, settings, report, slot)
                    )
                else:
                    outcomes.append(job)
        progress_due: list[int] = []  # indexes into report.snapshot
        for item in outcomes:
            current = item if isinstance(item, JobView) else item.result()
            # A job whose status was just written waits for the next cycle: its
            # resourceVersion is stale until then.
            if current is item and self._progress_due(
                current, pods_by_job.get(current.uid), settings
            ):
                progress_due.append(len(report.snapshot))
            report.snapshot.append(current)
        budget = settings.progress_reads_per_cycle
        for index in progress_due:
            if budget <= 0 or report.skipped:
                break
            if not self.may_act():
                report.skipped = True
                break
            job = report.snapshot[index]
            pod = pods_by_job.get(job.uid)
            report.snapshot[index] = self._reconcile_safely(
                job, pod, settings, report, None, progress_due=True
            )
            budget -= 1
        self._forget_progress(pods_by_job)
        self._failures.forget_except({job.uid for job in jobs})
        report.duration = time.monotonic() - started
        return report

    def _has_work(
        self, job: JobView, pod: PodView | None, settings: Settings, slot: QueueSlot | None
    ) -> bool:
        """Whether deciding for `job` yields any action (an error counts as work:
        `_reconcile_safely` then meets it again and records it for this job)."""
        try:
            return bool(decisions.decide(job, pod, settings, self.clock(), queue=slot).actions)
        except Exception:  # recorded by _reconcile_safely
            return True

    def _reconcile_safely(
        self,
        job: JobView,
        pod: PodView | None,
        settings: Settings,
        report: CycleReport,
        slot: QueueSlot | None,
        *,
        progress_due: bool = False,
    ) -> JobView:
        """`_reconcile`, with an error counted for this job; a job that keeps failing,
        or meets poison, ends Failed (`poller.poison`) instead of staying as it was."""
        if not self.may_act():  # the lease may be lost while jobs wait for a thread
            report.skipped = True
            return job
        try:
            current = self._reconcile(job, pod, settings, report, slot, progress_due)
        except Exception as error:  # one job never stops the others
            self._count_error(report, {"namespace": job.namespace, "name": job.name}, error)
            with report._lock:
                message = self._failures.failed(job.uid, error, time.monotonic())
            if message is None:
                return job
            return self._end_poisoned(job, pod, message, report)
        with report._lock:
            self._failures.succeeded(job.uid)
        return current

    def _end_poisoned(
        self, job: JobView, pod: PodView | None, message: str, report: CycleReport
    ) -> JobView:
        """End `job` Failed with `message`, and stop its evaluation."""
        if job.deleting or job.status.state == JobState.COMPLETE:
            return job  # nothing left to end: its TTL and deletion go on
        log.error("ending LMEvalJob %s/%s: %s", job.namespace, job.name, message)
        try:
            report.add(patches=self.writes.end_failed(job, self.clock(), message))
        except Exception as error:  # counted; the next cycle tries again
            self._count_error(report, {"namespace": job.namespace, "name": job.name}, error)
            return job
        if pod is not None and judge_pod(job, pod)[0] is not PodTrust.FOREIGN:
            # A job that ended must not leave its evaluation running.
            with contextlib.suppress(Exception):
                self.kube.delete_pod(job.namespace, pod.name)
        return job

    @staticmethod
    def _count_error(report: CycleReport, meta: dict[str, Any], error: Exception) -> None:
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        report.add_error(f"{where}: {error}")
        log.error("error handling LMEvalJob %s: %s", where, error, exc_info=error)

    def _progress_due(self, job: JobView, pod: PodView | None, settings: Settings) -> bool:
        if pod is None or pod.main.state != "running":
            return False
        last = self._progress_read_at.get(job.uid)
        return last is None or time.monotonic() - last >= settings.progress_interval

    def _forget_progress(self, pods: dict[str, PodView]) -> None:
        # The rate limiter only remembers jobs that still have a running pod.
        for uid in [u for u in self._progress_read_at if u not in pods]:
            del self._progress_read_at[uid]

    def _reconcile(
        self,
        job: JobView,
        pod: PodView | None,
        settings: Settings,
        report: CycleReport,
        slot: QueueSlot | None,
        progress_due: bool,
    ) -> JobView:
        """Decide and act for one job; returns the job as it now stands."""
        now = self.clock()

        def decide(log_view: LogView | None = None, exec_view: ExecView | None = None) -> Decision:
            return decisions.decide(
                job,
                pod,
                settings,
                now,
                log_view,
                queue=slot,
                progress_due=progress_due,
                exec_view=exec_view,
            )

        decision = decide()
        if any(isinstance(action, CreatePod) for action in decision.actions):
            run_as_user = self._namespace_uid(job.namespace)
            if run_as_user is not None:
                decision = decisions.decide(
                    job, pod, settings, now, queue=slot, run_as_user=run_as_user
                )
        log_view: LogView | None = None
        for _ in range(MAX_LOG_ROUNDS):
            request = decision.needs_log
            if request is None:
                break
            if request.purpose == "progress":
                self._progress_read_at[job.uid] = time.monotonic()
            log_view = self.reads.read_log(job, request)
            decision = decide(log_view)
        wanted = decision.needs_exec
        if wanted is not None:
            decision = decide(log_view, self.reads.exec_results(job, wanted))
        current = job
        pod_uid: str | None = None
        store_problem: str | None = None
        for action in decision.actions:
            if isinstance(action, CreatePod):
                pod_uid = self._create_pod(job, action, now, report)
                if pod_uid is None:
                    return current
            elif isinstance(action, StoreResults):
                store_problem = self._store_results(job, action)
            elif isinstance(action, ArchiveLog):
                self.reads.archive_log(job, action)
            elif isinstance(action, DeletePod):
                self.kube.delete_pod(job.namespace, action.name)
            elif isinstance(action, DeleteJob):
                self.kube.delete_job(job.namespace, job.name)
            elif isinstance(action, ReleaseHold):
                self.reads.release(job, action)
            elif isinstance(action, PatchStatus):
                action = with_outcome_of_actions(action, pod_uid, store_problem)
                if self.writes.patch(job, action):
                    current = replace(job, status=action.status)
                report.add(patches=1)
            elif isinstance(action, PostEvent):
                self.writes.event(job, action, now)
        return current

    def _namespace_uid(self, namespace: str) -> int | None:
        """OpenShift: the first UID of the namespace's range, for a pod made now."""
        annotations = self.kube.namespace_annotations(namespace)
        return podspec.uid_range_start(annotations.get(OPENSHIFT_UID_RANGE))

    def _create_pod(
        self, job: JobView, action: CreatePod, now: dt.datetime, report: CycleReport
    ) -> str | None:
        """Create the job pod (stamped with its proof of origin); its UID, or None
        when the job could not get it (the job was failed, saying why)."""
        # Custom tasks: checked for code and frozen into the job's snapshots.
        problem = tasksnapshot.prepare_custom_tasks(self.kube, job, self.settings)
        if problem is not None:
            report.add(patches=self.writes.fail(job, now, problem))
            return None
        manifest = self.pod_proof().stamp(action.manifest, job.uid, action.attempt)
        try:
            created = self.kube.create_pod(manifest)
        except ApiError as error:
            if error.retry_later:
                raise  # transient: the next cycle tries again
            # Refused for good (admission, quota, invalid): the job cannot run.
            message = f"the job pod was refused: {error.message}"
            report.add(patches=self.writes.fail(job, now, message))
            return None
        if created is not None:
            report.add(pods_created=1)
            return created
        return self._existing_pod(job, manifest["metadata"]["name"], now, report)

    def _existing_pod(
        self, job: JobView, name: str, now: dt.datetime, report: CycleReport
    ) -> str | None:
        """The name was taken: adopt the pod if this poller made it, else fail the job.

        Found by name whatever its labels: a squatter without the poller's
        labels would never show in the cycle's LIST, and the job would try to
        create its pod for ever.
        """
        found = self.kube.find_pod(job.namespace, name)
        if found is None:
            raise Conflict(f"pod {job.namespace}/{name} existed and is gone: retrying")
        pod = PodView.from_object(found, podspec.MAIN_CONTAINER, self.pod_proof().attempt_of)
        # The attempt being created is not recorded yet, which judge_pod reads as ADOPT.
        trust, why = judge_pod(job, pod)
        if trust is PodTrust.FOREIGN:
            log.warning("pod %s/%s squats %s's pod name: %s", job.namespace, name, job.name, why)
            message = foreign_pod_message(pod, why)
            report.add(patches=self.writes.fail(job, now, message, cause="ForeignPod"))
            return None
        log.info("adopting existing pod %s for %s/%s", name, job.namespace, job.name)
        return pod.uid

    def _store_results(self, job: JobView, action: StoreResults) -> str | None:
        """Write the results ConfigMap; why it could not be, when that is for good.

        A ConfigMap of that name that is not this job's (made by someone else)
        is never overwritten, and one the apiserver refuses (too large,
        immutable, ...) will be refused again: either way the results stay in
        the job's status and the job finishes, saying what happened.
        """
        name = action.manifest["metadata"]["name"]
        try:
            self.kube.apply_configmap(action.manifest, merge=True)
        except NotOwned as error:
            return str(error)
        except ApiError as error:
            if error.retry_later:
                raise  # transient: the next cycle tries again
            return f"ConfigMap {name} was refused: {error.message}"
        return None
