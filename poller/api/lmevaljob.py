"""The LMEvalJob API: spec and status as pydantic models.

These models are the single source of truth for the resource's shape. The
CRD in ``crds/`` is generated from them (``python -m lmeval_sandbox.crd``), so the
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
token, reserved variables and keys) live in ``poller.api.rules``.

The spec's parts live in four modules so that each stays readable:
``poller.api.base`` (patterns, the base model, Secret references),
``poller.api.pod`` (``spec.pod``), ``poller.api.sources`` (task sources,
storage, outputs, TLS, chat) and ``poller.api.gate`` (the regression gate's
spec.gate and status.gate); the status, which only the poller writes, is
``poller.api.status``. This module holds ``LMEvalJobSpec`` and re-exports all
of them: the rest of the code reads the API as ``api.X``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, JsonValue, model_validator

from driver import protocol
from poller.api import rules
from poller.api.base import (
    ARG_PAIRS_MAX,
    ARGV_WORD,
    BATCH_SIZE,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    LIMIT,
    LIMIT_LENGTH_MAX,
    SYSTEM_INSTRUCTION_CHARS_MAX,
    TASK_NAME,
    TEXT,
    EnvSecret,
    FileSecret,
    LabelKey,
    LabelValue,
    NameValue,
    _Model,
)
from poller.api.gate import RegressionGate
from poller.api.pod import (
    PodOverride,
)
from poller.api.sources import (
    _ONE_TASK_SOURCE_RULE,
    ChatTemplate,
    CustomTasks,
    FileConfigMap,
    ModelTLS,
    Offline,
    Outputs,
)


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


# The most shards one job may run (the driver's bound: each is a pod and a Kueue
# pod set member, and status keeps one record per shard in every LIST of jobs).
MAX_SHARDS = protocol.MAX_SHARDS
# Shards keep their per-sample outputs and response caches on a claim: where
# they meet for the merge, and what a restarted shard resumes from.
_SHARDS_NEED_CLAIM = (
    "spec.parallelism above 1 needs spec.outputs.pvcName or spec.outputs.pvcManaged: the "
    "shards keep their per-sample outputs and response caches on that claim, where the merge "
    "reads them and a restarted shard resumes from them"
)
_SHARDS_RULE: dict[str, JsonValue] = {
    "rule": "!has(self.parallelism) || self.parallelism == 1 || (has(self.outputs) && "
    "(has(self.outputs.pvcName) || has(self.outputs.pvcManaged)))",
    "message": _SHARDS_NEED_CLAIM,
    "fieldPath": ".parallelism",
}


def _shards_problem(spec: LMEvalJobSpec) -> str | None:
    if (spec.parallelism or 1) == 1:
        return None
    outputs = spec.outputs
    if outputs is None or (outputs.pvc_name is None and outputs.pvc_managed is None):
        return _SHARDS_NEED_CLAIM
    return None


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
            # One paragraph (a docstring's line breaks would show in kubectl explain).
            "description": "What to evaluate and how the job pod may look. Once the job's "
            "first pod exists, only cancel, suspend, ttlSecondsAfterFinished and "
            "activeDeadlineSeconds may change: the spec is the record of what ran.",
            rules.VALIDATIONS: [_FEWSHOT_RULE, *_GATE_RULES, _REMOTE_CODE_RULE, _SHARDS_RULE],
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
        if (problem := _shards_problem(self)) is not None:
            raise ValueError(problem)
        return self

    model: Annotated[str, Field(pattern=ARGV_WORD, max_length=128)] = Field(
        description="lm_eval's model type (--model), e.g. hf, local-completions, "
        "local-chat-completions, dummy: a letter or digit first (never -, so it cannot read "
        "as an option), at most 128 characters."
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
        description="lm_eval's --model_args as name/value pairs, e.g. pretrained=gpt2: at most "
        f"{ARG_PAIRS_MAX} pairs, and at most {rules.ARGV_TOKEN_BYTES_MAX} bytes once joined "
        "into one argument (Linux refuses an argument over 128 KiB). trust_remote_code other "
        "than false or 0 needs allowCodeExecution.",
    )
    tasks: Annotated[
        list[Annotated[str, Field(pattern=TASK_NAME, max_length=256)]],
        Field(min_length=1, max_length=200),
        rules.joined_tasks_rule(),
    ] = Field(
        description="Task or group names (lm_eval --tasks), built in or from customTasks: 1 to "
        "200 names of at most 256 characters, a letter or digit first, at most "
        f"{rules.ARGV_TOKEN_BYTES_MAX} bytes once joined into one argument."
    )
    num_few_shot: Annotated[int, Field(ge=0, le=1000)] | None = Field(
        default=None,
        description="Few-shot examples per task (--num_fewshot), 0 to 1000; each task's own "
        "default when omitted.",
    )
    limit: Annotated[str, Field(pattern=LIMIT, max_length=LIMIT_LENGTH_MAX)] | None = Field(
        default=None,
        description="Examples per task (--limit): a whole number, or a fraction in (0, 1] such "
        f'as "0.5" (at most {LIMIT_LENGTH_MAX} characters); every example when omitted.',
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
        description="Generation arguments (--gen_kwargs) as name/value pairs, e.g. "
        f"temperature=0: at most {ARG_PAIRS_MAX} pairs and {rules.ARGV_TOKEN_BYTES_MAX} bytes "
        "once joined into one argument.",
    )
    log_samples: bool | None = Field(
        default=None,
        description="Keep per-sample outputs (--log_samples), which gives per-item scores for "
        "lmeval compare and a regression gate; default false (always on with spec.gate).",
    )
    parallelism: Annotated[int, Field(ge=1, le=MAX_SHARDS)] | None = Field(
        default=None,
        description="Shards: run the evaluation as this many pods at once, each evaluating "
        "every N-th document of every task (lm_eval --samples), then one merge pod that "
        "computes the job's results from the shards' per-sample outputs with lm_eval's own "
        "aggregation code, equal to what one unsharded run writes. Default 1 (one pod, no "
        f"merge); at most {MAX_SHARDS}. Above 1 it needs spec.outputs.pvcName or "
        "spec.outputs.pvcManaged: each shard keeps its per-sample outputs and its model "
        "response cache there (lm_eval --use_cache), so a shard that is preempted, evicted or "
        "lost with its node starts again and sends only the requests not answered yet. The "
        "shards of a ReadWriteOnce claim run on one node (a required pod affinity); a "
        "failed shard is retried up to 3 times (4 attempts) before the job fails naming it. "
        "A task with fewer documents than shards, and sampled generation (do_sample), end the "
        "job Failed at once saying so. Under Kueue the shards are one Workload whose pod set "
        "counts them all; max-running-jobs counts each shard.",
    )
    batch_size: Annotated[str, Field(pattern=BATCH_SIZE)] | None = Field(
        default=None,
        description='Batch size (--batch_size): a number, "auto" or "auto:N" (N tries); '
        "lm_eval's default (1) when omitted.",
    )
    env_secrets: Annotated[list[EnvSecret], Field(max_length=rules.ENV_SECRETS_MAX)] | None = Field(
        default=None,
        description="Environment variables of the evaluation taken from Secret keys (API "
        f"tokens, e.g. HF_TOKEN); at most {rules.ENV_SECRETS_MAX}. The requester must be "
        "allowed to get each Secret (admission policy).",
    )
    file_secrets: Annotated[list[FileSecret], Field(max_length=rules.FILE_SECRETS_MAX)] | None = (
        Field(
            default=None,
            description="Secrets mounted read-only as files in the evaluation container; at "
            f"most {rules.FILE_SECRETS_MAX}. The requester must be allowed to get each Secret.",
        )
    )
    custom_tasks: (
        Annotated[list[CustomTasks], Field(max_length=16), _ONE_TASK_SOURCE_RULE] | None
    ) = Field(
        default=None,
        description="Task definitions from ConfigMaps or Git repositories, passed to lm_eval "
        "with --include_path; at most 16 sources. Each entry sets exactly one of configMap "
        "and git.",
    )
    pod: PodOverride | None = Field(
        default=None,
        description="What a job may change in its pod: resources, environment, placement "
        "(nodeSelector, tolerations, affinity, priorityClassName) and sidecars, nothing else. "
        "The poller builds the pod under the restricted Pod Security profile with no API "
        "rights, and a job must not loosen that: other pod fields (volumes, host namespaces "
        "and ports, privileged or root containers, added capabilities, the service account, "
        "the evaluation's image and command) are refused.",
    )
    size: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] | None = Field(
        default=None,
        description="A resource preset from the poller setting size-presets (e.g. small, "
        "medium, large; a name of at most 63 characters); the setting default-size when "
        "omitted. Resources in spec.pod.resources win over the preset's, key by key.",
    )
    device: Annotated[str, Field(pattern=r"^(cpu|mps|xpu|hpu|npu|cuda)(:[0-9]{1,2})?$")] | None = (
        Field(
            default=None,
            description="lm_eval --device: cpu, cuda, mps, xpu, hpu or npu, optionally with an "
            "index (cuda:1). Default: cuda when the job's resources request a GPU, else cpu.",
        )
    )
    outputs: (
        Annotated[Outputs, rules.exactly_one_rule("pvcName", "pvcManaged", at_most=True)] | None
    ) = Field(
        default=None,
        description="Where the full outputs go besides status and the results ConfigMap: a "
        "claim (pvcName or pvcManaged, at most one) and an OCI registry (oci). Only in the "
        "pod, which is deleted, when omitted.",
    )
    labels: Annotated[dict[LabelKey, LabelValue], rules.poller_keys_rule()] | None = Field(
        default=None,
        description="Labels added to the job pod: at most 64 (a bound that keeps the key "
        "rule's cost within the apiserver's budget), values of at most 63 characters. Not "
        f"app.kubernetes.io/managed-by nor {rules.RESERVED_KEY_PREFIX}*, which the poller "
        "sets.",
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
        description="Annotations added to the job pod, at most 64; not the poller's keys (as "
        "for labels) nor any key containing seccomp or apparmor, which would loosen the "
        "pod's restricted profile.",
    )
    allow_online: bool | None = Field(
        default=None,
        description="Let the evaluation reach model hubs and dataset hosts (default false: "
        "offline, models and datasets from the image, storage or customTasks). Needs "
        "allow-online in the poller settings too.",
    )
    suspend: bool | None = Field(
        default=None,
        description="True stops the job (its pod is deleted) until set back to false, which "
        "starts a fresh pod; default false. May change after the job started.",
    )
    cancel: bool | None = Field(
        default=None,
        description="True stops the job for good: its pod is deleted and it ends "
        "Complete/Cancelled; default false. May change after the job started.",
    )
    active_deadline_seconds: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="Seconds the job may run, at least 1 (time suspended does not count); then "
        "it ends Failed with DeadlineExceeded. No deadline when omitted. May change after "
        "the job started.",
    )
    ttl_seconds_after_finished: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="Delete the job (its pod and results ConfigMap go with it) this many "
        "seconds after it finished, 0 or more. Defaults to the poller setting "
        "default-ttl-seconds-after-finished. May change after the job started or finished.",
    )
    allow_code_execution: bool | None = Field(
        default=None,
        description="Allow code that is not in the image: tasks that execute model-written "
        "code, custom tasks that name Python, Git task sources, and trust_remote_code in "
        "modelArgs; default false. Needs allow-code-execution in the poller settings, and a "
        "requester allowed to create pods in the namespace.",
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
        description="System instruction added to every prompt (--system_instruction): at most "
        f"{SYSTEM_INSTRUCTION_CHARS_MAX} characters, so that the one argument stays within "
        f"{rules.ARGV_TOKEN_BYTES_MAX} bytes; no control characters but tab, CR and LF.",
    )
    chat_template: ChatTemplate | None = Field(
        default=None,
        description="Apply a chat template to the prompts (--apply_chat_template); needed by "
        "chat-completions models (local-chat-completions, openai-chat-completions).",
    )
    fewshot_as_multiturn: bool | None = Field(
        default=None,
        description="Few-shot examples as a multi-turn conversation (--fewshot_as_multiturn). "
        "lm_eval turns it on with a chat template; true needs chatTemplate.enabled, false "
        "passes --fewshot_as_multiturn=false.",
    )
    offline: Offline | None = Field(
        default=None,
        description="Models and datasets from storage (offline.storage.pvcName or "
        "offline.storage.s3), for clusters without internet; the job then runs offline "
        "whatever allowOnline says.",
    )
    file_config_maps: (
        Annotated[list[FileConfigMap], Field(max_length=rules.FILE_SECRETS_MAX)] | None
    ) = Field(
        default=None,
        description="ConfigMaps mounted read-only as files (as fileSecrets for Secrets); at "
        f"most {rules.FILE_SECRETS_MAX}. The requester must be allowed to get each.",
    )
    baseline: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="Another LMEvalJob in this namespace to compare this one with (spec.gate), "
        "never this job itself; at most 253 characters, Kubernetes' limit for a name. The "
        "requester must be allowed to get it.",
    )
    gate: RegressionGate | None = Field(
        default=None,
        description="The regression gate against spec.baseline: once both jobs succeeded, "
        "condition Regressed says whether the score dropped by more than maxDrop with "
        "p < alpha. The job runs lm_eval with --log_samples.",
    )
