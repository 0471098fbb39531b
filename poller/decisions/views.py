"""Frozen views of what a cycle observed: jobs, pods, a log window, exec'd results,
and `Observed`, all that one job's decision reads, together.

The API layer turns raw API objects into these small frozen views, and the
decision functions read only them (what they return is in
`poller.decisions.actions`). Nothing here imports `kubernetes` or does I/O, which is
what lets every transition be a table-driven unit test.

`JobObject` and `PodObject` name the parts of an API object that the views
read. LISTs are parsed into exactly that shape (`poller.kube.client`), so the bulk
no view needs (managedFields, all of a pod spec but its containers' names and
images, ...) never becomes Python objects:
a field a view starts reading must be added there too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from typing_extensions import TypedDict

from driver.decoder import DecodedLog
from poller import api
from poller.results import lmeval

__all__ = [
    "CONTROL_SPEC_KEYS",
    "FINISHED_SPEC_KEYS",
    "FINISHED_STATUS_OMITS",
    "PROOF_ANNOTATION",
    "ContainerView",
    "ExecView",
    "JobObject",
    "JobView",
    "LogView",
    "PodObject",
    "PodView",
    "ProofCheck",
    "QueueSlot",
    "controller_reference",
    "pending_cause",
    "pod_fingerprint",
    "spec_digest",
    "waiting_init",
]


# (typing_extensions' TypedDict: pydantic parses into it on Python < 3.12.)
# Leaves are Any: parsing into these shapes drops keys and turns down nothing
# an apiserver sends.


class ObjectMeta(TypedDict, total=False):
    """The metadata fields `JobView` and `PodView` read."""

    name: Any
    namespace: Any
    uid: Any
    generation: Any
    resourceVersion: Any
    creationTimestamp: Any
    deletionTimestamp: Any
    ownerReferences: Any
    annotations: Any
    labels: Any


class JobObject(TypedDict, total=False):
    """The parts of an LMEvalJob that `JobView.from_object` reads."""

    metadata: ObjectMeta
    spec: Any
    status: Any


class ContainerStatusObject(TypedDict, total=False):
    """The parts of a container status that `PodView.from_object` reads."""

    name: Any
    state: Any
    image: Any
    imageID: Any
    restartCount: Any


class ContainerSpecObject(TypedDict, total=False):
    """The parts of a pod's container that can change after the pod was admitted."""

    name: Any
    image: Any


class PodSpecObject(TypedDict, total=False):
    """The parts of a pod's spec that `pod_fingerprint` covers."""

    initContainers: list[ContainerSpecObject] | None
    containers: list[ContainerSpecObject] | None
    ephemeralContainers: list[ContainerSpecObject] | None


class PodStatusObject(TypedDict, total=False):
    phase: Any
    reason: Any
    message: Any
    conditions: Any
    containerStatuses: list[ContainerStatusObject] | None
    initContainerStatuses: list[ContainerStatusObject] | None


class PodObject(TypedDict, total=False):
    """The parts of a Pod that `PodView.from_object` reads."""

    metadata: ObjectMeta
    spec: PodSpecObject
    status: PodStatusObject


# Kueue's labels a job may carry (the rest of Kueue is `poller.decisions.kueueadmission`).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"

# Where the poller's proof of origin sits on a pod, and how it is checked:
# (annotation value, namespace, pod name, owner job UID, creationTimestamp)
# -> the attempt it proves, or None (`poller.cycle.podproof.PodProof.attempt_of`).
PROOF_ANNOTATION = f"{api.API_GROUP}/pod-proof"
ProofCheck = Callable[[str | None, str, str, str, str], int | None]

# Which containers run, and from which images: after admission, the only
# parts of a pod's spec the apiserver lets anyone change are container images
# and the ephemeral containers (`kubectl debug`); the rest is immutable. The
# poller records this digest of the pod *as admitted* (after any mutating
# webhook, e.g. an image mirror's) in `status.podFingerprint`, and a pod whose
# digest differs later is not the pod it made (`poller.decisions.ownership`).
_FINGERPRINT_KINDS = ("initContainers", "containers", "ephemeralContainers")


def pod_fingerprint(spec: Mapping[str, Any] | None) -> str:
    """The digest of every container's name and image, by kind, in order ("" for none)."""
    parts: list[list[str]] = []
    for kind in _FINGERPRINT_KINDS:
        for container in (spec or {}).get(kind) or []:
            item = container if isinstance(container, Mapping) else {}
            parts.append([kind, _text(item.get("name")), _text(item.get("image"))])
    if not parts:
        return ""  # no spec was read: nothing to compare
    text = json.dumps(parts, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# The spec keys a finished job's view keeps: what `JobView`'s switches and
# the metrics read. Nothing else in a finished job's spec is acted on again.
FINISHED_SPEC_KEYS = frozenset(
    {
        "model",
        "cancel",
        "suspend",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
        # The regression gate (`poller.decisions.regression`) is decided after the job finished.
        "baseline",
        "gate",
    }
)
# The spec keys that control a job rather than say what it evaluates: the
# only ones that may change once its first pod exists (the admission policy
# `lmevaljob-requester-rights` refuses other edits; `spec_digest` is the
# poller's own check).
CONTROL_SPEC_KEYS = frozenset(
    {"cancel", "suspend", "ttlSecondsAfterFinished", "activeDeadlineSeconds"}
)


def spec_digest(spec: Mapping[str, Any]) -> str:
    """The digest of what a job evaluates: its spec without `CONTROL_SPEC_KEYS`.

    Recorded in `status.specDigest` when the first pod is made; a started
    job whose spec no longer has it was edited after it started, and its
    results would be paired with a spec that did not produce them. (A schema
    default added to the CRD later would show in every stored spec: such a
    field must be left out here too.)
    """
    evaluated = {k: v for k, v in spec.items() if k not in CONTROL_SPEC_KEYS}
    text = json.dumps(evaluated, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# And the status fields it leaves out (the status is only ever merge-patched,
# so a field missing from a view is never erased by a write).
FINISHED_STATUS_OMITS = frozenset({"results", "conditions", "provenance", "shards"})


@dataclass(frozen=True, slots=True)
class JobView:
    """One LMEvalJob as listed.

    Every job's view is alive at once (the queue plan and the metrics need
    them all), and in a long-lived cluster most jobs are finished. Nothing
    acts on a finished (Complete) job again but its TTL, so its view is
    compact: `spec` keeps only `FINISHED_SPEC_KEYS`, and its status leaves
    out `FINISHED_STATUS_OMITS`: the results JSON (up to 256 KB a job) and
    the conditions (six objects a job), which only the transitions read.
    Every job's numeric scores are parsed once, here, into `scores`.
    """

    namespace: str
    name: str
    uid: str
    generation: int
    resource_version: str
    creation_timestamp: str
    deleting: bool
    spec: dict[str, Any]
    status: api.LMEvalJobStatus
    scores: tuple[lmeval.Score, ...] = ()
    # Why the listed object could not be read as a job (then spec and status
    # hold only what could be salvaged, enough to end the job or expire it).
    problem: str | None = None
    # Kueue's labels on the job (`poller.decisions.kueueadmission`): its LocalQueue and its
    # WorkloadPriorityClass; empty without them.
    queue_name: str = ""
    priority_class: str = ""
    # `spec_digest` of an unfinished job's spec ("" for a finished one, whose
    # view keeps a part of its spec only).
    digest: str = ""

    # Lifecycle switches, read from the raw spec: validating every spec on
    # every cycle would cost more than listing it.
    @property
    def cancel_requested(self) -> bool:
        return self.spec.get("cancel") is True or self.status.state == api.JobState.CANCELLED

    @property
    def suspend_requested(self) -> bool:
        return self.spec.get("suspend") is True

    @property
    def active_deadline_seconds(self) -> int | None:
        value = self.spec.get("activeDeadlineSeconds")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def shard_count(self) -> int:
        """spec.parallelism: how many shard pods the job runs (1: none, one pod)."""
        value = self.spec.get("parallelism")
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
        return 1

    @property
    def ttl_seconds_after_finished(self) -> int | None:
        value = self.spec.get("ttlSecondsAfterFinished")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> JobView:
        meta = obj.get("metadata", {})
        spec: dict[str, Any] = obj.get("spec") or {}
        status: dict[str, Any] = obj.get("status") or {}
        text = status.get("results")
        finished = status.get("state") == api.JobState.COMPLETE.value
        digest = "" if finished else spec_digest(spec)
        if finished:
            # A gated job keeps its conditions: its gate writes condition Regressed
            # after it finished, and a merge patch replaces the whole list.
            omits = FINISHED_STATUS_OMITS - {"conditions"} if spec.get("gate") else None
            spec = {key: value for key, value in spec.items() if key in FINISHED_SPEC_KEYS}
            status = {k: v for k, v in status.items() if k not in (omits or FINISHED_STATUS_OMITS)}
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 0) or 0),
            resource_version=meta.get("resourceVersion", ""),
            creation_timestamp=meta.get("creationTimestamp", ""),
            deleting=bool(meta.get("deletionTimestamp")),
            spec=spec,
            status=api.LMEvalJobStatus.model_validate(status),
            scores=lmeval.parse_scores(text) if isinstance(text, str) else (),
            queue_name=_label(meta, KUEUE_QUEUE_LABEL),
            priority_class=_label(meta, KUEUE_PRIORITY_LABEL),
            digest=digest,
        )

    @classmethod
    def unreadable(cls, obj: dict[str, Any], error: Exception) -> JobView:
        """A view of an object `from_object` refused: its identity, the lifecycle
        switches of its spec and every status field that still validates alone."""
        meta = obj.get("metadata") or {}
        spec, raw = obj.get("spec"), obj.get("status")
        spec = spec if isinstance(spec, dict) else {}
        raw = raw if isinstance(raw, dict) else {}
        salvaged: dict[str, Any] = {}
        for key in _SALVAGED_STATUS:
            try:
                api.LMEvalJobStatus.model_validate({key: raw[key]})
            except Exception:  # noqa: S112 (missing or invalid alike: leave it out)
                continue
            salvaged[key] = raw[key]
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            generation=0,
            resource_version=str(meta.get("resourceVersion") or ""),
            creation_timestamp=str(meta.get("creationTimestamp") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
            spec={k: v for k, v in spec.items() if k in FINISHED_SPEC_KEYS},
            status=api.LMEvalJobStatus.model_validate(salvaged),
            problem=f"{type(error).__name__}: {str(error)[:500]}",
        )


def controller_reference(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ownerReference of `meta` marked controller (the apiserver allows one), or {}."""
    owners = meta.get("ownerReferences") or []
    return next((o for o in owners if isinstance(o, Mapping) and o.get("controller")), {})


def _label(meta: dict[str, Any], key: str) -> str:
    labels = meta.get("labels")
    value = labels.get(key) if isinstance(labels, dict) else None
    return value if isinstance(value, str) else ""


# What `JobView.unreadable` keeps of a status: enough to end or expire the job.
_SALVAGED_STATUS = (
    "state",
    "reason",
    "message",
    "podName",
    "podUID",
    "podAttempt",
    "completeTime",
    "startTime",
)


@dataclass(frozen=True, slots=True)
class ContainerView:
    """The main container's state as the kubelet reports it."""

    state: str  # "waiting" | "running" | "terminated" | "unknown"
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    signal: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    # The image as the kubelet reports it, and the image it actually ran
    # (imageID: a digest on a real node; "" until the container started).
    image: str = ""
    image_id: str = ""

    @classmethod
    def from_status(cls, status: dict[str, Any] | None) -> ContainerView:
        state = (status or {}).get("state") or {}
        image = _text((status or {}).get("image"))
        image_id = _text((status or {}).get("imageID"))
        if "terminated" in state:
            t = state["terminated"] or {}
            return cls(
                "terminated",
                reason=t.get("reason") or "",
                message=t.get("message") or "",
                exit_code=t.get("exitCode"),
                signal=t.get("signal"),
                started_at=t.get("startedAt"),
                finished_at=t.get("finishedAt"),
                image=image,
                image_id=image_id,
            )
        if "running" in state:
            started = (state["running"] or {}).get("startedAt")
            return cls("running", started_at=started, image=image, image_id=image_id)
        if "waiting" in state:
            w = state["waiting"] or {}
            return cls(
                "waiting",
                reason=w.get("reason") or "",
                message=w.get("message") or "",
                image=image,
                image_id=image_id,
            )
        return cls("unknown", image=image, image_id=image_id)


_IMAGE_ID = re.compile(r"(sha256:)?[0-9a-f]{64}")


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class PodView:
    """The job's pod as listed."""

    name: str
    namespace: str
    uid: str
    phase: str
    deleting: bool
    main: ContainerView
    owner_uid: str
    reason: str = ""
    message: str = ""
    created: str = ""
    # The PodScheduled condition when it is not True (e.g. Unschedulable).
    unschedulable_message: str = ""
    # The first init container that has not completed (its name and state),
    # if any: the one the main container waits for, or the one that failed.
    init: tuple[str, ContainerView] | None = None
    # Which of the job's pods the poller's keyed proof says this is (see
    # `poller.cycle.podproof`); None when it carries no valid proof: not ours.
    proof_attempt: int | None = None
    # `pod_fingerprint` of its spec as listed, and what in the pod itself shows
    # it was changed after admission ("" when nothing does).
    fingerprint: str = ""
    altered: str = ""

    @classmethod
    def from_object(
        cls, obj: dict[str, Any], main_container: str, verify: ProofCheck | None = None
    ) -> PodView:
        """The view of a listed pod; `verify` checks its proof of origin (else: no proof)."""
        meta = obj.get("metadata", {})
        status = obj.get("status") or {}
        init = _blocking_init(status)
        main = next(
            (c for c in status.get("containerStatuses") or [] if c.get("name") == main_container),
            None,
        )
        owner = controller_reference(meta)
        spec = obj.get("spec") or {}
        main_view = ContainerView.from_status(main)
        if _IMAGE_ID.fullmatch(main_view.image):
            # containerd reports an image pulled by digest alone (a release's
            # manifests name them so) by its config's ID, without a
            # repository: the spec's reference says which image that is.
            asked = next(
                (
                    c.get("image")
                    for c in spec.get("containers") or []
                    if c.get("name") == main_container
                ),
                None,
            )
            if isinstance(asked, str) and asked:
                main_view = dataclasses.replace(main_view, image=asked)
        return cls(
            fingerprint=pod_fingerprint(spec),
            altered=_altered(spec, status),
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            uid=meta.get("uid", ""),
            phase=status.get("phase") or "Pending",
            deleting=bool(meta.get("deletionTimestamp")),
            main=main_view,
            owner_uid=owner.get("uid", ""),
            proof_attempt=verify(
                (meta.get("annotations") or {}).get(PROOF_ANNOTATION),
                meta.get("namespace", ""),
                meta.get("name", ""),
                owner.get("uid", ""),
                meta.get("creationTimestamp") or "",
            )
            if verify is not None
            else None,
            reason=status.get("reason") or "",
            message=status.get("message") or _failed_init(init),
            init=init,
            created=meta.get("creationTimestamp") or "",
            unschedulable_message=next(
                (
                    f"{c.get('reason') or 'Unschedulable'}: {c.get('message') or ''}".strip()
                    for c in status.get("conditions") or []
                    if c.get("type") == "PodScheduled" and c.get("status") == "False"
                ),
                "",
            ),
        )


def pending_cause(pod: PodView) -> str:
    """Why a pod has not started, in the scheduler's or the kubelet's words."""
    if pod.unschedulable_message:
        return pod.unschedulable_message
    waiting = waiting_init(pod)
    if waiting is not None:
        name, init = waiting
        detail = f": {init.message}" if init.message else ""
        return f"init container {name}: {init.reason}{detail}"
    if pod.main.state == "waiting" and pod.main.reason:
        detail = f": {pod.main.message}" if pod.main.message else ""
        return f"{pod.main.reason}{detail}"
    return f"pod phase {pod.phase}"


def waiting_init(pod: PodView) -> tuple[str, ContainerView] | None:
    """The init container the pod waits for, when it waits for a reason
    (ErrImagePull of the git-image, ...) rather than merely starting."""
    if pod.init is None:
        return None
    init = pod.init[1]
    if init.state != "waiting" or init.reason in ("", "PodInitializing"):
        return None
    return pod.init


def _altered(spec: Mapping[str, Any], status: Mapping[str, Any]) -> str:
    """What in the pod shows it runs something other than what was admitted, or "".

    The poller's pods never restart (restartPolicy Never) and never get
    ephemeral containers, so a restart means the kubelet replaced a container
    whose image was changed; and a container pinned by digest must run that
    digest (the kubelet's imageID, when it reports a repository digest).
    """
    ephemeral = [_text(c.get("name")) for c in spec.get("ephemeralContainers") or []]
    if ephemeral:
        return f"ephemeral container {ephemeral[0]} was added to it"
    images = {
        _text(c.get("name")): _text(c.get("image"))
        for kind in ("initContainers", "containers")
        for c in spec.get(kind) or []
    }
    for kind in ("initContainerStatuses", "containerStatuses"):
        for item in status.get(kind) or []:
            name = _text(item.get("name"))
            restarts = item.get("restartCount")
            if isinstance(restarts, int) and not isinstance(restarts, bool) and restarts > 0:
                return (
                    f"its container {name} was restarted {restarts} time(s), which the kubelet "
                    "does to a pod that never restarts only when the container's image changed"
                )
            pinned = images.get(name, "").partition("@")[2]
            ran = _text(item.get("imageID")).partition("@")[2]
            if pinned and ran and pinned != ran:
                return f"its container {name} runs {ran}, not the pinned image digest {pinned}"
    return ""


def _blocking_init(status: dict[str, Any]) -> tuple[str, ContainerView] | None:
    """The first init container that has not succeeded (waiting, running or failed)."""
    for item in status.get("initContainerStatuses") or []:
        view = ContainerView.from_status(item)
        if not (view.state == "terminated" and view.exit_code == 0):
            return str(item.get("name") or ""), view
    return None


def _failed_init(init: tuple[str, ContainerView] | None) -> str:
    """What the first failed init container said (its exit code and termination message)."""
    if init is None:
        return ""
    name, view = init
    if view.state != "terminated" or not view.exit_code:
        return ""
    text = " ".join((view.message or view.reason).split())
    return f"init container {name} exited {view.exit_code}: {text[:1024]}"


@dataclass(frozen=True)
class QueueSlot:
    """Where a waiting job stands when max-running-jobs caps the running ones."""

    position: int  # 1-based
    limit: int


@dataclass(frozen=True)
class LogView:
    """The decoded tail of the main container's log, and how much was read."""

    decoded: DecodedLog
    tail_lines: int
    # How many lines came back: fewer than tail_lines means the whole log.
    lines_read: int = 0
    # Why the log could not be read (the kubelet or node is gone, ...), if so.
    unavailable: str | None = None
    # The read's byte limit when the window of lines held more bytes than it:
    # only the window's first lines were decoded, and a wider window would
    # only be cut sooner.
    cut_at: int | None = None


@dataclass(frozen=True)
class ExecView:
    """What the exec'd `cat` returned: the text, or None (the poller logs why)."""

    text: str | None
