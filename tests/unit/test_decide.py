"""`decide` is pure: a table of (job, pod, log, clock) -> actions.

Checks every transition without a cluster: scheduling, adoption, Running,
the outcomes read from the log (results, lm_eval's error, cancelled, no
results, log unavailable, OOM, signals, a cut log that asks for more lines),
queueing, cancel, suspend/resume, deadlines, TTL, pending timeouts and
evictions, and that a status which already reflects the pod yields nothing
(so an idle cycle writes nothing).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import replace
from typing import Any

import pytest

from driver.decoder import decode_lines
from driver.protocol import encode_marker, encode_results
from poller import api
from poller.api.settings import Settings
from poller.decisions import decide, outcome
from poller.decisions.actions import (
    ArchiveLog,
    CreatePod,
    DeleteJob,
    DeletePod,
    ExecRequest,
    LogRequest,
    Needs,
    PatchStatus,
    PostEvent,
    ReleaseHold,
    StoreResults,
)
from poller.decisions.draft import set_condition
from poller.decisions.observed import Observed
from poller.decisions.ownership import PodTrust, judge_pod
from poller.decisions.scheduling import EXACT_QUEUE_POSITIONS, queue_message
from poller.decisions.views import (
    ContainerView,
    ExecView,
    JobView,
    LogView,
    PodView,
    QueueSlot,
)
from poller.timefmt import format_time

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)
SETTINGS = Settings()
RESULTS = {"results": {"toy": {"acc,none": 0.5, "acc_stderr,none": 0.1}}, "configs": {}}


def job(status: dict[str, Any] | None = None, **spec: Any) -> JobView:
    """The view a cycle builds from this listed object (a finished job's is compact).

    A status that names a pod records it as the poller does when it creates
    one (attempt 1, the UID `pod()` has), unless the test says otherwise.
    """
    if status and "podName" in status:
        status = {"podAttempt": 1, "podUID": "pod-uid", **status}
    api.LMEvalJobStatus.model_validate(status or {})  # only statuses the poller could write
    return JobView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": "eval",
                "uid": "uid-1",
                "generation": 3,
                "resourceVersion": "41",
                "creationTimestamp": format_time(NOW - dt.timedelta(minutes=5)),
            },
            "spec": {"model": "dummy", "tasks": ["toy"], **spec},
            "status": status or {},
        }
    )


def pod(
    state: str = "running",
    *,
    phase: str = "Running",
    created_ago: float = 30,
    deleting: bool = False,
    pod_reason: str = "",
    pod_message: str = "",
    unschedulable: str = "",
    **main: Any,
) -> PodView:
    return PodView(
        name="eval-abc123",
        namespace="ns",
        uid="pod-uid",
        phase=phase,
        deleting=deleting,
        main=ContainerView(state, **main),
        owner_uid="uid-1",
        proof_attempt=1,
        reason=pod_reason,
        message=pod_message,
        created=format_time(NOW - dt.timedelta(seconds=created_ago)),
        unschedulable_message=unschedulable,
    )


def running_status(**extra: Any) -> dict[str, Any]:
    base = {
        "state": "Running",
        "reason": "NoReason",
        "message": "evaluation running",
        "podName": "eval-abc123",
        "startTime": format_time(NOW - dt.timedelta(seconds=60)),
    }
    return {**base, **extra}


def log_view(lines: list[str], tail: int = outcome.FIRST_TAIL_LINES, **kw: Any) -> LogView:
    return LogView(decode_lines(lines), tail, lines_read=len(lines), **kw)


def completed_log(results: dict[str, Any] | None = RESULTS) -> list[str]:
    lines = [encode_marker("started", run_id="r")]
    if results is not None:
        lines += encode_results(json.dumps(results).encode(), "r")
    lines.append(encode_marker("completed", run_id="r", exit_code=0, results_path="/x"))
    return lines


def status_of(decision: decide.Decision) -> api.LMEvalJobStatus:
    patches = [a for a in decision.actions if isinstance(a, PatchStatus)]
    assert len(patches) == 1, decision.actions
    return patches[0].status


def condition(status: api.LMEvalJobStatus, kind: str) -> api.Condition:
    return next(c for c in status.conditions or [] if c.type == kind)


def test_new_job_gets_a_pod_and_scheduled_status() -> None:
    decision = decide.decide(Observed(job(), None), SETTINGS, NOW)
    create, patch = decision.actions[0], decision.actions[1]
    assert isinstance(create, CreatePod) and isinstance(patch, PatchStatus)
    assert create.manifest["metadata"]["name"] == patch.status.pod_name
    assert patch.status.state == api.JobState.SCHEDULED
    assert patch.resource_version == "41"
    scheduled = condition(patch.status, "Scheduled")
    assert scheduled.status == "True" and scheduled.observed_generation == 3
    assert any(isinstance(a, PostEvent) and a.reason == "Scheduled" for a in decision.actions)


def test_invalid_spec_fails_without_a_pod() -> None:
    decision = decide.decide(Observed(job(limit="x"), None), SETTINGS, NOW)
    assert not any(isinstance(a, CreatePod) for a in decision.actions)
    status = status_of(decision)
    assert status.reason == api.JobReason.FAILED and "spec.limit" in (status.message or "")


def test_running_container_sets_running_once() -> None:
    first = status_of(
        decide.decide(
            Observed(job({"state": "Scheduled", "podName": "eval-abc123"}), pod()), SETTINGS, NOW
        )
    )
    assert first.state == api.JobState.RUNNING
    again = job(first.model_dump(by_alias=True, exclude_none=True, mode="json"))
    later = NOW + dt.timedelta(minutes=1)
    assert decide.decide(Observed(again, pod()), SETTINGS, later).actions == []


def test_adopts_a_pod_made_before_a_crash() -> None:
    # The poller made attempt 1 and died before writing the status: recorded now.
    decision = decide.decide(Observed(job(), pod()), SETTINGS, NOW)
    assert not any(isinstance(a, CreatePod | DeletePod) for a in decision.actions)
    status = status_of(decision)
    assert status.pod_name == "eval-abc123" and status.state == api.JobState.SCHEDULED
    assert (status.pod_uid, status.pod_attempt) == ("pod-uid", 1)
    again = job(status.model_dump(by_alias=True, exclude_none=True, mode="json"))
    assert (
        status_of(decide.decide(Observed(again, pod()), SETTINGS, NOW)).state
        == api.JobState.RUNNING
    )


def test_a_new_pod_is_the_next_attempt_and_its_uid_is_left_to_the_actuator() -> None:
    resumed = job({"state": "Suspended", "podName": "eval-abc123", "podAttempt": 2})
    decision = decide.decide(Observed(resumed, None), SETTINGS, NOW)
    create = decision.actions[0]
    assert isinstance(create, CreatePod) and create.attempt == 3
    status = status_of(decision)
    assert status.pod_attempt == 3 and status.pod_uid is None


def test_a_pod_an_older_poller_made_is_adopted_as_attempt_zero() -> None:
    # Upgrade: the status has no attempt yet; the pod predates the key (attempt 0).
    legacy = job(running_status(podAttempt=None, podUID=None))
    status = status_of(
        decide.decide(Observed(legacy, replace(pod(), proof_attempt=0)), SETTINGS, NOW)
    )
    assert (status.pod_attempt, status.pod_uid) == (0, "pod-uid")
    assert status.state == api.JobState.RUNNING
    again = job(status.model_dump(by_alias=True, exclude_none=True, mode="json"))
    assert judge_pod(again, replace(pod(), proof_attempt=0)) == (PodTrust.CURRENT, "")


def test_a_pod_made_at_resume_before_a_crash_is_adopted_not_waited_for() -> None:
    suspended = {"state": "Suspended", "podName": "eval-abc123", "suspendTime": format_time(NOW)}
    fresh = replace(pod(), uid="pod-2", proof_attempt=2)
    status = status_of(decide.decide(Observed(job(suspended), fresh), SETTINGS, NOW))
    assert status.state == api.JobState.SCHEDULED
    assert (status.pod_uid, status.pod_attempt) == ("pod-2", 2)


@pytest.mark.parametrize(
    ("changes", "status_extra", "words"),
    [
        ({"proof_attempt": None}, {}, "no valid proof that the poller created it"),
        ({"owner_uid": "uid-other"}, {}, "ownerReference is not this job"),
        ({"uid": "pod-forged"}, {}, "the job's pod was deleted and replaced"),
        ({"proof_attempt": 1}, {"podAttempt": 2, "podUID": "pod-2"}, "attempt 1"),
    ],
)
def test_a_pod_the_poller_did_not_make_fails_the_job_and_is_left_alone(
    changes: dict[str, Any], status_extra: dict[str, Any], words: str
) -> None:
    foreign = replace(pod("terminated", exit_code=0), **changes)
    decision = decide.decide(Observed(job(running_status(**status_extra)), foreign), SETTINGS, NOW)
    assert all(isinstance(a, PatchStatus | PostEvent) for a in decision.actions)
    status = status_of(decision)
    assert status.reason == api.JobReason.FAILED
    assert "pod eval-abc123 in namespace ns was not created by the poller" in (status.message or "")
    assert words in (status.message or "")
    assert condition(status, "Finished").reason == "ForeignPod"


def test_terminated_container_asks_for_the_log_first() -> None:
    needs = decide.what_to_observe(
        Observed(job(running_status()), pod("terminated", exit_code=0)), SETTINGS, NOW
    )
    assert needs == Needs(log=LogRequest("eval-abc123", "lmeval", outcome.FIRST_TAIL_LINES))


def test_success_stores_results_before_the_status() -> None:
    decision = decide.decide(
        Observed(
            job(running_status()), pod("terminated", exit_code=0), log=log_view(completed_log())
        ),
        SETTINGS,
        NOW,
    )
    store, patch = decision.actions[0], decision.actions[1]
    assert isinstance(store, StoreResults) and isinstance(patch, PatchStatus)
    assert json.loads(store.manifest["data"]["results.json"]) == RESULTS
    assert json.loads(patch.status.results or "") == RESULTS
    assert patch.status.reason == api.JobReason.SUCCEEDED
    assert condition(patch.status, "Succeeded").status == "True"
    assert condition(patch.status, "Finished").status == "True"
    assert patch.status.complete_time == format_time(NOW)


@pytest.mark.parametrize(
    ("lines", "main", "reason", "words"),
    [
        (
            [encode_marker("failed", exit_code=1, message="ValueError: Tasks not found: x")],
            {"exit_code": 1},
            api.JobReason.FAILED,
            "ValueError: Tasks not found: x (exit code 1)",
        ),
        (
            [encode_marker("cancelled", message="cancelled by SIGTERM", signal=15)],
            {"exit_code": 71},
            api.JobReason.CANCELLED,
            "cancelled by SIGTERM",
        ),
        (
            completed_log(None),
            {"exit_code": 0},
            api.JobReason.FAILED,
            "lm_eval exited 0 but the pod log holds no results",
        ),
        ([], {"exit_code": 137, "reason": "OOMKilled"}, api.JobReason.FAILED, "OOMKilled"),
        (
            [],
            {"exit_code": 143, "reason": "Error"},
            api.JobReason.FAILED,
            "killed by signal 15 (SIGTERM)",
        ),
        (
            [],
            {"exit_code": 2, "message": "last words"},
            api.JobReason.FAILED,
            "exit code 2: last words",
        ),
    ],
)
def test_outcomes(
    lines: list[str], main: dict[str, Any], reason: api.JobReason, words: str
) -> None:
    status = status_of(
        decide.decide(
            Observed(job(running_status()), pod("terminated", **main), log=log_view(lines)),
            SETTINGS,
            NOW,
        )
    )
    assert status.state == api.JobState.COMPLETE and status.reason == reason
    assert words in (status.message or "")


def test_unreadable_log_is_named_in_the_message() -> None:
    status = status_of(
        decide.decide(
            Observed(
                job(running_status()),
                pod("terminated", exit_code=0),
                log=log_view([], unavailable="node gone"),
            ),
            SETTINGS,
            NOW,
        )
    )
    assert "log unavailable: node gone" in (status.message or "")


def test_cut_log_asks_for_a_longer_tail() -> None:
    noise = os.urandom(60_000).hex()  # incompressible: several chunks
    chunks = encode_results(json.dumps({"results": {"t": {"a,none": noise}}}).encode(), "r")
    assert len(chunks) > 1
    cut = [*chunks[1:], encode_marker("completed", run_id="r", exit_code=0)]
    finished = pod("terminated", exit_code=0)
    window = outcome.next_results_window(finished, log_view(cut, tail=len(cut)))
    assert window == 4 * len(cut)
    # The whole log was read (fewer lines than asked): no point in asking again.
    whole = decide.decide(
        Observed(job(running_status()), finished, log=log_view(cut, tail=400)), SETTINGS, NOW
    )
    assert "log starts after" in (status_of(whole).message or "")


def test_finished_job_is_left_alone_until_its_ttl() -> None:
    done = {
        "state": "Complete",
        "reason": "Succeeded",
        "completeTime": format_time(NOW - dt.timedelta(seconds=30)),
    }
    assert (
        decide.decide(Observed(job(done), pod("terminated", exit_code=0)), SETTINGS, NOW).actions
        == []
    )
    assert (
        decide.decide(Observed(job(done, ttlSecondsAfterFinished=60), None), SETTINGS, NOW).actions
        == []
    )
    assert decide.decide(
        Observed(job(done, ttlSecondsAfterFinished=10), None), SETTINGS, NOW
    ).actions == [DeleteJob()]
    by_default = Settings.model_validate({"default-ttl-seconds-after-finished": "5"})
    assert decide.decide(Observed(job(done), None), by_default, NOW).actions == [DeleteJob()]


def test_vanished_pod_fails_and_is_not_recreated() -> None:
    decision = decide.decide(Observed(job(running_status()), None), SETTINGS, NOW)
    assert not any(isinstance(a, CreatePod) for a in decision.actions)
    assert "deleted before the evaluation finished" in (status_of(decision).message or "")


def test_evicted_pod_fails_with_its_message() -> None:
    evicted = pod("running", phase="Failed", pod_reason="Evicted", pod_message="low on memory")
    status = status_of(decide.decide(Observed(job(running_status()), evicted), SETTINGS, NOW))
    assert status.message == "pod eval-abc123 was evicted: low on memory"


def test_cancel_archives_then_deletes_the_pod() -> None:
    decision = decide.decide(Observed(job(running_status(), cancel=True), pod()), SETTINGS, NOW)
    assert decision.actions[:2] == [
        ArchiveLog("eval-abc123", "lmeval", 64 * 1024),
        DeletePod("eval-abc123"),
    ]
    assert status_of(decision).reason == api.JobReason.CANCELLED


def test_seed_style_cancelled_state_is_a_cancel_request() -> None:
    decision = decide.decide(
        Observed(job({"state": "Cancelled", "podName": "eval-abc123"}), pod()), SETTINGS, NOW
    )
    assert DeletePod("eval-abc123") in decision.actions
    assert status_of(decision).state == api.JobState.COMPLETE


def test_suspend_then_resume_counts_the_pause() -> None:
    suspended = decide.decide(Observed(job(running_status(), suspend=True), pod()), SETTINGS, NOW)
    assert DeletePod("eval-abc123") in suspended.actions
    paused = status_of(suspended)
    assert paused.state == api.JobState.SUSPENDED and paused.suspend_time == format_time(NOW)
    as_dict = paused.model_dump(by_alias=True, exclude_none=True, mode="json")
    # The old pod is still terminating: wait, do not create a second one.
    assert decide.decide(Observed(job(as_dict), pod(deleting=True)), SETTINGS, NOW).actions == []
    later = NOW + dt.timedelta(seconds=90)
    resumed = decide.decide(Observed(job(as_dict), None), SETTINGS, later)
    assert isinstance(resumed.actions[0], CreatePod)
    status = status_of(resumed)
    assert status.suspended_seconds == 90 and status.suspend_time is None
    assert condition(status, "Suspended").status == "False"


def test_deadline_excludes_suspended_time() -> None:
    started = format_time(NOW - dt.timedelta(seconds=100))
    within = job(running_status(startTime=started, suspendedSeconds=50), activeDeadlineSeconds=60)
    assert not any(
        isinstance(a, DeletePod)
        for a in decide.decide(Observed(within, pod()), SETTINGS, NOW).actions
    )
    over = job(running_status(startTime=started, suspendedSeconds=10), activeDeadlineSeconds=60)
    decision = decide.decide(Observed(over, pod()), SETTINGS, NOW)
    assert DeletePod("eval-abc123") in decision.actions
    assert (status_of(decision).message or "").startswith("DeadlineExceeded")


@pytest.mark.parametrize(
    ("stuck", "cause", "words"),
    [
        (
            pod("waiting", phase="Pending", created_ago=700, reason="", reason_=None)
            if False
            else pod("waiting", phase="Pending", created_ago=700),
            "PodPendingTimeout",
            "pod phase Pending",
        ),
        (
            pod(
                "waiting",
                phase="Pending",
                created_ago=700,
                unschedulable="Unschedulable: 0/2 nodes",
            ),
            "Unschedulable",
            "Unschedulable: 0/2 nodes",
        ),
    ],
)
def test_pending_too_long(stuck: PodView, cause: str, words: str) -> None:
    status = status_of(
        decide.decide(
            Observed(job({"state": "Scheduled", "podName": stuck.name}), stuck), SETTINGS, NOW
        )
    )
    assert words in (status.message or "")
    assert condition(status, "Finished").reason == cause


def test_image_pull_backoff_within_timeout_waits() -> None:
    waiting = PodView(
        name="eval-abc123",
        namespace="ns",
        uid="pod-uid",
        phase="Pending",
        deleting=False,
        owner_uid="uid-1",
        proof_attempt=1,
        created=format_time(NOW),
        main=ContainerView("waiting", reason="ImagePullBackOff", message="img"),
    )
    scheduled = {"state": "Scheduled", "podName": "eval-abc123"}
    assert all(
        not isinstance(a, DeletePod)
        for a in decide.decide(Observed(job(scheduled), waiting), SETTINGS, NOW).actions
    )
    late = NOW + dt.timedelta(seconds=SETTINGS.pod_pending_timeout + 1)
    status = status_of(decide.decide(Observed(job(scheduled), waiting), SETTINGS, late))
    assert condition(status, "Finished").reason == "ImagePullBackOff"
    assert "ImagePullBackOff: img" in (status.message or "")


def test_queued_job_learns_its_place() -> None:
    status = status_of(
        decide.decide(Observed(job(), None, queue=QueueSlot(position=2, limit=1)), SETTINGS, NOW)
    )
    assert status.state == api.JobState.NEW
    scheduled = condition(status, "Scheduled")
    assert scheduled.status == "False" and scheduled.reason == "Queued"
    assert scheduled.message == "waiting for a free slot: position 2 (max-running-jobs: 1)"


def test_a_moving_queue_rewrites_only_the_jobs_near_its_head() -> None:
    # 200 waiting jobs, one slot: each time the head starts, only the jobs
    # whose exact place is shown get a new status (plus the one that starts).
    waiting = 200
    before = [queue_message(QueueSlot(p, 1)) for p in range(1, waiting + 1)]
    after = [queue_message(QueueSlot(p - 1, 1)) for p in range(2, waiting + 1)]
    changed = sum(1 for old, new in zip(before[1:], after, strict=True) if old != new)
    assert changed == EXACT_QUEUE_POSITIONS
    assert before[-1] == "waiting for a free slot: more than 10 jobs ahead (max-running-jobs: 1)"
    # And through decide: a job far back that moves up one place writes nothing.
    first = status_of(decide.decide(Observed(job(), None, queue=QueueSlot(51, 1)), SETTINGS, NOW))
    queued = job(first.model_dump(by_alias=True, exclude_none=True, mode="json"))
    moved = QueueSlot(50, 1)
    assert decide.decide(Observed(queued, None, queue=moved), SETTINGS, NOW).actions == []


def test_progress_read_is_requested_only_when_due() -> None:
    settled = status_of(decide.decide(Observed(job(running_status()), pod()), SETTINGS, NOW))
    running = job(settled.model_dump(by_alias=True, exclude_none=True, mode="json"))
    assert decide.decide(Observed(running, pod()), SETTINGS, NOW).actions == []
    assert decide.what_to_observe(Observed(running, pod()), SETTINGS, NOW) == Needs()
    asked = decide.what_to_observe(Observed(running, pod()), SETTINGS, NOW, progress_due=True).log
    assert asked == LogRequest("eval-abc123", "lmeval", decide.PROGRESS_TAIL_LINES, "progress")
    marker = encode_marker("progress", phase="loglikelihood", percent=40.0, n=4, total=10)
    status = status_of(
        decide.decide(Observed(running, pod(), log=log_view([marker])), SETTINGS, NOW)
    )
    assert status.progress is not None and status.progress.percent == 40.0
    assert status.progress.line == "40% loglikelihood (4/10)"


def test_condition_transition_time_moves_only_on_flip() -> None:
    first = set_condition([], api.ConditionType.RUNNING, True, "A", "", "t1", 1)
    same = set_condition(first, api.ConditionType.RUNNING, True, "B", "m", "t2", 2)
    assert same[0].last_transition_time == "t1" and same[0].observed_generation == 2
    flipped = set_condition(same, api.ConditionType.RUNNING, False, "C", "", "t3", 2)
    assert flipped[0].last_transition_time == "t3"


def test_exec_mode_reads_results_by_exec_then_releases_the_hold() -> None:
    exec_settings = Settings(**{"results-source": "exec"})
    held = log_view(completed_log())
    running = job(running_status())
    needs = decide.what_to_observe(Observed(running, pod()), exec_settings, NOW, progress_due=True)
    assert needs.held_results
    first = outcome.results_to_exec(running, pod(), exec_settings, held)
    assert first == ExecRequest("eval-abc123", "lmeval", "/x")
    done = decide.decide(
        Observed(running, pod(), log=held, exec_view=ExecView(json.dumps(RESULTS))),
        exec_settings,
        NOW,
    )
    assert isinstance(done.actions[0], StoreResults)
    status = status_of(done)
    assert status.results_source == "exec" and json.loads(status.results or "") == RESULTS
    assert done.actions[-1] == ReleaseHold("eval-abc123", "lmeval", ("lmeval-driver", "release"))
    fallback = status_of(
        decide.decide(
            Observed(running, pod(), log=held, exec_view=ExecView(None)), exec_settings, NOW
        )
    )
    assert fallback.results_source == "log" and json.loads(fallback.results or "") == RESULTS
    # Once the container exits, the stored results make it Succeeded without a log read.
    stored = job(status.model_dump(by_alias=True, exclude_none=True, mode="json"))
    final = status_of(
        decide.decide(Observed(stored, pod("terminated", exit_code=0)), exec_settings, NOW)
    )
    assert final.reason == api.JobReason.SUCCEEDED


def test_pod_that_ended_before_the_evaluation_ran_fails() -> None:
    ended = pod("waiting", phase="Failed", pod_reason="InitFailed", pod_message="cp: not found")
    status = status_of(decide.decide(Observed(job(running_status()), ended), SETTINGS, NOW))
    assert status.reason == api.JobReason.FAILED
    assert status.message == (
        "pod eval-abc123 ended (Failed) before the evaluation ran: InitFailed: cp: not found"
    )


def test_pod_deleted_by_someone_else_fails_even_if_the_driver_says_cancelled() -> None:
    gone = pod("terminated", deleting=True, exit_code=71)
    lines = [encode_marker("cancelled", message="cancelled by SIGTERM", signal=15)]
    status = status_of(
        decide.decide(Observed(job(running_status()), gone, log=log_view(lines)), SETTINGS, NOW)
    )
    assert status.reason == api.JobReason.FAILED
    assert "was deleted before the evaluation finished" in (status.message or "")
