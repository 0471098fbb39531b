"""Spec rules the apiserver checks in CEL and pydantic checks again in Python.

A pattern or a length carries over from a pydantic field to the CRD by
itself; a rule about a whole list or map (the size of the argv token a list
is joined into, a key the poller keeps for itself, a variable or a mount
that would load code into the driver) does not. Each such rule is a `Cel`
placed in the field's ``Annotated[...]``: it holds the CEL expression the CRD
carries in ``x-kubernetes-validations`` and the same rule in Python, side by
side; both messages open with the same words (pydantic's then adds the
measured size or the offending keys). The apiserver refuses a job that breaks it with the field's
path; the poller validates the spec again, so a job stored under an older
schema ends Failed with the same message instead of a pod that never starts.

The sizes are in bytes because the kernel counts bytes: ``execve`` refuses
one argv or environment string over 128 KiB (MAX_ARG_STRLEN) with "Argument
list too long", while the apiserver's ``maxLength`` counts characters (up to
4 bytes each in UTF-8). CEL's ``size(bytes(s))`` is the byte count.

This module is also the one list of environment variables a job may not set
(`env_name_problem`): the schema refuses them, and ``podspec`` checks again
before it builds a pod. Every bound here is also what keeps the CRD's CEL
within the apiserver's cost budget: rules over lists need maxItems.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

__all__ = [
    "ALLOWED_PYTHON_ENV",
    "ARGV_TOKEN_BYTES_MAX",
    "CONTAINER_ENV_BYTES_MAX",
    "CONTAINER_ENV_ITEMS_MAX",
    "ENV_SECRETS_MAX",
    "FILE_SECRETS_MAX",
    "OFFLINE_ENV",
    "RESERVED_ENV_NAMES",
    "RESERVED_ENV_PREFIXES",
    "RESERVED_KEY_PREFIX",
    "RESERVED_MOUNT_PATHS",
    "RESERVED_MOUNT_PREFIXES",
    "RESERVED_MOUNT_ROOTS",
    "SIDECAR_ARGV_BYTES_MAX",
    "SIDECAR_ARGV_ITEMS_MAX",
    "SIDECAR_ENV_ITEMS_MAX",
    "VALIDATIONS",
    "Cel",
    "argv_list_rule",
    "env_list_rule",
    "env_name_problem",
    "env_name_rule",
    "joined_pairs_rule",
    "joined_tasks_rule",
    "mount_path_problem",
    "mount_path_rule",
    "poller_keys_rule",
    "security_annotations_rule",
]

VALIDATIONS = "x-kubernetes-validations"

# -- sizes ----------------------------------------------------------------------
# One lm_eval option built from a list (--model_args=..., --gen_kwargs=...,
# --tasks=...): a quarter of MAX_ARG_STRLEN, so each token stays far below it.
ARGV_TOKEN_BYTES_MAX = 32 * 1024
# The evaluation container's spec.pod.env, counted as the kernel does
# ("NAME=value" plus its NUL per variable), and the number of variables.
CONTAINER_ENV_BYTES_MAX = 64 * 1024
CONTAINER_ENV_ITEMS_MAX = 128
# spec.envSecrets entries. Their values come from Secrets and are not known at
# admission: only their names count here.
ENV_SECRETS_MAX = 64
# spec.fileSecrets entries (a bound the CEL cost estimate of the mount-path
# rule needs; the admission policy checks at most 8 distinct Secrets anyway,
# unless the requester may read them all).
FILE_SECRETS_MAX = 32
# A sidecar's variables: fewer than the evaluation's, because the CEL cost
# estimate of the byte count (8 sidecars x items x 32768-character values)
# must fit the apiserver's budget: 128 exceeded it 1.35 times.
SIDECAR_ENV_ITEMS_MAX = 64
# A sidecar's command and its args, each: the strings with their NULs, and
# how many strings.
SIDECAR_ARGV_BYTES_MAX = 32 * 1024
SIDECAR_ARGV_ITEMS_MAX = 256

# -- environment a job may not set ------------------------------------------------
# What the poller sets to keep the evaluation offline.
OFFLINE_ENV = (
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_EVALUATE_OFFLINE",
)
RESERVED_ENV_NAMES = frozenset(
    {
        # Set by the poller: the offline switch and the driver's paths.
        *OFFLINE_ENV,
        "HF_HOME",
        "HF_HUB_CACHE",
        "HOME",
        # glibc's "unsecure" variables (sysdeps/generic/unsecure-envvars.h),
        # the ones it drops for setuid programs because they load code or
        # redirect files; LD_* is a prefix below.
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TMPDIR",
        "TZDIR",
    }
)
# LD_*: the dynamic loader (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT...). PYTHON*:
# the interpreter that runs the driver (PYTHONPATH, PYTHONSTARTUP,
# PYTHONWARNINGS and PYTHONBREAKPOINT import modules). LMEVAL_*: the driver's own.
RESERVED_ENV_PREFIXES = ("LD_", "LMEVAL_", "PYTHON")
# PYTHON* variables that load nothing and leave the driver's output alone.
# Not PYTHONIOENCODING: it re-encodes the driver's stdout, which carries the
# marker protocol (utf-16 would make every marker unreadable).
ALLOWED_PYTHON_ENV = frozenset(
    {"PYTHONHASHSEED", "PYTHONUTF8", "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER"}
)
_ENV_REASON = (
    "the poller sets it, or it changes what code the driver and lm_eval load "
    "(LD_*, LMEVAL_*, PYTHON* other than " + ", ".join(sorted(ALLOWED_PYTHON_ENV)) + ", "
    "and glibc's unsecure variables such as GCONV_PATH and TMPDIR)"
)

# -- where a fileSecret may not be mounted -------------------------------------------
# A Secret mounted over a directory replaces it: over the interpreter's or the
# driver's code, or glibc's preload list, it loads the Secret's files into the
# driver as surely as LD_PRELOAD. Refused: these directories and everything
# under them (code, the kernel's, the poller's own mounts: /tmp, /outputs,
# /cache/huggingface, /opt/lmeval-driver, /opt/lmeval/tasks)...
RESERVED_MOUNT_ROOTS = (
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr",
    "/opt",
    "/proc",
    "/sys",
    "/dev",
    "/tmp",  # noqa: S108 (a path refused, not a file made)
    "/outputs",
    "/cache",
)
# ... "/" and "/etc" themselves (a mount there hides /etc/ld.so.preload's
# absence), and these prefixes of /etc (ld.so.preload and ld.so.conf*, and
# Debian's /etc/python3.X/sitecustomize.py, imported at every start).
# /etc/ssl/certs and the like stay allowed: a CA bundle is a common fileSecret.
RESERVED_MOUNT_PATHS = ("/", "/etc")
RESERVED_MOUNT_PREFIXES = ("/etc/ld.so", "/etc/python")
_MOUNT_REASON = (
    "a Secret mounted there would replace code the driver or lm_eval loads, or a path the "
    "poller mounts (not " + ", ".join(RESERVED_MOUNT_ROOTS) + " nor under them, not / or /etc, "
    "not /etc/ld.so* or /etc/python*)"
)

# -- pod labels and annotations the poller keeps for itself ----------------------
RESERVED_KEY_PREFIX = "foundation-model-stack.github.com/"
_MANAGED_BY = "app.kubernetes.io/managed-by"


@dataclass(frozen=True)
class Cel:
    """A rule checked by the apiserver (`rule`: CEL with ``self`` the field's
    value) and by pydantic (`problem`: the same rule in Python, returning the
    message, or None when the value is fine).

    The apiserver says `message`, or evaluates `message_expression` (CEL)
    when given. Its cost estimator refuses any messageExpression that builds
    a string of unbounded size: concatenating ``string(n)``, a map's key or
    ``join()`` all count as unbounded. So sizes and keys get a fixed
    `message`, and `problem` says the same words, then the measured size or
    the offending keys.
    """

    rule: str
    message: str
    problem: Callable[[Any], str | None]
    message_expression: str | None = None

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        def check(value: Any) -> Any:
            if (text := self.problem(value)) is not None:
                raise ValueError(text)
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        validation = {"rule": self.rule, "message": self.message}
        if self.message_expression is not None:
            validation["messageExpression"] = self.message_expression
        json_schema.setdefault(VALIDATIONS, []).append(validation)
        return json_schema


def _literal(text: str) -> str:
    """`text` as a CEL string literal (our texts need no escapes: refuse any)."""
    if '"' in text or "\\" in text:
        raise ValueError(f"not a plain CEL literal: {text!r}")
    return f'"{text}"'


def _list(names: Iterable[str]) -> str:
    return "[" + ", ".join(_literal(n) for n in sorted(names)) + "]"


def _utf8(text: str) -> int:
    return len(text.encode())


# -- rules --------------------------------------------------------------------------


def env_name_problem(name: str) -> str | None:
    """Why a job may not set variable `name` in its evaluation container, or None."""
    if name in ALLOWED_PYTHON_ENV:
        return None
    if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
        return f"{name} cannot be set by a job: {_ENV_REASON}"
    return None


def env_name_rule() -> Cel:
    prefixes = " || ".join(f"self.startsWith({_literal(p)})" for p in RESERVED_ENV_PREFIXES)
    return Cel(
        rule=f"self in {_list(ALLOWED_PYTHON_ENV)} || "
        f"!(self in {_list(RESERVED_ENV_NAMES)} || {prefixes})",
        message=f"this variable cannot be set by a job: {_ENV_REASON}",
        # `self` is at most 128 characters: a bounded message.
        message_expression=f"self + {_literal(' cannot be set by a job: ' + _ENV_REASON)}",
        problem=env_name_problem,
    )


def mount_path_problem(path: str) -> str | None:
    """Why a fileSecret may not be mounted at `path` (normalised, absolute), or None."""
    if (
        path in RESERVED_MOUNT_PATHS
        or any(path == root or path.startswith(root + "/") for root in RESERVED_MOUNT_ROOTS)
        or path.startswith(RESERVED_MOUNT_PREFIXES)
    ):
        return f"{path}: {_MOUNT_REASON}"
    return None


def mount_path_rule() -> Cel:
    # Spelled out rather than a list.exists(): cheaper in the cost estimate.
    tests = [f"self == {_literal(path)}" for path in RESERVED_MOUNT_PATHS]
    for root in RESERVED_MOUNT_ROOTS:
        tests += [f"self == {_literal(root)}", f"self.startsWith({_literal(root + '/')})"]
    tests += [f"self.startsWith({_literal(p)})" for p in RESERVED_MOUNT_PREFIXES]
    return Cel(
        rule=f"!({' || '.join(tests)})",
        message=f"this path is reserved: {_MOUNT_REASON}",
        # `self` is at most 1024 characters: a bounded message.
        message_expression=f"self + {_literal(': ' + _MOUNT_REASON)}",
        problem=mount_path_problem,
    )


def _size_rule(cel_size: str, size: Callable[[Any], int], limit: int, message: str) -> Cel:
    """`size` (CEL `cel_size`) at most `limit` bytes."""

    def problem(value: Any) -> str | None:
        measured = size(value)
        return f"{message}; these take {measured}" if measured > limit else None

    return Cel(rule=f"{cel_size} <= {limit}", message=message, problem=problem)


def _joined_rule(flag: str, cel_size: str, size: Callable[[Any], int]) -> Cel:
    return _size_rule(
        cel_size,
        size,
        ARGV_TOKEN_BYTES_MAX,
        f"joined into lm_eval's --{flag}= option, these may take at most "
        f"{ARGV_TOKEN_BYTES_MAX} bytes (UTF-8)",
    )


def joined_pairs_rule(flag: str) -> Cel:
    """A list of {name, value} joined into one ``--flag=n=v,n=v`` token."""
    return _joined_rule(
        flag,
        "self.map(p, size(bytes(p.name)) + size(bytes(p.value)) + 2).sum() - 1",
        lambda pairs: sum(_utf8(p.name) + _utf8(p.value) + 2 for p in pairs) - 1,
    )


def joined_tasks_rule() -> Cel:
    """The task names, joined into one ``--tasks=a,b`` token."""
    return _joined_rule(
        "tasks",
        "self.map(t, size(bytes(t)) + 1).sum() - 1",
        lambda tasks: sum(_utf8(t) + 1 for t in tasks) - 1,
    )


def env_list_rule() -> Cel:
    """Environment variables, each ``NAME=value`` plus the NUL ``execve`` counts."""
    return _size_rule(
        "self.map(e, size(bytes(e.name)) + (has(e.value) ? size(bytes(e.value)) : 0) + 2).sum()",
        lambda env: sum(_utf8(e.name) + _utf8(e.value) + 2 for e in env),
        CONTAINER_ENV_BYTES_MAX,
        f"the variables may take at most {CONTAINER_ENV_BYTES_MAX} bytes "
        "(UTF-8, NAME=value and a NUL each)",
    )


def argv_list_rule() -> Cel:
    """A sidecar's command or args: each string plus its NUL."""
    return _size_rule(
        "self.map(s, size(bytes(s)) + 1).sum()",
        lambda strings: sum(_utf8(s) + 1 for s in strings),
        SIDECAR_ARGV_BYTES_MAX,
        f"the strings may take at most {SIDECAR_ARGV_BYTES_MAX} bytes (UTF-8, a NUL each)",
    )


_OWNED = (
    f"{_MANAGED_BY} and keys under {RESERVED_KEY_PREFIX} (or a subdomain of it) are set by the "
    "poller on the job pod; a job may not set them"
)
_SECURITY = "annotations that set a seccomp or AppArmor profile are not allowed"


def _owned_by_poller(key: str) -> bool:
    head, slash, _ = key.partition("/")
    prefix = head + slash
    return (
        key == _MANAGED_BY
        or prefix == RESERVED_KEY_PREFIX
        or prefix.endswith("." + RESERVED_KEY_PREFIX)
    )


def _sets_security_profile(key: str) -> bool:
    # Every form: seccomp.security.alpha.kubernetes.io/pod, the per-container
    # container.seccomp... and container.apparmor..., runtime-specific ones.
    lowered = key.lower()
    return "seccomp" in lowered or "apparmor" in lowered


def _keys_rule(cel: str, test: Callable[[str], bool], message: str) -> Cel:
    def problem(mapping: Mapping[str, str]) -> str | None:
        keys = [k for k in mapping if test(k)]
        return f"{message}: {', '.join(keys)}" if keys else None

    return Cel(rule=f"!self.exists(k, {cel})", message=message, problem=problem)


def poller_keys_rule() -> Cel:
    """Keys of spec.labels or spec.annotations: none the poller sets itself."""
    return _keys_rule(
        f"k == {_literal(_MANAGED_BY)} || k.startsWith({_literal(RESERVED_KEY_PREFIX)}) || "
        f"k.contains({_literal('.' + RESERVED_KEY_PREFIX)})",
        _owned_by_poller,
        _OWNED,
    )


def security_annotations_rule() -> Cel:
    """Keys of spec.annotations: none that sets a seccomp or AppArmor profile."""
    return _keys_rule(
        "k.lowerAscii().contains('seccomp') || k.lowerAscii().contains('apparmor')",
        _sets_security_profile,
        _SECURITY,
    )


def exactly_one_rule(*fields: str, at_most: bool = False) -> Cel:
    """An object that must set exactly one of `fields` (camelCase, as on the wire), or
    at most one with `at_most`."""
    names = " and ".join(fields) if len(fields) == 2 else ", ".join(fields)
    message = f"set {'at most' if at_most else 'exactly'} one of {names}"

    def problem(value: Any) -> str | None:
        dump = value.model_dump(by_alias=True, exclude_none=True)
        count = sum(f in dump for f in fields)
        return None if count == 1 or (at_most and count == 0) else message

    has = ", ".join(f"has(self.{f})" for f in fields)
    test = "<=" if at_most else "=="
    return Cel(rule=f"[{has}].filter(x, x).size() {test} 1", message=message, problem=problem)
