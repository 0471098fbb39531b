"""The LMEvalJob API: the restricted pod overrides (``spec.pod``).

Resources, environment, tolerations, sidecars and affinity, each held to
the subset the restricted profile allows. Re-exported by ``poller.api``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from poller.api import rules
from poller.api.base import (
    _QUALIFIED,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    ENV_NAME,
    IMAGE,
    LABEL_VALUE,
    QUALIFIED_NAME_LENGTH_MAX,
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


# Why the lists of placement rules are bounded (Kubernetes itself sets no bound):
# a job is copied into its pod and carried by every list of jobs.
_ROOMY = "far more than placement needs, so that a job stays a small object"
_KEY = (
    "a label key: an optional DNS-subdomain prefix and /, then a name of at most 63 "
    f"characters; at most {QUALIFIED_NAME_LENGTH_MAX} characters in all"
)
_VALUES = f"at most 64 values ({_ROOMY}) of at most 63 characters, a label value's limit"


class ResourceRequirements(_Model):
    """Requests and limits of a container, as in a Pod; quantities as "2", 500m or 8Gi."""

    requests: dict[ResourceName, Quantity] | None = Field(
        default=None,
        description='Minimum resources the scheduler reserves, e.g. cpu: "2", memory: 8Gi; at '
        "most 64 resources, quantities of at most 64 characters.",
    )
    limits: dict[ResourceName, Quantity] | None = Field(
        default=None,
        description='Maximum resources, e.g. memory: 16Gi, nvidia.com/gpu: "1" (a GPU here or '
        "in requests makes the device default to cuda); at most 64 resources, quantities of at "
        "most 64 characters.",
    )


class EnvVar(_Model):
    """A variable of a sidecar."""

    # Not NVIDIA_*: the node's container toolkit acts on them in any container.
    name: Annotated[str, Field(pattern=ENV_NAME, max_length=128), rules.node_env_name_rule()] = (
        Field(
            description="Variable name, at most 128 characters; not NVIDIA_*, which the node's "
            "container toolkit acts on in any container."
        )
    )
    value: Annotated[str, Field(pattern=TEXT, max_length=32768)] = Field(
        default="",
        description="Value, passed as written (default empty); at most 32768 characters, no "
        "control characters but tab, CR and LF.",
    )


class EvaluationEnvVar(EnvVar):
    """A variable of the evaluation container."""

    name: EvaluationEnvName = Field(
        description="Variable name, at most 128 characters. Not one the poller sets (HF_HOME, "
        "the offline switches, LMEVAL_*...) nor one that loads code or acts on the node "
        "(LD_*, PYTHON* but a few, OPENSSL_*, NVIDIA_*, PATH, GIT_*...): the message names "
        "the family."
    )


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
_ARGV_BOUND = (
    f"at most {rules.SIDECAR_ARGV_ITEMS_MAX} strings of at most 4096 characters, "
    f"{rules.SIDECAR_ARGV_BYTES_MAX} bytes in all (Linux refuses one argv string over 128 KiB)"
)


class Toleration(_Model):
    """A toleration of the job pod, as in a Pod."""

    key: Annotated[str, Field(pattern=rf"^({_QUALIFIED})?$", max_length=316)] | None = Field(
        default=None,
        description="The taint key tolerated (a label key, at most 316 characters); empty with "
        "operator Exists tolerates every taint.",
    )
    operator: Annotated[str, Field(pattern=r"^(Exists|Equal)$")] | None = Field(
        default=None,
        description="Exists (any value) or Equal (the value below); Kubernetes' default Equal "
        "when omitted.",
    )
    value: Annotated[str, Field(pattern=LABEL_VALUE, max_length=63)] | None = Field(
        default=None,
        description="The taint value matched with Equal (at most 63 characters, a label "
        "value's limit).",
    )
    effect: Annotated[str, Field(pattern=r"^(NoSchedule|PreferNoSchedule|NoExecute)$")] | None = (
        Field(
            default=None,
            description="The taint effect tolerated: NoSchedule, PreferNoSchedule or NoExecute; "
            "every effect when omitted.",
        )
    )
    toleration_seconds: int | None = Field(
        default=None,
        description="With NoExecute: how long the pod stays on a node after the taint appears "
        "(a pod taken off its node ends the job Failed); forever when omitted.",
    )


class ContainerPort(_Model):
    """A port a sidecar listens on, as in a Pod (informational: no Service is made)."""

    container_port: Annotated[int, Field(ge=1, le=65535)] = Field(
        description="Port number, 1 to 65535."
    )
    name: (
        Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=15)] | None
    ) = Field(default=None, description="Port name (at most 15 characters, as in a Pod).")
    protocol: Annotated[str, Field(pattern=r"^(TCP|UDP|SCTP)$")] | None = Field(
        default=None, description="TCP, UDP or SCTP; Kubernetes' default TCP when omitted."
    )


class Sidecar(_Model):
    """A container beside the evaluation, held to the restricted profile."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] = Field(
        description="Container name (a DNS label of at most 63 characters), not one of the "
        "poller's own containers (lmeval, install-driver, the Git clone's). It runs with the "
        "pod's restricted security context and a writable /tmp of its own only."
    )
    image: Annotated[str, Field(pattern=IMAGE, max_length=512)] = Field(
        description="The container image, e.g. registry.example.com/proxy:1.2 (at most 512 "
        "characters, no spaces or control characters)."
    )
    command: ArgvList | None = Field(
        default=None,
        description=f"The entrypoint, as in a Pod (the image's when omitted): {_ARGV_BOUND}. "
        "The kubelet expands $(VAR) in it.",
    )
    args: ArgvList | None = Field(
        default=None,
        description=f"Arguments to the entrypoint, as in a Pod: {_ARGV_BOUND}.",
    )
    env: SidecarEnv | None = Field(
        default=None,
        description=f"Environment variables, at most {rules.SIDECAR_ENV_ITEMS_MAX} and "
        f"{rules.CONTAINER_ENV_BYTES_MAX} bytes in all, as execve counts them.",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="The sidecar's own requests and limits."
    )
    ports: list[ContainerPort] | None = Field(
        default=None, description="Ports the sidecar listens on, for the record, as in a Pod."
    )


# -- pod placement: affinity (Kubernetes' own shape) -----------------------------------
_NODE_OPERATOR = r"^(In|NotIn|Exists|DoesNotExist|Gt|Lt)$"
_LABEL_OPERATOR = r"^(In|NotIn|Exists|DoesNotExist)$"
_Values = Annotated[list[LabelValue], Field(max_length=64)]


class NodeSelectorRequirement(_Model):
    """A rule on a node label, as in a Pod's node affinity."""

    key: LabelKey = Field(description=f"The node label's key ({_KEY}).")
    operator: Annotated[str, Field(pattern=_NODE_OPERATOR)] = Field(
        description="In, NotIn (the label's value is, or is not, one of values), Exists, "
        "DoesNotExist (no values), Gt or Lt (one integer value, compared)."
    )
    values: _Values | None = Field(default=None, description=f"The values compared: {_VALUES}.")


class NodeFieldRequirement(_Model):
    """A rule on the node's name (its only selectable field)."""

    key: Annotated[str, Field(pattern=r"^metadata[.]name$")] = Field(
        description="metadata.name, the only node field Kubernetes selects on."
    )
    operator: Annotated[str, Field(pattern=r"^(In|NotIn)$")] = Field(
        description="In or NotIn: the node's name is, or is not, one of values."
    )
    values: (
        Annotated[
            list[Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)]], Field(max_length=64)
        ]
        | None
    ) = Field(
        default=None,
        description=f"Node names: at most 64 ({_ROOMY}), each at most 253 characters.",
    )


class NodeSelectorTerm(_Model):
    """Node rules that must all hold (the terms of a list are ORed)."""

    match_expressions: Annotated[list[NodeSelectorRequirement], Field(max_length=32)] | None = (
        Field(default=None, description=f"Rules on node labels, at most 32 ({_ROOMY}).")
    )
    match_fields: Annotated[list[NodeFieldRequirement], Field(max_length=32)] | None = Field(
        default=None, description=f"Rules on the node's name, at most 32 ({_ROOMY})."
    )


class NodeSelector(_Model):
    """Nodes the pod may run on: any one of the terms."""

    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=32)] = (
        Field(description=f"The terms, ORed: 1 to 32 ({_ROOMY}).")
    )


class PreferredSchedulingTerm(_Model):
    """Nodes the scheduler prefers, with a weight."""

    weight: Annotated[int, Field(ge=1, le=100)] = Field(
        description="How much a matching node counts, 1 to 100 (as in a Pod)."
    )
    preference: NodeSelectorTerm = Field(description="The nodes preferred.")


class NodeAffinity(_Model):
    """Which nodes the job pod may, or should, run on."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None,
        description="Nodes the pod must run on; the pod stays Pending (and the job fails "
        "after pod-pending-timeout) if none fits.",
    )
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[PreferredSchedulingTerm], Field(max_length=32)] | None
    ) = Field(
        default=None,
        description=f"Nodes the scheduler prefers, weighted; at most 32 terms ({_ROOMY}).",
    )


class LabelSelectorRequirement(_Model):
    """A rule on a label, as in a Kubernetes label selector."""

    key: LabelKey = Field(description=f"The label's key ({_KEY}).")
    operator: Annotated[str, Field(pattern=_LABEL_OPERATOR)] = Field(
        description="In, NotIn (the value is, or is not, one of values), Exists or "
        "DoesNotExist (no values)."
    )
    values: _Values | None = Field(default=None, description=f"The values compared: {_VALUES}.")


class LabelSelector(_Model):
    """A Kubernetes label selector: every label and rule must match."""

    match_labels: dict[LabelKey, LabelValue] | None = Field(
        default=None,
        description="Labels that must be present with these values: at most 64, values of at "
        "most 63 characters.",
    )
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=32)] | None = (
        Field(default=None, description=f"Label rules, at most 32 ({_ROOMY}).")
    )


class PodAffinityTerm(_Model):
    """Pods to be near (or away from), and what near means."""

    label_selector: LabelSelector | None = Field(
        default=None, description="The pods concerned, by their labels."
    )
    namespaces: (
        Annotated[
            list[Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]], Field(max_length=64)
        ]
        | None
    ) = Field(
        default=None,
        description="Namespaces of those pods (the job's own when omitted, with no "
        f"namespaceSelector): at most 64 ({_ROOMY}), names of at most 63 characters.",
    )
    namespace_selector: LabelSelector | None = Field(
        default=None, description="Namespaces of those pods, by their labels."
    )
    topology_key: LabelKey = Field(
        description="The node label whose equal values mean near, e.g. kubernetes.io/hostname "
        f"or topology.kubernetes.io/zone ({_KEY})."
    )


class WeightedPodAffinityTerm(_Model):
    """A preferred pod (anti-)affinity term, with a weight."""

    weight: Annotated[int, Field(ge=1, le=100)] = Field(
        description="How much the term counts, 1 to 100 (as in a Pod)."
    )
    pod_affinity_term: PodAffinityTerm = Field(description="The pods and the topology.")


class PodAffinity(_Model):
    """Pods to run near (podAffinity) or away from (podAntiAffinity)."""

    required_during_scheduling_ignored_during_execution: (
        Annotated[list[PodAffinityTerm], Field(max_length=32)] | None
    ) = Field(
        default=None,
        description=f"Terms that must all hold when the pod is scheduled; at most 32 ({_ROOMY}).",
    )
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[WeightedPodAffinityTerm], Field(max_length=32)] | None
    ) = Field(
        default=None,
        description=f"Terms the scheduler prefers, weighted; at most 32 ({_ROOMY}).",
    )


class Affinity(_Model):
    """The job pod's affinity, as in a Pod (node affinity, pod affinity and anti-affinity)."""

    node_affinity: NodeAffinity | None = Field(
        default=None, description="Which nodes the job pod may, or should, run on."
    )
    pod_affinity: PodAffinity | None = Field(
        default=None,
        description="Pods the job pod must, or should, run near (e.g. a model server).",
    )
    pod_anti_affinity: PodAffinity | None = Field(
        default=None,
        description="Pods the job pod must, or should, run away from (e.g. other evaluations).",
    )


class PodOverride(_Model):
    """The restricted subset of the job pod that a job may shape."""

    resources: ResourceRequirements | None = Field(
        default=None,
        description="CPU, memory and accelerator requests and limits of the evaluation "
        "container; they win over spec.size's preset, key by key.",
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
        default=None,
        description="Node labels the pod must match, as a Pod's nodeSelector: at most 64, "
        "values of at most 63 characters.",
    )
    tolerations: list[Toleration] | None = Field(
        default=None, description="Taints of nodes the pod tolerates, as in a Pod."
    )
    affinity: Affinity | None = Field(
        default=None,
        description="Pod affinity (nodeAffinity, podAffinity, podAntiAffinity), as in a Pod.",
    )
    priority_class_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = (
        Field(
            default=None,
            description="PriorityClass of the job pod, at most 253 characters (a name). The "
            "cluster's priority admission and quotas apply as to any pod of the namespace; a "
            "class that does not exist fails the job.",
        )
    )
    sidecars: Annotated[list[Sidecar], Field(max_length=8)] | None = Field(
        default=None,
        description="Extra containers beside the evaluation (e.g. a proxy to the model or "
        "storage), at most 8. They get the same restricted security context; the admission "
        "policy allows them only to users who may create pods in the namespace themselves.",
    )
