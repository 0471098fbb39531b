"""Observing: everything a cycle reads before it decides.

A cycle decides for each job once, on complete observations (`poller.cycle.reconciler`
orchestrates; `poller.cycle.act` carries decisions out). What is read comes in two
parts:

* **the listing**: what can still change, whatever the history. Two paged
  LISTs: the jobs that are not Complete (the CRD makes status.state
  selectable) and the managed pods that have not ended (status.phase), each
  page turned into views as it arrives (raw objects never pile up). Then a
  few reads by name (`Kube.find_job`, `Kube.find_pod`), each for a reason:
  the finished jobs the store of finished jobs (`poller.cycle.retained`) says are
  due (a TTL expired, a retention step to confirm, a change the sweep saw,
  a gate whose baseline is in this listing), the jobs that left the
  unfinished listing since the last cycle (finished or deleted: a job that
  finishes is never lost between the two), the baselines of gated jobs,
  and the pod of a Scheduled or Running job whose pod no longer shows among
  the live ones (it ended). Once the observer holds views, both LISTs ask
  for metadata only and the few objects whose resourceVersion changed since
  are read by name (`_metadata_first`): an idle cycle's pods then cost a
  third of their bytes and a quarter of the CPU, its jobs half, so that the
  cycle can run every couple of seconds. Each job is joined to the pod under its
  deterministic pod name in its own namespace, whatever claims other pods
  make (labels and ownerReferences can be copied by anyone who may create
  pods); whether that pod really is the job's is judged by `decide` from its
  proof of origin (`poller.decisions.ownership`).
* **one job's needs**, as the pure `decide.what_to_observe` names them
  (`Needs`): the namespace's OpenShift UID range for a pod about to be
  made; for a finished gated job, its own and its baseline's per-item
  scores (their results ConfigMaps, each GET bounded by `ITEMS_READ_MAX`;
  the baseline's job object is already in the listing, `poller.decisions.regression`); a
  window of the pod's log, widened or narrowed by the stated rule of
  `outcome.next_results_window` (never more than
  `outcome.MAX_RESULTS_READS` reads); in exec mode the results file the
  driver holds, when that log shows it holding one
  (`outcome.results_to_exec`).

Reads that cannot get their data say so in the view (`LogView.unavailable`,
`ExecView` without text); only transient API errors propagate, so that the
job is tried again next cycle (`poller.cycle.poison`).

Between cycles the observer keeps each listed job's and pod's view keyed by
the resourceVersion it was built from: a view is a pure function of the
object (and of the poller's key, for a pod's proof of origin), and the
apiserver changes the resourceVersion with every change to it, so reusing
the view of an unchanged object saves validating it again and alters
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from poller import api
from poller.api.settings import Settings
from poller.cycle.podio import PodIO
from poller.cycle.retained import JobKey, RetainedJobs
from poller.decisions import kueueadmission, outcome, shards
from poller.decisions.actions import LogRequest, Needs
from poller.decisions.kueueadmission import Flavor, KueueView, Priority, WorkloadView
from poller.decisions.observed import Observed
from poller.decisions.ownership import controller_uid
from poller.decisions.regression import GateView, ItemsRead, baseline_name
from poller.decisions.views import ExecView, JobView, LogView, PodView, ProofCheck
from poller.jobpod import podspec
from poller.kube.client import PAGE_SIZE, ApiError, Kube, NotFound
from poller.results import lmeval

__all__ = [
    "FINISHED_READS_PER_CYCLE",
    "HOT_JOBS",
    "HOT_PAGE_SIZE",
    "ITEMS_READ_MAX",
    "LIVE_PODS",
    "MANAGED_SELECTOR",
    "NEW_JOBS",
    "OPENSHIFT_UID_RANGE",
    "Listing",
    "Observer",
]

MANAGED_SELECTOR = f"{podspec.LABEL_MANAGED_BY}={podspec.MANAGED_BY}"
# What can still change: jobs not Complete, pods not ended.
HOT_JOBS = f"status.state!={api.JobState.COMPLETE.value}"
# Jobs no cycle has written a status to yet: a selectable field the object
# lacks has the empty value, so this selects exactly them.
NEW_JOBS = "status.state="
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
# The hot job listing's page size. The apiserver answers a first page from
# its watch cache (milliseconds), but a continue page from its cache only
# while it keeps a snapshot at the token's resourceVersion, and it drops them
# all at the next etcd compaction when no LMEvalJob changed since (a quiet
# cluster, every 5 minutes). Then a continue page is read from etcd, filtered
# object by object from the token's key on: with 1,000 active jobs among
# 100,000 finished ones, 30-40 s per page, measured (tests/bench/history.py;
# a single page took 0.2-0.6 s). So up to this many active jobs are one page;
# the price is their parsed page held at once (about 12 MiB per 1,000 jobs,
# measured) instead of 500 jobs' worth. Pods keep pages of 500: the pods
# resource changes all the time in a real cluster, so its snapshots stay.
HOT_PAGE_SIZE = 2000
# Finished jobs read by name in one cycle (due TTLs first): a burst (the sweep
# seeing many changed at once) is spread over cycles instead of one long one.
FINISHED_READS_PER_CYCLE = 200
# Reads by name at once (each is one small request).
READ_WORKERS = 4
# What reading a pod by name costs against listing it, in pods listed whole
# (measured: about 1.5 ms of the poller's CPU for a read by name, against 48
# µs a pod listed whole and 18 µs a pod listed as metadata): the live pods are
# listed as metadata and the changed ones read by name while fewer than one
# in this many changed, and listed whole otherwise.
BY_NAME_COST = 50
# A job the cycle expects to have a pod (one exists from Scheduled on).
_POD_STATES = (api.JobState.SCHEDULED, api.JobState.RUNNING)
OPENSHIFT_UID_RANGE = "openshift.io/sa.scc.uid-range"
# The largest results ConfigMap read for the gate: the apiserver keeps a
# ConfigMap's data under 1 MiB, which base64 and the metadata make at most
# about 1.4 MiB as JSON; anything larger is not one the poller wrote.
ITEMS_READ_MAX = 3 * 1024 * 1024


@dataclass
class Listing:
    """What the cycle's LISTs returned, as views."""

    jobs: list[JobView] = field(default_factory=list)
    # Each job's pod (by job UID): the pod under the job's pod name, if any.
    pods_by_job: dict[str, PodView] = field(default_factory=dict)
    # A sharded job's shard pods (by job UID), by index (None: none there).
    shards_by_job: dict[str, tuple[PodView | None, ...]] = field(default_factory=dict)
    # How many objects were listed.
    jobs_listed: int = 0
    pods_listed: int = 0
    # Listed jobs whose object could not be read as a job (metadata, error);
    # their views are kept (`JobView.unreadable`), so they are ended or
    # expire instead of being skipped for ever.
    unreadable: list[tuple[dict[str, Any], Exception]] = field(default_factory=list)
    # Kueue (`poller.decisions.kueueadmission`): whether its Workloads are served (listed only
    # when a job carries its queue label), each job's workload by job UID, and
    # why the workloads could not be listed, if so (the jobs under Kueue then
    # wait for the next cycle: never started behind Kueue's back).
    kueue_installed: bool = False
    workloads_by_job: dict[str, WorkloadView] = field(default_factory=dict)
    workloads_listed: int = 0
    kueue_error: str | None = None
    # Every listed job by (namespace, name), and the baselines of gated jobs
    # read by name (`poller.decisions.regression`).
    jobs_by_name: dict[tuple[str, str], JobView] = field(default_factory=dict)
    # Reads by name this cycle: finished jobs, and pods of jobs whose pod ended.
    jobs_read: int = 0
    pods_read: int = 0

    def gate_view(self, job: JobView) -> GateView | None:
        """The job's side of the regression gate, when it has one (spec.gate)."""
        name = baseline_name(job)
        if name is None:
            return None
        return GateView(self.jobs_by_name.get((job.namespace, name)))

    def kueue_view(self, job: JobView) -> KueueView | None:
        """The job's side of Kueue, when Kueue gates it (its label, and Kueue installed)."""
        if not job.queue_name or not self.kueue_installed:
            return None
        return KueueView(self.workloads_by_job.get(job.uid))


class Observer:
    """The cycle's reads (thread-safe for `gather`; `list_cluster` runs alone)."""

    def __init__(
        self,
        kube: Kube,
        reads: PodIO,
        namespaces: Sequence[str] = (),
        retained: RetainedJobs | None = None,
    ) -> None:
        self.kube = kube
        self.reads = reads
        self.namespaces = list(namespaces)
        self.retained = retained if retained is not None else RetainedJobs()
        # The last cycle's view of every job by UID (see the module docstring).
        self._views: dict[str, JobView] = {}
        # The jobs the last cycle's unfinished LIST returned: one that is not
        # in the next is read by name (it finished, or was deleted).
        self._hot: dict[str, JobKey] = {}
        # The last cycle's view of every listed pod by UID, with the
        # resourceVersion it was built from (a running pod rarely changes).
        self._pods: dict[str, tuple[str, PodView]] = {}

    def list_cluster(self, attempt_of: ProofCheck, settings: Settings, now: float) -> Listing:
        """List what can change (page by page) into views, read the few jobs and
        pods named for a reason (see the module docstring); each job's pod by job UID.

        `attempt_of` checks a pod's proof of origin (`poller.cycle.podproof`); `now`
        (epoch seconds) says which finished jobs' TTLs expired. Raises only
        when a LIST or a read by name fails.
        """
        listing = Listing()
        by_name: dict[tuple[str, str], PodView] = {}
        views: dict[str, JobView] = {}
        pods: dict[str, tuple[str, PodView]] = {}
        scopes: list[str | None] = [*self.namespaces] or [None]
        with ThreadPoolExecutor(READ_WORKERS, thread_name_prefix="lmeval-read") as pool:
            for namespace in scopes:
                for obj in self._hot_jobs(namespace, listing, pool):
                    listing.jobs_listed += 1
                    self._add_job(listing, views, obj)
                for obj in self._live_pods(namespace, listing, pool):
                    listing.pods_listed += 1
                    view = self._pod_view(obj, attempt_of, pods)
                    by_name[(view.namespace, view.name)] = view
            hot = {job.uid: JobKey(job.namespace, job.name, job.uid) for job in listing.jobs}
            self._read_finished(listing, views, hot, settings, now, pool)
            self._read_ended_pods(listing, by_name, attempt_of, pool)
        self._views, self._hot, self._pods = views, hot, pods
        for job in listing.jobs:
            pod = by_name.get((job.namespace, podspec.pod_name(job.name, job.uid)))
            if pod is not None:
                listing.pods_by_job[job.uid] = pod
            if job.shard_count > 1:
                listing.shards_by_job[job.uid] = tuple(
                    by_name.get((job.namespace, name)) for name in _shard_names(job)
                )
        if any(job.queue_name for job in listing.jobs):
            self._list_workloads(listing, scopes)
        return listing

    def new_job_waits(self) -> bool:
        """Whether a job without a status yet is one the last cycle did not list at
        its resourceVersion: a job created (or changed) since, which the next
        cycle would start. One metadata-only LIST per scope, usually empty; it
        reads only what the last cycle left (`poller.service` calls it between
        cycles, on a thread of its own). Raises when the LIST fails.
        """
        known = self._views
        scopes: list[str | None] = [*self.namespaces] or [None]
        for namespace in scopes:
            token: str | None = None
            while True:
                page = self.kube.list_jobs_page(
                    namespace,
                    field_selector=NEW_JOBS,
                    token=token,
                    limit=PAGE_SIZE,
                    metadata_only=True,
                )
                for item in page.items:
                    meta = item.get("metadata") or {}
                    seen = known.get(meta.get("uid") or "")
                    if seen is None or seen.resource_version != meta.get("resourceVersion"):
                        return True
                token = page.continue_token
                if token is None:
                    break
        return False

    def _hot_jobs(
        self, namespace: str | None, listing: Listing, pool: ThreadPoolExecutor
    ) -> Iterator[dict[str, Any]]:
        """The jobs that are not Complete (in `namespace`, or everywhere), as
        `_metadata_first` lists them."""

        def listed(metadata_only: bool) -> Iterator[dict[str, Any]]:
            return self.kube.list_jobs(
                namespace,
                field_selector=HOT_JOBS,
                page_size=HOT_PAGE_SIZE,
                unchanged=self._job_unchanged,
                metadata_only=metadata_only,
            )

        found = _metadata_first(listed, self._job_unchanged, self.kube.find_job, bool(self._views))
        for obj, read in found(pool):
            listing.jobs_read += read
            if obj is not None:
                yield obj

    def _live_pods(
        self, namespace: str | None, listing: Listing, pool: ThreadPoolExecutor
    ) -> Iterator[dict[str, Any]]:
        """The live pods the poller manages (in `namespace`, or everywhere), as
        `_metadata_first` lists them."""

        def listed(metadata_only: bool) -> Iterator[dict[str, Any]]:
            return self.kube.list_pods(
                MANAGED_SELECTOR,
                namespace,
                field_selector=LIVE_PODS,
                unchanged=self._pod_unchanged,
                metadata_only=metadata_only,
            )

        found = _metadata_first(listed, self._pod_unchanged, self.kube.find_pod, bool(self._pods))
        for obj, read in found(pool):
            listing.pods_read += read
            if obj is None:
                continue  # gone since: a job whose pod it was reads it by name
            labels = (obj.get("metadata") or {}).get("labels") or {}
            # Read by name whatever its labels: one that is no longer the
            # poller's is left out, as the LIST would.
            if not read or labels.get(podspec.LABEL_MANAGED_BY) == podspec.MANAGED_BY:
                yield obj

    def _add_job(self, listing: Listing, views: dict[str, JobView], obj: dict[str, Any]) -> None:
        try:
            job = self._job_view(obj)
        except Exception as error:  # one bad object never stops the others
            listing.unreadable.append((obj.get("metadata") or {}, error))
            job = JobView.unreadable(obj, error)
        listing.jobs.append(job)
        listing.jobs_by_name[(job.namespace, job.name)] = job
        views[job.uid] = job

    def _read_finished(
        self,
        listing: Listing,
        views: dict[str, JobView],
        hot: dict[str, JobKey],
        settings: Settings,
        now: float,
        pool: ThreadPoolExecutor,
    ) -> None:
        """Read by name the finished jobs the cycle must decide, then the baselines
        their gates compare with; a job found gone leaves the store."""
        due = self.retained.due(
            now, settings.default_ttl_seconds_after_finished, FINISHED_READS_PER_CYCLE
        )
        left = [key for uid, key in self._hot.items() if uid not in hot]
        wanted = _unique(key for key in (*left, *due) if key.uid not in hot)
        self._add_found(listing, views, self._find_jobs(wanted, pool))
        names = set(listing.jobs_by_name)
        waiting = [key for key in self.retained.waiting_on(names) if key.uid not in views]
        self._add_found(listing, views, self._find_jobs(_unique(waiting), pool))
        # Baselines of gated jobs that are not listed: read for the gate only.
        missing = {
            (job.namespace, name)
            for job in listing.jobs
            if (name := baseline_name(job)) is not None
            and (job.namespace, name) not in listing.jobs_by_name
        }
        keys = [JobKey(namespace, name, "") for namespace, name in sorted(missing)]
        for _, obj in self._find_jobs(keys, pool):
            if obj is not None:
                view = self._view_or_unreadable(obj)
                listing.jobs_by_name[(view.namespace, view.name)] = view

    def _find_jobs(
        self, keys: list[JobKey], pool: ThreadPoolExecutor
    ) -> list[tuple[JobKey, dict[str, Any] | None]]:
        found = list(pool.map(lambda key: self.kube.find_job(key.namespace, key.name), keys))
        return list(zip(keys, found, strict=True))

    def _add_found(
        self,
        listing: Listing,
        views: dict[str, JobView],
        found: list[tuple[JobKey, dict[str, Any] | None]],
    ) -> None:
        for key, obj in found:
            listing.jobs_read += 1
            uid = ((obj or {}).get("metadata") or {}).get("uid")
            if uid != key.uid:
                self.retained.drop(key.uid)  # deleted (perhaps made again under its name)
            if obj is None or not uid or uid in views:
                continue
            self._add_job(listing, views, obj)

    def _view_or_unreadable(self, obj: dict[str, Any]) -> JobView:
        try:
            return self._job_view(obj)
        except Exception as error:  # the gate says the baseline cannot be read
            return JobView.unreadable(obj, error)

    def _read_ended_pods(
        self,
        listing: Listing,
        by_name: dict[tuple[str, str], PodView],
        attempt_of: ProofCheck,
        pool: ThreadPoolExecutor,
    ) -> None:
        """The pod of each Scheduled or Running job that is not among the live pods:
        it ended (or is gone), and the job's decision needs to know which. So
        too each shard pod that status records as made and that is not listed:
        read once, as its shard's record then says it ended and its pod goes."""
        wanted = [
            (job.namespace, name)
            for job in listing.jobs
            if job.status.state in _POD_STATES
            for name in _expected_pods(job)
            if (job.namespace, name) not in by_name
        ]
        found = pool.map(lambda key: self.kube.find_pod(*key), wanted)
        for obj in found:
            listing.pods_read += 1
            labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
            # As the LIST would: only pods with the poller's label.
            if obj is None or labels.get(podspec.LABEL_MANAGED_BY) != podspec.MANAGED_BY:
                continue
            view = PodView.from_object(obj, podspec.MAIN_CONTAINER, attempt_of)
            by_name[(view.namespace, view.name)] = view

    def _list_workloads(self, listing: Listing, scopes: list[str | None]) -> None:
        """The Workloads the poller made (one LIST per scope), joined to their jobs
        by name and controller; Kueue counts as absent when they are not served."""
        by_name: dict[tuple[str, str], WorkloadView] = {}
        try:
            for namespace in scopes:
                for obj in self.kube.list_workloads(MANAGED_SELECTOR, namespace):
                    listing.workloads_listed += 1
                    view = WorkloadView.from_object(obj)
                    by_name[(view.namespace, view.name)] = view
        except NotFound:
            return  # no Workload CRD: Kueue is not installed
        except ApiError as error:
            listing.kueue_installed = True
            listing.kueue_error = f"cannot list Kueue workloads: {error}"
            return
        listing.kueue_installed = True
        for job in listing.jobs:
            found = by_name.get((job.namespace, kueueadmission.workload_name(job.name, job.uid)))
            if found is not None and found.owner_uid == job.uid:
                listing.workloads_by_job[job.uid] = found

    def _pod_view(
        self, obj: dict[str, Any], attempt_of: ProofCheck, kept: dict[str, tuple[str, PodView]]
    ) -> PodView:
        """The pod's view, reused when its resourceVersion did not change (the proof
        of origin is in the object, so the same object gets the same verdict)."""
        meta = obj.get("metadata") or {}
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if self._pod_unchanged(meta):
            view = self._pods[meta["uid"]][1]
        else:
            view = PodView.from_object(obj, podspec.MAIN_CONTAINER, attempt_of)
        if uid and version:
            kept[uid] = (version, view)
        return view

    def _job_unchanged(self, meta: Mapping[str, Any]) -> bool:
        """Whether the last cycle's view of this job is at this resourceVersion: a
        page of such jobs is parsed for its metadata only (`kubepages.paged`)."""
        known = self._views.get(meta.get("uid") or "")
        version = meta.get("resourceVersion")
        return known is not None and bool(version) and known.resource_version == version

    def _pod_unchanged(self, meta: Mapping[str, Any]) -> bool:
        """As `_job_unchanged`, for the pods' views."""
        known = self._pods.get(meta.get("uid") or "")
        version = meta.get("resourceVersion")
        return known is not None and bool(version) and known[0] == version

    def _job_view(self, obj: dict[str, Any]) -> JobView:
        """The job's view, reused when its resourceVersion did not change."""
        meta = obj.get("metadata") or {}
        if self._job_unchanged(meta):
            return self._views[meta["uid"]]
        return JobView.from_object(obj)

    def gather(self, listed: Observed, settings: Settings, needs: Needs) -> Observed:
        """`listed` (the job, its pod, queue slot, Kueue's and the gate's views, as
        listed) completed with what `needs` names, read in order: Kueue's flavors
        and priority class, the namespace, the log, the exec, the gate's per-item scores."""
        job, pod, kueue, gate = listed.job, listed.pod, listed.kueue, listed.gate
        if kueue is not None and (needs.flavors or needs.priority_class):
            kueue = replace(
                kueue,
                flavors=tuple(self._flavor(name) for name in needs.flavors),
                priority=self._priority(needs.priority_class) if needs.priority_class else None,
            )
        run_as_user = self._namespace_uid(job.namespace) if needs.namespace_uid else None
        log_view: LogView | None = None
        exec_view: ExecView | None = None
        if needs.log is not None and pod is not None:
            log_view = self._read_log(job, pod, needs.log)
            if needs.held_results:
                wanted = outcome.results_to_exec(job, pod, settings, log_view)
                if wanted is not None:
                    exec_view = self.reads.exec_results(job, wanted)
        if needs.gate_items and gate is not None and gate.baseline is not None:
            gate = replace(
                gate,
                own=self.read_items(job.namespace, job.name, job.uid),
                base=self.read_items(job.namespace, gate.baseline.name, gate.baseline.uid),
            )
        return replace(
            listed,
            log=log_view,
            exec_view=exec_view,
            run_as_user=run_as_user,
            kueue=kueue,
            gate=gate,
        )

    def read_items(self, namespace: str, name: str, uid: str) -> ItemsRead:
        """A job's per-item scores from its results ConfigMap, or why there are none.

        Only a ConfigMap whose controller is that job counts (anyone may make
        one under the name first). A transient API error propagates: the job
        is decided again next cycle.
        """
        configmap = lmeval.results_configmap_name(name)
        try:
            found = self.kube.read_configmap(namespace, configmap, max_bytes=ITEMS_READ_MAX)
        except ApiError as error:
            if error.transient:
                raise
            problem = f"ConfigMap {configmap} cannot be read: {error}"[:500]
            return ItemsRead(problem=problem, retry=True)
        except ValueError as error:  # larger than any results ConfigMap the poller writes
            return ItemsRead(problem=str(error))
        if found is None:
            return ItemsRead(problem=f"no ConfigMap {configmap}")
        if controller_uid(found) != uid:
            return ItemsRead(problem=f"ConfigMap {configmap} is not owned by LMEvalJob {name}")
        binary = found.get("binaryData") or {}
        encoded = binary.get(lmeval.ITEMS_KEY)
        if not isinstance(encoded, str):
            return ItemsRead(problem=f"ConfigMap {configmap} has no {lmeval.ITEMS_KEY}")
        text = (found.get("data") or {}).get(lmeval.RESULTS_KEY)
        packed = binary.get(lmeval.RESULTS_GZ_KEY)
        if isinstance(text, str):
            return ItemsRead(encoded=encoded, results=text)
        if isinstance(packed, str):
            return ItemsRead(encoded=encoded, results=packed, results_packed=True)
        return ItemsRead(encoded=encoded)

    def _flavor(self, name: str) -> Flavor:
        found = self.kube.read_resource_flavor(name)
        return Flavor.from_object(found) if found is not None else Flavor(name)

    def _priority(self, name: str) -> Priority:
        found = self.kube.read_workload_priority_class(name)
        value = (found or {}).get("value")
        return Priority(name, value if isinstance(value, int) else None)

    def _namespace_uid(self, namespace: str) -> int | None:
        """OpenShift: the first UID of the namespace's range, for a pod made now."""
        annotations = self.kube.namespace_annotations(namespace)
        return podspec.uid_range_start(annotations.get(OPENSHIFT_UID_RANGE))

    def _read_log(self, job: JobView, pod: PodView, first: LogRequest) -> LogView:
        """The window `first`; for results, then the next windows the rule names.

        The rule (`outcome.next_results_window`) ends within
        `outcome.MAX_RESULTS_READS` reads whatever each read returns; the
        loop's bound only states it.
        """
        view = self.reads.read_log(job, first)
        if first.purpose != "results":
            return view
        for _ in range(outcome.MAX_RESULTS_READS - 1):
            window = outcome.next_results_window(pod, view)
            if window is None:
                break
            view = self.reads.read_log(job, replace(first, tail_lines=window))
        return view


def _shard_names(job: JobView) -> list[str]:
    return [podspec.shard_pod_name(job.name, job.uid, k) for k in range(job.shard_count)]


def _expected_pods(job: JobView) -> list[str]:
    """The names of the pods a Scheduled or Running job's status says exist: its
    pod, or in a sharded job's shard stage the shards made and not yet over."""
    if not shards.in_shard_stage(job):
        return [podspec.pod_name(job.name, job.uid)]
    made = (api.ShardState.SCHEDULED, api.ShardState.RUNNING)
    return [
        podspec.shard_pod_name(job.name, job.uid, record.index)
        for record in shards.records(job)
        if record.state in made
    ]


# A LIST of one kind: whole (False) or as metadata (True).
_Lister = Callable[[bool], Iterator[dict[str, Any]]]
# What `_metadata_first` yields: an object (None when gone since) and how many
# reads by name it took (1, or 0 when it came from the LIST).
_Found = Iterator[tuple[dict[str, Any] | None, int]]


def _metadata_first(
    listed: _Lister,
    unchanged: Callable[[Mapping[str, Any]], bool],
    find: Callable[[str, str], dict[str, Any] | None],
    holds_views: bool,
) -> Callable[[ThreadPoolExecutor], _Found]:
    """A LIST that costs what changed: once the observer holds views of this kind
    (`holds_views`), the LIST asks for metadata only (a third of a pod's bytes, a
    half of a job's; a quarter to a third of the CPU) and the objects whose
    view is not kept at their resourceVersion are read by name (few: a pod
    changes when it starts or ends, a job when its status is written); the
    others come as their metadata, which the cached views stand for. When more
    changed than `BY_NAME_COST` says pays, or without views (the first
    cycle), the objects are listed whole instead.
    """

    def found(pool: ThreadPoolExecutor) -> _Found:
        if not holds_views:
            yield from ((obj, 0) for obj in listed(False))
            return
        metas = [item.get("metadata") or {} for item in listed(True)]
        changed = [meta for meta in metas if not unchanged(meta)]
        if len(changed) * BY_NAME_COST > len(metas):
            yield from ((obj, 0) for obj in listed(False))
            return
        read = pool.map(
            lambda meta: find(str(meta.get("namespace")), str(meta.get("name"))), changed
        )
        fresh = {id(meta): obj for meta, obj in zip(changed, read, strict=True)}
        for meta in metas:
            if id(meta) in fresh:
                yield fresh[id(meta)], 1
            else:
                yield {"metadata": meta}, 0

    return found


def _unique(keys: Iterable[JobKey]) -> list[JobKey]:
    """`keys` without repeated UIDs, in order."""
    seen: set[str] = set()
    unique: list[JobKey] = []
    for key in keys:
        if key.uid not in seen:
            seen.add(key.uid)
            unique.append(key)
    return unique
