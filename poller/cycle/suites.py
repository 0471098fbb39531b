"""The suites' half of a cycle: observe each LMEvalSuite, decide once, act.

Why beside the jobs' loop rather than in it: a suite's runs are LMEvalJobs
that the jobs' loop runs like any other; what a suite adds is before and
after them (start a run on a trigger; judge a finished one against its
baseline), at most a few requests per suite and cycle. So the cycle runs
this after its jobs: one LIST of the suites (and, only when there is one,
one LIST of the LMEvalJobs carrying a suite's label, the pinned baselines
by name, and the InferenceServices a model trigger names), then per suite
the pure `poller.decisions.suites` decision on complete observations, then
its writes: runs created (stamped with the poller's proof) or deleted, the
status written only when it changed, events.

One suite's error never stops the others: it is counted and logged, and
the suite is decided again next cycle (every step is idempotent: a run's
name is derived from its trigger, and a run made before a crash is adopted
by its proof).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from poller import api
from poller.cycle.observe import Observer
from poller.cycle.podproof import PROOF_ANNOTATION, PodProof
from poller.decisions import suites as decisions
from poller.decisions.suites import ModelRevision, RunJob, SuiteObserved, SuiteView
from poller.kube.client import Kube
from poller.kube.errors import ApiError

__all__ = ["RUN_PROOF_ATTEMPT", "SuiteLoop", "SuitesReport"]

log = logging.getLogger(__name__)

# The attempt number signed into a run's proof (a pod's proof counts attempts;
# a run has one).
RUN_PROOF_ATTEMPT = 1


@dataclass
class SuitesReport:
    """What the suites' half of one cycle saw and did."""

    suites: int = 0
    runs_created: int = 0
    runs_deleted: int = 0
    patches: int = 0
    errors: list[str] = field(default_factory=list)
    # Every suite as it stands after this cycle (for the metrics).
    snapshot: list[SuiteView] = field(default_factory=list)


class SuiteLoop:
    """Observes, decides and acts for every LMEvalSuite, once per cycle."""

    def __init__(
        self,
        kube: Kube,
        observer: Observer,
        proof: Callable[[], PodProof],
        namespaces: Sequence[str] = (),
    ) -> None:
        self.kube = kube
        self.observer = observer
        self.proof = proof
        # Empty: every namespace (one LIST each); else only these (the jobs' rule).
        self.namespaces = tuple(namespaces)

    def run(self, now: dt.datetime) -> SuitesReport:
        """One pass over the suites. Raises only when the LIST of suites fails."""
        report = SuitesReport()
        scopes: Sequence[str | None] = self.namespaces or (None,)
        listed = [obj for scope in scopes for obj in self.kube.list_suites(scope)]
        report.suites = len(listed)
        if not listed:
            return report
        proof = self.proof()
        runs_by_suite = self._runs(proof, scopes)
        for obj in listed:
            suite = SuiteView.from_object(obj)
            try:
                report.snapshot.append(self._handle(suite, runs_by_suite, now, report))
            except Exception as error:  # one suite never stops the others
                where = f"{suite.namespace}/{suite.name}"
                report.errors.append(f"LMEvalSuite {where}: {error}")
                log.error("error handling LMEvalSuite %s: %s", where, error, exc_info=error)
                report.snapshot.append(suite)
        return report

    def _runs(self, proof: PodProof, scopes: Sequence[str | None]) -> dict[str, dict[str, RunJob]]:
        """The proven runs of every suite, by the suite's UID, then by run name."""
        out: dict[str, dict[str, RunJob]] = {}
        listed = [obj for scope in scopes for obj in self.kube.list_suite_runs(scope)]
        for obj in listed:
            meta = obj.get("metadata") or {}
            owner = next(
                (
                    ref
                    for ref in meta.get("ownerReferences") or []
                    if ref.get("controller") and ref.get("kind") == api.SUITE_KIND
                ),
                None,
            )
            if owner is None:
                continue
            suite_uid = str(owner.get("uid") or "")
            value = (meta.get("annotations") or {}).get(PROOF_ANNOTATION)
            name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
            if proof.verify(value, namespace, name, suite_uid) != RUN_PROOF_ATTEMPT:
                continue  # not made by this poller for this suite: never the suite's run
            out.setdefault(suite_uid, {})[name] = RunJob.from_object(obj)
        return out

    def _observe(
        self, suite: SuiteView, runs_by_suite: dict[str, dict[str, RunJob]]
    ) -> SuiteObserved:
        spec = suite.spec
        pinned: RunJob | None = None
        model: ModelRevision | None = None
        if spec is not None and spec.baseline.pinned is not None:
            found = self.kube.find_job(suite.namespace, spec.baseline.pinned)
            pinned = RunJob.from_object(found) if found is not None else None
        if spec is not None and spec.triggers.model_change is not None:
            model = self._model(suite.namespace, spec.triggers.model_change)
        return SuiteObserved(
            suite, runs=runs_by_suite.get(suite.uid, {}), pinned=pinned, model=model
        )

    def _model(self, namespace: str, trigger: api.ModelChangeTrigger) -> ModelRevision:
        name = trigger.inference_service.name
        where = "spec.triggers.modelChange.inferenceService"
        try:
            found = self.kube.read_inference_service(namespace, name)
        except ApiError as error:
            if error.transient:
                raise
            return ModelRevision(problem=f"{where}: cannot read {name}: {error}"[:512])
        if found is None:
            return ModelRevision(problem=f"{where}: InferenceService {name} not found")
        return ModelRevision(revision=model_revision(found))

    def _handle(
        self,
        suite: SuiteView,
        runs_by_suite: dict[str, dict[str, RunJob]],
        now: dt.datetime,
        report: SuitesReport,
    ) -> SuiteView:
        observed = self._observe(suite, runs_by_suite)
        wanted = list(decisions.needs_items(observed))
        before = decisions.needs_baseline_items(observed, now)
        if before is not None:
            wanted.append(before)
        if wanted:
            read = {
                uid: self.observer.read_items(suite.namespace, name, uid) for name, uid in wanted
            }
            observed = decisions.with_items(observed, read)
        decision = decisions.decide_suite(observed, now)
        return self._act(suite, decision, now, report)

    def _act(
        self,
        suite: SuiteView,
        decision: decisions.SuiteDecision,
        now: dt.datetime,
        report: SuitesReport,
    ) -> SuiteView:
        proof = self.proof()
        for manifest in decision.create:
            stamped = proof.stamp(manifest, suite.uid, RUN_PROOF_ATTEMPT)
            if self.kube.create_job(stamped) is not None:
                report.runs_created += 1
            # Taken already: a run made before a crash is adopted by its proof next
            # cycle; anything else under the name is never the suite's.
        for name in decision.delete:
            self.kube.delete_job(suite.namespace, name)
            report.runs_deleted += 1
        if decision.status is not None:
            status = dict(decision.status)
            # A merge patch keeps what it does not name: erase what the decision dropped.
            for key in suite.raw_status:
                status.setdefault(key, None)
            self.kube.patch_suite_status(
                suite.namespace, suite.name, status, suite.resource_version
            )
            report.patches += 1
        for kind, reason, message in decision.events:
            self.kube.post_event(
                namespace=suite.namespace,
                job_name=suite.name,
                job_uid=suite.uid,
                event_type=kind,
                reason=reason,
                message=message,
                now=now,
                kind=api.SUITE_KIND,
            )
        if decision.status is None:
            return suite
        return SuiteView.from_object(
            {
                "metadata": {
                    "namespace": suite.namespace,
                    "name": suite.name,
                    "uid": suite.uid,
                    "generation": suite.generation,
                    "creationTimestamp": suite.creation_timestamp,
                },
                "spec": suite.spec.model_dump(by_alias=True, mode="json") if suite.spec else {},
                "status": decision.status,
            }
        )


def model_revision(inference_service: dict[str, Any]) -> str | None:
    """What identifies the model an InferenceService serves now: its predictor's
    latest ready revision, else its URL (KServe's raw deployment mode has no
    revisions). Bounded: it goes into a status and a run's annotation."""
    status = inference_service.get("status") or {}
    predictor = ((status.get("components") or {}).get("predictor")) or {}
    for value in (predictor.get("latestReadyRevision"), status.get("url")):
        if isinstance(value, str) and value:
            return value[:256]
    return None
