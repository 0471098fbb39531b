"""Objects the poller makes for a job besides its pod are the job's only by their controller.

The pure judgement (`ownership.not_the_jobs`): an object under one of a
job's deterministic names (its managed outputs claim, results ConfigMap,
task snapshots) is the job's when, and only when, its controller
ownerReference is the job's UID: not without one, not with another job's
(even of the same name), not with the job as a mere non-controller owner,
and never for a matching label. The failure message names the object, its
kind and namespace, says it is not the poller's and what to do. Every
managed claim, kept or not, carries the job as its controller; `kept_claim`
reads keep from the raw spec.

Then the actuator with a recording stand-in for the API: a squatted outputs
claim or results ConfigMap fails the job before any pod is made, and the
squatted object sees no write at all (no release, no update, no delete); a
claim the job controls is adopted and the pod made; a results ConfigMap
left by a deleted job of the same name waits for the garbage collector
(Conflict, retried) rather than failing the new job; a kept claim is
released (its exact owner reference, atomically) before the status that
ends the job is written, and a claim without keep is not. What the real
apiserver does with these requests is tests/cluster/test_outputs_claim.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from poller import api
from poller.api.settings import Settings
from poller.cycle.act import Actuator
from poller.cycle.podio import PodIO
from poller.cycle.podproof import PodProof
from poller.cycle.statuswrites import StatusWrites
from poller.decisions import ownership
from poller.decisions.observed import Observed
from poller.decisions.scheduling import decide_failure, schedule
from poller.decisions.views import JobView
from poller.jobpod import offline, podspec
from poller.kube.client import Conflict
from poller.results import lmeval

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
UID = "uid-job"


def owned_by(uid: str, *, name: str = "eval", controller: bool = True) -> dict[str, Any]:
    ref = {**offline.owner_reference(name, uid)}
    ref["controller"] = controller
    return {"metadata": {"name": "x", "ownerReferences": [ref]}}


# -- the pure judgement ---------------------------------------------------------------


def test_only_the_jobs_controller_reference_makes_an_object_the_jobs() -> None:
    assert ownership.not_the_jobs(owned_by(UID), UID) is None
    assert ownership.not_the_jobs({"metadata": {}}, UID) == "it has no controller ownerReference"
    # The job as a plain owner, not controller: anyone could add that beside their own.
    assert ownership.not_the_jobs(owned_by(UID, controller=False), UID) == (
        "it has no controller ownerReference"
    )
    other = ownership.not_the_jobs(owned_by("uid-former"), UID)
    assert other == "its controller ownerReference is LMEvalJob eval (uid uid-former), not this job"
    deployment = {
        "metadata": {
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": UID}
            ]
            # Same UID string, but not marked controller: still not the job's.
        }
    }
    assert ownership.not_the_jobs(deployment, UID) is not None


def test_a_label_naming_the_job_does_not_make_an_object_the_jobs() -> None:
    labelled = {"metadata": {"labels": {podspec.LABEL_JOB_UID: UID}}}
    assert ownership.not_the_jobs(labelled, UID) == "it has no controller ownerReference"


def test_the_message_names_the_object_its_kind_and_what_to_do() -> None:
    why = ownership.not_the_jobs({"metadata": {}}, UID) or ""
    message = offline.foreign_object_message(
        "PersistentVolumeClaim", "eval-outputs-abc123", "team-a", "outputs claim", why
    )
    assert message.startswith(
        "PersistentVolumeClaim eval-outputs-abc123 in namespace team-a exists and is not this "
        "job's outputs claim (it has no controller ownerReference)"
    )
    assert "neither used, written nor deleted" in message
    assert message.endswith("delete it, or rename the job")


def _spec(**outputs: Any) -> api.LMEvalJobSpec:
    return api.LMEvalJobSpec.model_validate(
        {"model": "hf", "tasks": ["arc_easy"], "outputs": outputs}
    )


@pytest.mark.parametrize("keep", [False, True])
def test_every_managed_claim_is_controlled_by_its_job(keep: bool) -> None:
    claim = podspec.managed_claim(
        "eval", "ns", UID, _spec(pvcManaged={"size": "1Gi", "keep": keep})
    )
    assert claim is not None
    assert ownership.not_the_jobs(claim, UID) is None
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("LMEvalJob", "eval", True)


def test_kept_claim_reads_keep_from_the_raw_spec() -> None:
    name = offline.managed_claim_name("eval", UID)
    assert offline.kept_claim({"outputs": {"pvcManaged": {"keep": True}}}, "eval", UID) == name
    for raw in (
        {},
        {"outputs": {"pvcManaged": {"size": "1Gi"}}},
        {"outputs": {"pvcManaged": {"keep": False}}},
        {"outputs": {"pvcManaged": {"keep": "true"}}},  # not a boolean: not validated, not kept
        {"outputs": {"pvcName": "mine"}},
        {"outputs": "garbage"},
    ):
        assert offline.kept_claim(raw, "eval", UID) is None, raw


# -- the actuator, with a recording stand-in for the API --------------------------------


class StandIn:
    """The API calls the actuator makes on a job's way to its pod, and at its end."""

    def __init__(
        self,
        *,
        claim: dict[str, Any] | None = None,
        configmap: dict[str, Any] | None = None,
    ) -> None:
        self.claim = claim  # under the claim's name already (None: free)
        self.configmap = configmap  # under the results ConfigMap's name already
        self.calls: list[tuple[str, Any]] = []

    def read_configmap(self, namespace: str, name: str, **_: Any) -> dict[str, Any] | None:
        self.calls.append(("read_configmap", name))
        return self.configmap if name == lmeval.results_configmap_name("eval") else None

    def create_claim(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("create_claim", manifest["metadata"]["name"]))
        return self.claim

    def release_claim(self, namespace: str, name: str, owners: list[dict[str, Any]]) -> bool:
        self.calls.append(("release_claim", (name, owners)))
        return True

    def create_pod(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("create_pod", manifest["metadata"]["name"]))
        return {"metadata": {"uid": "pod-uid"}, "spec": manifest["spec"]}

    def patch_job_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> None:
        self.calls.append(("patch_job_status", status))

    def post_event(self, **event: Any) -> None:
        self.calls.append(("post_event", event["reason"]))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]


class Tally:
    def add(self, *, patches: int = 0, pods_created: int = 0) -> None:
        pass


def job(**outputs: Any) -> JobView:
    return JobView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": "eval",
                "uid": UID,
                "generation": 1,
                "resourceVersion": "5",
                "creationTimestamp": "2026-11-30T00:00:00Z",
            },
            "spec": {"model": "hf", "tasks": ["arc_easy"], "outputs": outputs},
        }
    )


def actuator(kube: StandIn) -> Actuator:
    return Actuator(kube, PodIO(kube), StatusWrites(kube), lambda: PodProof(bytes(32)))  # type: ignore[arg-type]


def start(kube: StandIn, view: JobView) -> None:
    settings = Settings()
    actuator(kube).carry_out(
        view, schedule(Observed(view, None), settings, NOW), settings, NOW, Tally()
    )


def failure_message(kube: StandIn) -> str:
    [status] = [value for kind, value in kube.calls if kind == "patch_job_status"]
    assert (status["state"], status["reason"]) == ("Complete", "Failed")
    message: str = status["message"]
    return message


@pytest.mark.parametrize(
    "squatter",
    [
        {"metadata": {}},
        {"metadata": {"labels": {podspec.LABEL_JOB_UID: UID}}},
        owned_by("uid-other", name="other"),
        owned_by(UID, controller=False),
    ],
    ids=["no-owner", "the-jobs-label", "another-job", "not-controller"],
)
def test_a_squatted_outputs_claim_fails_the_job_and_is_never_touched(
    squatter: dict[str, Any],
) -> None:
    kube = StandIn(claim=squatter)
    start(kube, job(pvcManaged={"size": "1Gi", "keep": True}))
    name = offline.managed_claim_name("eval", UID)
    assert kube.kinds() == ["read_configmap", "create_claim", "patch_job_status", "post_event"]
    message = failure_message(kube)
    assert f"PersistentVolumeClaim {name} in namespace ns exists and is not this job's" in message
    assert message.endswith("delete it, or rename the job")
    assert ("post_event", "ForeignObject") in kube.calls


def test_the_jobs_own_claim_is_adopted_and_the_pod_made() -> None:
    kube = StandIn(claim=owned_by(UID))
    start(kube, job(pvcManaged={"size": "1Gi"}))
    assert kube.kinds()[:3] == ["read_configmap", "create_claim", "create_pod"]
    assert "release_claim" not in kube.kinds()


def test_a_squatted_results_configmap_fails_the_job_before_any_claim_or_pod() -> None:
    kube = StandIn(configmap={"metadata": {"name": "eval-results"}, "data": {"mine": "yes"}})
    start(kube, job(pvcManaged={"size": "1Gi"}))
    assert kube.kinds() == ["read_configmap", "patch_job_status", "post_event"]
    assert failure_message(kube).startswith(
        "ConfigMap eval-results in namespace ns exists and is not this job's results ConfigMap "
        "(it has no controller ownerReference)"
    )


def test_a_former_same_named_jobs_results_configmap_is_waited_for() -> None:
    kube = StandIn(configmap=owned_by("uid-deleted-job"))
    with pytest.raises(Conflict, match="former job"):
        start(kube, job())
    assert kube.kinds() == ["read_configmap"]


def test_a_kept_claim_is_released_before_the_status_that_ends_the_job() -> None:
    kube = StandIn()
    view = job(pvcManaged={"size": "1Gi", "keep": True})
    ending = decide_failure(view, NOW, "it failed")
    actuator(kube).carry_out(view, ending, Settings(), NOW, Tally())
    assert kube.kinds()[:2] == ["release_claim", "patch_job_status"]
    [(name, owners)] = [value for kind, value in kube.calls if kind == "release_claim"]
    assert name == offline.managed_claim_name("eval", UID)
    assert owners == [offline.owner_reference("eval", UID)]

    plain = StandIn()
    view = job(pvcManaged={"size": "1Gi"})
    actuator(plain).carry_out(view, decide_failure(view, NOW, "x"), Settings(), NOW, Tally())
    assert "release_claim" not in plain.kinds()
