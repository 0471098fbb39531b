"""Errors a person can act on, and the exit codes of ``lmeval``.

Why this module exists: the Kubernetes client reports a failed request as an
HTTP dump, which tells a data scientist nothing about what to do next. Every
failure of the command line ends here and leaves as one sentence that names
the next step (install the poller, ask for a role, fix a typo) and as an exit
code that scripts can branch on. The mapping works on the apiserver's own
``Status`` body (its ``reason``, ``message`` and ``details``), so it is the
server's words, made specific, never a guess.
"""

from __future__ import annotations

import difflib
import json
import re
from enum import IntEnum
from typing import Any

from poller import api, apierrors

__all__ = [
    "API_NOT_FOUND",
    "ApiError",
    "CliError",
    "ExitCode",
    "explain",
    "forbidden_message",
    "job_not_found",
    "parse_status",
    "suggest",
]


class ExitCode(IntEnum):
    """Exit codes of every ``lmeval`` command (documented in the README)."""

    OK = 0
    JOB_FAILED = 1  # the job ended Failed or Cancelled (wait, submit --wait)
    TIMEOUT = 2  # wait --timeout passed before the job got there
    USAGE = 3  # bad flags, an invalid spec or file, a request the server refused as invalid
    NOT_FOUND = 4  # no such job, or it has no pod, log or results (yet)
    NOT_INSTALLED = 5  # the LMEvalJob API is not served: the poller is not installed
    FORBIDDEN = 6  # RBAC refused the request
    CLUSTER = 7  # kubeconfig, credentials, unreachable server, other API errors
    INTERRUPTED = 130  # Ctrl-C


INSTALL_HINT = "kubectl apply -k deploy/overlays/kubernetes"
API_NOT_FOUND = (
    f"LMEvalJob API not found on this cluster: is the lmeval poller installed? ({INSTALL_HINT})"
)
# The apiserver's RBAC refusal, e.g. 'User "alice" cannot list resource
# "lmevaljobs" in API group "g" in the namespace "ns"'.
_FORBIDDEN_RE = re.compile(
    r'User "(?P<user>[^"]*)" cannot (?P<verb>\S+) resource "(?P<resource>[^"]*)"'
    r'(?: in API group "(?P<group>[^"]*)")?'
    r'(?: in the namespace "(?P<namespace>[^"]*)"| at the cluster scope)?'
)


class CliError(Exception):
    """A failure to report as one message on stderr, with its exit code."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def parse_status(raw: bytes | str) -> dict[str, Any]:
    """The apiserver's Status body as a dict; plain text becomes {"message": text}."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    try:
        body = json.loads(text)
    except ValueError:
        return {"message": text.strip()}
    return body if isinstance(body, dict) else {"message": text.strip()}


class ApiError(apierrors.ApiError):
    """A non-2xx answer, with what we asked for (verb, resource, where).

    `status_body` is the apiserver's Status body, parsed (`parse_status`).
    """

    def __init__(
        self,
        status: int,
        body: dict[str, Any],
        verb: str,
        resource: str,
        group: str = "",
        namespace: str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(status, str(body.get("reason") or ""), json.dumps(body))
        self.status_body = body
        self.verb = verb
        self.resource = resource
        self.group = group
        self.namespace = namespace
        self.name = name

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"

    @property
    def message(self) -> str:
        return str(self.status_body.get("message") or "").strip()

    @property
    def details(self) -> dict[str, Any]:
        details = self.status_body.get("details")
        return details if isinstance(details, dict) else {}


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def _where(namespace: str | None) -> str:
    return f' in namespace "{namespace}"' if namespace else " at the cluster scope"


def forbidden_message(error: ApiError) -> str:
    """Who may not do which verb on which resource where, and how to check."""
    match = _FORBIDDEN_RE.search(error.message)
    user = match["user"] if match else ""
    verb = match["verb"] if match else error.verb
    resource = match["resource"] if match else error.resource
    group = (match["group"] if match and match["group"] is not None else None) or error.group
    namespace = match["namespace"] if match else error.namespace
    if match and match["namespace"] is None and "at the cluster scope" in error.message:
        namespace = None
    base, _, sub = resource.partition("/")
    target = _qualified(base, group) + (f"/{sub}" if sub else "")
    who = f'user "{user}"' if user else "you"
    can_i = f"kubectl auth can-i {verb} {_qualified(base, group)}"
    if sub:
        can_i += f" --subresource={sub}"
    can_i += f" -n {namespace}" if namespace else " --all-namespaces"
    hint = ""
    if group == api.API_GROUP:
        role = "lmeval-jobs-view" if verb in {"get", "list", "watch"} else "lmeval-jobs-edit"
        hint = f"; ask a cluster admin to bind the {role} ClusterRole to you"
    return (
        f"permission denied: {who} may not {verb} {target}{_where(namespace)}{hint} "
        f"(check with: {can_i})"
    )


def _invalid_message(error: ApiError) -> str:
    causes = error.details.get("causes") or []
    parts = [f"{c.get('field', '')}: {c.get('message', '')}".strip(": ") for c in causes]
    detail = "; ".join(p for p in parts if p) or error.message
    return f"the API server refused the request as invalid: {detail}"


def explain(error: ApiError) -> CliError:
    """Turn an API failure into a message that says what to do, with its exit code."""
    if error.status == 404:
        named = error.details.get("name")
        if error.resource == api.PLURAL and error.group == api.API_GROUP and not named:
            # The collection itself is unknown: no CRD (a missing object names itself).
            return CliError(API_NOT_FOUND, ExitCode.NOT_INSTALLED)
        if error.resource == api.PLURAL and named:
            return job_not_found(str(named), error.namespace, [])
        what = _qualified(error.resource, error.group)
        if error.name:
            what += f" {error.name}"
        return CliError(f"{what} not found{_where(error.namespace)}", ExitCode.NOT_FOUND)
    if error.status == 403:
        return CliError(forbidden_message(error), ExitCode.FORBIDDEN)
    if error.status == 401:
        return CliError(
            "the API server refused your credentials (401 Unauthorized): log in again or "
            "pick another --context",
            ExitCode.CLUSTER,
        )
    if error.status == 409 and error.reason == "AlreadyExists":
        return CliError(
            f"{error.message}: choose another --name, or use --generate-name",
            ExitCode.USAGE,
        )
    if error.status == 422 or error.reason == "Invalid":
        return CliError(_invalid_message(error), ExitCode.USAGE)
    if error.status == 400:
        return CliError(error.message or "bad request", ExitCode.USAGE)
    return CliError(
        f"the API server answered {error.status} {error.reason or ''} to {error.verb} "
        f"{_qualified(error.resource, error.group)}: {error.message}".replace("  ", " "),
        ExitCode.CLUSTER,
    )


def suggest(name: str, candidates: list[str]) -> list[str]:
    """Names close to `name` (typos, a missing suffix), best first."""
    scored = sorted(
        ((difflib.SequenceMatcher(None, name, c).ratio(), c) for c in candidates),
        key=lambda pair: (-pair[0], pair[1]),
    )
    # Close enough, and not much worse than the best: jobs share long prefixes.
    best = scored[0][0] if scored else 0.0
    close = [c for score, c in scored if score >= max(0.6, best - 0.08)]
    starts = [c for c in candidates if c.startswith(name) and c not in close]
    return (close + sorted(starts))[:3]


def job_not_found(
    name: str,
    namespace: str | None,
    candidates: list[str],
    elsewhere: list[str] | None = None,
) -> CliError:
    """'No LMEvalJob X in namespace Y', with the names it probably meant."""
    message = f'LMEvalJob "{name}" not found{_where(namespace)}'
    close = suggest(name, candidates)
    if close:
        message += ": did you mean " + " or ".join(f'"{c}"' for c in close) + "?"
    elif elsewhere:
        places = ", ".join(elsewhere[:3])
        message += f" (a job of that name exists in namespace {places}: use -n)"
    elif not candidates:
        message += " (there are no LMEvalJobs there; `lmeval list -A` shows all namespaces)"
    return CliError(message, ExitCode.NOT_FOUND)
