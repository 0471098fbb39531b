"""Acting: carrying out one job's decision through `Kube`.

`decide` returns actions in the order they must happen (results and the
archived log are stored before a pod may go, the status is written after
what it reports); this module performs them, one job at a time per thread
(`poller.cycle.reconciler` runs several jobs at once). Reads and execs inside a pod
are `poller.cycle.podio`, status patches and events `poller.cycle.statuswrites`.

Two things only the actuator can settle are settled here:

* **making the pod**: custom tasks are checked and snapshotted
  (`poller.cycle.tasksnapshot`), the manifest is stamped with the poller's proof
  of origin (`poller.cycle.podproof`), and a name already taken is either the
  poller's own pod (adopted) or a squatter (the job fails, the pod is never
  touched);
* **refusals for good**: an API error that is not transient (admission,
  quota, an invalid or too large object) would be refused again every
  cycle, so the job fails or finishes saying why; a transient one
  propagates and the next cycle tries again (`raise_if_transient`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from poller import api
from poller.api import JobState
from poller.api.settings import Settings
from poller.cycle import tasksnapshot
from poller.cycle.podio import PodIO
from poller.cycle.podproof import PodProof
from poller.cycle.statuswrites import AdmittedPod, StatusWrites, with_outcome_of_actions
from poller.decisions.actions import (
    ArchiveLog,
    CreatePod,
    CreateWorkload,
    Decision,
    DeleteJob,
    DeletePod,
    DeleteWorkload,
    PatchStatus,
    PatchWorkloadStatus,
    PostEvent,
    ReleaseHold,
    StoreResults,
)
from poller.decisions.ownership import (
    PodTrust,
    foreign_pod_message,
    judge_pod,
    judge_shard,
    not_the_jobs,
)
from poller.decisions.views import JobView, PodView, controller_reference, pod_fingerprint
from poller.jobpod import offline, podspec
from poller.kube.client import ApiError, Conflict, Kube, NotOwned
from poller.results import lmeval

__all__ = ["Actuator", "Tally", "raise_if_transient"]

log = logging.getLogger(__name__)


class Tally(Protocol):
    """Where acting counts what it did (the cycle's report; thread-safe)."""

    def add(self, *, patches: int = 0, pods_created: int = 0) -> None: ...


def raise_if_transient(error: ApiError) -> None:
    """Raise `error` again if it is transient (`ApiError.transient`): the same
    request may succeed next cycle. Any other is a refusal for good, which the
    caller words with the apiserver's own message (`error.message`)."""
    if error.transient:
        raise error


class Actuator:
    """Carries out decisions (thread-safe: no state of its own)."""

    def __init__(
        self,
        kube: Kube,
        reads: PodIO,
        writes: StatusWrites,
        pod_proof: Callable[[], PodProof],
    ) -> None:
        self.kube = kube
        self.reads = reads
        self.writes = writes
        # The pod-identity key, read once by the cycle (`Reconciler.pod_proof`).
        self.pod_proof = pod_proof

    def carry_out(
        self,
        job: JobView,
        decision: Decision,
        settings: Settings,
        now: dt.datetime,
        tally: Tally,
    ) -> JobView:
        """Perform `decision`'s actions in order; returns the job as it now stands."""
        current = job
        pod: AdmittedPod | None = None
        store_problem: str | None = None
        prepared = False
        for action in decision.actions:
            if isinstance(action, CreatePod):
                made = self._create_pod(job, action, settings, now, tally, prepared)
                if made is None:
                    return current
                prepared = True
                if action.shard is None:
                    pod = made
            elif isinstance(action, StoreResults):
                store_problem = self._store_results(action)
            elif isinstance(action, ArchiveLog):
                self.reads.archive_log(job, action)
            elif isinstance(action, DeletePod):
                self.kube.delete_pod(job.namespace, action.name)
            elif isinstance(action, DeleteJob):
                self.kube.delete_job(job.namespace, job.name)
            elif isinstance(action, ReleaseHold):
                self.reads.release(job, action)
            elif isinstance(action, PatchStatus):
                action = with_outcome_of_actions(action, pod, store_problem)
                ends = action.status.state == JobState.COMPLETE
                if ends and job.status.state != JobState.COMPLETE:
                    self._release_kept_claim(job)  # before the status says it ended
                if self.writes.patch(job, action):
                    current = replace(job, status=action.status)
                tally.add(patches=1)
            elif isinstance(action, PostEvent):
                self.writes.event(job, action, now)
            elif isinstance(action, CreateWorkload):
                # Taken already: the next cycle lists it (a 409 is not an error).
                self.kube.create_workload(action.manifest)
            elif isinstance(action, PatchWorkloadStatus):
                self._patch_workload_status(job, action)
            elif isinstance(action, DeleteWorkload):
                self.kube.delete_workload(job.namespace, action.name)
        return current

    def _patch_workload_status(self, job: JobView, action: PatchWorkloadStatus) -> None:
        """Kueue writes its workloads too: a stale write is decided again next cycle."""
        try:
            self.kube.patch_workload_status(
                job.namespace, action.name, action.status, action.resource_version
            )
        except Conflict:
            log.info(
                "workload %s/%s changed meanwhile; deciding again next cycle",
                job.namespace,
                action.name,
            )
        except ApiError as error:
            if not action.best_effort:
                raise
            log.warning(
                "workload %s/%s not marked (%s); its job's retention tries again",
                job.namespace,
                action.name,
                error,
            )

    def end_failed(
        self, job: JobView, pod: PodView | None, message: str, now: dt.datetime, tally: Tally
    ) -> None:
        """End `job` Failed with `message`, and stop its evaluation (raises if the
        status cannot be written: the next cycle tries again)."""
        if job.deleting or job.status.state == JobState.COMPLETE:
            return  # nothing left to end: its TTL and deletion go on
        log.error("ending LMEvalJob %s/%s: %s", job.namespace, job.name, message)
        with contextlib.suppress(Exception):  # the job must end even if this fails
            self._release_kept_claim(job)
        tally.add(patches=self.writes.end_failed(job, now, message))
        if pod is not None and judge_pod(job, pod)[0] is not PodTrust.FOREIGN:
            # A job that ended must not leave its evaluation running.
            with contextlib.suppress(Exception):
                self.kube.delete_pod(job.namespace, pod.name)

    def _create_pod(
        self,
        job: JobView,
        action: CreatePod,
        settings: Settings,
        now: dt.datetime,
        tally: Tally,
        prepared: bool = False,
    ) -> AdmittedPod | None:
        """Create the job pod, or a shard's (stamped with its proof of origin); its
        UID and fingerprint as admitted, or None when the job could not get it (the
        job was failed, saying why). `prepared`: an earlier pod of this decision
        (another shard) already checked the custom tasks, ConfigMap and claim."""
        if not prepared:
            # Custom tasks: checked for code and frozen into the job's snapshots.
            problem = tasksnapshot.prepare_custom_tasks(self.kube, job, settings)
            cause = None
            if problem is None and (problem := self._results_configmap_problem(job)) is not None:
                cause = "ForeignObject"
            if problem is None and action.claim is not None:
                problem, cause = self._outputs_claim(job, action.claim)
            elif problem is not None:
                # Ours, made by an earlier attempt: what that attempt wrote there stays.
                self._release_kept_claim(job)
            if problem is not None:
                tally.add(patches=self.writes.fail(job, now, problem, cause=cause))
                return None
        manifest = self.pod_proof().stamp(action.manifest, job.uid, action.attempt)
        try:
            created = self.kube.create_pod(manifest)
        except ApiError as error:
            # Refused for good (admission, quota, invalid): the job cannot run.
            raise_if_transient(error)
            message = f"the job pod was refused: {error.message}"
            self._release_kept_claim(job)  # what an earlier attempt wrote there stays
            tally.add(patches=self.writes.fail(job, now, message))
            return None
        if created is not None:
            tally.add(pods_created=1)
            meta = created.get("metadata") or {}
            return AdmittedPod(str(meta.get("uid") or ""), pod_fingerprint(created.get("spec")))
        return self._existing_pod(job, manifest["metadata"]["name"], now, tally, action.shard)

    def _outputs_claim(self, job: JobView, claim: dict[str, Any]) -> tuple[str | None, str | None]:
        """Make the job's outputs claim (outputs.pvcManaged); why it cannot be (and
        the failure's cause), or None.

        A claim of that name already there is this job's only when the job is
        its controller (made by an earlier attempt, or before a crash): anyone
        may create a claim under the name, which all who can read the job can
        compute, and it would receive the job's samples and log.
        """
        name = claim["metadata"]["name"]
        try:
            found = self.kube.create_claim(claim)
        except ApiError as error:
            raise_if_transient(error)
            return f"the outputs claim {name} was refused: {error.message}", None
        if found is None:
            return None, None  # made now
        why = not_the_jobs(found, job.uid)
        if why is None:
            return None, None  # made for this job before: adopted
        log.warning("claim %s/%s squats %s's outputs claim: %s", job.namespace, name, job.name, why)
        message = offline.foreign_object_message(
            "PersistentVolumeClaim", name, job.namespace, "outputs claim", why
        )
        return message, "ForeignObject"

    def _results_configmap_problem(self, job: JobView) -> str | None:
        """Why the job cannot start because its results ConfigMap's name is taken by a
        ConfigMap that is not the job's (None when free, or the job's own).

        Checked before any pod exists: the results and the log archive would
        never be written there (`Kube.apply_configmap`), and the job should
        not run to find that out.
        """
        name = lmeval.results_configmap_name(job.name)
        found = self.kube.read_configmap(job.namespace, name)
        if found is None or (why := not_the_jobs(found, job.uid)) is None:
            return None
        owner = controller_reference(found.get("metadata") or {})
        if owner.get("kind") == api.KIND and owner.get("name") == job.name:
            # A former job of this name (deleted, then created again): the
            # garbage collector deletes its ConfigMap. Decided again next cycle.
            raise Conflict(f"ConfigMap {job.namespace}/{name} is a former job's: waiting for GC")
        log.warning("ConfigMap %s/%s squats %s's results: %s", job.namespace, name, job.name, why)
        return offline.foreign_object_message(
            "ConfigMap", name, job.namespace, "results ConfigMap", why
        )

    def _release_kept_claim(self, job: JobView) -> None:
        """outputs.pvcManaged with keep: the job's claim stops being controlled by
        it, so it outlives the job (the garbage collector would delete it)."""
        name = offline.kept_claim(job.spec, job.name, job.uid)
        if name is None:
            return
        owners = [offline.owner_reference(job.name, job.uid)]
        if self.kube.release_claim(job.namespace, name, owners):
            log.info("released kept claim %s/%s from %s", job.namespace, name, job.name)

    def _existing_pod(
        self, job: JobView, name: str, now: dt.datetime, tally: Tally, shard: int | None = None
    ) -> AdmittedPod | None:
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
        trust, why = judge_pod(job, pod) if shard is None else judge_shard(job, shard, pod)
        if trust is PodTrust.FOREIGN:
            log.warning("pod %s/%s squats %s's pod name: %s", job.namespace, name, job.name, why)
            message = foreign_pod_message(pod, why)
            self._release_kept_claim(job)
            tally.add(patches=self.writes.fail(job, now, message, cause="ForeignPod"))
            return None
        if trust is PodTrust.ALTERED:
            # Ours, but changed before it was ever recorded: the next cycle's
            # decision fails the job and deletes it.
            log.warning("pod %s/%s was changed after admission: %s", job.namespace, name, why)
            return AdmittedPod(pod.uid, "")
        log.info("adopting existing pod %s for %s/%s", name, job.namespace, job.name)
        return AdmittedPod(pod.uid, pod.fingerprint)

    def _store_results(self, action: StoreResults) -> str | None:
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
            raise_if_transient(error)
            return f"ConfigMap {name} was refused: {error.message}"
        return None
