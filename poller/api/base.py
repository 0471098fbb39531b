"""The LMEvalJob API's building blocks: the patterns every string is held to,
the base model (camelCase on the wire, unknown fields refused) and the
references to Secrets a job may name.

Split from ``poller.api`` (which re-exports every name here) so that each
module stays readable; ``poller.api`` has the whole picture.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from poller.api import rules

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "ARGV_WORD",
    "ARG_NAME",
    "ARG_PAIRS_MAX",
    "ARG_VALUE",
    "BATCH_SIZE",
    "DATA_KEY",
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "ENV_NAME",
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
    "QUALIFIED_NAME",
    "QUALIFIED_NAME_LENGTH_MAX",
    "QUANTITY",
    "REPO_PATH",
    "RESOURCE_NAME",
    "SHORT_NAME",
    "SYSTEM_INSTRUCTION_CHARS_MAX",
    "TASK_NAME",
    "TEXT",
    "EnvSecret",
    "EvaluationEnvName",
    "FileSecret",
    "KeyToPath",
    "LabelKey",
    "LabelValue",
    "NameValue",
    "Quantity",
    "ResourceName",
    "SecretKeyRef",
    "SecretVolumeRef",
    "job_owner_reference",
]


API_GROUP = "foundation-model-stack.github.com"
API_VERSION = "v1beta1"
KIND = "LMEvalJob"
PLURAL = "lmevaljobs"
SHORT_NAME = "lmej"


def job_owner_reference(job_name: str, job_uid: str) -> dict[str, object]:
    """The job as controller: what every object the poller makes for a job carries
    (its pod, results and task-snapshot ConfigMaps, its managed claim), and the
    only way the poller recognises them (`poller.decisions.ownership.controller_uid`)."""
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": job_name,
        "uid": job_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


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

    name: Annotated[
        str,
        Field(
            pattern=ARG_NAME,
            max_length=128,
            description="Argument name, e.g. pretrained or temperature: a letter or _ first, "
            "then letters, digits, _ . and -; at most 128 characters.",
        ),
    ]
    value: Annotated[
        str,
        Field(
            pattern=ARG_VALUE,
            max_length=4096,
            description="Argument value, at most 4096 characters. No commas (lm_eval splits "
            "the joined pairs on them) and no control characters, tab and newline included.",
        ),
    ]


class SecretKeyRef(_Model):
    """One key of a Secret in the job's namespace."""

    name: Annotated[
        str,
        Field(
            pattern=DNS_SUBDOMAIN,
            max_length=253,
            description="Secret name (at most 253 characters, Kubernetes' limit for a name). "
            "The admission policy refuses a job whose requester may not get it.",
        ),
    ]
    key: Annotated[
        str,
        Field(
            pattern=DATA_KEY,
            max_length=253,
            description="Key in the Secret (at most 253 characters, Kubernetes' limit for a "
            "data key).",
        ),
    ]


# A variable of the evaluation container: not one the poller sets, nor one
# that loads code into the driver (LD_PRELOAD...).
EvaluationEnvName = Annotated[str, Field(pattern=ENV_NAME, max_length=128), rules.env_name_rule()]


class EnvSecret(_Model):
    """An environment variable of the evaluation taken from a Secret."""

    env: EvaluationEnvName = Field(
        description="Variable name, at most 128 characters; the same names as spec.pod.env "
        "are refused (those the poller sets and those that load code, e.g. LD_*, PYTHON*)."
    )
    secret_ref: SecretKeyRef = Field(
        description="The Secret key that holds the value; it reaches the evaluation "
        "container's environment only, never the pod's argv or status."
    )


class KeyToPath(_Model):
    """One key projected as a file, as in a Pod's volume items."""

    key: Annotated[str, Field(pattern=DATA_KEY, max_length=253)] = Field(
        description="The key to project (at most 253 characters, Kubernetes' limit for a data key)."
    )
    path: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*$", max_length=253)] = Field(
        description="File path relative to the mount path, e.g. config/token (no leading "
        "/ or -); at most 253 characters."
    )


class SecretVolumeRef(_Model):
    """The Secret of a fileSecrets entry and the keys to project."""

    secret_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] = Field(
        description="Secret name (at most 253 characters, Kubernetes' limit for a name). The "
        "admission policy refuses a job whose requester may not get it."
    )
    items: list[KeyToPath] | None = Field(
        default=None, description="Keys to project as files; all keys when omitted."
    )


class FileSecret(_Model):
    """A Secret mounted read-only as files in the evaluation container."""

    secret_ref: SecretVolumeRef = Field(description="The Secret to mount.")
    mount_path: Annotated[
        str, Field(pattern=MOUNT_PATH, max_length=1024), rules.mount_path_rule()
    ] = Field(
        description="Absolute path of the mount in normal form (no . or .. segment), at most "
        "1024 characters. Not over code or the poller's own mounts, where a file could "
        "replace what the evaluation loads: /usr, /lib*, /bin, /sbin, /opt, /tmp, /outputs, "
        "/cache, /proc, /sys, /dev, / and /etc themselves, /etc/ld.so*, /etc/python*."
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
