"""The values of ``lmeval submit``'s flags as LMEvalJob spec fields.

Why this module exists: each flag's text has a small grammar of its own
(``ENV=SECRET:KEY``, ``URL,branch=B``, ``KEY[=VALUE][:EFFECT]``...), and a
mistake there must be reported as the flag and the form it expects, before
the spec is validated as a whole (`lmeval_cli.submit`). One function per
flag value, each pure: text in, spec fragment out, or a usage `CliError`.
"""

from __future__ import annotations

from typing import Any

from lmeval_cli.errors import CliError, ExitCode
from poller.cliapi import parse_duration

__all__ = [
    "chat_template",
    "env_secrets",
    "file_secrets",
    "gate",
    "git_tasks",
    "mapping",
    "model_ca",
    "pairs",
    "seconds",
    "toleration",
]


def pairs(values: list[str], flag: str) -> list[dict[str, str]]:
    """'k=v' items (each may be a comma list) as [{name, value}]."""
    out: list[dict[str, str]] = []
    for value in values:
        for item in value.split(","):
            if not item.strip():
                continue
            name, sep, val = item.partition("=")
            if not sep or not name.strip():
                raise CliError(f"{flag} {item!r}: expected NAME=VALUE", ExitCode.USAGE)
            out.append({"name": name.strip(), "value": val})
    return out


def mapping(values: list[str], flag: str) -> dict[str, str]:
    return {p["name"]: p["value"] for p in pairs(values, flag)}


def seconds(text: str, flag: str) -> int:
    try:
        return max(0, round(parse_duration(text)))
    except ValueError as error:
        raise CliError(f"{flag}: {error}", ExitCode.USAGE) from error


def env_secrets(values: list[str]) -> list[dict[str, Any]]:
    out = []
    for value in values:
        env, sep, ref = value.partition("=")
        secret, colon, key = ref.partition(":")
        if not (sep and colon and env and secret and key):
            raise CliError(
                f"--env-secret {value!r}: expected ENV=SECRET:KEY, e.g. "
                "OPENAI_API_KEY=openai-credentials:api-key",
                ExitCode.USAGE,
            )
        out.append({"env": env, "secretRef": {"name": secret, "key": key}})
    return out


def file_secrets(values: list[str]) -> list[dict[str, Any]]:
    out = []
    for value in values:
        secret, sep, path = value.partition(":")
        if not (sep and secret and path):
            raise CliError(f"--file-secret {value!r}: expected SECRET:/MOUNT/PATH", ExitCode.USAGE)
        out.append({"secretRef": {"secretName": secret}, "mountPath": path})
    return out


GIT_KEYS = ("branch", "commit", "path", "credentialsSecret")


def git_tasks(values: list[str]) -> list[dict[str, Any]]:
    """--git-tasks URL,key=value,...: the URL has no comma (the schema says so)."""
    out = []
    for value in values:
        url, *options = value.split(",")
        source: dict[str, str] = {"url": url}
        for pair in options:
            key, sep, item = pair.partition("=")
            if not sep or key not in GIT_KEYS or not item:
                raise CliError(
                    f"--git-tasks {value!r}: after the URL, comma-separated "
                    f"{', '.join(k + '=...' for k in GIT_KEYS)}",
                    ExitCode.USAGE,
                )
            source[key] = item
        out.append({"git": source})
    return out


def toleration(text: str) -> dict[str, str]:
    """'key=value:NoSchedule', 'key:NoSchedule' or 'key=value' as a toleration."""
    taint, _, effect = text.partition(":")
    key, has_value, value = taint.partition("=")
    if not key:
        raise CliError(f"--toleration {text!r}: expected KEY[=VALUE][:EFFECT]", ExitCode.USAGE)
    found = {"key": key, "operator": "Equal" if has_value else "Exists"}
    if has_value:
        found["value"] = value
    if effect:
        found["effect"] = effect
    return found


def model_ca(text: str) -> dict[str, Any]:
    """'configmap/NAME:KEY' or 'secret/NAME:KEY' as spec.modelTLS."""
    kind, _, ref = text.partition("/")
    name, _, key = ref.partition(":")
    field = {"configmap": "configMapKeyRef", "secret": "secretKeyRef"}.get(kind.lower())
    if field is None or not name or not key:
        raise CliError(
            f"--model-ca {text!r}: expected configmap/NAME:KEY or secret/NAME:KEY", ExitCode.USAGE
        )
    return {"caBundle": {field: {"name": name, "key": key}}}


def chat_template(name: str | None) -> dict[str, Any] | None:
    if name is None:
        return None
    return {"enabled": True, "name": name} if name else {"enabled": True}


def gate(
    task: str | None,
    metric: str | None,
    max_drop: float | None,
    alpha: float | None,
    lower_is_better: bool,
) -> dict[str, Any] | None:
    """spec.gate from --gate-task and the flags that refine it (None without any)."""
    refined = metric is not None or max_drop is not None or alpha is not None or lower_is_better
    if task is None:
        if refined:
            raise CliError(
                "--gate-metric, --max-drop, --alpha and --lower-is-better refine a gate: "
                "give --gate-task TASK (and --baseline JOB) too",
                ExitCode.USAGE,
            )
        return None
    found: dict[str, Any] = {"task": task}
    optional = {"metric": metric, "maxDrop": max_drop, "alpha": alpha}
    found.update({key: value for key, value in optional.items() if value is not None})
    if lower_is_better:
        found["higherIsBetter"] = False
    return found
