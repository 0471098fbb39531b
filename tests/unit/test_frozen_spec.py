"""A started job's spec is frozen but for its control switches: the poller's side.

Checks, without a cluster: `spec_digest` ignores exactly the control switches
(cancel, suspend, ttlSecondsAfterFinished, activeDeadlineSeconds) and key
order, and sees every other change; a finished job's view carries none; the
first pod's decision records it in `status.specDigest` (and an adoption
does, when nothing was recorded), a resumed job keeps the first one; a
started job whose spec changed otherwise ends Failed (cause SpecChanged),
its pod stopped; one whose switches changed does not; a job recorded by an
older poller (no digest) is never judged.
"""

from __future__ import annotations

from dataclasses import replace

from poller import api
from poller.decisions import decide
from poller.decisions.actions import DeletePod
from poller.decisions.observed import Observed
from poller.decisions.views import spec_digest
from tests.unit.test_decide import NOW, SETTINGS, condition, job, pod, running_status, status_of

SPEC = {"model": "dummy", "tasks": ["toy"]}


def test_the_digest_ignores_the_switches_and_nothing_else() -> None:
    base = spec_digest(SPEC)
    assert base.startswith("sha256:")
    switched = {**SPEC, "cancel": True, "suspend": True, "ttlSecondsAfterFinished": 5}
    assert spec_digest({**switched, "activeDeadlineSeconds": 60}) == base
    assert spec_digest({"tasks": ["toy"], "model": "dummy"}) == base
    assert spec_digest({**SPEC, "limit": "5"}) != base
    assert spec_digest({**SPEC, "tasks": ["toy", "other"]}) != base
    assert job().digest == base
    finished = job({"state": "Complete", "reason": "Succeeded"})
    assert finished.digest == ""


def test_the_first_pod_records_the_digest_and_a_resume_keeps_it() -> None:
    first = status_of(decide.decide(Observed(job(), None), SETTINGS, NOW))
    assert first.spec_digest == spec_digest(SPEC)
    resumed = job({"state": "Suspended", "podAttempt": 1, "specDigest": "sha256:old"})
    status = status_of(decide.decide(Observed(resumed, None), SETTINGS, NOW))
    assert status.spec_digest == "sha256:old"


def test_an_adoption_records_the_digest_when_none_was() -> None:
    unrecorded = job({"state": "New"})
    adopted = replace(pod(), proof_attempt=1, uid="pod-2")
    status = status_of(decide.decide(Observed(unrecorded, adopted), SETTINGS, NOW))
    assert status.pod_uid == "pod-2" and status.spec_digest == spec_digest(SPEC)


def test_a_started_job_whose_spec_changed_fails_and_its_pod_stops() -> None:
    recorded = running_status(specDigest=spec_digest(SPEC))
    edited = job(recorded, limit="5")
    decision = decide.decide(Observed(edited, pod()), SETTINGS, NOW)
    assert any(isinstance(a, DeletePod) for a in decision.actions)
    status = status_of(decision)
    assert status.reason == api.JobReason.FAILED
    assert "spec: changed after the job started" in (status.message or "")
    assert condition(status, "Succeeded").reason == "SpecChanged"


def test_switches_and_older_statuses_are_not_changes() -> None:
    recorded = running_status(specDigest=spec_digest(SPEC))
    decision = decide.decide(
        Observed(job(recorded, ttlSecondsAfterFinished=60), pod()), SETTINGS, NOW
    )
    assert all(not isinstance(a, DeletePod) for a in decision.actions)
    cancelled = status_of(decide.decide(Observed(job(recorded, cancel=True), pod()), SETTINGS, NOW))
    assert cancelled.reason == api.JobReason.CANCELLED
    older = decide.decide(Observed(job(running_status(), limit="5"), pod()), SETTINGS, NOW)
    assert all(not isinstance(a, DeletePod) for a in older.actions)
