"""Where the poller's connection settings and credentials come from.

`poller.kube.transport.ApiTransport` connects to an `Endpoint`; this module makes
one from a kubeconfig file or from the pod's service account, without the
kubernetes package (see the transport's docstring for why).

* kubeconfig: ``server``, ``certificate-authority`` or ``-data``,
  ``insecure-skip-tls-verify``, ``tls-server-name``, ``client-certificate``
  and ``client-key`` or their ``-data``, ``token``, ``tokenFile``, and
  ``exec`` credential plugins (``client.authentication.k8s.io/v1`` and
  ``v1beta1``: command, args, env; the plugin's token or client certificate is
  kept until its ``expirationTimestamp``). Relative paths are relative to the
  kubeconfig's folder; the context's namespace is ignored, and so are several
  files in $KUBECONFIG beyond the first (no merging). ``auth-provider`` (the
  removed gcp/oidc/azure plugins), basic auth, impersonation, ``proxy-url``
  and any other field are refused with a ValueError naming the field.
* in cluster: ``KUBERNETES_SERVICE_HOST``/``PORT``, the service account's
  ``ca.crt`` and its ``token``, re-read at most every minute because bound
  tokens rotate (the kubelet rewrites the file well before expiry).
"""

from __future__ import annotations

import base64
import json
import math
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from poller import timefmt

__all__ = ["SERVICE_ACCOUNT", "Credentials", "Endpoint", "in_cluster", "load"]

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_FILE_TTL = 60.0
PLUGIN_TIMEOUT = 60.0
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
_CLUSTER_KEYS = {"server", "certificate-authority", "certificate-authority-data", "extensions"}
_CLUSTER_KEYS |= {"insecure-skip-tls-verify", "tls-server-name", "disable-compression"}
_USER_KEYS = {"client-certificate", "client-certificate-data", "client-key", "client-key-data"}
_USER_KEYS |= {"token", "tokenFile", "exec", "extensions"}
_INSTEAD = {
    "auth-provider": "an exec credential plugin instead (gke-gcloud-auth-plugin, kubelogin, ...)",
    "username": "a token, a client certificate or an exec plugin instead",
    "password": "a token, a client certificate or an exec plugin instead",
    "proxy-url": "a kubeconfig that reaches the apiserver directly",
}


class Credentials:
    """The bearer token, from the kubeconfig, a token file or an exec plugin.

    An exec plugin may give a client certificate instead (`cert`, PEM). Not
    thread-safe by itself: the transport calls it under its lock.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        token_file: Path | None = None,
        plugin: dict[str, Any] | None = None,
        base: Path = Path(),
        cluster_info: dict[str, Any] | None = None,
    ) -> None:
        self._token, self._token_file, self._plugin = token, token_file, plugin
        self._base, self._cluster_info = base, cluster_info
        self._until = 0.0  # when to fetch again (monotonic for a file, wall clock for a plugin)
        self.cert: tuple[bytes, bytes] | None = None
        if token_file is not None:
            self.token()  # a missing token file is a configuration error: say so at once

    def token(self) -> str | None:
        """The token to send now (None: none, e.g. a client certificate is enough)."""
        if self._token_file is not None and time.monotonic() >= self._until:
            try:
                self._token = self._token_file.read_text().strip()
            except OSError:
                if self._token is None:
                    raise
                # The file is being replaced: keep the last token, read again next time.
            self._until = time.monotonic() + TOKEN_FILE_TTL
        elif self._plugin is not None and time.time() >= self._until:
            self._run_plugin(self._plugin)
        return self._token

    def invalidate(self) -> bool:
        """After a 401: True when the next `token()` may bring a different credential."""
        self._until = 0.0
        return self._token_file is not None or self._plugin is not None

    def _run_plugin(self, spec: dict[str, Any]) -> None:
        command = str(spec["command"])
        if os.sep in command and not os.path.isabs(command):
            command = str(self._base / command)  # like kubectl: relative to the kubeconfig
        info: dict[str, Any] = {"interactive": False}
        if spec.get("provideClusterInfo") and self._cluster_info is not None:
            info["cluster"] = self._cluster_info
        request = {"apiVersion": spec["apiVersion"], "kind": "ExecCredential", "spec": info}
        env = {**os.environ, **{e["name"]: e["value"] for e in spec.get("env") or []}}
        env["KUBERNETES_EXEC_INFO"] = json.dumps(request)
        # stderr is inherited: what a plugin explains there belongs in the poller's log.
        done = subprocess.run(
            [command, *map(str, spec.get("args") or [])],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            timeout=PLUGIN_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"exec credential plugin {command} exited {done.returncode}")
        reply = json.loads(done.stdout)
        if reply.get("apiVersion") != spec["apiVersion"]:
            raise RuntimeError(f"exec credential plugin {command}: {reply.get('apiVersion')!r}")
        status = reply.get("status") or {}
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        self._token = status.get("token") or None
        self.cert = (cert.encode(), key.encode()) if cert and key else None
        if self._token is None and self.cert is None:
            raise RuntimeError(f"exec credential plugin {command} gave no token nor certificate")
        expiry = status.get("expirationTimestamp")
        until = timefmt.timestamp(expiry) if expiry else math.inf
        if until is None:
            raise ValueError(
                f"exec credential plugin {command}: expirationTimestamp {expiry!r} is not a time"
            )
        self._until = until


@dataclass(frozen=True)
class Endpoint:
    """An apiserver and how to trust and authenticate to it."""

    server: str
    ca_file: Path | None = None
    ca_data: str | None = None  # PEM; neither: the system's CAs
    insecure: bool = False
    server_name: str | None = None  # tls-server-name
    cert_files: tuple[Path, Path] | None = None  # client certificate, key
    cert_data: tuple[bytes, bytes] | None = None  # the same as PEM
    credentials: Credentials = field(default_factory=Credentials)


def in_cluster(root: Path = SERVICE_ACCOUNT) -> Endpoint:
    """The pod's service account (token and CA under `root`)."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ValueError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set")
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return Endpoint(
        f"https://{host}:{port}",
        ca_file=root / "ca.crt",
        credentials=Credentials(token_file=root / "token"),
    )


def default_path() -> Path:
    """The first file of $KUBECONFIG, else ~/.kube/config."""
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return Path(listed[0] if listed else "~/.kube/config").expanduser()


def load(path: Path | None = None, context: str | None = None) -> Endpoint:
    """A kubeconfig's context (default: its current one); `path` None: `default_path()`."""
    path = (path or default_path()).expanduser()
    doc = yaml.safe_load(path.read_text()) or {}
    name = context or doc.get("current-context")
    if not name:
        raise ValueError(f"{path}: no current-context is set; name a context")
    where = f"{path}: context {name!r}"
    ctx = _named(doc, "contexts", name, where)
    cluster = _named(doc, "clusters", ctx.get("cluster"), where)
    user = _named(doc, "users", ctx["user"], where) if ctx.get("user") else {}
    _check_keys(cluster, _CLUSTER_KEYS, f"{where}, cluster {ctx.get('cluster')!r}")
    _check_keys(user, _USER_KEYS, f"{where}, user {ctx.get('user')!r}")
    if not cluster.get("server"):
        raise ValueError(f"{where}: the cluster has no server")
    base = path.parent

    def file(entry: dict[str, Any], key: str) -> Path | None:
        value = entry.get(key)
        return base / Path(value).expanduser() if value else None  # an absolute path stays

    def data(entry: dict[str, Any], key: str) -> bytes | None:
        value = entry.get(f"{key}-data")
        return base64.b64decode(value) if value else None

    # The -data form wins over the file, as in kubectl.
    ca_data = data(cluster, "certificate-authority")
    ca_file = None if ca_data else file(cluster, "certificate-authority")
    cert, key = file(user, "client-certificate"), file(user, "client-key")
    cert_pem, key_pem = data(user, "client-certificate"), data(user, "client-key")
    if bool(cert_pem) != bool(key_pem) or (not cert_pem and bool(cert) != bool(key)):
        raise ValueError(f"{where}: client-certificate and client-key go together (or their -data)")
    plugin = user.get("exec")
    cluster_info = None
    if plugin is not None:
        _check_plugin(plugin, where)
        ca = ca_data or (ca_file.read_bytes() if ca_file else b"")
        cluster_info = {  # what the plugin sees with provideClusterInfo
            "server": cluster["server"],
            "tls-server-name": cluster.get("tls-server-name"),
            "insecure-skip-tls-verify": bool(cluster.get("insecure-skip-tls-verify")),
            "certificate-authority-data": base64.b64encode(ca).decode() if ca else None,
        }
    credentials = Credentials(
        token=user.get("token"),
        # An explicit token wins over tokenFile, as in kubectl.
        token_file=None if user.get("token") else file(user, "tokenFile"),
        plugin=plugin,
        base=base,
        cluster_info=cluster_info,
    )
    return Endpoint(
        str(cluster["server"]),
        ca_file=ca_file,
        ca_data=ca_data.decode() if ca_data else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        server_name=cluster.get("tls-server-name"),
        cert_files=(cert, key) if cert and key and not cert_pem else None,
        cert_data=(cert_pem, key_pem) if cert_pem and key_pem else None,
        credentials=credentials,
    )


def _named(doc: dict[str, Any], section: str, name: Any, where: str) -> dict[str, Any]:
    kind = section[:-1]
    for entry in doc.get(section) or []:
        if entry.get("name") == name:
            found: dict[str, Any] = entry.get(kind) or {}
            return found
    raise ValueError(f"{where}: no {kind} named {name!r}")


def _check_keys(entry: dict[str, Any], known: set[str], where: str) -> None:
    for key in entry:
        if key not in known:
            instead = f"; use {_INSTEAD[key]}" if key in _INSTEAD else ""
            raise ValueError(f"{where}: {key!r} is not supported by lmeval-poller{instead}")


def _check_plugin(plugin: dict[str, Any], where: str) -> None:
    if plugin.get("apiVersion") not in EXEC_API_VERSIONS:
        raise ValueError(
            f"{where}: exec apiVersion {plugin.get('apiVersion')!r} is not supported; "
            f"use one of {', '.join(EXEC_API_VERSIONS)}"
        )
    if not plugin.get("command"):
        raise ValueError(f"{where}: exec has no command")
    if plugin.get("interactiveMode") == "Always":
        raise ValueError(f"{where}: exec interactiveMode 'Always' needs a terminal; it has none")
