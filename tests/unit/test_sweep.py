"""The sweep of finished jobs (`poller.cycle.sweep`): its pace and what it marks, without a cluster.

Checks: the first round reads whole objects in one step, whatever the
budget, and builds a record per job (a gated job without a final outcome
marked to be decided); later steps read metadata only, at most
finished-sweep-jobs a step, going on from the last continue token, so a
round over 1,200 jobs at 500 a step takes three steps; a job deleted during
a round is removed at its end, one whose resourceVersion changed is marked
for the cycle to read, one the store lacks is noted for reading; and a
namespaced poller sweeps each of its namespaces in turn.

The API layer is a stand-in serving pages (the real LIST, field selector,
metadata-only pages and 410 continuation run against a real apiserver in
tests/cluster/test_finished_jobs.py and tests/unit/test_transport.py).
"""

from __future__ import annotations

from typing import Any

from poller.api.settings import Settings
from poller.cycle.retained import RetainedJobs
from poller.cycle.sweep import FINISHED_JOBS, FinishedSweep
from poller.kube.client import JobsPage

STATUS = {
    "state": "Complete",
    "reason": "Succeeded",
    "message": "done",
    "completeTime": "2026-12-01T00:00:00Z",
}


def job(namespace: str, name: str, version: str = "1", **spec: Any) -> dict[str, Any]:
    meta = {"namespace": namespace, "name": name, "uid": f"uid-{name}", "resourceVersion": version}
    return {
        "metadata": {**meta, "generation": 1},
        "spec": {"model": "dummy", "tasks": ["toy_mc"], **spec},
        "status": STATUS,
    }


class Pages:
    """Finished jobs served as LIST pages, the way `Kube.list_jobs_page` returns them."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = jobs
        self.asked: list[tuple[str | None, int, bool]] = []

    def list_jobs_page(
        self,
        namespace: str | None,
        *,
        field_selector: str,
        token: str | None,
        limit: int = 500,
        metadata_only: bool = False,
    ) -> JobsPage:
        assert field_selector == FINISHED_JOBS
        self.asked.append((namespace, limit, metadata_only))
        scoped = [j for j in self.jobs if namespace in (None, j["metadata"]["namespace"])]
        start = int(token or 0)
        items = scoped[start : start + limit]
        if metadata_only:
            items = [{"metadata": dict(j["metadata"])} for j in items]
        following = str(start + limit) if start + limit < len(scoped) else None
        return JobsPage(items, following)


def settings(jobs_a_step: int = 500) -> Settings:
    return Settings.model_validate({"finished-sweep-jobs": jobs_a_step})


def test_the_first_round_reads_whole_objects_then_steps_are_paced() -> None:
    served = Pages([job("ns", f"job-{i:04d}") for i in range(1200)])
    store = RetainedJobs()
    sweep = FinishedSweep(served, store)  # type: ignore[arg-type]
    first = sweep.step(settings(), 0.0)
    assert (first.full, first.round_ended, first.added, first.pages) == (True, True, 1200, 3)
    assert len(store) == 1200 and store.get("uid-job-0007") is not None
    assert sweep.warm and not sweep.due(settings(), 30.0) and sweep.due(settings(), 60.0)
    served.asked.clear()
    steps = [sweep.step(settings(), 60.0 * k) for k in (1, 2, 3)]
    assert [(s.listed, s.round_ended, s.full) for s in steps] == [
        (500, False, False),
        (500, False, False),
        (200, True, False),
    ]
    assert all(metadata for _, _, metadata in served.asked)
    assert sum(s.removed for s in steps) == 0 and len(store) == 1200


def test_a_round_removes_the_deleted_marks_the_changed_and_notes_the_unknown() -> None:
    served = Pages([job("ns", name) for name in ("a", "b", "c")])
    store = RetainedJobs()
    sweep = FinishedSweep(served, store)  # type: ignore[arg-type]
    sweep.step(settings(), 0.0)
    assert store.due(0.0, None, 10) == []  # nothing to decide
    served.jobs = [job("ns", "a", version="2"), job("ns", "c"), job("ns", "d")]
    step = sweep.step(settings(), 60.0)
    assert (step.changed, step.unknown, step.removed, step.round_ended) == (1, 1, 1, True)
    assert "uid-b" not in store
    due = {key.name for key in store.due(0.0, None, 10)}
    assert due == {"a", "d"}  # the changed one, and the one it lacks


def test_a_gated_job_without_a_final_outcome_is_marked_for_the_cycle() -> None:
    gate = {"task": "toy_mc"}
    served = Pages([job("ns", "base"), job("ns", "cand", baseline="base", gate=gate)])
    store = RetainedJobs()
    FinishedSweep(served, store).step(settings(), 0.0)  # type: ignore[arg-type]
    assert [key.name for key in store.due(0.0, None, 10)] == ["cand"]


def test_each_namespace_is_swept_in_turn() -> None:
    served = Pages([job("one", "a"), job("two", "b"), job("three", "c")])
    store = RetainedJobs()
    sweep = FinishedSweep(served, store, ["one", "two"])  # type: ignore[arg-type]
    report = sweep.step(settings(), 0.0)
    assert report.round_ended and {r.name for r in store.series()} == {"a", "b"}
    assert [namespace for namespace, _, _ in served.asked] == ["one", "two"]
