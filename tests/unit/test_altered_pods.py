"""A job pod changed after admission: the fingerprint, the evidence, the decision.

Checks, without a cluster: `pod_fingerprint` covers every container's kind,
name and image (and nothing the apiserver defaults), is "" for a pod read
without its spec; `PodView.altered` names an ephemeral container, a restarted
container and a digest-pinned image that runs another digest; `judge_pod`
calls a recorded pod ALTERED when its fingerprint differs or it shows such
evidence, and never when nothing changed (or nothing was recorded); `decide`
then fails the job (cause AlteredPod), deletes the pod, and reads nothing of
it (no log, no exec).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

from poller import api
from poller.decisions import decide
from poller.decisions.actions import DeletePod, PatchStatus
from poller.decisions.observed import Observed
from poller.decisions.ownership import PodTrust, judge_pod
from poller.decisions.views import PodView, pod_fingerprint
from tests.unit.test_decide import NOW, SETTINGS, condition, job, pod, running_status, status_of

SPEC: dict[str, Any] = {
    "initContainers": [{"name": "install-driver", "image": "driver:1"}],
    "containers": [{"name": "lmeval", "image": "job@sha256:" + "a" * 64}],
}


def _listed(spec: dict[str, Any], status: dict[str, Any] | None = None) -> PodView:
    return PodView.from_object(
        {
            "metadata": {"name": "eval-abc123", "namespace": "ns", "uid": "pod-uid"},
            "spec": spec,
            "status": status or {},
        },
        "lmeval",
    )


def test_the_fingerprint_covers_names_and_images_only() -> None:
    base = pod_fingerprint(SPEC)
    assert base.startswith("sha256:") and len(base) == 7 + 64
    # What the apiserver adds at admission does not count.
    defaulted = {
        "initContainers": [{**SPEC["initContainers"][0], "terminationMessagePath": "/dev/x"}],
        "containers": [{**SPEC["containers"][0], "imagePullPolicy": "IfNotPresent"}],
        "dnsPolicy": "ClusterFirst",
    }
    assert pod_fingerprint(defaulted) == base
    swapped = {**SPEC, "containers": [{"name": "lmeval", "image": "evil:1"}]}
    assert pod_fingerprint(swapped) != base
    debugged = {**SPEC, "ephemeralContainers": [{"name": "peek", "image": "shell:1"}]}
    assert pod_fingerprint(debugged) != base
    # The kind counts: an init container is not a container.
    moved = {"containers": SPEC["initContainers"] + SPEC["containers"]}
    assert pod_fingerprint(moved) != base
    assert pod_fingerprint({}) == pod_fingerprint(None) == ""


def test_the_pod_itself_shows_an_ephemeral_container_a_restart_or_another_digest() -> None:
    assert _listed(SPEC).altered == ""
    debugged = {**SPEC, "ephemeralContainers": [{"name": "peek", "image": "shell:1"}]}
    assert _listed(debugged).altered == "ephemeral container peek was added to it"
    restarted = {"containerStatuses": [{"name": "lmeval", "restartCount": 1}]}
    assert "its container lmeval was restarted 1 time(s)" in _listed(SPEC, restarted).altered
    other = {"containerStatuses": [{"name": "lmeval", "imageID": "job@sha256:" + "b" * 64}]}
    assert "not the pinned image digest sha256:" + "a" * 64 in _listed(SPEC, other).altered
    same = {"containerStatuses": [{"name": "lmeval", "imageID": "job@sha256:" + "a" * 64}]}
    assert _listed(SPEC, same).altered == ""
    # A locally imported image reports no repository digest: nothing to compare.
    local = {"containerStatuses": [{"name": "lmeval", "imageID": "sha256:" + "c" * 64}]}
    assert _listed(SPEC, local).altered == ""


def test_a_recorded_pod_with_another_fingerprint_is_altered() -> None:
    recorded = pod_fingerprint(SPEC)
    current = job(running_status(podFingerprint=recorded))
    same = replace(pod(), fingerprint=recorded)
    assert judge_pod(current, same)[0] is PodTrust.CURRENT
    swapped = replace(pod(), fingerprint=pod_fingerprint({"containers": [{"name": "x"}]}))
    trust, why = judge_pod(current, swapped)
    assert trust is PodTrust.ALTERED and "not the ones the apiserver admitted" in why
    # Nothing recorded (an older poller's status), or nothing read: not judged.
    assert judge_pod(job(running_status()), swapped)[0] is PodTrust.CURRENT
    assert judge_pod(current, replace(pod(), fingerprint=""))[0] is PodTrust.CURRENT


def test_evidence_in_the_pod_makes_it_altered_even_before_it_is_recorded() -> None:
    evidence = replace(pod(), altered="ephemeral container peek was added to it")
    assert judge_pod(job(running_status()), evidence)[0] is PodTrust.ALTERED
    unrecorded = job({"state": "New", "podAttempt": 0})
    assert judge_pod(unrecorded, evidence)[0] is PodTrust.ALTERED
    # Someone else's pod stays FOREIGN, whatever it shows.
    foreign = replace(evidence, owner_uid="uid-other")
    assert judge_pod(job(running_status()), foreign)[0] is PodTrust.FOREIGN


def test_an_altered_pod_fails_the_job_is_deleted_and_is_never_read() -> None:
    current = job(running_status(podFingerprint=pod_fingerprint(SPEC)))
    swapped = replace(
        pod("terminated", exit_code=0), fingerprint=pod_fingerprint({"containers": [{"name": "x"}]})
    )
    needs = decide.what_to_observe(Observed(current, swapped), SETTINGS, NOW)
    assert not needs.any
    decision = decide.decide(Observed(current, swapped), SETTINGS, NOW)
    assert [type(a) for a in decision.actions][:1] == [DeletePod]
    assert any(isinstance(a, PatchStatus) for a in decision.actions)
    status = status_of(decision)
    assert status.reason == api.JobReason.FAILED
    assert "pod eval-abc123 was changed after the poller created it" in (status.message or "")
    assert condition(status, "Succeeded").reason == "AlteredPod"
    assert status.results is None


def test_a_new_attempt_forgets_the_last_fingerprint() -> None:
    suspended = job(
        {"state": "Suspended", "podAttempt": 1, "podFingerprint": pod_fingerprint(SPEC)},
    )
    decision = decide.decide(Observed(suspended, None), SETTINGS, NOW + dt.timedelta(seconds=1))
    status = status_of(decision)
    assert status.pod_attempt == 2 and status.pod_fingerprint is None
