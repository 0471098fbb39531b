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

from poller.cliapi import ApiError as OperatorApiError
from poller.cliapi import api

__all__ = [
    "API_NOT_FOUND",
    "SUITE_API_NOT_FOUND",
    "USER_ROLES",
    "ApiError",
    "CliError",
    "ExitCode",
    "explain",
    "forbidden_message",
    "job_not_found",
    "not_owned",
    "parse_status",
    "role_for",
    "suggest",
    "suite_not_found",
]


class ExitCode(IntEnum):
    """Exit codes of every ``lmeval`` command (documented in the README)."""

    OK = 0
    JOB_FAILED = 1  # the job ended Failed or Cancelled (wait, submit --wait)
    TIMEOUT = 2  # wait --timeout passed before the job got there
    USAGE = 3  # bad flags, an invalid spec or file, a request the server refused as invalid
    NOT_FOUND = 4  # no such job or suite, or the job has no pod, log or results (yet)
    NOT_INSTALLED = 5  # the LMEvalJob (or LMEvalSuite) API is not served: no poller, or an old one
    FORBIDDEN = 6  # 403: RBAC, or an admission policy (its own words)
    CLUSTER = 7  # kubeconfig, credentials, unreachable server, other API errors
    NOT_OWNED = 8  # an object the job names (results ConfigMap, pod) is not the job's
    INTERRUPTED = 130  # Ctrl-C


INSTALL_HINT = "kubectl apply -k deploy/overlays/kubernetes"
API_NOT_FOUND = (
    f"LMEvalJob API not found on this cluster: is the lmeval poller installed? ({INSTALL_HINT})"
)
# Suites came later than jobs: a cluster may serve LMEvalJobs and not yet LMEvalSuites.
SUITE_API_NOT_FOUND = (
    f"LMEvalSuite API not found on this cluster: is the lmeval poller installed, at a version "
    f"with suites? ({INSTALL_HINT})"
)
# The apiserver's RBAC refusal, e.g. 'lmevaljobs.g is forbidden: User "alice"
# cannot list resource "lmevaljobs" in API group "g" in the namespace "ns"',
# possibly followed by the authorizer's reason (': RBAC: clusterrole ... not
# found'). Anchored at the start or right after "is forbidden: ": an admission
# denial has its own words there ("ValidatingAdmissionPolicy '...' ...",
# "admission webhook ..."), so a policy message that quotes such a sentence is
# still read as the policy's.
_FORBIDDEN_RE = re.compile(
    r'(?:^|is forbidden: )User "(?P<user>[^"]*)" cannot (?P<verb>\S+) '
    r'resource "(?P<resource>[^"]*)"'
    r'(?: in API group "(?P<group>[^"]*)")?'
    r'(?: in the namespace "(?P<namespace>[^"]*)"|(?P<cluster> at the cluster scope))?'
    r"(?P<rest>.*)$",
    re.DOTALL,
)

# What the ClusterRoles for people grant (deploy/base/user-roles.yaml; the
# unit tests compare this with the file), least first: the role advised for
# an RBAC denial is the first that grants the refused verb on the refused
# resource of the LMEvalJob group, and no role is advised when none does
# (e.g. an update of lmevaljobs/status: that is the poller's). The same two
# roles cover LMEvalJobs and LMEvalSuites.
_VIEW_VERBS = ("get", "list", "watch")
_EDIT_VERBS = (*_VIEW_VERBS, "create", "update", "patch", "delete", "deletecollection")
_KINDS = (api.PLURAL, api.SUITE_PLURAL)
USER_ROLES: tuple[tuple[str, frozenset[tuple[str, str]]], ...] = (
    (
        "lmeval-jobs-view",
        frozenset((v, r) for v in _VIEW_VERBS for k in _KINDS for r in (k, f"{k}/status")),
    ),
    (
        "lmeval-jobs-edit",
        frozenset(
            [(v, k) for v in _EDIT_VERBS for k in _KINDS] + [("get", f"{k}/status") for k in _KINDS]
        ),
    ),
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


class ApiError(OperatorApiError):
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


def role_for(verb: str, resource: str, group: str) -> str | None:
    """The least of `USER_ROLES` that grants `verb` on `resource` of `group`, if any."""
    if group != api.API_GROUP:
        return None
    return next((name for name, grants in USER_ROLES if (verb, resource) in grants), None)


def _role_advice(role: str | None, namespace: str | None, server_adds: str) -> str:
    """What to ask for after an RBAC denial ("" when no role of ours would help)."""
    if role is None:
        return ""
    if role in server_adds:
        # The authorizer's reason names the role (bound, but missing from the
        # cluster, say): binding it again would change nothing.
        return ""
    if namespace is None:
        return (
            f"; at the cluster scope only a ClusterRoleBinding to the {role} ClusterRole "
            "grants this (a RoleBinding covers one namespace): name a namespace with -n, "
            "or ask a cluster admin for one"
        )
    return f"; ask a cluster admin to bind the {role} ClusterRole to you"


def forbidden_message(error: ApiError) -> str:
    """A 403 in words: an RBAC denial with the role that grants it, else the server's reason.

    An RBAC denial names who may not do which verb on which resource where,
    the `lmeval-jobs-*` role that would grant it (only when one does) and how
    to check. Any other refusal (an admission policy names what is wrong with
    the request) is the server's message verbatim, with no advice.
    """
    match = _FORBIDDEN_RE.search(error.message)
    if match is None:
        if error.message:
            return error.message
        return (
            f"permission denied: the API server refused to {error.verb} "
            f"{_qualified(error.resource, error.group)}{_where(error.namespace)} "
            "(403 Forbidden, without a reason)"
        )
    user, verb, resource = match["user"], match["verb"], match["resource"]
    group = match["group"] if match["group"] is not None else error.group
    namespace = match["namespace"] or (None if match["cluster"] else error.namespace)
    server_adds = match["rest"].strip().lstrip(":;, ").strip()
    base, _, sub = resource.partition("/")
    target = _qualified(base, group) + (f"/{sub}" if sub else "")
    can_i = f"kubectl auth can-i {verb} {_qualified(base, group)}"
    if sub:
        can_i += f" --subresource={sub}"
    can_i += f" -n {namespace}" if namespace else " --all-namespaces"
    said = f" ({server_adds})" if server_adds else ""
    advice = _role_advice(role_for(verb, resource, group), namespace, server_adds)
    return (
        f'permission denied: user "{user}" may not {verb} {target}{_where(namespace)}{said}'
        f"{advice} (check with: {can_i})"
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
        if error.resource == api.SUITE_PLURAL and error.group == api.API_GROUP:
            if not named:
                return CliError(SUITE_API_NOT_FOUND, ExitCode.NOT_INSTALLED)
            return suite_not_found(str(named), error.namespace, [])
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


def suite_not_found(
    name: str,
    namespace: str | None,
    candidates: list[str],
    elsewhere: list[str] | None = None,
) -> CliError:
    """'No LMEvalSuite X in namespace Y', with the names it probably meant."""
    message = f'{api.SUITE_KIND} "{name}" not found{_where(namespace)}'
    close = suggest(name, candidates)
    if close:
        message += ": did you mean " + " or ".join(f'"{c}"' for c in close) + "?"
    elif elsewhere:
        places = ", ".join(elsewhere[:3])
        message += f" (a suite of that name exists in namespace {places}: use -n)"
    elif not candidates:
        message += (
            f" (there are no {api.SUITE_KIND}s there; `lmeval suite list -A` shows all namespaces)"
        )
    return CliError(message, ExitCode.NOT_FOUND)


# What is lost when an object a job names is not the job's, and what to do;
# by the object's resource (the kinds the CLI reads besides the job itself).
_NOT_OWNED_CONSEQUENCE = {
    "configmaps": (
        "ConfigMap",
        "it is not the one the poller made for this job (another user may have created or "
        "replaced it under the name the job's status gives), so nothing in it is shown: the "
        "job's full results (the complete results document, per-item scores, provenance, "
        "archived log) are unavailable; what the job's status holds is the poller's "
        "(lmeval get {job})",
    ),
    "pods": (
        "pod",
        "it is not the pod the poller made for this job (another user may have created it "
        "under the job's pod name), so its log is not shown: it is not this job's evaluation",
    ),
}


def not_owned(
    resource: str,
    name: str,
    namespace: str,
    job_name: str,
    job_uid: str,
    controller: str,
) -> CliError:
    """An object the job names is not the job's: which, whose it is, what that means, what to do.

    `controller` describes the object's actual controller ownerReference
    ("none", or "LMEvalJob other (uid ...)").
    """
    kind, consequence = _NOT_OWNED_CONSEQUENCE.get(resource, (resource, "it is not shown"))
    return CliError(
        f"{kind} {name} in namespace {namespace} is not LMEvalJob {job_name}'s: its controller "
        f"ownerReference is {controller}, not the job (uid {job_uid}); "
        f"{consequence.format(job=job_name)}. Delete it (kubectl delete {resource} {name} "
        f"-n {namespace}), run the job again (lmeval rerun {job_name}), and ask who may create "
        f"{resource} in namespace {namespace}",
        ExitCode.NOT_OWNED,
    )
