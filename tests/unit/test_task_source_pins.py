"""status.taskSources is checked against the spec's pins (`outcome.task_source_problem`).

The commits come from the pod log (the driver's started and final markers),
so they are checked before they are recorded: a source that pins
``git.commit`` must report exactly that commit; every reported commit must be
a full hash; every reported name must be a Git source of the spec (by index,
as the poller names them); one source may not report two commits; and a run
that ended with results must have reported every Git source. A source that
follows a branch records what it reported. Through `decide`: a terminated
run whose commit is not the pin ends Failed (TaskSourceMismatch) naming
``spec.customTasks[i].git.commit``, the expected and the reported commit,
with no results stored and no status.taskSources (an earlier record is
removed); a running one (whose results exec mode would store while the
driver holds them) is stopped, its pod deleted, before anything is stored;
and a run that reports the pins succeeds with them recorded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from driver.protocol import encode_marker, encode_results
from poller import api
from poller.api.settings import Settings
from poller.decisions import decide, outcome
from poller.decisions.actions import ArchiveLog, DeletePod, ReleaseHold, StoreResults
from poller.decisions.observed import Observed
from poller.decisions.views import ExecView
from tests.unit.test_decide import (
    NOW,
    RESULTS,
    SETTINGS,
    condition,
    job,
    log_view,
    pod,
    running_status,
    status_of,
)

PIN = "a" * 40
OTHER = "b" * 40
HEAD = "c" * 40
URL = "https://git.example.com/tasks.git"
SPEC: dict[str, Any] = {
    "customTasks": [
        {"configMap": "local-tasks"},
        {"git": {"url": URL, "commit": PIN, "path": "tasks"}},
        {"git": {"url": URL, "branch": "main"}},
    ]
}


def problem(reported: list[tuple[str, str]], *, finished: bool = True) -> str | None:
    return outcome.task_source_problem(SPEC, reported, finished=finished)


def test_the_pinned_commit_and_any_full_commit_of_a_branch_pass() -> None:
    assert problem([("1", PIN), ("2", HEAD)]) is None
    # The same pair in the started and the final marker.
    assert problem([("1", PIN), ("2", HEAD), ("1", PIN), ("2", HEAD)]) is None
    sha256 = {"customTasks": [{"git": {"url": URL, "commit": "d" * 64}}]}
    assert outcome.task_source_problem(sha256, [("0", "d" * 64)], finished=True) is None


def test_another_commit_than_the_pin_names_the_field_and_both_commits() -> None:
    assert problem([("1", OTHER), ("2", HEAD)]) == (
        f"spec.customTasks[1].git.commit: expected {PIN}, the run reported {OTHER}: "
        "its results are not the pinned code's"
    )
    # No prefix or case games: the schema takes full lower-case hashes only.
    assert problem([("1", PIN[:12]), ("2", HEAD)]) is not None
    assert problem([("1", PIN.upper()), ("2", HEAD)]) is not None
    assert problem([("1", PIN + "0"), ("2", HEAD)]) is not None


@pytest.mark.parametrize(
    ("reported", "words"),
    [
        (
            [("1", "main")],
            f"spec.customTasks[1].git.commit: expected {PIN}, the run reported 'main'",
        ),
        ([("2", "HEAD~1")], "spec.customTasks[2].git.branch: expected a full commit hash"),
        ([("2", "z" * 500)], "'" + "z" * outcome.MAX_SHOWN_COMMIT + "...'"),
    ],
)
def test_a_reported_commit_that_is_no_hash_fails(
    reported: list[tuple[str, str]], words: str
) -> None:
    found = problem(reported, finished=False)
    assert found is not None and words in found and "not a commit hash" in found


@pytest.mark.parametrize("name", ["0", "3", "9", "01", "1 ", "x", "customTasks[1]", "-1", "\u0661"])
def test_a_name_that_is_no_git_source_of_the_spec_fails(name: str) -> None:
    found = problem([(name, PIN)], finished=False)
    assert found is not None
    assert found.startswith(f"spec.customTasks: the run reported a commit for task source {name!r}")


def test_two_commits_for_one_branch_source_fail() -> None:
    found = problem([("2", HEAD), ("1", PIN), ("2", OTHER)])
    assert found == (
        f"spec.customTasks[2].git.branch: the run reported two commits, {HEAD} and {OTHER}: "
        "its results are not tied to one commit"
    )


def test_a_source_not_reported_fails_only_a_run_with_results() -> None:
    assert problem([("2", HEAD)], finished=False) is None
    assert problem([("2", HEAD)]) == (
        f"spec.customTasks[1].git.commit: expected {PIN}, the run reported no commit for this "
        "source: its results are not tied to the spec's task code"
    )
    assert problem([("1", PIN)]) is not None and "spec.customTasks[2].git.branch" in (
        problem([("1", PIN)]) or ""
    )
    no_git = {"customTasks": [{"configMap": "local-tasks"}]}
    assert outcome.task_source_problem(no_git, [], finished=True) is None


def _log(sources: list[dict[str, str]], started: list[dict[str, str]] | None = None) -> list[str]:
    started_sources = sources if started is None else started
    return [
        encode_marker("started", run_id="r", task_sources=started_sources),
        *encode_results(json.dumps(RESULTS).encode(), "r"),
        encode_marker(
            "completed", run_id="r", exit_code=0, results_path="/x", task_sources=sources
        ),
    ]


PINNED = [{"name": "1", "commit": PIN}, {"name": "2", "commit": HEAD}]
FORGED = [{"name": "1", "commit": OTHER}, {"name": "2", "commit": HEAD}]


def test_a_run_that_reports_the_pins_succeeds_with_them_recorded() -> None:
    decision = decide.decide(
        Observed(
            job(running_status(), **SPEC),
            pod("terminated", exit_code=0),
            log=log_view(_log(PINNED)),
        ),
        SETTINGS,
        NOW,
    )
    assert any(isinstance(a, StoreResults) for a in decision.actions)
    status = status_of(decision)
    assert status.reason == api.JobReason.SUCCEEDED
    assert [(s.name, s.branch, s.commit) for s in status.task_sources or []] == [
        ("customTasks[1]", None, PIN),
        ("customTasks[2]", "main", HEAD),
    ]


@pytest.mark.parametrize(
    ("final", "started"), [(FORGED, FORGED), (PINNED, FORGED), (FORGED, PINNED)]
)
def test_a_finished_run_on_another_commit_fails_without_its_results(
    final: list[dict[str, str]], started: list[dict[str, str]]
) -> None:
    recorded = running_status(taskSources=[{"name": "customTasks[1]", "url": URL, "commit": PIN}])
    decision = decide.decide(
        Observed(
            job(recorded, **SPEC),
            pod("terminated", exit_code=0),
            log=log_view(_log(final, started)),
        ),
        SETTINGS,
        NOW,
    )
    assert not any(isinstance(a, StoreResults) for a in decision.actions)
    status = status_of(decision)
    assert status.reason == api.JobReason.FAILED
    assert status.message == (
        f"spec.customTasks[1].git.commit: expected {PIN}, the run reported {OTHER}: "
        "its results are not the pinned code's"
    )
    assert status.results is None and status.task_sources is None
    assert condition(status, "Finished").reason == outcome.TASK_SOURCE_MISMATCH
    assert condition(status, "Succeeded").status == "False"


def test_a_finished_run_that_reported_no_commit_keeps_no_results() -> None:
    bare = _log([])
    decision = decide.decide(
        Observed(job(running_status(), **SPEC), pod("terminated", exit_code=0), log=log_view(bare)),
        SETTINGS,
        NOW,
    )
    status = status_of(decision)
    assert not any(isinstance(a, StoreResults) for a in decision.actions)
    assert status.reason == api.JobReason.FAILED
    assert (status.message or "").startswith(
        f"spec.customTasks[1].git.commit: expected {PIN}, the run reported no commit"
    )


def test_a_running_pod_on_another_commit_is_stopped_before_held_results_are_stored() -> None:
    exec_settings = Settings.model_validate({"results-source": "exec"})
    running = job(running_status(), **SPEC)
    decision = decide.decide(
        Observed(
            running, pod(), log=log_view(_log(FORGED)), exec_view=ExecView(json.dumps(RESULTS))
        ),
        exec_settings,
        NOW,
    )
    kinds = [type(a) for a in decision.actions]
    assert StoreResults not in kinds and ReleaseHold not in kinds
    assert ArchiveLog in kinds and DeletePod in kinds
    status = status_of(decision)
    assert status.reason == api.JobReason.FAILED and status.results is None
    assert f"expected {PIN}, the run reported {OTHER}" in (status.message or "")
    # While it runs, a started marker alone with the pins is recorded.
    started_only = [encode_marker("started", run_id="r", task_sources=PINNED)]
    fine = status_of(
        decide.decide(Observed(running, pod(), log=log_view(started_only)), SETTINGS, NOW)
    )
    assert fine.state == api.JobState.RUNNING
    assert [s.commit for s in fine.task_sources or []] == [PIN, HEAD]
