"""The LMEvalJob API: the restricted pod overrides (``spec.pod``).

Resources, environment, tolerations, sidecars and affinity, each held to
the subset the restricted profile allows. Re-exported by ``poller.api``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from poller import specrules as rules
from poller.apibase import (
    _QUALIFIED,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    ENV_NAME,
    IMAGE,
    LABEL_VALUE,
    TEXT,
    EvaluationEnvName,
    LabelKey,
    LabelValue,
    Quantity,
    ResourceName,
    _Model,
)

__all__ = [
    "Affinity",
    "ArgvList",
    "ContainerPort",
    "EnvVar",
    "EvaluationEnv",
    "EvaluationEnvVar",
    "LabelSelector",
    "LabelSelectorRequirement",
    "NodeAffinity",
    "NodeFieldRequirement",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "PodAffinity",
    "PodAffinityTerm",
    "PodOverride",
    "PreferredSchedulingTerm",
    "ResourceRequirements",
    "Sidecar",
    "SidecarEnv",
    "Toleration",
    "WeightedPodAffinityTerm",
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

    # Not NVIDIA_*: the node's container toolkit acts on them in any container.
    name: Annotated[str, Field(pattern=ENV_NAME, max_length=128), rules.node_env_name_rule()]
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
        "those the poller sets, nor any that loads code or acts on the node: LD_*, PYTHON* "
        "(but " + ", ".join(sorted(rules.ALLOWED_PYTHON_ENV)) + "), glibc's unsecure "
        "variables, OPENSSL_*, NVIDIA_*, GPU and OpenMP plugin paths, TRITON_*, PATH, GIT_*...",
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
