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
(`ENV_FAMILIES`, `env_name_problem`): each family says in the refusal why
(the loader, an interpreter, a library that loads plugins, the node, the
poller's own); the schema refuses them, and ``podspec`` checks again before
it builds a pod. One rule reads two fields, so it sits on the spec rather than
on a field: ``trust_remote_code`` in ``spec.modelArgs`` needs
``spec.allowCodeExecution`` (`remote_code_rule`). Every bound here is also what keeps the CRD's CEL
within the apiserver's cost budget: rules over lists need maxItems.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

__all__ = [
    "ALLOWED_PYTHON_ENV",
    "ARGV_TOKEN_BYTES_MAX",
    "CODE_EVAL_ENV",
    "CONTAINER_ENV_BYTES_MAX",
    "CONTAINER_ENV_ITEMS_MAX",
    "ENV_FAMILIES",
    "ENV_SECRETS_MAX",
    "FILE_SECRETS_MAX",
    "NODE_ENV_FAMILY",
    "OFFLINE_ENV",
    "REMOTE_CODE_ARG",
    "REMOTE_CODE_OFF",
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
    "EnvFamily",
    "argv_list_rule",
    "env_list_rule",
    "env_name_problem",
    "env_name_rule",
    "joined_pairs_rule",
    "joined_tasks_rule",
    "mount_path_problem",
    "mount_path_rule",
    "node_env_name_problem",
    "node_env_name_rule",
    "poller_keys_rule",
    "remote_code_problem",
    "remote_code_rule",
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
# What the poller sets when spec.allowCodeExecution (and the setting) allow
# code: the `code_eval` metric runs model-written code only with it.
CODE_EVAL_ENV = "HF_ALLOW_CODE_EVAL"


@dataclass(frozen=True)
class EnvFamily:
    """Variables a job may not set, for one reason: exact `names` and name `prefixes`."""

    reason: str
    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    def holds(self, name: str) -> bool:
        return name in self.names or name.startswith(self.prefixes)


# PYTHON* variables that load nothing and leave the driver's output alone.
# Not PYTHONIOENCODING: it re-encodes the driver's stdout, which carries the
# marker protocol (utf-16 would make every marker unreadable).
ALLOWED_PYTHON_ENV = frozenset(
    {"PYTHONHASHSEED", "PYTHONUTF8", "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER"}
)
# Refused in every container of the job pod, the job's sidecars too: the node
# acts on them, whatever runs in the container.
NODE_ENV_FAMILY = EnvFamily(
    "the NVIDIA container toolkit reads them on the node when the container starts "
    "(NVIDIA_*: NVIDIA_VISIBLE_DEVICES=all exposes every GPU of the node)",
    prefixes=("NVIDIA_",),
)
# Each family names what it is in the refusal, so that a user sees why. The
# guarantee they serve: a job loads no code into the driver or lm_eval that
# the image and the settings did not put there, and reaches nothing on the
# node beyond its pod. A variable read by a library that loads a module, a
# plugin or a configuration that names one is such a door.
ENV_FAMILIES = (
    EnvFamily(
        "the poller sets it (the offline switch, the code switch, the driver's paths and "
        "options: " + ", ".join([*OFFLINE_ENV, CODE_EVAL_ENV]) + ", HF_HOME, HF_HUB_CACHE, "
        "HOME, LMEVAL_*)",
        frozenset({*OFFLINE_ENV, CODE_EVAL_ENV, "HF_HOME", "HF_HUB_CACHE", "HOME"}),
        ("LMEVAL_",),
    ),
    EnvFamily(
        # glibc's "unsecure" variables (sysdeps/generic/unsecure-envvars.h), the
        # ones it drops for setuid programs because they load code or redirect
        # files; LD_* is the dynamic loader's (LD_PRELOAD, LD_AUDIT...).
        "glibc's loader and its unsecure variables load libraries or redirect files "
        "(LD_*, GCONV_PATH, GLIBC_TUNABLES, LOCPATH, TMPDIR...)",
        frozenset(
            {
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
        ),
        ("LD_",),
    ),
    EnvFamily(
        # PYTHONPATH, PYTHONSTARTUP, PYTHONWARNINGS, PYTHONBREAKPOINT import
        # modules; PYTHONSAFEPATH is the poller's and the driver's.
        "Python's own variables import code or change the driver's output (PYTHON* other "
        "than " + ", ".join(sorted(ALLOWED_PYTHON_ENV)) + ")",
        prefixes=("PYTHON",),
    ),
    EnvFamily(
        # OPENSSL_CONF names a configuration that loads providers and engines
        # (shared libraries) into every process that initialises OpenSSL: the
        # driver too, through Python's ssl module.
        "OpenSSL loads providers, engines and configuration named there into the driver "
        "(OPENSSL_*: OPENSSL_CONF, OPENSSL_MODULES, OPENSSL_ENGINES)",
        prefixes=("OPENSSL_",),
    ),
    EnvFamily(
        "Hugging Face libraries run code from datasets, models or modules with them "
        "(HF_DATASETS_TRUST_REMOTE_CODE, HF_MODULES_CACHE); code needs "
        "spec.allowCodeExecution",
        frozenset({"HF_DATASETS_TRUST_REMOTE_CODE", "HF_MODULES_CACHE"}),
    ),
    EnvFamily(
        # The CUDA driver and NVTX load an injection library at initialisation;
        # NCCL loads its network, tuner, profiler and environment plugins (and
        # reads NCCL_CONF_FILE, which may name them); ROCm's HSA runtime and the
        # OpenCL and Vulkan loaders load tool libraries, drivers and layers.
        "GPU runtimes load the injection, plugin and tool libraries named there "
        "(CUDA_INJECTION64_PATH, NVTX_INJECTION64_PATH, NCCL_*_PLUGIN, NCCL_CONF_FILE, "
        "HSA_TOOLS_LIB, OCL_ICD_*, VK_*)",
        frozenset(
            {
                "CUDA_INJECTION32_PATH",
                "CUDA_INJECTION64_PATH",
                "NVTX_INJECTION32_PATH",
                "NVTX_INJECTION64_PATH",
                "NCCL_NET_PLUGIN",
                "NCCL_TUNER_PLUGIN",
                "NCCL_PROFILER_PLUGIN",
                "NCCL_ENV_PLUGIN",
                "NCCL_CONF_FILE",
                "HSA_TOOLS_LIB",
                "ROCP_TOOL_LIB",
                "ROCP_TOOL_LIBRARIES",
                "OCL_ICD_FILENAMES",
                "OCL_ICD_VENDORS",
            }
        ),
        ("VK_",),
    ),
    NODE_ENV_FAMILY,
    EnvFamily(
        "the OpenMP runtime loads the tool libraries named there (OMP_TOOL, OMP_TOOL_LIBRARIES)",
        frozenset({"OMP_TOOL", "OMP_TOOL_LIBRARIES"}),
    ),
    EnvFamily(
        # Triton runs ptxas and friends from TRITON_*_PATH, dlopens libcuda from
        # TRITON_LIBCUDA_PATH and compiled kernels from its cache; torch loads
        # compiled extensions and inductor kernels from these directories.
        "Triton and torch run tools and load compiled libraries from there (TRITON_*, "
        "TORCHINDUCTOR_CACHE_DIR, TORCH_EXTENSIONS_DIR)",
        frozenset({"TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR"}),
        ("TRITON_",),
    ),
    EnvFamily(
        # GLib's GIO modules, GTK modules, GStreamer plugins, Qt plugins, image
        # loaders, GObject typelibs, and libglvnd's EGL/GLX vendor libraries.
        "desktop and graphics libraries load the modules named there (GIO_*, GTK_MODULES, "
        "GST_PLUGIN_*, QT_PLUGIN_PATH, __EGL_VENDOR_LIBRARY_*...)",
        frozenset(
            {
                "GTK_MODULES",
                "GTK_PATH",
                "GTK_EXE_PREFIX",
                "QT_PLUGIN_PATH",
                "GDK_PIXBUF_MODULE_FILE",
                "GDK_PIXBUF_MODULEDIR",
                "GI_TYPELIB_PATH",
                "LIBGL_DRIVERS_PATH",
                "__GLX_VENDOR_LIBRARY_NAME",
            }
        ),
        ("GIO_", "GST_PLUGIN_", "__EGL_VENDOR_LIBRARY_"),
    ),
    EnvFamily(
        "other interpreters and shells run code named there (BASH_ENV, ENV, PERL5OPT, "
        "PERL5LIB, RUBYOPT, NODE_OPTIONS, JAVA_TOOL_OPTIONS...)",
        frozenset(
            {
                "BASH_ENV",
                "ENV",
                "SHELLOPTS",
                "BASHOPTS",
                "PS4",
                "PERL5OPT",
                "PERL5LIB",
                "PERLLIB",
                "PERL5DB",
                "RUBYOPT",
                "RUBYLIB",
                "NODE_OPTIONS",
                "NODE_PATH",
                "JAVA_TOOL_OPTIONS",
                "_JAVA_OPTIONS",
                "JDK_JAVA_OPTIONS",
                "CLASSPATH",
            }
        ),
    ),
    EnvFamily(
        # PATH chooses the program the container runtime starts (`python`) and
        # every one started by name after it; a read-only claim may hold
        # executables. Git runs commands its configuration names.
        "they choose which programs run (PATH; GIT_*: configuration, exec path, SSH and "
        "askpass commands)",
        frozenset({"PATH"}),
        ("GIT_",),
    ),
)
# The union of the families, for readers that want one list.
RESERVED_ENV_NAMES = frozenset(n for family in ENV_FAMILIES for n in family.names)
RESERVED_ENV_PREFIXES = tuple(p for family in ENV_FAMILIES for p in family.prefixes)

# -- model arguments that run code -----------------------------------------------------
# transformers (and vLLM) import Python from the model's repository when it is
# truthy. lm_eval turns a --model_args value into a boolean ("true"/"false" in
# any case), None ("none"), an int, a float, or else the string itself, which is
# truthy unless empty: so only the values below are surely off, and any other
# value counts as on (refusing "none" or "0.0" costs a user one word; admitting
# a truthy string would run code).
REMOTE_CODE_ARG = "trust_remote_code"
REMOTE_CODE_OFF = ("false", "0")
_REMOTE_CODE_REASON = (
    f"{REMOTE_CODE_ARG} other than {' or '.join(REMOTE_CODE_OFF)} lets the model's repository "
    "run Python in the evaluation: it needs spec.allowCodeExecution: true (and "
    "allow-code-execution: true in ConfigMap lmeval-poller-config), or set it to false"
)


def remote_code_problem(
    model_args: Iterable[tuple[str, str]], allow_code_execution: bool | None
) -> str | None:
    """Why spec.modelArgs (name, value pairs) may not run as they are, or None."""
    if allow_code_execution:
        return None
    for index, (name, value) in enumerate(model_args):
        # lm_eval strips the value and compares it in lower case.
        if name == REMOTE_CODE_ARG and value.strip().lower() not in REMOTE_CODE_OFF:
            found = f"{REMOTE_CODE_ARG}={value}"
            return f"spec.modelArgs[{index}]: {_REMOTE_CODE_REASON}; it is {found}"
    return None


def remote_code_rule() -> dict[str, str]:
    """The same rule in CEL, on the spec (it reads two fields)."""
    return {
        "rule": "!has(self.modelArgs) || "
        "(has(self.allowCodeExecution) && self.allowCodeExecution) || "
        f"!self.modelArgs.exists(p, p.name == {_literal(REMOTE_CODE_ARG)} && "
        f"!(p.value.trim().lowerAscii() in {_list(REMOTE_CODE_OFF)}))",
        "message": _REMOTE_CODE_REASON,
        "fieldPath": ".modelArgs",
    }


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


def _env_family(name: str) -> EnvFamily | None:
    if name in ALLOWED_PYTHON_ENV:
        return None
    return next((family for family in ENV_FAMILIES if family.holds(name)), None)


def env_name_problem(name: str) -> str | None:
    """Why a job may not set variable `name` in its evaluation container, or None."""
    family = _env_family(name)
    return None if family is None else f"{name} cannot be set by a job: {family.reason}"


def _family_test(family: EnvFamily) -> str:
    tests = [f"self.startsWith({_literal(p)})" for p in family.prefixes]
    if family.names:
        tests.insert(0, f"self in {_list(family.names)}")
    return " || ".join(tests)


def _family_message(families: Sequence[EnvFamily]) -> str:
    """CEL: `self` and the reason of the first family that holds it (each string
    bounded: `self` is at most 128 characters)."""
    expression = _literal(" cannot be set by a job")
    for family in reversed(families):
        reason = _literal(f" cannot be set by a job: {family.reason}")
        expression = f"({_family_test(family)}) ? {reason} : {expression}"
    return f"self + ({expression})"


def env_name_rule() -> Cel:
    refused = " || ".join(f"({_family_test(family)})" for family in ENV_FAMILIES)
    return Cel(
        rule=f"self in {_list(ALLOWED_PYTHON_ENV)} || !({refused})",
        message="this variable cannot be set by a job: it loads code into the driver or "
        "lm_eval, acts on the node, or the poller sets it",
        message_expression=_family_message(ENV_FAMILIES),
        problem=env_name_problem,
    )


def node_env_name_problem(name: str) -> str | None:
    """Why no container of the job pod (a sidecar included) may set `name`, or None."""
    if NODE_ENV_FAMILY.holds(name):
        return f"{name} cannot be set by a job: {NODE_ENV_FAMILY.reason}"
    return None


def node_env_name_rule() -> Cel:
    """A sidecar's variable: none that the node acts on."""
    return Cel(
        rule=f"!({_family_test(NODE_ENV_FAMILY)})",
        message=f"this variable cannot be set by a job: {NODE_ENV_FAMILY.reason}",
        message_expression=_family_message([NODE_ENV_FAMILY]),
        problem=node_env_name_problem,
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
