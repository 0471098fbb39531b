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
the budgets in ``poller.results.lmeval`` and ``poller.results.provenance``): every LIST of
jobs carries status, and a hostile pod must not be able to bloat it.
Re-exported by ``poller.api``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated

from pydantic import Field

from driver import protocol
from poller.api.base import _Model
from poller.api.gate import GateStatus

__all__ = [
    "PROVENANCE_ARGV_MAX",
    "PROVENANCE_ARG_MAX",
    "PROVENANCE_HASH_MAX",
    "PROVENANCE_MESSAGE_MAX",
    "PROVENANCE_TASK_HASHES_MAX",
    "PROVENANCE_TEXT_MAX",
    "REASON_DOCS",
    "SHARD_MESSAGE_MAX",
    "STATE_DOCS",
    "Condition",
    "ConditionType",
    "ItemScoresStatus",
    "JobReason",
    "JobState",
    "LMEvalJobStatus",
    "MlflowRunStatus",
    "Progress",
    "Provenance",
    "Seeds",
    "ShardState",
    "ShardStatus",
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


# What each state and reason means and what to do about it: the text of
# status.state's and status.reason's descriptions (so kubectl explain) and of
# the generated documentation, from this one place.
STATE_DOCS: Mapping[JobState, str] = MappingProxyType(
    {
        JobState.NEW: "Accepted, no pod yet: waiting for the next poll, or for a free slot "
        "under the poller setting max-running-jobs (condition Scheduled is False, reason "
        "Queued, and status.message gives the place in the queue).",
        JobState.SCHEDULED: "The job pod was created and has not started its evaluation yet "
        "(image pulls, init containers fetching tasks or storage). A pod still Pending after "
        "the setting pod-pending-timeout ends the job Failed with the scheduler's or kubelet's "
        "words.",
        JobState.RUNNING: "The evaluation container runs lm_eval; status.progress says how far "
        "it got. Cancel with spec.cancel: true, pause with spec.suspend: true.",
        JobState.COMPLETE: "Finished for good: status.reason says how (Succeeded, Failed, "
        "Cancelled) and status.message why. A finished job never runs again; `lmeval rerun "
        "NAME` submits its spec as a new job.",
        JobState.SUSPENDED: "No pod, waiting: spec.suspend is true (set it to false to start a "
        "fresh pod), or Kueue has not admitted the job or took the admission back (condition "
        "Suspended says which). Time suspended does not count against activeDeadlineSeconds.",
        JobState.CANCELLED: "Never written by the poller: a user may write it into status (as "
        "with TrustyAI LMES) to ask for cancellation, and the job then ends Complete with "
        "reason Cancelled. Prefer spec.cancel: true.",
    }
)
REASON_DOCS: Mapping[JobReason, str] = MappingProxyType(
    {
        JobReason.NO_REASON: "The job has not finished (New, Scheduled, Running or "
        "Suspended): nothing to read yet.",
        JobReason.SUCCEEDED: "lm_eval finished and its results were stored: status.results, "
        "the results ConfigMap (status.resultsConfigMap), and the outputs claim or registry "
        "when the job names one.",
        JobReason.FAILED: "The evaluation did not produce results the poller could keep: "
        "status.message says why in lm_eval's, the kubelet's or the scheduler's words, and "
        "condition Succeeded's reason names the cause (e.g. OOMKilled, DeadlineExceeded, "
        "ImagePullBackOff). Fix that and submit a new job.",
        JobReason.CANCELLED: "Stopped on request (spec.cancel: true, or status.state "
        "Cancelled written by a user): its pod was deleted and the job will not run again; "
        "submit a new job to evaluate after all.",
    }
)


def _explained(lead: str, docs: Mapping[JobState, str] | Mapping[JobReason, str]) -> str:
    return lead + " " + " ".join(f"{value.value}: {text}" for value, text in docs.items())


class ConditionType(StrEnum):
    SCHEDULED = "Scheduled"
    RUNNING = "Running"
    FINISHED = "Finished"
    SUCCEEDED = "Succeeded"
    SUSPENDED = "Suspended"
    # spec.outputs.oci: whether the results reached the registry.
    RESULTS_PUSHED = "ResultsPushed"
    # spec.outputs.mlflow: whether the run reached the MLflow tracking server.
    RESULTS_EXPORTED = "ResultsExported"
    # spec.gate: whether the score dropped significantly against spec.baseline.
    REGRESSED = "Regressed"


class Condition(_Model):
    """A Kubernetes-style condition, as `kubectl wait --for=condition=X` reads it."""

    type: str = Field(
        description="What the condition tells, one of each per job. Scheduled: the job pod "
        "was created. Running: the evaluation container runs. Finished: the job is Complete, "
        "whatever the outcome. Succeeded: it finished with results (False: it failed or was "
        "cancelled). Suspended: it has no pod because of spec.suspend or Kueue. "
        "ResultsPushed: the results reached spec.outputs.oci's registry. ResultsExported: "
        "the run reached spec.outputs.mlflow's tracking server. Regressed: "
        "spec.gate's verdict against spec.baseline (see status.gate)."
    )
    status: Annotated[str, Field(pattern=r"^(True|False|Unknown)$")] = Field(
        description="True, False or Unknown (Unknown: not decided yet, e.g. Regressed while "
        "the baseline runs). `kubectl wait --for=condition=Succeeded` waits for True, "
        "`--for=condition=Regressed=false` for False."
    )
    reason: str = Field(
        default="",
        description="Why the condition has its status, one CamelCase word (default empty). "
        "Scheduled: PodCreated, or Queued behind max-running-jobs. Running: ContainerRunning; "
        "False with Finished, Suspended, Resumed or Kueue's reason. Suspended: Suspended "
        "(spec.suspend), KueueQueued, KueueInadmissible or Kueue<eviction reason> while Kueue "
        "holds the job; False with Resumed, Admitted or Finished. Finished and Succeeded: "
        "Succeeded, Cancelled, Failed, or the failure's cause: SpecChanged, DeadlineExceeded, "
        "AlteredPod, ForeignPod, ForeignObject, Evicted, PodFailed, PodDeleted, "
        "PodPendingTimeout, Unschedulable, ErrImagePull, ImagePullBackOff (or another of the "
        "kubelet's waiting reasons), TaskSourceMismatch, UnreadableJob, PollerError, or the "
        "container's termination reason (OOMKilled...). ResultsPushed: Pushed or PushFailed. "
        "ResultsExported: Exported or ExportFailed. "
        "Regressed: Regressed, NotRegressed, WaitingForBaseline, BaselineMissing, "
        "BaselineFailed, NoItemScores, NotComparable, JobNotSucceeded or InvalidGate.",
    )
    message: str = Field(
        default="",
        description="Details in the cluster's, lm_eval's or the gate's words, e.g. the "
        "failure's message or the gate's numbers (default empty).",
    )
    last_transition_time: str = Field(
        description="When status last changed (RFC 3339); a new reason or message under the "
        "same status leaves it."
    )
    observed_generation: int | None = Field(
        default=None, description="The spec generation (metadata.generation) it was set for."
    )


class Progress(_Model):
    """The driver's latest progress report, as the poller last read it from the pod log."""

    percent: float | None = Field(
        default=None,
        description="How much of lm_eval's current progress bar is done, 0 to 100 (absent "
        "when the bar has no total).",
    )
    phase: str | None = Field(
        default=None,
        description="What lm_eval is doing, in its own words, e.g. Running loglikelihood "
        "requests (at most 200 characters).",
    )
    line: str | None = Field(
        default=None,
        description="One-line summary (percent, phase and counts), the Progress column of "
        "kubectl get.",
    )
    update_time: str | None = Field(
        default=None, description="When the poller last changed it (RFC 3339)."
    )


class ShardState(StrEnum):
    PENDING = "Pending"
    SCHEDULED = "Scheduled"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


# status.shards[].message's bound: it quotes the shard container's termination
# message, which the pod writes.
SHARD_MESSAGE_MAX = 512


class ShardStatus(_Model):
    """One shard of a job with spec.parallelism above 1, as the poller last saw it."""

    index: Annotated[int, Field(ge=0, le=protocol.MAX_SHARDS - 1)] = Field(
        description="Which shard: 0 to spec.parallelism - 1 (at most "
        f"{protocol.MAX_SHARDS - 1}); it evaluates the "
        "documents whose index modulo spec.parallelism is this."
    )
    state: ShardState = Field(
        description="Pending (no pod: not made yet, or stopped by a suspend or Kueue and "
        "waiting to start again), Scheduled, Running, Succeeded (its outputs are on the "
        "claim; its pod was deleted), or Failed (its last attempt failed; retried while "
        "attempts remain)."
    )
    attempt: int = Field(
        default=0,
        description="How many pods the poller has created for this shard (the current pod's "
        "proof of origin names this number); default 0, none yet.",
    )
    failures: int = Field(
        default=0,
        description="How many of its attempts failed (a pod stopped by a suspend or by Kueue "
        "does not count); default 0. The job fails when it reaches 4.",
    )
    pod_uid: str | None = Field(
        default=None,
        alias="podUID",
        description="UID of the shard's current pod, once the poller saw it.",
    )
    message: Annotated[str, Field(max_length=SHARD_MESSAGE_MAX)] | None = Field(
        default=None,
        description="What its last pod said when it ended (its termination message: how many "
        "requests the response cache answered, or why it failed), at most "
        f"{SHARD_MESSAGE_MAX} characters.",
    )


class TaskSourceStatus(_Model):
    """A Git task source as the evaluation used it."""

    name: str = Field(description="The spec entry it stands for, e.g. customTasks[0].")
    url: str | None = Field(default=None, description="The entry's git.url, as in the spec.")
    branch: str | None = Field(
        default=None, description="The entry's git.branch, if the spec names one."
    )
    commit: str = Field(
        description="The commit checked out, as the driver reported it: a full hash, equal to "
        "spec's git.commit when that is set (a run that reports another ends Failed)."
    )


class MlflowRunStatus(_Model):
    """The MLflow run a job's evaluation was logged as (spec.outputs.mlflow)."""

    id: str = Field(description="The run's ID (32 hex digits), as the driver reported it.")
    url: str = Field(
        description="The run's page on the tracking server: spec.outputs.mlflow.trackingUri "
        "followed by #/experiments/<experiment>/runs/<run>."
    )
    experiment_id: str | None = Field(
        default=None, description="The ID of the experiment the run is in."
    )


# status.provenance's bounds (every LIST of jobs carries it, and the pod writes it).
PROVENANCE_TEXT_MAX = 512
PROVENANCE_HASH_MAX = 128
PROVENANCE_TASK_HASHES_MAX = 50
PROVENANCE_ARG_MAX = 1024
PROVENANCE_ARGV_MAX = 128
PROVENANCE_MESSAGE_MAX = 1024
_TEXT_BOUND = (
    f"; at most {PROVENANCE_TEXT_MAX} characters, since it comes from the pod and every list "
    "of jobs carries it"
)


class Seeds(_Model):
    """The seeds lm_eval ran with (its results' config), each absent when it was not set."""

    random: int | None = Field(default=None, description="Python's random module's seed.")
    numpy: int | None = Field(default=None, description="NumPy's random seed.")
    torch: int | None = Field(default=None, description="PyTorch's random seed.")
    fewshot: int | None = Field(
        default=None, description="The seed of lm_eval's few-shot example sampler."
    )


class Provenance(_Model):
    """What identifies a run, as the pod and the driver reported it.

    All of it comes from the job's pod (its log and results), except image
    and imageID, which the kubelet reports; every value is bounded and
    well-typed. The full record (every task's hash, dataset and version, the
    documents' digests) is the results ConfigMap's provenance.json.
    """

    driver_version: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None, description=f"The in-pod driver's version{_TEXT_BOUND}."
    )
    lm_eval_version: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None, description=f"lm_eval's version, as installed in the image{_TEXT_BOUND}."
    )
    image: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None,
        description=f"The main container's image, as the kubelet reports it{_TEXT_BOUND}.",
    )
    image_id: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None,
        alias="imageID",
        description="The image the kubelet actually ran (its imageID, a digest on a real "
        f"node){_TEXT_BOUND}.",
    )
    model: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None,
        description=f"lm_eval's model type (--model), as its results record it{_TEXT_BOUND}.",
    )
    model_name: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None,
        description="The pretrained= (or model=) value of lm_eval's model_args, URL "
        f"credentials hidden; nothing else of them is copied{_TEXT_BOUND}.",
    )
    server_models: Annotated[str, Field(max_length=PROVENANCE_TEXT_MAX)] | None = Field(
        default=None,
        description="API models: the ids the model server's /v1/models listed "
        f"(comma-separated){_TEXT_BOUND}.",
    )
    seeds: Seeds | None = Field(default=None, description="The seeds lm_eval ran with.")
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
        description="lm_eval's task_hashes (written with logSamples): task name to a hash of "
        f"its documents, prompts and targets. The first {PROVENANCE_TASK_HASHES_MAX} tasks by "
        f"name, names of at most {PROVENANCE_TEXT_MAX} and hashes of at most "
        f"{PROVENANCE_HASH_MAX} characters; provenance.json has them all.",
    )
    task_hashes_omitted: int | None = Field(
        default=None,
        description="How many tasks' hashes were left out of taskHashes (provenance.json "
        "holds them).",
    )
    argv: (
        Annotated[
            list[Annotated[str, Field(max_length=PROVENANCE_ARG_MAX)]],
            Field(max_length=PROVENANCE_ARGV_MAX),
        ]
        | None
    ) = Field(
        default=None,
        description="lm_eval's command line as the driver ran it, secrets redacted: at most "
        f"{PROVENANCE_ARGV_MAX} arguments of at most {PROVENANCE_ARG_MAX} characters "
        "(provenance.json has it whole).",
    )


class ItemScoresStatus(_Model):
    """Where the run's per-item scores are kept, and how many there are."""

    stored: Annotated[str, Field(pattern=r"^(ConfigMap|None)$")] = Field(
        description="ConfigMap: kept in the results ConfigMap (items.json.gz), where lmeval "
        "compare and the regression gate read them; None: not kept (message says why)."
    )
    tasks: int | None = Field(default=None, description="How many tasks have per-item scores.")
    items: int | None = Field(
        default=None, description="How many documents have scores, over all those tasks."
    )
    bytes: int | None = Field(
        default=None,
        description="Size in bytes of the per-item scores' JSON, before it is stored gzip'd.",
    )
    message: Annotated[str, Field(max_length=PROVENANCE_MESSAGE_MAX)] | None = Field(
        default=None,
        description="Why they are not kept (e.g. lm_eval wrote no samples: run with "
        f"logSamples), or a note on them; at most {PROVENANCE_MESSAGE_MAX} characters.",
    )


class LMEvalJobStatus(_Model):
    """Written only by the poller: the job's state, outcome, results, provenance and conditions."""

    state: JobState | None = Field(
        default=None,
        description=_explained(
            "Where the job is in its lifecycle (New, Scheduled, Running, Complete; Suspended "
            "on the way), the State column of kubectl get; select on it with "
            "--field-selector status.state=Running.",
            STATE_DOCS,
        ),
    )
    reason: JobReason | None = Field(
        default=None,
        description=_explained(
            "How the job ended, once state is Complete; the Reason column of kubectl get.",
            REASON_DOCS,
        ),
    )
    message: str | None = Field(
        default=None,
        description="What happened last, in the cluster's or lm_eval's own words (e.g. "
        "ValueError: Tasks not found: x (exit code 1), OOMKilled: ..., pod ... was evicted: "
        "...); kubectl get -o wide shows it.",
    )
    pod_name: str | None = Field(
        default=None,
        description="Name of the job pod (the job's name plus a short hash of its UID).",
    )
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
        description="Digest (sha256:<hex>, at most 80 characters) of what the job evaluates "
        "(its spec without cancel, suspend, "
        "ttlSecondsAfterFinished and activeDeadlineSeconds) when its first pod was made. Once "
        "started, a job's spec is frozen but for those four fields: a job whose spec no longer "
        "matches ends Failed (cause SpecChanged), since its results would be paired with a "
        "spec that did not produce them.",
    )
    pod_fingerprint: Annotated[str, Field(max_length=80)] | None = Field(
        default=None,
        description="Digest (sha256:<hex>, at most 80 characters) of the job pod's containers "
        "and their images as the apiserver "
        "admitted it (sha256 over each container's kind, name and image). A pod whose "
        "containers or images differ later was changed after admission: the job ends Failed "
        "and the pod is deleted, unread.",
    )
    last_schedule_time: str | None = Field(
        default=None, description="When the current pod was created (RFC 3339)."
    )
    complete_time: str | None = Field(
        default=None,
        description="When the job finished (RFC 3339); ttlSecondsAfterFinished counts from it.",
    )
    start_time: str | None = Field(
        default=None,
        description="When the first pod was created (RFC 3339); activeDeadlineSeconds counts "
        "from it.",
    )
    suspend_time: str | None = Field(
        default=None, description="When the job was last suspended (RFC 3339), while it is."
    )
    suspended_seconds: int | None = Field(
        default=None,
        description="Seconds spent suspended so far; not counted against activeDeadlineSeconds.",
    )
    progress: Progress | None = Field(
        default=None, description="The driver's latest progress report, while lm_eval runs."
    )
    shards: list[ShardStatus] | None = Field(
        default=None,
        description="Each shard's state, with spec.parallelism above 1 (one record per shard, "
        "in index order).",
    )
    shards_done: str | None = Field(
        default=None,
        description="How many shards succeeded, as done/total (e.g. 3/8), with "
        "spec.parallelism above 1; the Shards column of kubectl get.",
    )
    results: str | None = Field(
        default=None,
        description="lm_eval's results JSON, secrets in its echo of the configuration "
        "redacted; reduced to 256 KiB when larger (echoed task configurations go first, "
        "scores never). The whole of it is in resultsConfigMap.",
    )
    results_reduced: bool | None = Field(
        default=None,
        description="True when results leaves out parts of the full results JSON (read "
        "resultsConfigMap's results.json).",
    )
    results_config_map: str | None = Field(
        default=None,
        description="ConfigMap <job>-results, owned by the job (deleted with it): the "
        "complete results (results.json, or gzip'd as results.json.gz), the archived tail "
        "of the pod log (log-tail.txt), provenance.json and the per-item scores "
        "(items.json.gz).",
    )
    results_source: str | None = Field(
        default=None,
        description="Where the results were read: log (the pod log, the default) or exec "
        "(the results file, with the poller setting results-source: exec).",
    )
    outputs: str | None = Field(
        default=None,
        description="Where the full outputs are kept: the claim of spec.outputs (pvcName or "
        "pvcManaged), with lm_eval's run-*/ directories and the complete pod log.",
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
    mlflow_run: MlflowRunStatus | None = Field(
        default=None,
        description="The MLflow run the evaluation was logged as (spec.outputs.mlflow), as "
        "the driver in the pod reported it.",
    )
    mlflow_run_error: str | None = Field(
        default=None,
        description="Why logging the evaluation to spec.outputs.mlflow failed, in the "
        "tracking server's or the client's words (the job still succeeds with its results; "
        "condition ResultsExported is False).",
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
    conditions: list[Condition] | None = Field(
        default=None,
        description="The job's conditions, at most one of each type, for kubectl wait "
        "(--for=condition=Finished, Succeeded, Regressed=false...) and kubectl describe.",
    )
    observed_generation: int | None = Field(
        default=None,
        description="The spec generation (metadata.generation) this status reflects.",
    )
