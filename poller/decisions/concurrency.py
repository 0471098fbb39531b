"""Admission under ``max-running-jobs``: who may start now, and who waits where.

A pure function of the cycle's jobs and pods. Jobs start in order of
creation, but fairly across namespaces: the queue is built by taking the
oldest waiting job of each namespace in turn (namespaces ordered by their
oldest waiter), so one team's hundred submissions do not keep another
team's single job waiting behind all of them. Running jobs are those whose
pod is not finished yet; the remaining slots are given to the head of the
queue, and every other waiting job learns its place. A slot is a pod: a job
with spec.parallelism N takes N (at most the limit) from its first shard to
its merge pod's end.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Mapping

from poller import api
from poller.decisions.views import JobView, PodView, QueueSlot

__all__ = ["fair_order", "plan_queue"]


def _waiting(job: JobView, pod: PodView | None) -> bool:
    return (
        pod is None
        and not job.deleting
        and job.status.state in (None, api.JobState.NEW)
        and not job.cancel_requested
        and not job.suspend_requested
    )


def _occupies_slot(job: JobView, pod: PodView | None) -> bool:
    if pod is not None:
        return pod.main.state != "terminated" and job.status.state != api.JobState.COMPLETE
    # A sharded job between its first shard and its merge pod holds its slots.
    return job.shard_count > 1 and job.status.state in (
        api.JobState.SCHEDULED,
        api.JobState.RUNNING,
    )


def _slots(job: JobView, limit: int) -> int:
    """The slots a job takes: one per pod it runs at once (a sharded job's shards),
    never more than the limit, so that a job wider than it still runs, alone."""
    return min(job.shard_count, limit)


def fair_order(jobs: Iterable[JobView]) -> list[JobView]:
    """FIFO by creation time within a namespace, round-robin across namespaces."""
    by_namespace: dict[str, deque[JobView]] = defaultdict(deque)
    for job in sorted(jobs, key=lambda j: (j.creation_timestamp, j.namespace, j.name)):
        by_namespace[job.namespace].append(job)
    order: list[JobView] = []
    while by_namespace:
        heads = sorted(by_namespace, key=lambda ns: by_namespace[ns][0].creation_timestamp)
        for namespace in heads:
            queue = by_namespace[namespace]
            order.append(queue.popleft())
            if not queue:
                del by_namespace[namespace]
    return order


def plan_queue(
    jobs: Iterable[JobView], pods: Mapping[str, PodView], limit: int
) -> dict[str, QueueSlot]:
    """Slots for the jobs that must keep waiting, by UID (absent: may start).

    `pods` maps job UID to its pod; `limit` 0 means no cap.
    """
    if limit <= 0:
        return {}
    all_jobs = list(jobs)
    running = sum(_slots(job, limit) for job in all_jobs if _occupies_slot(job, pods.get(job.uid)))
    waiting = fair_order(job for job in all_jobs if _waiting(job, pods.get(job.uid)))
    free = max(0, limit - running)
    # In order: the head takes what it needs; the first that does not fit waits,
    # and everyone behind it (a wide job is not overtaken for ever by narrow ones).
    starting = 0
    for job in waiting:
        if _slots(job, limit) > free:
            break
        free -= _slots(job, limit)
        starting += 1
    held = waiting[starting:]
    return {job.uid: QueueSlot(position=index + 1, limit=limit) for index, job in enumerate(held)}
