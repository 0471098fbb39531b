"""`Observed`: everything one job's decision reads, in one frozen object.

Why a module of its own: `decide`, `what_to_observe` and the branches they
share (`routing.route`, `scheduling.schedule`) all read it, and it names the
views of two decisions modules (Kueue's, the regression gate's) that the
views module itself cannot import without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass

from poller.decisions.kueueadmission import KueueView
from poller.decisions.regression import GateView
from poller.decisions.views import ExecView, JobView, LogView, PodView, QueueSlot

__all__ = ["Observed"]


@dataclass(frozen=True)
class Observed:
    """Everything one job's decision reads: what `decide` takes, complete."""

    job: JobView
    pod: PodView | None
    queue: QueueSlot | None = None
    # The last window of the pod's log read, when the needs named one.
    log: LogView | None = None
    # What the exec'd `cat` of the held results returned, when it ran.
    exec_view: ExecView | None = None
    # The first UID of the namespace's OpenShift range, for a pod made now.
    run_as_user: int | None = None
    # The job's side of Kueue when Kueue gates it, with the flavors and the
    # priority class the needs named.
    kueue: KueueView | None = None
    # The regression gate's view (spec.gate), with the per-item scores read.
    gate: GateView | None = None
    # spec.parallelism above 1: the pod under each shard's name, by index
    # (None: none there), as listed or read.
    shards: tuple[PodView | None, ...] = ()
