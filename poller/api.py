"""The LMEvalJob API: spec and status as pydantic models.

These models are the single source of truth for the resource's shape. The
CRD in ``crds/`` is generated from them (``python -m poller.sandbox.crd``), so the
field descriptions here are what ``kubectl explain lmevaljob.spec`` shows,
and every pattern here is enforced twice: by the apiserver when a user
applies a job, and by pydantic when the poller reads it (a job that slipped
past an older schema still ends Failed with a clear message instead of
reaching an argv). Strings that end up in lm_eval's command line are held to
conservative patterns: the argv is a list, never a shell, but a value that
starts with ``-`` could still be read by lm_eval as an option. Free-form
strings that reach a process or the container runtime (argument values,
environment values, sidecar commands, annotation values) carry no control
characters: a NUL there is refused by the runtime only after the pod exists,
leaving it Pending. Rules about a whole list or map (the size of a joined argv
token, reserved variables and keys) live in ``poller.specrules``.

The spec's parts live in four modules so that each stays readable:
``poller.apibase`` (patterns, the base model, Secret references),
``poller.apipod`` (``spec.pod``), ``poller.apisources`` (task sources,
storage, outputs, TLS, chat) and ``poller.apigate`` (the regression gate's
spec.gate and status.gate); the status, which only the poller writes, is
``poller.apistatus``. This module holds ``LMEvalJobSpec`` and re-exports all
of them: the rest of the code reads the API as ``api.X``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, JsonValue, model_validator

from poller import specrules as rules
from poller.apibase import (
    API_GROUP,
    API_VERSION,
    ARG_NAME,
    ARG_PAIRS_MAX,
    ARG_VALUE,
    ARGV_WORD,
    BATCH_SIZE,
    DATA_KEY,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    ENV_NAME,
    GIT_COMMIT,
    GIT_REF,
    GIT_URL,
    IMAGE,
    KIND,
    LABEL_VALUE,
    LIMIT,
    LIMIT_LENGTH_MAX,
    MOUNT_PATH,
    PLURAL,
    QUALIFIED_NAME,
    QUALIFIED_NAME_LENGTH_MAX,
    QUANTITY,
    REPO_PATH,
    RESOURCE_NAME,
    SHORT_NAME,
    SYSTEM_INSTRUCTION_CHARS_MAX,
    TASK_NAME,
    TEXT,
    EnvSecret,
    EvaluationEnvName,
    FileSecret,
    KeyToPath,
    LabelKey,
    LabelValue,
    NameValue,
    Quantity,
    ResourceName,
    SecretKeyRef,
    SecretVolumeRef,
    _Model,
    job_owner_reference,
)
from poller.apigate import DEFAULT_GATE_METRIC, GATE_METRIC, GateStatus, RegressionGate
from poller.apipod import (
    Affinity,
    ArgvList,
    ContainerPort,
    EnvVar,
    EvaluationEnv,
    EvaluationEnvVar,
    LabelSelector,
    LabelSelectorRequirement,
    NodeAffinity,
    NodeFieldRequirement,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinity,
    PodAffinityTerm,
    PodOverride,
    PreferredSchedulingTerm,
    ResourceRequirements,
    Sidecar,
    SidecarEnv,
    Toleration,
    WeightedPodAffinityTerm,
)
from poller.apisources import (
    _ONE_TASK_SOURCE_RULE,
    CABundle,
    CABundleSource,
    ChatTemplate,
    ConfigMapKeyRef,
    ConfigMapVolumeRef,
    CustomTasks,
    FileConfigMap,
    GitSource,
    ModelTLS,
    OciOutput,
    Offline,
    OfflineS3,
    OfflineStorage,
    Outputs,
    PvcManaged,
)
from poller.apistatus import (
    PROVENANCE_ARG_MAX,
    PROVENANCE_ARGV_MAX,
    PROVENANCE_HASH_MAX,
    PROVENANCE_MESSAGE_MAX,
    PROVENANCE_TASK_HASHES_MAX,
    PROVENANCE_TEXT_MAX,
    Condition,
    ConditionType,
    ItemScoresStatus,
    JobReason,
    JobState,
    LMEvalJobStatus,
    Progress,
    Provenance,
    Seeds,
    TaskSourceStatus,
)

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "ARGV_WORD",
    "ARG_NAME",
    "ARG_PAIRS_MAX",
    "ARG_VALUE",
    "BATCH_SIZE",
    "DATA_KEY",
    "DEFAULT_GATE_METRIC",
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "ENV_NAME",
    "GATE_METRIC",
    "GIT_COMMIT",
    "GIT_REF",
    "GIT_URL",
    "IMAGE",
    "KIND",
    "LABEL_VALUE",
    "LIMIT",
    "LIMIT_LENGTH_MAX",
    "MOUNT_PATH",
    "PLURAL",
    "PROVENANCE_ARGV_MAX",
    "PROVENANCE_ARG_MAX",
    "PROVENANCE_HASH_MAX",
    "PROVENANCE_MESSAGE_MAX",
    "PROVENANCE_TASK_HASHES_MAX",
    "PROVENANCE_TEXT_MAX",
    "QUALIFIED_NAME",
    "QUALIFIED_NAME_LENGTH_MAX",
    "QUANTITY",
    "REPO_PATH",
    "RESOURCE_NAME",
    "SHORT_NAME",
    "SYSTEM_INSTRUCTION_CHARS_MAX",
    "TASK_NAME",
    "TEXT",
    "Affinity",
    "ArgvList",
    "CABundle",
    "CABundleSource",
    "ChatTemplate",
    "Condition",
    "ConditionType",
    "ConfigMapKeyRef",
    "ConfigMapVolumeRef",
    "ContainerPort",
    "CustomTasks",
    "EnvSecret",
    "EnvVar",
    "EvaluationEnv",
    "EvaluationEnvName",
    "EvaluationEnvVar",
    "FileConfigMap",
    "FileSecret",
    "GateStatus",
    "GitSource",
    "ItemScoresStatus",
    "JobReason",
    "JobState",
    "KeyToPath",
    "LMEvalJobSpec",
    "LMEvalJobStatus",
    "LabelKey",
    "LabelSelector",
    "LabelSelectorRequirement",
    "LabelValue",
    "ModelTLS",
    "NameValue",
    "NodeAffinity",
    "NodeFieldRequirement",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "OciOutput",
    "Offline",
    "OfflineS3",
    "OfflineStorage",
    "Outputs",
    "PodAffinity",
    "PodAffinityTerm",
    "PodOverride",
    "PreferredSchedulingTerm",
    "Progress",
    "Provenance",
    "PvcManaged",
    "Quantity",
    "RegressionGate",
    "ResourceName",
    "ResourceRequirements",
    "SecretKeyRef",
    "SecretVolumeRef",
    "Seeds",
    "Sidecar",
    "SidecarEnv",
    "TaskSourceStatus",
    "Toleration",
    "WeightedPodAffinityTerm",
    "job_owner_reference",
]


def _fewshot_needs_chat(spec: LMEvalJobSpec) -> str | None:
    if spec.fewshot_as_multiturn and not (spec.chat_template and spec.chat_template.enabled):
        return "spec.fewshotAsMultiturn: true needs spec.chatTemplate.enabled: true"
    return None


_FEWSHOT_RULE: dict[str, JsonValue] = {
    "rule": "!has(self.fewshotAsMultiturn) || !self.fewshotAsMultiturn || "
    "(has(self.chatTemplate) && self.chatTemplate.enabled)",
    "message": "fewshotAsMultiturn: true needs chatTemplate.enabled: true",
    "fieldPath": ".fewshotAsMultiturn",
}


_GATE_RULES: list[JsonValue] = [
    {
        "rule": "!has(self.gate) || has(self.baseline)",
        "message": "spec.gate needs spec.baseline (the LMEvalJob to compare with)",
        "fieldPath": ".gate",
    },
]


# trust_remote_code in spec.modelArgs runs the model repository's Python: it
# needs spec.allowCodeExecution (which itself needs the setting, podargv).
_REMOTE_CODE_RULE: dict[str, JsonValue] = dict(rules.remote_code_rule())


def _remote_code(spec: LMEvalJobSpec) -> str | None:
    pairs = [(pair.name, pair.value) for pair in spec.model_args or []]
    return rules.remote_code_problem(pairs, spec.allow_code_execution)


class LMEvalJobSpec(_Model):
    """What to evaluate and how the job pod may look."""

    model_config = ConfigDict(
        json_schema_extra={
            rules.VALIDATIONS: [_FEWSHOT_RULE, *_GATE_RULES, _REMOTE_CODE_RULE],
        }
    )

    @model_validator(mode="after")
    def _chat_options_agree(self) -> LMEvalJobSpec:
        if (problem := _fewshot_needs_chat(self)) is not None:
            raise ValueError(problem)
        if (problem := _remote_code(self)) is not None:
            raise ValueError(problem)
        if self.gate is not None and self.baseline is None:
            raise ValueError("spec.gate needs spec.baseline (the LMEvalJob to compare with)")
        return self

    model: Annotated[str, Field(pattern=ARGV_WORD, max_length=128)] = Field(
        description="lm_eval model type (--model), e.g. hf, local-completions, dummy."
    )
    model_args: (
        Annotated[
            list[NameValue],
            Field(max_length=ARG_PAIRS_MAX),
            rules.joined_pairs_rule("model_args"),
        ]
        | None
    ) = Field(
        default=None,
        description="lm_eval --model_args as name/value pairs (joined, at most "
        f"{rules.ARGV_TOKEN_BYTES_MAX} bytes).",
    )
    tasks: Annotated[
        list[Annotated[str, Field(pattern=TASK_NAME, max_length=256)]],
        Field(min_length=1, max_length=200),
        rules.joined_tasks_rule(),
    ] = Field(
        description="Task or group names (lm_eval --tasks; joined, at most "
        f"{rules.ARGV_TOKEN_BYTES_MAX} bytes)."
    )
    num_few_shot: Annotated[int, Field(ge=0, le=1000)] | None = Field(
        default=None, description="Few-shot examples per task (--num_fewshot)."
    )
    limit: Annotated[str, Field(pattern=LIMIT, max_length=LIMIT_LENGTH_MAX)] | None = Field(
        default=None,
        description="Examples per task: a whole number, or a fraction in (0, 1] (--limit).",
    )
    gen_args: (
        Annotated[
            list[NameValue],
            Field(max_length=ARG_PAIRS_MAX),
            rules.joined_pairs_rule("gen_kwargs"),
        ]
        | None
    ) = Field(
        default=None,
        description="Generation arguments (--gen_kwargs; joined, at most "
        f"{rules.ARGV_TOKEN_BYTES_MAX} bytes).",
    )
    log_samples: bool | None = Field(
        default=None, description="Keep per-sample outputs (--log_samples)."
    )
    batch_size: Annotated[str, Field(pattern=BATCH_SIZE)] | None = Field(
        default=None, description='Batch size: a number, "auto" or "auto:N" (--batch_size).'
    )
    env_secrets: Annotated[list[EnvSecret], Field(max_length=rules.ENV_SECRETS_MAX)] | None = Field(
        default=None,
        description="Environment variables from Secrets (the names follow spec.pod.env's rules).",
    )
    file_secrets: Annotated[list[FileSecret], Field(max_length=rules.FILE_SECRETS_MAX)] | None = (
        Field(default=None, description="Secrets mounted as files.")
    )
    custom_tasks: (
        Annotated[list[CustomTasks], Field(max_length=16), _ONE_TASK_SOURCE_RULE] | None
    ) = Field(
        default=None,
        description="Task definitions from ConfigMaps or Git repositories, passed to lm_eval "
        "with --include_path. Each entry sets exactly one of configMap and git.",
    )
    pod: PodOverride | None = Field(default=None, description="Restricted pod overrides.")
    size: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] | None = Field(
        default=None,
        description="A resource preset from the poller setting size-presets (e.g. small, "
        "medium, large). Resources in spec.pod.resources win over the preset's.",
    )
    device: Annotated[str, Field(pattern=r"^(cpu|mps|xpu|hpu|npu|cuda)(:[0-9]{1,2})?$")] | None = (
        Field(
            default=None,
            description="lm_eval --device. Default: cuda when the job's resources request a "
            "GPU, else cpu.",
        )
    )
    outputs: (
        Annotated[Outputs, rules.exactly_one_rule("pvcName", "pvcManaged", at_most=True)] | None
    ) = Field(default=None, description="Where full outputs go.")
    labels: Annotated[dict[LabelKey, LabelValue], rules.poller_keys_rule()] | None = Field(
        default=None,
        description="Labels added to the job pod; not app.kubernetes.io/managed-by nor "
        f"{rules.RESERVED_KEY_PREFIX}*, which the poller sets.",
    )
    annotations: (
        Annotated[
            dict[LabelKey, Annotated[str, Field(pattern=TEXT)]],
            rules.poller_keys_rule(),
            rules.security_annotations_rule(),
        ]
        | None
    ) = Field(
        default=None,
        description="Annotations added to the job pod; not the poller's keys (as for labels) "
        "nor any that sets a seccomp or AppArmor profile.",
    )
    allow_online: bool | None = Field(
        default=None,
        description="Let the evaluation reach model hubs and dataset hosts. Needs allow-online "
        "in the poller settings too.",
    )
    suspend: bool | None = Field(
        default=None,
        description="True stops the job (its pod is deleted) until set back to false, which "
        "starts a fresh pod.",
    )
    cancel: bool | None = Field(
        default=None, description="True stops the job for good: it ends Complete/Cancelled."
    )
    active_deadline_seconds: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="Seconds the job may run (time suspended does not count); then it ends "
        "Failed with DeadlineExceeded.",
    )
    ttl_seconds_after_finished: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="Delete the job (its pod and results ConfigMap go with it) this long after "
        "it finished. Defaults to the poller setting default-ttl-seconds-after-finished.",
    )
    allow_code_execution: bool | None = Field(
        default=None,
        description="Allow code that is not in the image: tasks that execute model-written "
        "code, custom tasks that name Python, and trust_remote_code in modelArgs. Needs "
        "allow-code-execution in the poller settings too.",
    )
    model_tls: ModelTLS | None = Field(
        default=None,
        alias="modelTLS",
        description="TLS to the model endpoint: extra certificate authorities to trust. "
        "Turning verification off (modelArgs verify_certificate=false) needs the poller "
        "setting allow-insecure-model-endpoints.",
    )
    system_instruction: (
        Annotated[str, Field(pattern=TEXT, max_length=SYSTEM_INSTRUCTION_CHARS_MAX)] | None
    ) = Field(
        default=None,
        description="System instruction added to every prompt (--system_instruction).",
    )
    chat_template: ChatTemplate | None = Field(
        default=None,
        description="Apply a chat template to the prompts (--apply_chat_template); needed by "
        "chat-completions models (local-chat-completions, openai-chat-completions).",
    )
    fewshot_as_multiturn: bool | None = Field(
        default=None,
        description="Few-shot examples as a multi-turn conversation (--fewshot_as_multiturn). "
        "lm_eval turns it on with a chat template; true needs chatTemplate.enabled.",
    )
    offline: Offline | None = Field(
        default=None,
        description="Models and datasets from storage (offline.storage.pvcName or "
        "offline.storage.s3), as TrustyAI LMES's field of the same name.",
    )
    file_config_maps: (
        Annotated[list[FileConfigMap], Field(max_length=rules.FILE_SECRETS_MAX)] | None
    ) = Field(
        default=None,
        description="ConfigMaps mounted read-only as files (as fileSecrets for Secrets); the "
        "requester must be allowed to get each.",
    )
    baseline: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="Another LMEvalJob in this namespace to compare this one with "
        "(spec.gate); never this job itself.",
    )
    gate: RegressionGate | None = Field(
        default=None,
        description="The regression gate against spec.baseline: once both jobs succeeded, "
        "condition Regressed says whether the score dropped by more than maxDrop with "
        "p < alpha. The job runs lm_eval with --log_samples.",
    )
