"""``lmeval version``: which client, which Kubernetes, which poller.

Why this module exists: a report of a problem starts with versions, and the
three that matter live in three places: this client's installed metadata
(`poller.buildinfo`), the apiserver (``GET /version``, readable by every
user), and the poller's Deployment (label ``app.kubernetes.io/version`` and
the image of its container), which a person who only submits jobs may not
be allowed to read, or which may be installed elsewhere. Those two cases are
facts to state in one line, not failures: the command still exits 0. Only
what stops the server's version from being read (kubeconfig, credentials,
connection) is an error, after the client's version has been printed, as
``kubectl version`` does.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from lmeval_cli import output, render
from lmeval_cli.client import Cluster
from lmeval_cli.errors import ApiError, CliError, ExitCode, explain
from poller.cliapi import buildinfo

__all__ = [
    "POLLER_CONTAINER",
    "POLLER_DEPLOYMENT",
    "POLLER_NAMESPACE",
    "VERSION_LABEL",
    "add_arguments",
    "cmd_version",
    "poller_version",
]

# Where deploy/ installs the poller (deploy/base/deployment.yaml).
POLLER_NAMESPACE = "lmeval-system"
POLLER_DEPLOYMENT = "lmeval-poller"
POLLER_CONTAINER = "poller"
VERSION_LABEL = "app.kubernetes.io/version"
# The API's own reasons for the two answers that are expected here.
_REASONS = {403: "Forbidden", 404: "NotFound"}


def add_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--client",
        action="store_true",
        help="only this client's version (no cluster is contacted)",
    )
    cmd.add_argument(
        "--poller-namespace",
        default=POLLER_NAMESPACE,
        metavar="NAMESPACE",
        help=f"where the poller's Deployment {POLLER_DEPLOYMENT} is (default: %(default)s)",
    )
    output.add_output(cmd, ("json", "yaml"), "the versions as one document, as kubectl's")


def client_version() -> dict[str, str]:
    return {"version": buildinfo.version(), "revision": buildinfo.revision()}


def poller_version(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """What the poller's Deployment says of its version; ``error`` when it cannot be read.

    ``error`` is the API's reason (``NotFound``, ``Forbidden``...) and
    ``message`` says it in words; an absent label is ``version: null``.
    """
    found: dict[str, Any] = {"namespace": namespace, "deployment": POLLER_DEPLOYMENT}
    try:
        deployment = cluster.get_deployment(POLLER_DEPLOYMENT, namespace)
    except ApiError as error:
        if error.status == 404:
            message = f"no Deployment {POLLER_DEPLOYMENT} in namespace {namespace}"
            if namespace == POLLER_NAMESPACE:
                message += " (installed in another namespace? --poller-namespace)"
        else:  # 403: who may not read what, and how to check (errors.forbidden_message)
            message = explain(error).message
        reason = _REASONS.get(error.status) or error.reason or str(error.status)
        return {**found, "error": reason, "message": message}
    labels = (deployment.get("metadata") or {}).get("labels") or {}
    pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = pod.get("containers") or []
    # The poller's container by name; the first one if it was renamed.
    chosen = next((c for c in containers if c.get("name") == POLLER_CONTAINER), None)
    if chosen is None and containers:
        chosen = containers[0]
    version = labels.get(VERSION_LABEL)
    return {
        **found,
        "version": str(version) if version is not None else None,
        "image": str(chosen.get("image")) if chosen and chosen.get("image") else None,
    }


def _client_line(client: dict[str, str]) -> str:
    revision = buildinfo.short_revision(client["revision"])
    return f"Client Version: {client['version']} (revision {revision})"


def _server_line(server: dict[str, Any], where: str) -> str:
    shown = server.get("gitVersion") or f"{server.get('major')}.{server.get('minor')}"
    return f"Server Version: {render.safe(str(shown))} ({where})"


def _poller_line(poller: dict[str, Any]) -> str:
    where = f"Deployment {poller['namespace']}/{poller['deployment']}"
    if "error" in poller:
        said = "not found" if poller["error"] == "NotFound" else "not shown"
        return f"Poller Version: {said}: {render.safe(str(poller['message']))}"
    version = poller["version"]
    image = f"image {render.safe(poller['image'])}, " if poller["image"] else ""
    if version is None:
        return f"Poller Version: unknown ({image}{where} has no {VERSION_LABEL} label)"
    return f"Poller Version: {render.safe(version)} ({image}{where})"


def cmd_version(
    args: argparse.Namespace, connect: Callable[[], Cluster], out: render.Output
) -> int:
    """Print the versions; `connect` is called only when the cluster is asked (not --client)."""
    fmt = args.output.name if args.output is not None else ""
    structured = bool(fmt)
    document: dict[str, Any] = {"clientVersion": client_version()}
    if not structured:
        out.write(_client_line(document["clientVersion"]))
    if args.client:
        if structured:
            out.write(render.dump(document, fmt))
        return ExitCode.OK
    try:
        cluster = connect()
        try:
            document["serverVersion"] = cluster.server_version()
        except ApiError as error:
            raise explain(error) from error
        if not structured:
            out.write(_server_line(document["serverVersion"], cluster.server))
        document["pollerVersion"] = poller_version(cluster, args.poller_namespace)
    except CliError:
        if structured:  # what is known, then the error (main prints it, with its exit code)
            out.write(render.dump(document, fmt))
        raise
    if structured:
        out.write(render.dump(document, fmt))
    else:
        out.write(_poller_line(document["pollerVersion"]))
    return ExitCode.OK
