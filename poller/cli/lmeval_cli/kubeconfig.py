"""Find the cluster and namespace the way kubectl does.

Why this module exists: people expect a kubectl plugin to act on exactly
what ``kubectl`` would act on. So the rules are kubectl's: ``--kubeconfig``,
else every file in ``$KUBECONFIG`` (merged), else ``~/.kube/config``, else
the in-cluster service account; ``--context`` picks a context, else the
current one; ``-n/--namespace`` wins over the context's namespace, which wins
over ``default``. The Kubernetes client's own loader does the parsing and the
credentials (certificates, tokens, exec plugins), so nothing here
re-implements authentication; it only resolves the names and turns the
loader's exceptions into messages that say which file and which context.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from lmeval_cli.errors import CliError, ExitCode

__all__ = [
    "IN_CLUSTER_NAMESPACE_FILE",
    "Target",
    "connect",
    "describe_source",
    "no_kubeconfig",
    "resolve",
]

IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_KUBECONFIG = "~/.kube/config"
REQUEST_RETRIES = 1


@dataclass(frozen=True)
class Target:
    """Where commands go: the client, the namespace, and what they came from."""

    api_client: client.ApiClient
    namespace: str
    context: str
    server: str


def _kubeconfig_paths(explicit: str | None) -> list[str]:
    if explicit:
        return [explicit]
    env = os.environ.get("KUBECONFIG", "")
    paths = [p for p in env.split(os.pathsep) if p]
    return paths or [DEFAULT_KUBECONFIG]


def describe_source(explicit: str | None) -> str:
    """Which kubeconfig file(s) are read, for error messages."""
    if explicit:
        return f"--kubeconfig {explicit}"
    if os.environ.get("KUBECONFIG"):
        return f"KUBECONFIG={os.environ['KUBECONFIG']}"
    return DEFAULT_KUBECONFIG


def no_kubeconfig(explicit: str | None) -> CliError:
    """No kubeconfig file to read: what was tried, and the advice that fits.

    Setting KUBECONFIG is advised only when it is not set: when it is, its
    files are what was tried, and it is its value that needs fixing.
    """
    paths = _kubeconfig_paths(explicit)
    tried = ", ".join(paths)
    cluster = " and not running in a cluster" if not _in_cluster() else ""
    if explicit:
        return CliError(f"kubeconfig file {explicit} does not exist", ExitCode.CLUSTER)
    if os.environ.get("KUBECONFIG"):
        return CliError(
            f"no kubeconfig found: none of the files KUBECONFIG names exists (tried {tried})"
            f"{cluster}: point KUBECONFIG at your kubeconfig file(s), or pass --kubeconfig",
            ExitCode.CLUSTER,
        )
    return CliError(
        f"no kubeconfig found (tried {tried}){cluster}: set KUBECONFIG or pass --kubeconfig",
        ExitCode.CLUSTER,
    )


def _any_file_exists(paths: list[str]) -> bool:
    return any(Path(os.path.expanduser(p)).exists() for p in paths)


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def resolve(
    kubeconfig: str | None, context: str | None, namespace: str | None
) -> tuple[str, str, str | None]:
    """(context name, namespace, config file argument) without connecting.

    The config file argument is None when the client should read its default
    location ($KUBECONFIG, merged, or ~/.kube/config).
    """
    paths = _kubeconfig_paths(kubeconfig)
    if kubeconfig and not Path(os.path.expanduser(kubeconfig)).exists():
        raise CliError(f"kubeconfig file {kubeconfig} does not exist", ExitCode.CLUSTER)
    config_file = kubeconfig
    if config_file is None and len(paths) == 1:
        config_file = os.path.expanduser(paths[0])
    try:
        contexts, active = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=config_file
        )
    except ConfigException as error:
        raise CliError(
            f"cannot read the kubeconfig ({describe_source(kubeconfig)}): {error}",
            ExitCode.CLUSTER,
        ) from error
    except FileNotFoundError as error:
        raise no_kubeconfig(kubeconfig) from error
    chosen: dict[str, Any] | None = active
    if context:
        chosen = next((c for c in contexts or [] if c.get("name") == context), None)
        if chosen is None:
            names = ", ".join(sorted(str(c.get("name")) for c in contexts or [])) or "none"
            raise CliError(
                f'context "{context}" not found in {describe_source(kubeconfig)} '
                f"(contexts: {names})",
                ExitCode.CLUSTER,
            )
    if not chosen:
        raise CliError(
            f"no current context in {describe_source(kubeconfig)}: pass --context "
            "(kubectl config get-contexts lists them)",
            ExitCode.CLUSTER,
        )
    context_ns = (chosen.get("context") or {}).get("namespace")
    return str(chosen.get("name")), namespace or context_ns or "default", config_file


def _in_cluster_target(namespace: str | None) -> Target:
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except ConfigException as error:
        raise CliError(
            f"no kubeconfig and no in-cluster config: {error}", ExitCode.CLUSTER
        ) from error
    own_ns = "default"
    if IN_CLUSTER_NAMESPACE_FILE.exists():
        own_ns = IN_CLUSTER_NAMESPACE_FILE.read_text().strip() or "default"
    api_client = client.ApiClient()
    return Target(api_client, namespace or own_ns, "in-cluster", api_client.configuration.host)


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Target:
    """A client for the chosen context, and the namespace commands default to."""
    paths = _kubeconfig_paths(kubeconfig)
    if not kubeconfig and not _any_file_exists(paths) and _in_cluster():
        return _in_cluster_target(namespace)
    if not kubeconfig and not _any_file_exists(paths):
        raise no_kubeconfig(kubeconfig)
    context_name, chosen_ns, config_file = resolve(kubeconfig, context, namespace)
    configuration = client.Configuration()
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=config_file,
            context=context_name,
            client_configuration=configuration,
            persist_config=False,
        )
    except (ConfigException, OSError) as error:
        raise CliError(
            f'cannot use context "{context_name}" from {describe_source(kubeconfig)}: {error}',
            ExitCode.CLUSTER,
        ) from error
    # One retry: an unreachable server should fail in seconds, not after urllib3's default.
    configuration.retries = REQUEST_RETRIES
    return Target(client.ApiClient(configuration), chosen_ns, context_name, configuration.host)
