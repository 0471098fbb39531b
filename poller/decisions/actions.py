"""What a job's decision asks to read first (`Needs`), and the actions it returns.

`poller.decisions.decide.what_to_observe` names what one job's decision needs beyond
its listed object and pod (a log window, the results file the driver holds,
the namespace's UID range); `poller.cycle.observe` reads it before `decide` runs;
`decide` returns a `Decision`, whose actions `poller.cycle.act` carries out.
Actions are only actions: nothing in `Action` asks for more data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from poller import api

__all__ = [
    "Action",
    "ArchiveLog",
    "CreatePod",
    "CreateWorkload",
    "Decision",
    "DeleteJob",
    "DeletePod",
    "DeleteWorkload",
    "ExecRequest",
    "LogRequest",
    "Needs",
    "PatchStatus",
    "PatchWorkloadStatus",
    "PostEvent",
    "ReleaseHold",
    "StoreResults",
]


@dataclass(frozen=True)
class LogRequest:
    """A window of the main container's log (its last `tail_lines` lines)."""

    pod: str
    container: str
    tail_lines: int
    # "results" for a finished container, "progress" for a running one (the
    # latter is rate-limited by the cycle).
    purpose: str = "results"


@dataclass(frozen=True)
class ExecRequest:
    """exec `cat` of the results file in the container the driver holds."""

    pod: str
    container: str
    path: str


@dataclass(frozen=True)
class Needs:
    """What one job's decision needs besides its listed object and pod
    (`poller.decisions.decide.what_to_observe`), read before `decide` runs
    (`poller.cycle.observe`)."""

    namespace_uid: bool = False  # its OpenShift UID range: a pod is about to be made
    log: LogRequest | None = None  # the log window to read first
    held_results: bool = False  # exec mode: cat the results file the log shows held
    # Kueue (`poller.decisions.kueueadmission`): the ResourceFlavors assigned to an admitted
    # workload, for a pod made now; the WorkloadPriorityClass of a workload
    # submitted now.
    flavors: tuple[str, ...] = ()
    priority_class: str | None = None
    # The regression gate (`poller.decisions.regression`): this job's and its baseline's
    # per-item scores, from their results ConfigMaps.
    gate_items: bool = False

    @property
    def any(self) -> bool:
        """Whether anything must be read before deciding."""
        return (
            self.namespace_uid
            or self.log is not None
            or bool(self.flavors)
            or self.priority_class is not None
            or self.gate_items
        )


@dataclass(frozen=True)
class CreatePod:
    """Create the job pod; the actuator stamps the proof of origin for `attempt` on it."""

    manifest: dict[str, Any]
    attempt: int = 1
    # outputs.pvcManaged: the claim made (or found, if the job's own) before the pod.
    claim: dict[str, Any] | None = None
    # A shard's pod (spec.parallelism above 1): its index. Its UID is recorded
    # in status.shards when the next cycle sees it, not in status.podUID.
    shard: int | None = None


@dataclass(frozen=True)
class PatchStatus:
    """Replace the job's status; `resource_version` makes a stale write fail (409)."""

    status: api.LMEvalJobStatus
    resource_version: str


@dataclass(frozen=True)
class StoreResults:
    """Create or replace the job's results ConfigMap."""

    manifest: dict[str, Any]


@dataclass(frozen=True)
class ArchiveLog:
    """Keep the last `max_bytes` of the container log in the job's results ConfigMap."""

    pod: str
    container: str
    max_bytes: int


@dataclass(frozen=True)
class ReleaseHold:
    """exec the driver's `release` so a holding container exits."""

    pod: str
    container: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class DeletePod:
    name: str


@dataclass(frozen=True)
class CreateWorkload:
    """Create the job's Kueue Workload (`poller.decisions.kueueadmission.workload_manifest`)."""

    manifest: dict[str, Any]


@dataclass(frozen=True)
class PatchWorkloadStatus:
    """Merge-patch a Workload's status; `resource_version` makes a stale write fail.

    `best_effort`: a refused write is logged and the actions after it go on
    (a finishing job's status must not wait on Kueue; its retention marks the
    workload again next cycle).
    """

    name: str
    status: dict[str, Any]
    resource_version: str
    best_effort: bool = False


@dataclass(frozen=True)
class DeleteWorkload:
    name: str


@dataclass(frozen=True)
class DeleteJob:
    """Delete the job itself (TTL); its pod and ConfigMap go through ownerReferences."""


@dataclass(frozen=True)
class PostEvent:
    type: str  # "Normal" | "Warning"
    reason: str
    message: str


Action = (
    CreatePod
    | PatchStatus
    | StoreResults
    | PostEvent
    | ArchiveLog
    | DeletePod
    | DeleteJob
    | ReleaseHold
    | CreateWorkload
    | PatchWorkloadStatus
    | DeleteWorkload
)


@dataclass(frozen=True)
class Decision:
    """What to do for one job, in order."""

    actions: list[Action] = field(default_factory=list)
