"""One polling cycle: list, join, decide, act.

A cycle reads the settings ConfigMap, lists every LMEvalJob and every pod
the poller manages (two paged LISTs whatever the number of jobs), joins pods
to jobs by their controller ownerReference, and for each job runs the pure
`decide` and carries out its actions through `Kube`. Each page of a LIST is
turned into views as it arrives, so raw objects never pile up. Jobs are
independent: an exception while handling one is logged and counted, and the
cycle goes on with the next.

The cluster is the state. Between cycles the poller keeps only the settings'
last good values, when each running job's progress was last read (a rate
limiter), and each job's view keyed by the resourceVersion it was built
from: a view is a pure function of the object, and the apiserver changes
the resourceVersion with every change to it, so reusing the view of an
unchanged job saves validating its status again and alters nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from driver.decoder import decode_bytes
from driver.protocol import MAX_RESULTS_BYTES
from poller import decide as decisions
from poller import podspec, results
from poller.kube import ApiError, Conflict, Kube, LogTail, NotFound
from poller.model import (
    ArchiveLog,
    CreatePod,
    Decision,
    DeleteJob,
    DeletePod,
    ExecResults,
    ExecView,
    JobView,
    LogView,
    PatchStatus,
    PodView,
    PostEvent,
    QueueSlot,
    ReadLog,
    ReleaseHold,
    StoreResults,
)
from poller.queue import plan_queue
from poller.settings import CONFIGMAP_NAME, Settings, SettingsTracker
from poller.transport import ExecOutputTooLarge

__all__ = ["CycleReport", "Poller", "utc_now"]

log = logging.getLogger(__name__)

MANAGED_SELECTOR = f"{podspec.LABEL_MANAGED_BY}={podspec.MANAGED_BY}"
# A decision may ask for the log, then for a longer tail when the results
# were cut off; each round is one log read.
MAX_LOG_ROUNDS = 4
OPENSHIFT_UID_RANGE = "openshift.io/sa.scc.uid-range"
# Jobs acting at once in a cycle (each one's own requests stay in order).
ACTION_WORKERS = 4
# Byte limits of the reads of a job pod's log, whose author controls it; sent
# as limitBytes and enforced while reading. Results: the encoded results
# (protocol.MAX_ENCODED_RESULTS_CHARS, 1 MiB) with their markers' fields,
# and as much again for the lines around them.
LOG_READ_RESULTS_BYTES = 2 * 1024 * 1024
# Progress: 60 lines of ordinary output (a few hundred bytes each) and markers.
LOG_READ_PROGRESS_BYTES = 128 * 1024
LOG_READ_BYTES = {"results": LOG_READ_RESULTS_BYTES, "progress": LOG_READ_PROGRESS_BYTES}
# The log archive: twice the largest log-archive-bytes (512 KiB), so that a
# window of ordinary lines is kept whole; its last log-archive-bytes are stored.
LOG_READ_ARCHIVE_BYTES = 1024 * 1024
# Windows of lines tried for the archive, narrower each time the previous one
# held more than LOG_READ_ARCHIVE_BYTES (the kubelet keeps a window's head, so
# only a narrower window reaches the log's real end).
ARCHIVE_TAIL_LINES = (5000, 500, 50)
# Exec'd results: the protocol's limit on results, whatever their source.
EXEC_RESULTS_MAX_BYTES = MAX_RESULTS_BYTES


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
    ) -> None:
        self.kube = kube
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
        # The last cycle's view of every job by UID; reused while the job's
        # resourceVersion is unchanged (see the module docstring).
        self._views: dict[str, JobView] = {}

    @property
    def settings(self) -> Settings:
        return self.tracker.current

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

    def _observe(self, report: CycleReport) -> tuple[list[JobView], dict[str, PodView]]:
        """List jobs and pods (page by page) into views; pods keyed by owner UID."""
        jobs: list[JobView] = []
        by_owner: dict[str, PodView] = {}
        views: dict[str, JobView] = {}
        scopes: list[str | None] = [*self.namespaces] or [None]
        for namespace in scopes:
            for obj in self.kube.list_jobs(namespace):
                report.jobs += 1
                try:
                    job = self._job_view(obj)
                except Exception as error:  # one bad object never stops the others
                    self._count_error(report, obj.get("metadata") or {}, error)
                    continue
                jobs.append(job)
                views[job.uid] = job
            for obj in self.kube.list_pods(MANAGED_SELECTOR, namespace):
                report.pods += 1
                view = PodView.from_object(obj, podspec.MAIN_CONTAINER)
                if view.owner_uid:
                    by_owner[view.owner_uid] = view
        self._views = views
        return jobs, by_owner

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
        jobs, by_owner = self._observe(report)
        queue = plan_queue(jobs, by_owner, settings.max_running_jobs)
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
                pod, slot = by_owner.get(job.uid), queue.get(job.uid)
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
            if current is item and self._progress_due(current, by_owner.get(current.uid), settings):
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
            pod = by_owner.get(job.uid)
            report.snapshot[index] = self._reconcile_safely(
                job, pod, settings, report, None, progress_due=True
            )
            budget -= 1
        self._forget_progress(by_owner)
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
        """`_reconcile`, with an error counted for this job and the job left as it was."""
        if not self.may_act():  # the lease may be lost while jobs wait for a thread
            report.skipped = True
            return job
        try:
            return self._reconcile(job, pod, settings, report, slot, progress_due)
        except Exception as error:  # one job never stops the others
            self._count_error(report, {"namespace": job.namespace, "name": job.name}, error)
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
            log_view = self._read_log(job, request)
            decision = decide(log_view)
        wanted = decision.needs_exec
        if wanted is not None:
            decision = decide(log_view, self._exec_results(job, wanted))
        current = job
        for action in decision.actions:
            if isinstance(action, CreatePod):
                if not self._create_pod(job, action, now, report):
                    return current
            elif isinstance(action, StoreResults):
                self.kube.apply_configmap(action.manifest, merge=True)
            elif isinstance(action, ArchiveLog):
                self._archive_log(job, action)
            elif isinstance(action, DeletePod):
                self.kube.delete_pod(job.namespace, action.name)
            elif isinstance(action, DeleteJob):
                self.kube.delete_job(job.namespace, job.name)
            elif isinstance(action, ReleaseHold):
                self._release(job, action)
            elif isinstance(action, PatchStatus):
                if self._patch_status(job, action):
                    current = replace(job, status=action.status)
                report.add(patches=1)
            elif isinstance(action, PostEvent):
                self._post_event(job, action, now)
        return current

    def _namespace_uid(self, namespace: str) -> int | None:
        """OpenShift: the first UID of the namespace's range, for a pod made now."""
        annotations = self.kube.namespace_annotations(namespace)
        return podspec.uid_range_start(annotations.get(OPENSHIFT_UID_RANGE))

    def _exec_results(self, job: JobView, action: ExecResults) -> ExecView:
        """cat the results file in the held container; errors make an empty view."""
        try:
            code, out, err = self.kube.exec_in_pod(
                job.namespace,
                action.pod,
                action.container,
                ["cat", action.path],
                max_stdout=EXEC_RESULTS_MAX_BYTES,
            )
        except ExecOutputTooLarge:
            why = f"results file larger than {EXEC_RESULTS_MAX_BYTES} bytes"
            log.warning("%s/%s: %s; reading the log instead", job.namespace, job.name, why)
            return ExecView(None, why)
        except Exception as error:  # exec is best effort: the log is the fallback
            return ExecView(None, f"exec failed: {error}")
        if code not in (0, None) or not out:
            return ExecView(None, f"cat exited {code}: {err.strip()[:200]}")
        return ExecView(out)

    def _release(self, job: JobView, action: ReleaseHold) -> None:
        try:
            self.kube.exec_in_pod(job.namespace, action.pod, action.container, list(action.argv))
        except Exception as error:  # the driver's hold ends by itself anyway
            log.warning("could not release %s/%s: %s", job.namespace, action.pod, error)

    def _archive_log(self, job: JobView, action: ArchiveLog) -> None:
        """Keep the log's last bytes; a log that cannot be read is noted, not fatal."""
        try:
            tail = self._archive_tail(job, action)
        except Exception as error:  # the archive is best effort; deletion goes on
            tail = f"(the pod log could not be read before deletion: {error})"
        manifest = results.results_configmap(
            namespace=job.namespace,
            job_name=job.name,
            job_uid=job.uid,
            results=None,
            labels={podspec.LABEL_MANAGED_BY: podspec.MANAGED_BY},
            extra_data={results.LOG_ARCHIVE_KEY: tail},
        )
        try:
            self.kube.apply_configmap(manifest, merge=True)
        except ApiError as error:
            if error.status is None or error.status >= 500 or error.status == 429:
                raise  # transient: archive (and delete) next cycle
            # Refused for good (with large results, the ConfigMap would pass
            # its size limit): the pod's deletion must not wait on it forever.
            log.warning(
                "log archive of %s/%s not kept: %s", job.namespace, job.name, _api_message(error)
            )

    def _archive_tail(self, job: JobView, action: ArchiveLog) -> str:
        """The log's last `max_bytes`, from the widest window that fits the read limit."""
        read: LogTail | None = None
        for lines in ARCHIVE_TAIL_LINES:
            read = self.kube.read_log_tail(
                job.namespace, action.pod, action.container, lines, LOG_READ_ARCHIVE_BYTES
            )
            if not read.cut:
                break
        assert read is not None
        kept = read.data[-action.max_bytes :].decode("utf-8", errors="ignore")
        if read.cut:
            kept += (
                f"\n(the log's last {ARCHIVE_TAIL_LINES[-1]} lines exceed "
                f"{LOG_READ_ARCHIVE_BYTES} bytes: the log's end is not shown)\n"
            )
        return kept

    def _read_log(self, job: JobView, request: ReadLog) -> LogView:
        limit = LOG_READ_BYTES.get(request.purpose, LOG_READ_PROGRESS_BYTES)
        try:
            read = self.kube.read_log_tail(
                job.namespace, request.pod, request.container, request.tail_lines, limit
            )
        except NotFound as error:
            return LogView(decode_bytes(b""), request.tail_lines, unavailable=str(error))
        except ApiError as error:
            if error.status is None or error.status >= 500 or error.status == 429:
                raise  # transient: read again next cycle
            # The log is gone for good (node lost, pod evicted, ...): decide without it.
            return LogView(decode_bytes(b""), request.tail_lines, unavailable=_api_message(error))
        return LogView(
            decode_bytes(read.data),
            request.tail_lines,
            lines_read=read.data.count(b"\n"),
            cut_at=limit if read.cut else None,
        )

    def _create_pod(
        self, job: JobView, action: CreatePod, now: dt.datetime, report: CycleReport
    ) -> bool:
        missing = [
            name
            for name in _custom_task_configmaps(action.manifest)
            if not self.kube.configmap_exists(job.namespace, name)
        ]
        if missing:
            self._apply_failure(
                job,
                now,
                report,
                f"spec.customTasks: ConfigMap {', '.join(missing)} not found in namespace "
                f"{job.namespace}",
            )
            return False
        try:
            created = self.kube.create_pod(action.manifest)
        except ApiError as error:
            if error.status is None or error.status >= 500 or error.status == 429:
                raise  # transient: the next cycle tries again
            # Refused for good (admission, quota, invalid): the job cannot run.
            self._apply_failure(job, now, report, f"the job pod was refused: {_api_message(error)}")
            return False
        if created:
            report.add(pods_created=1)
        else:
            log.info(
                "adopting existing pod %s for %s/%s",
                action.manifest["metadata"]["name"],
                job.namespace,
                job.name,
            )
        return True

    def _apply_failure(
        self, job: JobView, now: dt.datetime, report: CycleReport, message: str
    ) -> None:
        for follow_up in decisions.decide_failure(job, now, message).actions:
            if isinstance(follow_up, PatchStatus):
                self._patch_status(job, follow_up)
                report.add(patches=1)
            elif isinstance(follow_up, PostEvent):
                self._post_event(job, follow_up, now)

    def _patch_status(self, job: JobView, action: PatchStatus) -> bool:
        """Write the status; False when another writer got there first."""
        new = action.status.model_dump(by_alias=True, exclude_none=True, mode="json")
        old = job.status.model_dump(by_alias=True, exclude_none=True, mode="json")
        # A merge patch only removes a field that is explicitly null.
        patch: dict[str, Any] = {**{key: None for key in old if key not in new}, **new}
        try:
            self.kube.patch_job_status(job.namespace, job.name, patch, action.resource_version)
            return True
        except Conflict:
            log.info(
                "status of %s/%s changed meanwhile; deciding again next cycle",
                job.namespace,
                job.name,
            )
            return False

    def _post_event(self, job: JobView, action: PostEvent, now: dt.datetime) -> None:
        try:
            self.kube.post_event(
                namespace=job.namespace,
                job_name=job.name,
                job_uid=job.uid,
                event_type=action.type,
                reason=action.reason,
                message=action.message,
                now=now,
            )
        except Exception as error:  # events are best effort
            log.warning(
                "cannot record event %s on %s/%s: %s", action.reason, job.namespace, job.name, error
            )


def _custom_task_configmaps(manifest: dict[str, Any]) -> list[str]:
    volumes = manifest.get("spec", {}).get("volumes") or []
    return [v["configMap"]["name"] for v in volumes if "configMap" in v]


def _api_message(error: ApiError) -> str:
    try:
        body = json.loads(error.body or "{}")
    except ValueError:
        return str(error.reason)
    return str(body.get("message") or error.reason)
