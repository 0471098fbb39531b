"""Finished jobs between sweeps: what the poller keeps of each, instead of listing them.

A cycle lists only the jobs that can still change (status.state!=Complete,
`poller.cycle.observe`); a finished job leaves that listing in the cycle that
finishes it. What the poller still needs of it (its metrics series, when its
TTL expires, whether its regression gate waits for a baseline) is kept here
as a compact record, and `poller.cycle.sweep` re-lists finished jobs on a slower
cadence of its own to notice the ones deleted or changed since.

A long-lived cluster keeps 100,000 finished jobs and more, so a record is
small (under 700 bytes with eight scores, tests/unit/test_retained.py: its
series compact as `poller.cycle.jobseries` makes them, one object per record in
the expiry heap), and nothing a cycle asks of the store goes through every
record: expiries sit in a heap, followed jobs in a set, gated jobs in an
index by baseline, and the metrics' tuple of series is rebuilt only after a
change (a tuple of pointers, made in C). Only the end of a sweep round, a
change of the default TTL and an occasional compaction of the heap visit
every record.

Pure: no I/O, no clock (times are epoch seconds passed in). Thread-safe: the
cycle and the sweep call the store from their own threads.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from operator import attrgetter
from sys import intern
from typing import NamedTuple

from poller.cycle.jobseries import JobSeries, series_of
from poller.decisions.regression import baseline_name, recorded_verdict
from poller.decisions.views import JobView

__all__ = [
    "FinishedRecord",
    "JobKey",
    "RetainedJobs",
    "compact_version",
    "expires_at",
    "record_of",
]


@dataclass(slots=True)
class FinishedRecord:
    """What the poller keeps of one finished (Complete) job between sweeps.

    Its UID, namespace, name and completion time are its series' (one copy).
    """

    series: JobSeries
    # An int when the resourceVersion is one (etcd's are): 28 bytes, not 57.
    resource_version: int | str
    # spec.ttlSecondsAfterFinished.
    ttl: int | None
    # spec.baseline while the job's regression gate still waits on it (no verdict,
    # and no final outcome for this generation): the baseline finishing must wake
    # the job.
    baseline: str | None
    # Under Kueue (the job has a queue-name label).
    queued: bool
    # The sweep saw the object change since this record was made: the cycle
    # reads it again and decides it.
    follow: bool = False
    # The sweep round that last saw the job, and the one this record appeared in.
    seen: int = 0
    born: int = 0
    # When the store's heap orders it (`RetainedJobs`): an expiry of its own
    # instead of a (time, uid) pair per record, 64 bytes less each.
    expiry: float = field(default=math.inf, repr=False, compare=False)

    @property
    def uid(self) -> str:
        return self.series.uid

    @property
    def namespace(self) -> str:
        return self.series.namespace

    @property
    def name(self) -> str:
        return self.series.name

    @property
    def completed(self) -> float | None:
        """status.completeTime (epoch seconds)."""
        return self.series.completed

    def __lt__(self, other: FinishedRecord) -> bool:
        """The heap's order: the earliest expiry first."""
        return self.expiry < other.expiry


def _waiting_baseline(job: JobView) -> str | None:
    baseline = baseline_name(job)
    if baseline is None or recorded_verdict(job):  # a verdict is never decided again
        return None
    gate = job.status.gate
    if gate is None or not gate.final or gate.generation != job.generation:
        return intern(baseline)
    return None


def record_of(job: JobView, *, follow: bool = False) -> FinishedRecord:
    """The record of a finished job, from its view."""
    return FinishedRecord(
        series=series_of(job),
        resource_version=compact_version(job.resource_version),
        ttl=job.ttl_seconds_after_finished,
        baseline=_waiting_baseline(job),
        queued=bool(job.queue_name),
        follow=follow,
    )


def compact_version(resource_version: str) -> int | str:
    """A resourceVersion as kept in a record: an int when it is a plain decimal
    number (they are opaque to clients, so anything else is kept as it is)."""
    if resource_version.isascii() and resource_version.isdigit() and resource_version[0] != "0":
        return int(resource_version)
    return resource_version


def expires_at(record: FinishedRecord, default_ttl: int | None) -> float | None:
    """When the job's TTL runs out (its own, else the settings' default), or None."""
    ttl = record.ttl if record.ttl is not None else default_ttl
    completed = record.completed
    if ttl is None or completed is None:
        return None
    return completed + ttl


class JobKey(NamedTuple):
    """A job to read by name this cycle."""

    namespace: str
    name: str
    uid: str


def _key(record: FinishedRecord) -> JobKey:
    return JobKey(record.namespace, record.name, record.uid)


_series = attrgetter("series")


class RetainedJobs:
    """The finished jobs the poller knows of, by UID.

    The cycle `put`s each job it decided that is Complete (its authoritative
    view) and `drop`s one that is not, or that is gone; `due` says which
    records it should read again. The sweep counts rounds: `begin_round`,
    `saw` (metadata) or `add` (a full view) for each finished job listed,
    `end_round` to remove the records the round did not see.

    Every key `due` hands out stays due until the cycle puts or drops its
    UID (an expired job whose deletion failed is handed out again next
    cycle, an unknown one until it is read); the cycle must do one or the
    other for each. The store owns the records it is given: do not change
    one after handing it over, nor one that `get` returns.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, FinishedRecord] = {}
        self._round = 0
        # The records with an expiry under `_heap_default`, earliest first; an
        # entry that is no longer the record of its UID is stale and skipped.
        # Built by the first `due` (nothing asks for the order before).
        self._heap: list[FinishedRecord] = []
        self._heap_default: int | None = None
        self._heap_built = False
        self._expiring = 0  # the records with an expiry (live heap entries)
        self._follow: set[str] = set()
        # (namespace, baseline) -> UIDs of gated jobs waiting on that baseline.
        self._waiting: dict[tuple[str, str], set[str]] = {}
        # Jobs the sweep listed that the store lacks, to be read by the cycle.
        self._unknown: dict[str, JobKey] = {}
        self._version = 0
        self._series_version = -1
        self._series: tuple[JobSeries, ...] = ()

    # -- the cycle --------------------------------------------------------------

    def put(self, record: FinishedRecord) -> None:
        """The cycle's view of a finished job: replaces the record of its UID."""
        with self._lock:
            uid = record.uid
            old = self._records.get(uid)
            if old is not None:
                record.seen, record.born = old.seen, old.born
                self._unindex(old)
                if old.series == record.series:
                    record.series = old.series  # one copy, the one `series()` holds
                else:
                    self._version += 1
            else:
                record.born = self._round
                self._version += 1
            self._records[uid] = record
            self._unknown.pop(uid, None)
            self._index(record)

    def drop(self, uid: str) -> None:
        """Forget a job (gone, or no longer finished)."""
        with self._lock:
            self._unknown.pop(uid, None)
            record = self._records.pop(uid, None)
            if record is not None:
                self._unindex(record)
                self._version += 1
                self._compact()

    def get(self, uid: str) -> FinishedRecord | None:
        """The record of `uid`."""
        with self._lock:
            return self._records.get(uid)

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def __contains__(self, uid: object) -> bool:
        with self._lock:
            return uid in self._records

    def due(self, now: float, default_ttl: int | None, limit: int) -> list[JobKey]:
        """The jobs to read this cycle, at most `limit`: expired ones (earliest
        expiry first), then followed ones, then unknown ones the sweep noted."""
        with self._lock:
            if not self._heap_built or default_ttl != self._heap_default:
                self._rebuild_heap(default_ttl)
            keys: dict[str, JobKey] = {}
            self._expired(now, limit, keys)
            for uid in self._follow:
                if len(keys) >= limit:
                    break
                keys.setdefault(uid, _key(self._records[uid]))
            for uid, key in self._unknown.items():
                if len(keys) >= limit:
                    break
                keys.setdefault(uid, key)
            return list(keys.values())

    def waiting_on(self, names: Collection[tuple[str, str]]) -> list[JobKey]:
        """The gated jobs waiting on a baseline among `names` ((namespace, name))."""
        with self._lock:
            return [
                _key(self._records[uid]) for name in names for uid in self._waiting.get(name, ())
            ]

    def series(self) -> tuple[JobSeries, ...]:
        """Every record's series (in no particular order), rebuilt only after a change."""
        with self._lock:
            if self._series_version != self._version:
                self._series = tuple(map(_series, self._records.values()))
                self._series_version = self._version
            return self._series

    # -- the sweep --------------------------------------------------------------

    def note_unknown(self, namespace: str, name: str, uid: str) -> None:
        """A finished job listed (metadata only) that the store lacks: `due`
        hands it out until the cycle puts or drops it (or the sweep adds it)."""
        with self._lock:
            if uid not in self._records:
                self._unknown[uid] = JobKey(intern(namespace), name, uid)

    def begin_round(self) -> int:
        """Start a sweep round; returns its number."""
        with self._lock:
            self._round += 1
            return self._round

    def saw(self, round: int, uid: str, resource_version: str) -> bool:
        """The sweep listed this job (metadata): False when the store lacks it. A
        changed resourceVersion sets `follow`: the cycle reads it again."""
        with self._lock:
            record = self._records.get(uid)
            if record is None:
                return False
            record.seen = round
            if record.resource_version != compact_version(resource_version) and not record.follow:
                record.follow = True
                self._follow.add(uid)
            return True

    def add(self, record: FinishedRecord) -> bool:
        """The sweep's full view of a job: kept only when the store lacks its UID
        (the cycle's view is newer). Returns whether it was kept."""
        with self._lock:
            uid = record.uid
            if uid in self._records:
                return False
            record.born = record.seen = self._round
            self._records[uid] = record
            self._unknown.pop(uid, None)
            self._index(record)
            self._version += 1
            return True

    def end_round(self, round: int) -> list[FinishedRecord]:
        """Remove and return the records neither seen in `round` nor made during
        it: their jobs were deleted since the last round."""
        with self._lock:
            gone = [r for r in self._records.values() if r.seen < round and r.born < round]
            for record in gone:
                del self._records[record.uid]
                self._unindex(record)
            if gone:
                self._version += 1
                self._compact()
            return gone

    # -- indexes (under the lock) ------------------------------------------------

    def _index(self, record: FinishedRecord) -> None:
        if record.follow:
            self._follow.add(record.uid)
        if record.baseline is not None:
            self._waiting.setdefault((record.namespace, record.baseline), set()).add(record.uid)
        if self._heap_built:
            expiry = expires_at(record, self._heap_default)
            if expiry is not None:
                record.expiry = expiry
                self._expiring += 1
                heapq.heappush(self._heap, record)
                self._compact()

    def _unindex(self, record: FinishedRecord) -> None:
        # Its heap entry goes stale: skipped, or left out by the next rebuild.
        self._follow.discard(record.uid)
        if record.expiry != math.inf:
            self._expiring -= 1
        if record.baseline is not None:
            key = (record.namespace, record.baseline)
            uids = self._waiting.get(key)
            if uids is not None:
                uids.discard(record.uid)
                if not uids:
                    del self._waiting[key]

    def _compact(self) -> None:
        """Rebuild the heap when stale entries (which keep old records alive) outnumber
        the live ones: amortised, each rebuild follows as many changes as it costs."""
        if self._heap_built and len(self._heap) > 2 * self._expiring + 64:
            self._rebuild_heap(self._heap_default)

    def _rebuild_heap(self, default_ttl: int | None) -> None:
        heap = []
        for record in self._records.values():
            expiry = expires_at(record, default_ttl)
            record.expiry = math.inf if expiry is None else expiry
            if expiry is not None:
                heap.append(record)
        heapq.heapify(heap)
        self._heap, self._heap_default, self._heap_built = heap, default_ttl, True
        self._expiring = len(heap)

    def _expired(self, now: float, limit: int, keys: dict[str, JobKey]) -> None:
        """Add the expired records to `keys`, earliest first; their entries stay."""
        heap, records, taken = self._heap, self._records, []
        while heap and heap[0].expiry <= now and len(keys) < limit:
            record = heapq.heappop(heap)
            uid = record.uid
            if records.get(uid) is not record or uid in keys:
                continue  # stale, or a second entry of the same record
            keys[uid] = _key(record)
            taken.append(record)
        # Still due until put or dropped: back on the heap.
        for record in taken:
            heapq.heappush(heap, record)
