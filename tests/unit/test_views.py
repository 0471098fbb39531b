"""How a listed object becomes the views a cycle holds, without a cluster.

Checks: a finished job's view is compact (only `FINISHED_SPEC_KEYS` of its
spec, no results text, no conditions, no provenance) while every other job's view keeps
its whole spec and status; the scores are parsed once into the view for any
job that has results, junk results give none; a compact view still makes
the decisions a finished job needs (TTL) and the status patch a cycle would
send for it can never erase what the view left out; `parse_scores` interns
the names every job repeats; an object that cannot be read as a job still
gets a view (what of its status validates alone), which ends it Failed
saying why, or, when it had finished, still expires by its TTL; a pod's
view carries the main container's image and imageID as the kubelet reports
them, in every state (an image pulled by digest alone: the spec's reference,
not the bare ID containerd reports).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from poller import api
from poller.api.settings import Settings
from poller.cycle.reconciler import Reconciler
from poller.decisions import decide
from poller.decisions.actions import DeleteJob, PatchStatus
from poller.decisions.observed import Observed
from poller.decisions.views import FINISHED_SPEC_KEYS, FINISHED_STATUS_OMITS, JobView, PodView
from poller.results.lmeval import parse_scores
from poller.timefmt import format_time

NOW = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)
RESULTS = {
    "results": {
        "arc": {"alias": "arc", "acc,none": 0.5, "acc_stderr,none": 0.01},
        "hella": {"acc_norm,none": 0.25},
    },
    "configs": {"arc": {"task": "arc", "num_fewshot": 5}},
}
SPEC = {
    "model": "hf",
    "modelArgs": [{"name": "pretrained", "value": "org/m"}],
    "tasks": ["arc", "hella"],
    "pod": {"resources": {"requests": {"cpu": "2"}}},
    "ttlSecondsAfterFinished": 600,
}


def condition(kind: str, status: str, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": "m",
        "lastTransitionTime": format_time(NOW - dt.timedelta(hours=1)),
        "observedGeneration": 1,
    }


def listed(state: str, *, results: bool = True, finished_ago: float = 60) -> dict[str, Any]:
    """An LMEvalJob as a LIST returns it, with a status the poller could have written."""
    status: dict[str, Any] = {
        "state": state,
        "message": "evaluation finished: arc, hella",
        "podName": "eval-pod",
        "lastScheduleTime": format_time(NOW - dt.timedelta(hours=1)),
        "progress": {"percent": 100.0, "phase": "loglikelihood"},
        "conditions": [
            condition("Scheduled", "True", "PodCreated"),
            condition("Running", "False", "Finished"),
            condition("Finished", "True", "Succeeded"),
            condition("Succeeded", "True", "Succeeded"),
        ],
        "observedGeneration": 1,
    }
    if state == "Complete":
        status["reason"] = "Succeeded"
        status["completeTime"] = format_time(NOW - dt.timedelta(seconds=finished_ago))
    if results:
        status.update(
            results=json.dumps(RESULTS),
            resultsReduced=False,
            resultsConfigMap="eval-results",
            provenance={"imageID": "sha256:" + "a" * 64, "argv": ["lm_eval", "--tasks", "t"]},
            itemScores={"stored": "ConfigMap", "tasks": 1, "items": 10, "bytes": 300},
        )
    api.LMEvalJobStatus.model_validate(status)
    return {
        "metadata": {
            "namespace": "ns",
            "name": "eval",
            "uid": "uid-1",
            "generation": 1,
            "resourceVersion": "7",
            "creationTimestamp": format_time(NOW - dt.timedelta(hours=2)),
        },
        "spec": json.loads(json.dumps(SPEC)),
        "status": status,
    }


def test_a_finished_jobs_view_is_compact() -> None:
    view = JobView.from_object(listed("Complete"))
    assert set(view.spec) <= FINISHED_SPEC_KEYS
    assert view.spec == {"model": "hf", "ttlSecondsAfterFinished": 600}
    assert view.status.results is None
    assert view.status.conditions is None
    assert view.status.provenance is None  # a few KB a job, read only by the CLI
    assert {"results", "conditions", "provenance", "shards"} == FINISHED_STATUS_OMITS
    # The gate reads a finished baseline's itemScores.
    assert view.status.item_scores is not None and view.status.item_scores.items == 10
    # What the metrics and the TTL read is all there.
    assert view.status.state == api.JobState.COMPLETE
    assert view.status.reason == api.JobReason.SUCCEEDED
    assert view.status.complete_time is not None
    assert view.status.progress is not None and view.status.progress.percent == 100.0
    assert view.status.results_config_map == "eval-results"
    assert view.ttl_seconds_after_finished == 600


@pytest.mark.parametrize("state", ["New", "Scheduled", "Running", "Suspended"])
def test_other_jobs_keep_their_whole_spec_and_status(state: str) -> None:
    obj = listed(state)
    view = JobView.from_object(obj)
    assert view.spec == SPEC
    assert view.status.results == obj["status"]["results"]
    assert view.status.conditions is not None and len(view.status.conditions) == 4


@pytest.mark.parametrize("state", ["Complete", "Running"])
def test_scores_are_parsed_into_the_view(state: str) -> None:
    view = JobView.from_object(listed(state))
    by_key = {(s.task, s.metric, s.filter, s.stderr): s.value for s in view.scores}
    assert by_key == {
        ("arc", "acc", "none", False): 0.5,
        ("arc", "acc", "none", True): 0.01,
        ("hella", "acc_norm", "none", False): 0.25,
    }
    assert JobView.from_object(listed(state, results=False)).scores == ()


def test_junk_results_give_no_scores_and_no_error() -> None:
    obj = listed("Complete", results=False)
    obj["status"]["results"] = "{not json"
    assert JobView.from_object(obj).scores == ()


def test_scores_intern_the_names_every_job_repeats() -> None:
    text = json.dumps(RESULTS)
    first, second = parse_scores(text), parse_scores(json.loads(json.dumps(text)))
    assert first == second
    assert all(
        a.task is b.task and a.metric is b.metric for a, b in zip(first, second, strict=True)
    )


@pytest.mark.parametrize(("ago", "deleted"), [(60, False), (601, True)])
def test_a_compact_view_still_expires_by_ttl(ago: float, deleted: bool) -> None:
    view = JobView.from_object(listed("Complete", finished_ago=ago))
    actions = decide.decide(Observed(view, None), Settings(), NOW).actions
    assert actions == ([DeleteJob()] if deleted else [])


class RecordingKube:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def patch_job_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> None:
        self.patches.append(status)


def test_a_patch_built_from_a_compact_view_never_erases_what_it_left_out() -> None:
    # A merge patch removes only the keys it sets to null: whatever a status
    # written for a finished job holds, the omitted fields are never in it.
    view = JobView.from_object(listed("Complete"))
    new = view.status.model_copy(update={"message": "changed"})
    kube = RecordingKube()
    poller = Reconciler(kube, settings_namespace="lmeval-system")  # type: ignore[arg-type]
    assert poller.writes.patch(view, PatchStatus(new, view.resource_version))
    (patch,) = kube.patches
    assert patch["message"] == "changed"
    assert not FINISHED_STATUS_OMITS & set(patch)


def _unreadable(state: str) -> JobView:
    obj = {
        "metadata": {"namespace": "ns", "name": "odd", "uid": "u", "resourceVersion": "9"},
        "spec": {"model": "hf", "ttlSecondsAfterFinished": 60},
        "status": {
            "state": state,
            "completeTime": format_time(NOW - dt.timedelta(hours=1)),
            "bogus": {"deep": [1]},
        },
    }
    with pytest.raises(ValueError) as caught:
        JobView.from_object(obj)  # an unknown status field: refused by the model
    return JobView.unreadable(obj, caught.value)


def test_an_unreadable_job_is_kept_and_ended_with_the_reason() -> None:
    view = _unreadable("Running")
    assert view.status.state == api.JobState.RUNNING and view.problem
    decision = decide.decide(Observed(view, None), Settings(), NOW)
    (patch,) = [a for a in decision.actions if isinstance(a, PatchStatus)]
    assert patch.status.reason == api.JobReason.FAILED
    assert "the poller cannot read this LMEvalJob: ValidationError" in (patch.status.message or "")


def test_an_unreadable_finished_job_still_expires() -> None:
    assert decide.decide(Observed(_unreadable("Complete"), None), Settings(), NOW).actions == [
        DeleteJob()
    ]


@pytest.mark.parametrize(
    "state",
    [
        {"terminated": {"exitCode": 0, "reason": "Completed"}},
        {"running": {"startedAt": "2026-11-30T11:00:00Z"}},
        {"waiting": {"reason": "ContainerCreating"}},
        {},
    ],
)
def test_the_pod_view_carries_the_image_the_kubelet_ran(state: dict[str, Any]) -> None:
    digest = "docker.io/library/python@sha256:" + "e" * 64
    statuses = [
        {"name": "other", "image": "x", "imageID": "y", "state": state},
        {"name": "lmeval", "image": "python:3.12", "imageID": digest, "state": state},
    ]
    view = PodView.from_object(
        {"metadata": {"name": "p"}, "status": {"containerStatuses": statuses}}, "lmeval"
    )
    assert (view.main.image, view.main.image_id) == ("python:3.12", digest)
    junk = [{"name": "lmeval", "image": 5, "imageID": None, "state": state}]
    view = PodView.from_object({"status": {"containerStatuses": junk}}, "lmeval")
    assert (view.main.image, view.main.image_id) == ("", "")


def test_an_image_pulled_by_digest_is_named_by_the_spec_not_by_its_id() -> None:
    # containerd's status names an image pulled by digest alone by its
    # config's ID; the provenance should say which image that was.
    by_digest = "registry.example/lmeval/lmeval-job@sha256:" + "1" * 64
    spec = {"containers": [{"name": "other", "image": "x"}, {"name": "lmeval", "image": by_digest}]}
    status = {"name": "lmeval", "image": "sha256:" + "2" * 64, "imageID": by_digest, "state": {}}
    view = PodView.from_object({"spec": spec, "status": {"containerStatuses": [status]}}, "lmeval")
    assert view.main.image == by_digest
    named = {**status, "image": "registry.example/lmeval/lmeval-job:0.2.0"}
    view = PodView.from_object({"spec": spec, "status": {"containerStatuses": [named]}}, "lmeval")
    assert view.main.image == "registry.example/lmeval/lmeval-job:0.2.0"
