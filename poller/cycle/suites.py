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
from dataclasses import dataclass, field, replace
from typing import Any

from poller import api
from poller.api.settings import Settings
from poller.cycle.observe import Observer
from poller.cycle.podproof import PROOF_ANNOTATION, PodProof
from poller.decisions import attestation
from poller.decisions import suites as decisions
from poller.decisions.attestation import SignerView
from poller.decisions.suites import ModelRevision, RunJob, SuiteObserved, SuiteView
from poller.decisions.views import PodView
from poller.jobpod import signer
from poller.kube.client import Kube
from poller.kube.errors import ApiError, Conflict, NotFound

__all__ = ["RUN_PROOF_ATTEMPT", "SuiteLoop", "SuitesReport"]

log = logging.getLogger(__name__)

# The attempt number signed into a run's proof (a pod's proof counts attempts;
# a run has one).
RUN_PROOF_ATTEMPT = 1
# What is read of a signing pod's log: its one line is a DSSE envelope of a few KB.
SIGNER_LOG_LINES = 20
SIGNER_LOG_BYTES = 1 << 20


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
        settings: Callable[[], Settings] = Settings,
    ) -> None:
        self.kube = kube
        self.observer = observer
        self.proof = proof
        # The signing pod's image and account are the job pod's (the last good settings).
        self.settings = settings
        # Empty: every namespace (one LIST each); else only these (the jobs' rule).
        self.namespaces = tuple(namespaces)
        self._warned_no_api = False

    def run(self, now: dt.datetime) -> SuitesReport:
        """One pass over the suites. Raises only when the LIST of suites fails."""
        report = SuitesReport()
        scopes: Sequence[str | None] = self.namespaces or (None,)
        try:
            listed = [obj for scope in scopes for obj in self.kube.list_suites(scope)]
        except NotFound:
            # The LMEvalSuite CRD is not installed (only the LMEvalJob one was
            # applied, or an upgrade applies it after the poller): no suites, and
            # the jobs' half of the cycle is unaffected. Asked again next cycle.
            if not self._warned_no_api:
                log.warning("the LMEvalSuite API is not installed: no suites until it is")
                self._warned_no_api = True
            return report
        self._warned_no_api = False
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
        self, suite: SuiteView, runs_by_suite: dict[str, dict[str, RunJob]], now: dt.datetime
    ) -> SuiteObserved:
        """What the suite's decision reads. Runs are listed as metadata only; the
        runs whose state the decision needs (active ones, ones it may adopt, ones
        being signed and their baselines) are read whole, by name; the pinned
        baseline only when a run is going or may start."""
        spec = suite.spec
        runs = dict(runs_by_suite.get(suite.uid, {}))
        model: ModelRevision | None = None
        if spec is not None and spec.triggers.model_change is not None:
            model = self._model(suite.namespace, spec.triggers.model_change)
        signing = [
            run
            for run in suite.status.runs
            if run.attestation is not None and run.attestation.state == attestation.SIGNING
        ]
        recorded = {run.name for run in suite.status.runs}
        active = [run for run in suite.status.runs if run.state == decisions.ACTIVE]
        wanted = {name for run in active for name in (run.name, run.baseline) if name}
        wanted |= {name for name in runs if name not in recorded}
        wanted |= {name for run in signing for name in (run.name, run.baseline) if name}
        for name in sorted(wanted & runs.keys()):
            found = self.kube.find_job(suite.namespace, name)
            if found is not None and (found.get("metadata") or {}).get("uid") == runs[name].uid:
                runs[name] = RunJob.from_object(found)
        observed = SuiteObserved(
            suite,
            runs=runs,
            model=model,
            signers={run.name: self._signer(suite, run) for run in signing},
        )
        pinned = spec.baseline.pinned if spec is not None else None
        if pinned is not None and (wanted or decisions.may_start(observed, now)):
            found = self.kube.find_job(suite.namespace, pinned)
            if found is not None:
                observed = replace(observed, pinned=RunJob.from_object(found))
        return observed

    def _signer(self, suite: SuiteView, run: api.RunStatus) -> SignerView:
        """A run's signing pod: its phase, and on success its log's last lines.
        Only a pod whose controller is the run and which carries the poller's
        proof for it is the signer (as for job pods); any other pod under the
        name is never read or deleted, and the suite waits for the name."""
        name = signer.signer_name(run.name)
        found = self.kube.find_pod(suite.namespace, name)
        if found is None:
            return SignerView("")
        pod = PodView.from_object(found, signer.SIGNER_CONTAINER, self.proof().attempt_of)
        if pod.proof_attempt != RUN_PROOF_ATTEMPT or not run.uid or pod.owner_uid != run.uid:
            return SignerView("Pending", f"pod {name} is not the poller's signing pod")
        if pod.phase == "Failed":
            said = pod.main.message.strip() or pod.main.reason or pod.message or pod.reason
            return SignerView(pod.phase, f"{said} (exit code {pod.main.exit_code})"[:1024])
        if pod.phase != "Succeeded":
            return SignerView(pod.phase)
        tail = self.kube.read_log_tail(
            suite.namespace, name, signer.SIGNER_CONTAINER, SIGNER_LOG_LINES, SIGNER_LOG_BYTES
        )
        return SignerView(pod.phase, output=tail.data)

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
        observed = self._observe(suite, runs_by_suite, now)
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
        self._sign(suite, decision)
        if decision.status is not None:
            status = dict(decision.status)
            # A merge patch keeps what it does not name: erase what the decision dropped.
            for key in suite.raw_status:
                status.setdefault(key, None)
            try:
                self.kube.patch_suite_status(
                    suite.namespace, suite.name, status, suite.resource_version
                )
            except Conflict:
                # Someone changed the suite since it was listed (a run asked for by
                # hand, an edit): decided again next cycle on the new object; a run
                # made above is adopted then by its proof.
                log.info("LMEvalSuite %s/%s changed meanwhile", suite.namespace, suite.name)
                return suite
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

    def _sign(self, suite: SuiteView, decision: decisions.SuiteDecision) -> None:
        """The signing steps: start (statement, then pod), keep the envelope, and
        delete the pod once read (its ConfigMaps go with the run)."""
        spec = suite.spec
        uids = {run.name: run.uid for run in suite.status.runs if run.uid}
        for run_name, statement_json in decision.sign_start:
            run_uid = uids.get(run_name)
            if spec is None or spec.attestation is None or run_uid is None:
                continue
            self.kube.create_configmap(
                signer.statement_configmap(
                    suite.namespace, run_name, run_uid, suite.name, statement_json
                )
            )
            pod = signer.signer_pod(
                namespace=suite.namespace,
                run_name=run_name,
                run_uid=run_uid,
                suite_name=suite.name,
                attestation=spec.attestation,
                template=spec.template,
                settings=self.settings(),
                statement_json=statement_json,
            )
            # The proof binds the pod to its controller, the run (as a job pod's to its job).
            self.kube.create_pod(self.proof().stamp(pod, run_uid, RUN_PROOF_ATTEMPT))
        for run_name, envelope_json in decision.sign_keep:
            run_uid = uids.get(run_name)
            if run_uid is not None:
                self.kube.create_configmap(
                    signer.attestation_configmap(
                        suite.namespace, run_name, run_uid, suite.name, envelope_json
                    )
                )
        for run_name in decision.sign_clean:
            self.kube.delete_pod(suite.namespace, signer.signer_name(run_name))


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
