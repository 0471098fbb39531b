"""Sharded jobs (spec.parallelism above 1), decided without a cluster.

Checks the shard stage `poller.decisions.shards` runs through `decide`: N
shard pods made with a proof per shard and attempt, their records and the
job's state and progress, a succeeded shard recorded and its pod deleted, a
failed one retried up to its limit and then the job failed naming it, a pod
the poller did not make never touched, the merge pod once every shard
succeeded, suspend and resume (a stop is not a failure), cancel, the pods'
shape (argv, no exec hold, co-location, labels), Kueue's one pod set of N,
max-running-jobs counting pods, and the spec's refusal without a claim.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from driver import protocol
from poller import api
from poller.api.settings import Settings
from poller.decisions import decide, kueueadmission, shards
from poller.decisions.actions import CreatePod, DeletePod, PatchStatus
from poller.decisions.concurrency import plan_queue
from poller.decisions.observed import Observed
from poller.decisions.routing import Step, route
from poller.decisions.views import ContainerView, JobView, PodView
from poller.jobpod import podspec
from poller.timefmt import format_time

NOW = dt.datetime(2026, 12, 4, 12, 0, 0, tzinfo=dt.UTC)
SETTINGS = Settings()
CLAIM = {"pvcManaged": {"size": "1Gi"}}
UID = "uid-1"


def job(status: dict[str, Any] | None = None, count: int = 3, **spec: Any) -> JobView:
    api.LMEvalJobStatus.model_validate(status or {})
    return JobView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": "eval",
                "uid": UID,
                "generation": 1,
                "resourceVersion": "7",
                "creationTimestamp": format_time(NOW - dt.timedelta(minutes=5)),
            },
            "spec": {
                "model": "dummy",
                "tasks": ["toy"],
                "parallelism": count,
                "outputs": CLAIM,
                **spec,
            },
            "status": status or {},
        }
    )


def shard_pod(
    index: int,
    state: str = "running",
    *,
    attempt: int = 1,
    phase: str = "Running",
    owner: str = UID,
    uid: str | None = None,
    **main: Any,
) -> PodView:
    return PodView(
        name=podspec.shard_pod_name("eval", UID, index),
        namespace="ns",
        uid=uid or f"pod-{index}-{attempt}",
        phase=phase,
        deleting=False,
        main=ContainerView(state, **main),
        owner_uid=owner,
        proof_attempt=attempt,
        created=format_time(NOW - dt.timedelta(seconds=30)),
    )


def records(*states: str, attempt: int = 1, failures: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "index": index,
            "state": state,
            "attempt": attempt if state != "Pending" else 0,
            "failures": failures,
            **({"podUID": f"pod-{index}-{attempt}"} if state in ("Scheduled", "Running") else {}),
        }
        for index, state in enumerate(states)
    ]


def running(*states: str, **extra: Any) -> dict[str, Any]:
    return {
        "state": "Running",
        "reason": "NoReason",
        "startTime": format_time(NOW - dt.timedelta(minutes=1)),
        "shards": records(*states, **extra),
    }


def decided(listed: Observed) -> list[Any]:
    return decide.decide(listed, SETTINGS, NOW).actions


def status_of(actions: list[Any]) -> api.LMEvalJobStatus:
    return next(a for a in actions if isinstance(a, PatchStatus)).status


def test_a_new_sharded_job_makes_one_pod_per_shard_with_its_own_proof_attempt() -> None:
    listed = Observed(job(), None, shards=(None, None, None))
    assert route(listed, NOW) is Step.SHARDS
    actions = decided(listed)
    creates = [a for a in actions if isinstance(a, CreatePod)]
    assert [c.shard for c in creates] == [0, 1, 2]
    assert [c.attempt for c in creates] == [1, 1, 1]
    names = [c.manifest["metadata"]["name"] for c in creates]
    assert names == [podspec.shard_pod_name("eval", UID, k) for k in range(3)]
    assert len(set(names)) == 3
    assert all(c.claim is not None for c in creates)  # the managed claim, made first
    status = status_of(actions)
    assert status.state == api.JobState.SCHEDULED
    assert status.shards_done == "0/3"
    assert [(s.index, s.state, s.attempt) for s in status.shards or []] == [
        (0, "Scheduled", 1),
        (1, "Scheduled", 1),
        (2, "Scheduled", 1),
    ]
    assert status.pod_name is None  # the job's pod name is the merge pod's, made last


def test_shard_pods_run_their_part_hold_nothing_and_stay_together() -> None:
    spec = api.LMEvalJobSpec.model_validate(
        {"model": "dummy", "tasks": ["toy"], "parallelism": 2, "outputs": CLAIM}
    )
    settings = Settings(results_source="exec")
    shard = podspec.build_pod(
        name="eval", namespace="ns", uid=UID, spec=spec, settings=settings, shard=1
    )
    merge = podspec.build_pod(name="eval", namespace="ns", uid=UID, spec=spec, settings=settings)
    shard_command = shard["spec"]["containers"][0]["command"]
    merge_command = merge["spec"]["containers"][0]["command"]
    args = podspec.lm_eval_argv(spec, settings)
    root = podspec.shard_root("eval")
    assert shard_command[-len(args) - 1 :] == ["--", *args] or shard_command[-len(args) :] == args
    assert (
        protocol.shard_run_argv(1, 2, root, args) == shard_command[shard_command.index("--") + 1 :]
    )
    assert (
        protocol.shard_merge_argv(2, root, args) == merge_command[merge_command.index("--") + 1 :]
    )
    # Only the merge pod holds its results for an exec read (the job's results).
    assert not any(word.startswith("--hold-seconds") for word in shard_command)
    assert any(word.startswith("--hold-seconds") for word in merge_command)
    assert shard["metadata"]["labels"][podspec.LABEL_SHARD] == "1"
    assert podspec.LABEL_SHARD not in merge["metadata"]["labels"]
    for pod in (shard, merge):
        term = pod["spec"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ][0]
        assert term["labelSelector"]["matchLabels"] == {podspec.LABEL_JOB_UID: UID}
        assert term["topologyKey"] == "kubernetes.io/hostname"
    single = api.LMEvalJobSpec.model_validate({"model": "dummy", "tasks": ["toy"]})
    plain = podspec.build_pod(name="eval", namespace="ns", uid=UID, spec=single, settings=settings)
    assert "affinity" not in plain["spec"]
    assert "lm_eval" in plain["spec"]["containers"][0]["command"]


def test_running_shards_make_the_job_running_with_its_share_done() -> None:
    listed = Observed(
        job(running("Scheduled", "Scheduled", "Scheduled")),
        None,
        shards=(shard_pod(0), shard_pod(1, "waiting", phase="Pending"), shard_pod(2)),
    )
    status = status_of(decided(listed))
    assert status.state == api.JobState.RUNNING
    assert [s.state for s in status.shards or []] == ["Running", "Scheduled", "Running"]
    assert status.progress is not None and status.progress.line == "0/3 shards done"
    assert status.message == "2 of 3 shards running, 0 done"


def test_a_succeeded_shard_is_recorded_with_its_words_and_its_pod_goes() -> None:
    said = "shard 1/3: 40 requests, 12 answered from the cache (resumed)"
    done = shard_pod(1, "terminated", phase="Succeeded", exit_code=0, message=said)
    listed = Observed(
        job(running("Running", "Running", "Running")),
        None,
        shards=(shard_pod(0), done, shard_pod(2)),
    )
    actions = decided(listed)
    assert DeletePod(done.name) in actions
    status = status_of(actions)
    assert status.shards is not None
    assert status.shards[1].state == api.ShardState.SUCCEEDED
    assert status.shards[1].message == said
    assert status.shards_done == "1/3"
    assert status.progress is not None and status.progress.percent == pytest.approx(100 / 3)
    # Once recorded, the next cycle finds nothing to do: no pod is read again.
    after = Observed(
        job(status.model_dump(by_alias=True, exclude_none=True)),
        None,
        shards=(shard_pod(0), None, shard_pod(2)),
    )
    assert decided(after) == []


def test_a_failed_shard_is_retried_and_then_fails_the_job_naming_it() -> None:
    failed = shard_pod(2, "terminated", phase="Failed", exit_code=1, message="boom: no server")
    listed = Observed(
        job(running("Running", "Running", "Running")),
        None,
        shards=(shard_pod(0), shard_pod(1), failed),
    )
    actions = decided(listed)
    assert DeletePod(failed.name) in actions
    status = status_of(actions)
    assert status.shards is not None
    record = status.shards[2]
    assert (record.state, record.failures) == (api.ShardState.FAILED, 1)
    assert "exited with code 1: boom: no server" in (record.message or "")
    # Next cycle, its pod gone: attempt 2 is made (not a vanished pod).
    again = Observed(
        job(status.model_dump(by_alias=True, exclude_none=True)),
        None,
        shards=(shard_pod(0), shard_pod(1), None),
    )
    creates = [a for a in decided(again) if isinstance(a, CreatePod)]
    assert [(c.shard, c.attempt) for c in creates] == [(2, 2)]
    # The last allowed failure ends the job, naming the shard and its words.
    last = shards.MAX_SHARD_FAILURES - 1
    worn = running("Running", "Running", "Running", failures=0)
    worn["shards"][2].update(failures=last, attempt=last + 1, podUID="pod-2-4")
    final = shard_pod(
        2,
        "terminated",
        phase="Failed",
        attempt=last + 1,
        uid="pod-2-4",
        exit_code=3,
        message="ValueError: bad task",
    )
    ended = decided(Observed(job(worn), None, shards=(shard_pod(0), shard_pod(1), final)))
    status = status_of(ended)
    assert status.state == api.JobState.COMPLETE
    assert status.reason == api.JobReason.FAILED
    assert f"shard 2 of 3 failed {shards.MAX_SHARD_FAILURES} times" in (status.message or "")
    assert "ValueError: bad task" in (status.message or "")
    # The other shards stop with it.
    deleted = {a.name for a in ended if isinstance(a, DeletePod)}
    assert deleted == {shard_pod(k).name for k in range(3)}


def test_a_vanished_shard_pod_counts_as_a_failure_and_is_made_again() -> None:
    listed = Observed(
        job(running("Running", "Running", "Running")),
        None,
        shards=(shard_pod(0), None, shard_pod(2)),
    )
    status = status_of(decided(listed))
    assert status.shards is not None
    assert status.shards[1].state == api.ShardState.FAILED
    assert "vanished" in (status.shards[1].message or "")


def test_a_pod_the_poller_did_not_make_fails_the_job_and_is_never_touched() -> None:
    squatter = shard_pod(1, owner="someone-else")
    listed = Observed(
        job(running("Running", "Running", "Running")),
        None,
        shards=(shard_pod(0), squatter, shard_pod(2)),
    )
    actions = decided(listed)
    status = status_of(actions)
    assert status.reason == api.JobReason.FAILED
    assert squatter.name in (status.message or "")
    deleted = {a.name for a in actions if isinstance(a, DeletePod)}
    assert squatter.name not in deleted
    assert deleted == {shard_pod(0).name, shard_pod(2).name}
    # A copied proof for an older attempt is not the shard's either.
    stale = shard_pod(1, attempt=1)
    worn = running("Running", "Running", "Running")
    worn["shards"][1].update(attempt=3, podUID="pod-1-3")
    status = status_of(decided(Observed(job(worn), None, shards=(None, stale, None))))
    assert status.reason == api.JobReason.FAILED


def test_every_shard_done_starts_the_merge_pod_under_the_jobs_pod_name() -> None:
    done = running("Succeeded", "Succeeded", "Succeeded")
    done["shardsDone"] = "3/3"
    listed = Observed(job(done), None, shards=(None, None, None))
    assert not shards.in_shard_stage(listed.job)
    assert route(listed, NOW) is Step.SCHEDULE
    actions = decided(listed)
    create = next(a for a in actions if isinstance(a, CreatePod))
    assert create.shard is None
    assert create.manifest["metadata"]["name"] == podspec.pod_name("eval", UID)
    command = create.manifest["spec"]["containers"][0]["command"]
    assert "merge" in command and protocol.SHARD_MODULE in command
    assert status_of(actions).pod_attempt == 1


def test_suspend_stops_the_shards_without_counting_a_failure_and_resume_continues() -> None:
    listed = Observed(
        job(running("Succeeded", "Running", "Running"), suspend=True),
        None,
        shards=(None, shard_pod(1), shard_pod(2)),
    )
    actions = decided(listed)
    assert {a.name for a in actions if isinstance(a, DeletePod)} == {
        shard_pod(1).name,
        shard_pod(2).name,
    }
    status = status_of(actions)
    assert status.state == api.JobState.SUSPENDED
    assert [(s.state, s.failures) for s in status.shards or []] == [
        ("Succeeded", 0),
        ("Pending", 0),
        ("Pending", 0),
    ]
    resumed = status.model_dump(by_alias=True, exclude_none=True)
    listed = Observed(job(resumed), None, shards=(None, None, None))
    assert route(listed, NOW) is Step.SHARDS
    actions = decided(listed)
    creates = [(c.shard, c.attempt) for c in actions if isinstance(c, CreatePod)]
    assert creates == [(1, 2), (2, 2)]  # the succeeded shard is not run again
    assert status_of(actions).state == api.JobState.SCHEDULED


def test_cancel_deletes_every_shard_pod() -> None:
    listed = Observed(
        job(running("Running", "Running", "Running"), cancel=True),
        None,
        shards=(shard_pod(0), shard_pod(1), shard_pod(2)),
    )
    actions = decided(listed)
    assert status_of(actions).reason == api.JobReason.CANCELLED
    assert len([a for a in actions if isinstance(a, DeletePod)]) == 3


def test_kueue_admits_the_shards_as_one_pod_set_of_n() -> None:
    listed = Observed(job(count=4), None, shards=(None,) * 4, kueue=kueueadmission.KueueView(None))
    manifest = next(a.manifest for a in decided(listed) if hasattr(a, "manifest"))
    assert manifest["kind"] == "Workload"
    (pod_set,) = manifest["spec"]["podSets"]
    assert pod_set["count"] == 4
    assert pod_set["template"]["metadata"]["labels"][podspec.LABEL_SHARD] == "0"


def test_max_running_jobs_counts_a_sharded_job_as_its_pods() -> None:
    wide = job(running("Running", "Running", "Running"))
    narrow = JobView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": "n",
                "uid": "n",
                "creationTimestamp": format_time(NOW),
            },
            "spec": {"model": "dummy", "tasks": ["toy"]},
        }
    )
    # 3 of 4 slots taken by the shards: one narrow job may start.
    assert plan_queue([wide, narrow], {}, 4) == {}
    held = plan_queue([wide, narrow], {}, 3)
    assert list(held) == ["n"]
    # A waiting wide job needs all its slots, and is not overtaken.
    waiting_wide = job(None, count=3)
    later = JobView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": "later",
                "uid": "later",
                "creationTimestamp": format_time(NOW),
            },
            "spec": {"model": "dummy", "tasks": ["toy"]},
        }
    )
    held = plan_queue([waiting_wide, later], {}, 2)
    # Wider than the limit, it runs alone, taking every slot: the next one waits.
    assert list(held) == ["later"]
    busy = JobView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": "busy",
                "uid": "busy",
                "creationTimestamp": format_time(NOW - dt.timedelta(hours=1)),
            },
            "spec": {"model": "dummy", "tasks": ["toy"], "parallelism": 2, "outputs": CLAIM},
            "status": {"state": "Running"},
        }
    )
    held = plan_queue([busy, waiting_wide, later], {}, 4)
    assert set(held) == {UID, "later"}


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"parallelism": 2}, "spec.parallelism above 1 needs spec.outputs.pvcName"),
        ({"parallelism": api.MAX_SHARDS + 1, "outputs": CLAIM}, "less than or equal to 32"),
        ({"parallelism": 0, "outputs": CLAIM}, "greater than or equal to 1"),
    ],
)
def test_the_spec_refuses_shards_it_cannot_keep(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        api.LMEvalJobSpec.model_validate({"model": "dummy", "tasks": ["toy"], **spec})


def test_a_single_pod_job_is_untouched_by_shards() -> None:
    plain = JobView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": "eval",
                "uid": UID,
                "creationTimestamp": format_time(NOW),
            },
            "spec": {"model": "dummy", "tasks": ["toy"], "parallelism": 1},
        }
    )
    assert plain.shard_count == 1
    assert not shards.in_shard_stage(plain)
    assert route(Observed(plain, None), NOW) is Step.SCHEDULE


def test_a_shard_pod_made_before_a_crash_is_adopted_and_an_outcome_is_counted_once() -> None:
    # The poller made attempt 2 of shard 0, then stopped before its status said so.
    worn = running("Failed", "Running", "Running", failures=1)
    listed = Observed(job(worn), None, shards=(shard_pod(0, attempt=2), shard_pod(1), shard_pod(2)))
    status = status_of(decided(listed))
    assert status.shards is not None
    record = status.shards[0]
    assert (record.state, record.attempt, record.failures) == ("Running", 2, 1)
    assert record.pod_uid == "pod-0-2"
    # A failed shard whose pod is still there (its deletion failed) is not counted twice.
    failed = shard_pod(1, "terminated", phase="Failed", exit_code=1, message="boom")
    worn = running("Running", "Failed", "Running", failures=1)
    actions = decided(Observed(job(worn), None, shards=(shard_pod(0), failed, shard_pod(2))))
    assert DeletePod(failed.name) in actions
    patches = [a for a in actions if isinstance(a, PatchStatus)]
    for patch in patches:
        assert (patch.status.shards or [])[1].failures == 1


def test_a_shard_the_driver_refused_fails_the_job_at_once_with_its_words() -> None:
    said = (
        "ShardingRefusedError: task toy has 2 documents (after spec.limit), fewer than the 3 "
        "shards of spec.parallelism: lower spec.parallelism to 2 or less"
    )
    refused = shard_pod(
        2, "terminated", phase="Failed", exit_code=protocol.EXIT_SHARD_REFUSED, message=said
    )
    listed = Observed(
        job(running("Running", "Running", "Running")),
        None,
        shards=(shard_pod(0), shard_pod(1), refused),
    )
    actions = decided(listed)
    status = status_of(actions)
    assert status.reason == api.JobReason.FAILED
    assert status.message == f"shard 2 of 3: pod {refused.name} exited with code 2: {said}"
    assert "spec.parallelism" in (status.message or "")
    finished = next(c for c in status.conditions or [] if c.type == "Finished")
    assert finished.reason == "ShardRefused"
    assert {a.name for a in actions if isinstance(a, DeletePod)} == {
        shard_pod(k).name for k in range(3)
    }
