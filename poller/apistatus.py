"""The LMEvalJob API: status, which the poller writes and users read.

Why a module of its own: the spec is what users write, held to patterns
because its strings reach lm_eval's argv and the container runtime. Status
runs the other way. Only the poller writes it (the status subresource), and it
is the poller's memory between cycles: the pod's UID and attempt number, when
the job started and was suspended, its conditions. Users read it: ``kubectl
get`` prints state, reason and progress, ``kubectl wait --for=condition=X``
reads the conditions, the CLI compares two runs by their provenance. Much of
it comes from the job's pod, which runs code the poller does not trust (its
progress line, results, provenance, per-item score counts), so what the
poller writes from it is bounded and well-typed (the PROVENANCE_* limits here,
the budgets in ``poller.results`` and ``poller.provenance``): every LIST of
jobs carries status, and a hostile pod must not be able to bloat it.
Re-exported by ``poller.api``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from poller.apibase import _Model
from poller.apigate import GateStatus

__all__ = [
    "PROVENANCE_ARGV_MAX",
    "PROVENANCE_ARG_MAX",
    "PROVENANCE_HASH_MAX",
    "PROVENANCE_MESSAGE_MAX",
    "PROVENANCE_TASK_HASHES_MAX",
    "PROVENANCE_TEXT_MAX",
    "Condition",
    "ConditionType",
    "ItemScoresStatus",
    "JobReason",
    "JobState",
    "LMEvalJobStatus",
    "Progress",
    "Provenance",
    "Seeds",
    "TaskSourceStatus",
]


class JobState(StrEnum):
    NEW = "New"
    SCHEDULED = "Scheduled"
    RUNNING = "Running"
    COMPLETE = "Complete"
    SUSPENDED = "Suspended"
    # Never written by the poller: a seed-style cancel request written by a user.
    CANCELLED = "Cancelled"


class JobReason(StrEnum):
    NO_REASON = "NoReason"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


class ConditionType(StrEnum):
    SCHEDULED = "Scheduled"
    RUNNING = "Running"
    FINISHED = "Finished"
    SUCCEEDED = "Succeeded"
    SUSPENDED = "Suspended"
    # spec.outputs.oci: whether the results reached the registry.
    RESULTS_PUSHED = "ResultsPushed"
    # spec.gate: whether the score dropped significantly against spec.baseline.
    REGRESSED = "Regressed"


class Condition(_Model):
    """A Kubernetes-style condition, as `kubectl wait --for=condition=X` reads it."""

    type: str = Field(
        description="Scheduled, Running, Finished, Succeeded, Suspended, ResultsPushed or "
        "Regressed."
    )
    status: Annotated[str, Field(pattern=r"^(True|False|Unknown)$")]
    reason: str = ""
    message: str = ""
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = None


class Progress(_Model):
    percent: float | None = Field(default=None, description="0 to 100.")
    phase: str | None = Field(default=None, description="What lm_eval is doing.")
    line: str | None = Field(default=None, description="The driver's last progress report.")
    update_time: str | None = Field(default=None, description="When the poller last read it.")


class TaskSourceStatus(_Model):
    """A Git task source as the evaluation used it."""

    name: str = Field(description="The spec entry, e.g. customTasks[0].")
    url: str | None = Field(default=None, description="spec's git.url.")
    branch: str | None = Field(default=None, description="spec's git.branch, if any.")
    commit: str = Field(
        description="The commit checked out, as the driver reported it: a full hash, equal to "
        "spec's git.commit when that is set (a run that reports another ends Failed)."
    )


# status.provenance's bounds (every LIST of jobs carries it).
PROVENANCE_TEXT_MAX = 512
PROVENANCE_HASH_MAX = 128
PROVENANCE_TASK_HASHES_MAX = 50
PROVENANCE_ARG_MAX = 1024
PROVENANCE_ARGV_MAX = 128
PROVENANCE_MESSAGE_MAX = 1024


class Seeds(_Model):
    """The seeds lm_eval ran with (its results' config), each absent when it was not set."""

    random: int | None = Field(default=None, description="Python's random seed.")
    numpy: int | None = Field(default=None, description="NumPy's seed.")
    torch: int | None = Field(default=None, description="torch's seed.")
    fewshot: int | None = Field(default=None, description="The few-shot sampler's seed.")


class Provenance(_Model):
    """What identifies a run, as the pod and the driver reported it.

    All of it comes from the job's pod (its log and results), except image
    and imageID, which the kubelet reports; every value is bounded and
    well-typed. The full record (every task's hash, dataset and version, the
    documents' digests) is the results ConfigMap's provenance.json.
    """

    driver_version: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None, description="The in-pod driver's version."
    )
    lm_eval_version: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None, description="lm_eval's version, as installed in the image."
    )
    image: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None, description="The main container's image, as the kubelet reports it."
    )
    image_id: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None,
        alias="imageID",
        description="The image the kubelet actually ran (its imageID, a digest on a real node).",
    )
    model: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None, description="lm_eval's model type (--model), as its results record it."
    )
    model_name: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None, description="The pretrained= (or model=) value of lm_eval's model_args."
    )
    server_models: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None,
        description="API models: the ids the model server's /v1/models listed (comma-separated).",
    )
    seeds: Seeds | None = Field(default=None, description="lm_eval's seeds.")
    task_hashes: (
        Annotated[
            dict[
                Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)],
                Annotated[str, Field(max_length=PROVENANCE_HASH_MAX)],
            ],
            Field(max_length=PROVENANCE_TASK_HASHES_MAX),
        ]
        | None
    ) = Field(
        default=None,
        description="lm_eval's task_hashes (written with logSamples): a hash of every task's "
        f"documents, prompts and targets. At most {PROVENANCE_TASK_HASHES_MAX} tasks, in name "
        "order; provenance.json has them all.",
    )
    task_hashes_omitted: int | None = Field(
        default=None, description="Tasks whose hash only provenance.json holds."
    )
    argv: (
        Annotated[
            list[Annotated[str, Field(max_length=PROVENANCE_ARG_MAX)]],
            Field(max_length=PROVENANCE_ARGV_MAX),
        ]
        | None
    ) = Field(
        default=None,
        description="lm_eval's command line as the driver ran it, secrets redacted (shortened "
        "when long: provenance.json has it whole).",
    )


class ItemScoresStatus(_Model):
    """Where the run's per-item scores are kept, and how many there are."""

    stored: Annotated[str, Field(pattern=r"^(ConfigMap|None)$")] = Field(
        description="ConfigMap: in the results ConfigMap (items.json.gz); None: not kept."
    )
    tasks: int | None = Field(default=None, description="Tasks with per-item scores.")
    items: int | None = Field(default=None, description="Documents, over all those tasks.")
    bytes: int | None = Field(
        default=None, description="Size of the per-item scores JSON (stored gzip'd)."
    )
    message: Annotated[str, Field(max_length=PROVENANCE_MESSAGE_MAX)] | None = Field(
        default=None, description="Why they are not kept, or a note on them."
    )


class LMEvalJobStatus(_Model):
    """What the poller observed; written only by the poller."""

    state: JobState | None = Field(default=None, description="Lifecycle state.")
    reason: JobReason | None = Field(default=None, description="Outcome once Complete.")
    message: str | None = Field(default=None, description="Human-readable detail.")
    pod_name: str | None = Field(default=None, description="The job pod.")
    pod_uid: str | None = Field(
        default=None,
        alias="podUID",
        description="UID of the job pod the poller created: a pod under the same name with "
        "another UID is never taken for the job's.",
    )
    pod_attempt: int | None = Field(
        default=None,
        description="How many pods the poller has created for this job (the current pod's "
        "proof of origin names this number).",
    )
    spec_digest: Annotated[str, Field(max_length=80)] | None = Field(
        default=None,
        description="Digest of what the job evaluates (its spec without cancel, suspend, "
        "ttlSecondsAfterFinished and activeDeadlineSeconds) when its first pod was made. Once "
        "started, a job's spec is frozen but for those four fields: a job whose spec no longer "
        "matches ends Failed (cause SpecChanged), since its results would be paired with a "
        "spec that did not produce them.",
    )
    pod_fingerprint: Annotated[str, Field(max_length=80)] | None = Field(
        default=None,
        description="Digest of the job pod's containers and their images as the apiserver "
        "admitted it (sha256 over each container's kind, name and image). A pod whose "
        "containers or images differ later was changed after admission: the job ends Failed "
        "and the pod is deleted, unread.",
    )
    last_schedule_time: str | None = Field(default=None, description="When the pod was created.")
    complete_time: str | None = Field(default=None, description="When the job finished.")
    start_time: str | None = Field(
        default=None, description="When the first pod was created (for activeDeadlineSeconds)."
    )
    suspend_time: str | None = Field(default=None, description="When the job was last suspended.")
    suspended_seconds: int | None = Field(
        default=None, description="Time spent suspended; not counted against the deadline."
    )
    progress: Progress | None = Field(default=None, description="Latest progress report.")
    results: str | None = Field(
        default=None, description="lm_eval results JSON (reduced when large; see resultsConfigMap)."
    )
    results_reduced: bool | None = Field(
        default=None, description="True when results omits parts of the full results JSON."
    )
    results_config_map: str | None = Field(
        default=None,
        description="ConfigMap (owned by the job) holding the complete results and the "
        "archived tail of the pod log.",
    )
    results_source: str | None = Field(
        default=None, description="Where the results were read: log or exec."
    )
    outputs: str | None = Field(
        default=None, description="Where the full outputs are kept (spec.outputs.pvcName)."
    )
    task_sources: list[TaskSourceStatus] | None = Field(
        default=None,
        description="The Git task sources the evaluation used, each with the commit checked "
        "out (as the driver read it in the pod), once checked against the spec's pins.",
    )
    results_artifact: str | None = Field(
        default=None,
        description="The OCI artifact the results were pushed to (spec.outputs.oci), as "
        "<registry>/<repository>@sha256:<digest>, as the driver in the pod reported it.",
    )
    results_artifact_error: str | None = Field(
        default=None,
        description="Why pushing the results to spec.outputs.oci failed (the job still "
        "succeeds with its results; condition ResultsPushed is False).",
    )
    provenance: Provenance | None = Field(
        default=None,
        description="What identifies the run: versions, image digest, model, seeds, task "
        "hashes, argv (in full in the results ConfigMap's provenance.json).",
    )
    item_scores: ItemScoresStatus | None = Field(
        default=None,
        description="The per-item scores (logSamples) kept for paired comparisons.",
    )
    gate: GateStatus | None = Field(
        default=None,
        description="The regression gate's outcome (spec.gate): the numbers behind "
        "condition Regressed.",
    )
    conditions: list[Condition] | None = Field(default=None, description="Current conditions.")
    observed_generation: int | None = Field(
        default=None, description="The spec generation this status reflects."
    )
