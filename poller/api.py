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
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, model_validator
from pydantic.alias_generators import to_camel

from poller import specrules as rules

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "PLURAL",
    "CABundle",
    "ChatTemplate",
    "Condition",
    "ConditionType",
    "JobReason",
    "JobState",
    "LMEvalJobSpec",
    "LMEvalJobStatus",
    "ModelTLS",
    "NameValue",
]

API_GROUP = "foundation-model-stack.github.com"
API_VERSION = "v1beta1"
KIND = "LMEvalJob"
PLURAL = "lmevaljobs"
SHORT_NAME = "lmej"

# Names that reach lm_eval's argv: a letter or digit first, never "-".
ARGV_WORD = r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]*$"
TASK_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
ARG_NAME = r"^[A-Za-z_][A-Za-z0-9_.-]*$"
# C0 and C1 control characters and DEL (\x{..} is understood by Go's RE2,
# which the apiserver uses, and by pydantic's Rust regex alike).
_CONTROLS = r"\x00-\x1f\x7f-\x{9f}"
# model_args/gen_kwargs are joined with "," and split on "=" by lm_eval.
ARG_VALUE = rf"^[^,{_CONTROLS}]*$"
# Text that may span lines (a script in a sidecar's args, a PEM in a
# variable): tab, LF and CR are its only control characters.
TEXT = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x{9f}]*$"
IMAGE = rf"^[^\s{_CONTROLS}]+$"
# A whole number, or a fraction in (0, 1]: some digit after the point must
# not be 0 (RE2 has no look-ahead, hence the explicit non-zero digit), or 1.0.
LIMIT = r"^([1-9][0-9]{0,9}|0?\.[0-9]{0,8}[1-9][0-9]{0,8}|1\.0{0,9})$"
LIMIT_LENGTH_MAX = 11  # "0." and 9 digits
BATCH_SIZE = r"^(auto(:[1-9][0-9]{0,4})?|[1-9][0-9]{0,5})$"
# How many name/value pairs model_args and gen_args may hold.
ARG_PAIRS_MAX = 256
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
DATA_KEY = r"^[-._a-zA-Z0-9]+$"
# An absolute path in normal form: no empty, "." or ".." segment, no trailing
# "/", so that the reserved-path rule cannot be walked around ("/usr/../usr").
MOUNT_PATH = (
    r"^(/([A-Za-z0-9_-][A-Za-z0-9_.-]*|[.][A-Za-z0-9_-][A-Za-z0-9_.-]*|[.][.][A-Za-z0-9_.-]+))+$"
)
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei|e[0-9]+)?$"
RESOURCE_NAME = r"^([a-z0-9.-]+/)?[A-Za-z0-9][-A-Za-z0-9_.]*$"
# Label and annotation keys: an optional DNS-subdomain prefix, then a name of
# at most 63 characters. "[.]" rather than "\.": the crd module puts key
# patterns inside CEL string literals.
_NAME63 = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_QUALIFIED = rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME63}"
QUALIFIED_NAME = rf"^{_QUALIFIED}$"
QUALIFIED_NAME_LENGTH_MAX = 253 + 1 + 63
LABEL_VALUE = rf"^({_NAME63})?$"
# One --system_instruction= token, 4 bytes a character at worst: within
# rules.ARGV_TOKEN_BYTES_MAX.
SYSTEM_INSTRUCTION_CHARS_MAX = 8000
# Git: a URL without user information, query or fragment, with a scheme git
# itself handles (never ext:: or file://, never a leading "-"); a ref name as
# git check-ref-format allows it, conservatively; a full commit hash (SHA-1
# or SHA-256); a relative path without "." segments (so no "..", no ".git").
_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?"
_HOST = rf"({_LABEL}([.]{_LABEL})*|\[[0-9A-Fa-f:.]+\])"
GIT_URL = rf"^(https|http|git)://{_HOST}(:[0-9]{{1,5}})?(/[A-Za-z0-9._~%+@:-]+)*/?$"
_REF_PART = r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_-])?"
GIT_REF = rf"^{_REF_PART}(/{_REF_PART})*$"
GIT_COMMIT = r"^([0-9a-f]{40}|[0-9a-f]{64})$"
_PATH_PART = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
REPO_PATH = rf"^{_PATH_PART}(/{_PATH_PART})*$"


class _Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class NameValue(_Model):
    """One `name=value` pair for lm_eval's --model_args or --gen_kwargs."""

    name: Annotated[str, Field(pattern=ARG_NAME, max_length=128, description="Argument name.")]
    value: Annotated[
        str,
        Field(
            pattern=ARG_VALUE,
            max_length=4096,
            description="Argument value; no commas or control characters.",
        ),
    ]


class SecretKeyRef(_Model):
    name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Secret name.")]
    key: Annotated[str, Field(pattern=DATA_KEY, max_length=253, description="Key in the Secret.")]


# A variable of the evaluation container: not one the poller sets, nor one
# that loads code into the driver (LD_PRELOAD...).
EvaluationEnvName = Annotated[str, Field(pattern=ENV_NAME, max_length=128), rules.env_name_rule()]


class EnvSecret(_Model):
    """An environment variable of the evaluation taken from a Secret."""

    env: EvaluationEnvName = Field(description="Variable name.")
    secret_ref: SecretKeyRef = Field(description="The Secret key that holds the value.")


class KeyToPath(_Model):
    key: Annotated[str, Field(pattern=DATA_KEY, max_length=253)]
    path: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*$", max_length=253)]


class SecretVolumeRef(_Model):
    secret_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)]
    items: list[KeyToPath] | None = Field(
        default=None, description="Keys to project; all keys when omitted."
    )


class FileSecret(_Model):
    """A Secret mounted read-only as files in the evaluation container."""

    secret_ref: SecretVolumeRef = Field(description="The Secret to mount.")
    mount_path: Annotated[
        str, Field(pattern=MOUNT_PATH, max_length=1024), rules.mount_path_rule()
    ] = Field(
        description="Absolute path of the mount; not over code or the poller's own mounts "
        "(/usr, /lib*, /bin, /sbin, /opt, /tmp, /outputs, /cache, /proc, /sys, /dev, / and "
        "/etc themselves, /etc/ld.so*, /etc/python*)."
    )


ResourceName = Annotated[str, Field(pattern=RESOURCE_NAME, max_length=253)]
LabelKey = Annotated[str, Field(pattern=QUALIFIED_NAME, max_length=QUALIFIED_NAME_LENGTH_MAX)]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE, max_length=63)]
# YAML users write `cpu: 2` as often as `cpu: "2"`: accept both, like Kubernetes.
Quantity = Annotated[
    str,
    BeforeValidator(
        lambda v: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
    ),
    Field(pattern=QUANTITY, max_length=64, json_schema_extra={"x-kubernetes-int-or-string": True}),
]


class ResourceRequirements(_Model):
    requests: dict[ResourceName, Quantity] | None = Field(
        default=None, description='Minimum resources, e.g. cpu: "2", memory: 8Gi.'
    )
    limits: dict[ResourceName, Quantity] | None = Field(
        default=None, description='Maximum resources, e.g. nvidia.com/gpu: "1".'
    )


class EnvVar(_Model):
    """A variable of a sidecar."""

    name: Annotated[str, Field(pattern=ENV_NAME, max_length=128)]
    value: Annotated[str, Field(pattern=TEXT, max_length=32768)] = ""


class EvaluationEnvVar(EnvVar):
    """A variable of the evaluation container."""

    name: EvaluationEnvName


# A container's variables: bounded in number and in bytes, as execve counts.
SidecarEnv = Annotated[
    list[EnvVar], Field(max_length=rules.SIDECAR_ENV_ITEMS_MAX), rules.env_list_rule()
]
EvaluationEnv = Annotated[
    list[EvaluationEnvVar], Field(max_length=rules.CONTAINER_ENV_ITEMS_MAX), rules.env_list_rule()
]


# A sidecar's command or args: each string bounded, and all of them together.
ArgvList = Annotated[
    list[Annotated[str, Field(pattern=TEXT, max_length=4096)]],
    Field(max_length=rules.SIDECAR_ARGV_ITEMS_MAX),
    rules.argv_list_rule(),
]


class Toleration(_Model):
    key: Annotated[str, Field(pattern=rf"^({_QUALIFIED})?$", max_length=316)] | None = None
    operator: Annotated[str, Field(pattern=r"^(Exists|Equal)$")] | None = None
    value: Annotated[str, Field(pattern=LABEL_VALUE, max_length=63)] | None = None
    effect: Annotated[str, Field(pattern=r"^(NoSchedule|PreferNoSchedule|NoExecute)$")] | None = (
        None
    )
    toleration_seconds: int | None = None


class ContainerPort(_Model):
    container_port: Annotated[int, Field(ge=1, le=65535)]
    name: (
        Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=15)] | None
    ) = None
    protocol: Annotated[str, Field(pattern=r"^(TCP|UDP|SCTP)$")] | None = None


class Sidecar(_Model):
    """A container beside the evaluation, held to the restricted profile."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] = Field(
        description="Container name (not lmeval)."
    )
    image: Annotated[str, Field(pattern=IMAGE, max_length=512)]
    command: ArgvList | None = None
    args: ArgvList | None = None
    env: SidecarEnv | None = None
    resources: ResourceRequirements | None = None
    ports: list[ContainerPort] | None = None


# -- pod placement: affinity (Kubernetes' own shape) -----------------------------------
_NODE_OPERATOR = r"^(In|NotIn|Exists|DoesNotExist|Gt|Lt)$"
_LABEL_OPERATOR = r"^(In|NotIn|Exists|DoesNotExist)$"
_Values = Annotated[list[LabelValue], Field(max_length=64)]


class NodeSelectorRequirement(_Model):
    key: LabelKey
    operator: Annotated[str, Field(pattern=_NODE_OPERATOR)]
    values: _Values | None = None


class NodeFieldRequirement(_Model):
    key: Annotated[str, Field(pattern=r"^metadata[.]name$")]
    operator: Annotated[str, Field(pattern=r"^(In|NotIn)$")]
    values: (
        Annotated[
            list[Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)]], Field(max_length=64)
        ]
        | None
    ) = None


class NodeSelectorTerm(_Model):
    match_expressions: Annotated[list[NodeSelectorRequirement], Field(max_length=32)] | None = None
    match_fields: Annotated[list[NodeFieldRequirement], Field(max_length=32)] | None = None


class NodeSelector(_Model):
    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=32)]


class PreferredSchedulingTerm(_Model):
    weight: Annotated[int, Field(ge=1, le=100)]
    preference: NodeSelectorTerm


class NodeAffinity(_Model):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[PreferredSchedulingTerm], Field(max_length=32)] | None
    ) = None


class LabelSelectorRequirement(_Model):
    key: LabelKey
    operator: Annotated[str, Field(pattern=_LABEL_OPERATOR)]
    values: _Values | None = None


class LabelSelector(_Model):
    match_labels: dict[LabelKey, LabelValue] | None = None
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=32)] | None = None


class PodAffinityTerm(_Model):
    label_selector: LabelSelector | None = None
    namespaces: (
        Annotated[
            list[Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]], Field(max_length=64)
        ]
        | None
    ) = None
    namespace_selector: LabelSelector | None = None
    topology_key: LabelKey


class WeightedPodAffinityTerm(_Model):
    weight: Annotated[int, Field(ge=1, le=100)]
    pod_affinity_term: PodAffinityTerm


class PodAffinity(_Model):
    required_during_scheduling_ignored_during_execution: (
        Annotated[list[PodAffinityTerm], Field(max_length=32)] | None
    ) = None
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[WeightedPodAffinityTerm], Field(max_length=32)] | None
    ) = None


class Affinity(_Model):
    """The job pod's affinity, as in a Pod (node affinity, pod affinity and anti-affinity)."""

    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class PodOverride(_Model):
    """The restricted subset of the job pod that a job may shape."""

    resources: ResourceRequirements | None = Field(
        default=None, description="CPU, memory and accelerator requests and limits."
    )
    env: EvaluationEnv | None = Field(
        default=None,
        description="Extra environment variables of the evaluation container (at most "
        f"{rules.CONTAINER_ENV_ITEMS_MAX}, {rules.CONTAINER_ENV_BYTES_MAX} bytes in all). Not "
        "LD_*, LMEVAL_*, PYTHON* (but " + ", ".join(sorted(rules.ALLOWED_PYTHON_ENV)) + "), "
        "glibc's unsecure variables, nor those the poller sets.",
    )
    node_selector: dict[LabelKey, LabelValue] | None = Field(
        default=None, description="Node labels the pod must match."
    )
    tolerations: list[Toleration] | None = Field(default=None, description="Pod tolerations.")
    affinity: Affinity | None = Field(
        default=None,
        description="Pod affinity (nodeAffinity, podAffinity, podAntiAffinity), as in a Pod.",
    )
    priority_class_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = (
        Field(
            default=None,
            description="PriorityClass of the job pod (the cluster's priority admission and "
            "quotas apply as to any pod of the namespace).",
        )
    )
    sidecars: Annotated[list[Sidecar], Field(max_length=8)] | None = Field(
        default=None,
        description="Extra containers beside the evaluation (e.g. storage connectivity). They "
        "get the same restricted security context; the admission policy allows them only to "
        "users who may create pods in the namespace themselves.",
    )


class GitSource(_Model):
    """A Git repository of task files, cloned at a pinned commit before the evaluation."""

    url: Annotated[str, Field(pattern=GIT_URL, max_length=2048)] = Field(
        description="Repository URL: https://, or http:// and git:// (unencrypted, so only to "
        "loopback hosts unless the poller setting git-allow-plaintext is true). No user or "
        "password in the URL: use credentialsSecret."
    )
    branch: Annotated[str, Field(pattern=GIT_REF, max_length=255)] | None = Field(
        default=None,
        description="Branch or tag to clone. Resolved when the pod starts; the commit actually "
        "used is recorded in status.taskSources. With commit, the commit must be on it.",
    )
    commit: Annotated[str, Field(pattern=GIT_COMMIT)] | None = Field(
        default=None,
        description="Full commit hash (40 or 64 hex digits) checked out exactly. Without "
        "branch and commit, the repository's default branch is cloned.",
    )
    path: Annotated[str, Field(pattern=REPO_PATH, max_length=1024)] | None = Field(
        default=None,
        description="Directory inside the repository that holds the task files (no segment "
        "starting with '.'); the whole repository when omitted.",
    )
    credentials_secret: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="Secret with a key .git-credentials in git's credential-store format "
        "(https://USER:TOKEN@HOST, one per line), mounted as a file into the clone's "
        "container only and read by git's own store helper. The requester must be able to "
        "read it.",
    )


class CustomTasks(_Model):
    """Task YAML files and their data, from a ConfigMap or a Git repository."""

    config_map: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="ConfigMap whose keys are task YAML and data files. The pod mounts an "
        "immutable copy owned by the job at /opt/lmeval/tasks/<name>; data_files paths in the "
        "YAML must be absolute under it. Task files that name Python (!function, class, .py "
        "files, templates reaching Python) need allowCodeExecution.",
    )
    git: GitSource | None = Field(
        default=None,
        description="A Git repository, cloned by an init container without API rights into "
        "/opt/lmeval/tasks/git-<i> (i: this entry's index). Its files are not inspected by the "
        "poller, so a Git source needs allowCodeExecution.",
    )


class PvcManaged(_Model):
    """A claim the poller makes for the job's outputs (TrustyAI LMES's outputs.pvcManaged)."""

    size: Quantity = Field(description='Requested storage, e.g. "1Gi".')
    storage_class_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None, description="StorageClass of the claim (default: the cluster's)."
    )
    keep: bool | None = Field(
        default=None,
        description="True keeps the claim when the job is deleted (default: it is deleted "
        "with the job, as its owner).",
    )


class Outputs(_Model):
    pvc_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None, description="PersistentVolumeClaim that receives the full outputs."
    )
    pvc_managed: PvcManaged | None = Field(
        default=None,
        description="A ReadWriteOnce claim that the poller creates for the outputs, named "
        "<job>-outputs-<hash>, before the pod; the requester must be allowed to create "
        "PersistentVolumeClaims in the namespace. Not with pvcName.",
    )


class OfflineS3(_Model):
    """An S3 prefix copied into the pod before the evaluation (TrustyAI LMES's shape)."""

    access_key_id: SecretKeyRef = Field(description="Secret key holding the access key id.")
    secret_access_key: SecretKeyRef = Field(description="Secret key holding the secret access key.")
    bucket: SecretKeyRef = Field(description="Secret key holding the bucket name.")
    endpoint: SecretKeyRef = Field(
        description="Secret key holding the endpoint URL (http:// or https://, host and port "
        "only; checked by the copy before any request)."
    )
    region: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the region (default us-east-1)."
    )
    path: Annotated[str, Field(pattern=r"^([A-Za-z0-9_-][A-Za-z0-9._-]*/?)*$", max_length=1024)] = (
        Field(
            default="",
            description="Prefix copied (a folder of the bucket; empty: the whole bucket). Its "
            "objects land below /cache/storage relative to it, so hub/... is the hub cache.",
        )
    )
    verify_ssl: bool | None = Field(
        default=None,
        alias="verifySSL",
        description="False skips verifying the endpoint's certificate (default true).",
    )


class OfflineStorage(_Model):
    """Where an offline job finds models and datasets: a claim, or an S3 prefix."""

    pvc_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = Field(
        default=None,
        description="PersistentVolumeClaim mounted read-only at /cache/storage. Its hub/ "
        "directory is the Hugging Face hub cache (HF_HUB_CACHE, huggingface_hub's layout: "
        "models--ORG--NAME and datasets--ORG--NAME with refs/, snapshots/ and blobs/), so "
        "pretrained=ORG/NAME and a task's dataset_path ORG/NAME load from it; any other "
        "directory can be named by path, e.g. pretrained=/cache/storage/models/NAME. The "
        "job runs offline (HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1) whatever allowOnline "
        "says. The requester must be allowed to get the claim.",
    )
    s3: OfflineS3 | None = Field(
        default=None,
        description="An S3-compatible prefix that an init container (the job's restricted "
        "profile, no API rights) copies into an emptyDir mounted read-only at /cache/storage, "
        "used as a claim would be. The requester must be allowed to get its Secrets.",
    )


class Offline(_Model):
    """Models and datasets from storage, for clusters without internet."""

    storage: Annotated[OfflineStorage, rules.exactly_one_rule("pvcName", "s3")] = Field(
        description="Where the models and datasets are: pvcName or s3."
    )


class ConfigMapVolumeRef(_Model):
    name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] = Field(
        description="ConfigMap name."
    )
    items: list[KeyToPath] | None = Field(
        default=None, description="Keys to project; all keys when omitted."
    )


class FileConfigMap(_Model):
    """A ConfigMap mounted read-only as files in the evaluation container."""

    config_map_ref: ConfigMapVolumeRef = Field(description="The ConfigMap to mount.")
    mount_path: Annotated[
        str, Field(pattern=MOUNT_PATH, max_length=1024), rules.mount_path_rule()
    ] = Field(description="Absolute path of the mount; the same rules as fileSecrets' mountPath.")


class ConfigMapKeyRef(_Model):
    name: Annotated[
        str, Field(pattern=DNS_SUBDOMAIN, max_length=253, description="ConfigMap name.")
    ]
    key: Annotated[
        str, Field(pattern=DATA_KEY, max_length=253, description="Key in the ConfigMap.")
    ]


def _one_ca_source(bundle: CABundle) -> str | None:
    if (bundle.config_map_key_ref is None) == (bundle.secret_key_ref is None):
        return "set exactly one of configMapKeyRef and secretKeyRef"
    return None


class CABundle(_Model):
    """PEM certificates of the certificate authorities to trust, from one key."""

    config_map_key_ref: ConfigMapKeyRef | None = Field(
        default=None,
        description="The ConfigMap key that holds the PEM bundle (e.g. an OpenShift service CA "
        "or trusted-ca-bundle ConfigMap).",
    )
    secret_key_ref: SecretKeyRef | None = Field(
        default=None, description="The Secret key that holds the PEM bundle (e.g. ca.crt)."
    )


CABundleSource = Annotated[
    CABundle,
    rules.Cel(
        rule="has(self.configMapKeyRef) != has(self.secretKeyRef)",
        message="set exactly one of configMapKeyRef and secretKeyRef",
        problem=_one_ca_source,
    ),
]


class ModelTLS(_Model):
    """How the evaluation verifies the model endpoint's TLS certificate."""

    ca_bundle: CABundleSource = Field(
        description="Certificate authorities the evaluation trusts for https:// model "
        "endpoints, added to the image's own (system and certifi) authorities. Mounted "
        "read-only; SSL_CERT_FILE and REQUESTS_CA_BUNDLE point lm_eval's HTTP clients "
        "(aiohttp, requests) at the combined bundle."
    )


class ChatTemplate(_Model):
    """lm_eval's --apply_chat_template."""

    enabled: bool = Field(description="Format prompts as chat messages (--apply_chat_template).")
    name: Annotated[str, Field(pattern=TASK_NAME, max_length=128)] | None = Field(
        default=None,
        description="A named chat template of the model's tokenizer "
        "(--apply_chat_template=NAME); the default template when omitted.",
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


def _task_source_problem(entries: list[CustomTasks]) -> str | None:
    wrong = [i for i, t in enumerate(entries) if (t.config_map is None) == (t.git is None)]
    if not wrong:
        return None
    where = ", ".join(f"spec.customTasks[{i}]" for i in wrong)
    return f"each custom task source sets exactly one of configMap and git: {where}"


_ONE_TASK_SOURCE_RULE = rules.Cel(
    rule="self.all(t, has(t.configMap) != has(t.git))",
    message="each custom task source sets exactly one of configMap and git",
    problem=_task_source_problem,
)


class LMEvalJobSpec(_Model):
    """What to evaluate and how the job pod may look."""

    model_config = ConfigDict(json_schema_extra={rules.VALIDATIONS: [_FEWSHOT_RULE]})

    @model_validator(mode="after")
    def _chat_options_agree(self) -> LMEvalJobSpec:
        if (problem := _fewshot_needs_chat(self)) is not None:
            raise ValueError(problem)
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
        "code, and custom tasks that name Python. Needs allow-code-execution in the poller "
        "settings too.",
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


class Condition(_Model):
    """A Kubernetes-style condition, as `kubectl wait --for=condition=X` reads it."""

    type: str = Field(description="Scheduled, Running, Finished, Succeeded or Suspended.")
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
    commit: str = Field(description="The commit checked out.")


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
        "out (as the driver read it in the pod).",
    )
    conditions: list[Condition] | None = Field(default=None, description="Current conditions.")
    observed_generation: int | None = Field(
        default=None, description="The spec generation this status reflects."
    )
