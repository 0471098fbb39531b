"""Act as someone on the sandbox: the admin, a plain user, or a ServiceAccount.

Least-privilege claims are only worth something when the tests make their
calls *as* the identity in question. Users get client certificates from the
sandbox CA (CN is the user, O the groups); ServiceAccounts get a bound token
from the TokenRequest API, exactly what a pod's projected token would be.
Each helper returns a kubeconfig path, from which `api_client` builds a
Kubernetes client (or kubectl uses it directly).
"""

from __future__ import annotations

import re
from pathlib import Path

from kubernetes import client, config

from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.pki import issue_client_cert

__all__ = ["api_client", "service_account_kubeconfig", "user_kubeconfig"]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)


def api_client(kubeconfig: Path) -> client.ApiClient:
    """A fresh ApiClient for one kubeconfig (never the process-wide default)."""
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return api


def user_kubeconfig(plane: ControlPlane, user: str, groups: tuple[str, ...] = ()) -> Path:
    """A kubeconfig that authenticates as `user` in `groups` by client certificate."""
    assert plane.pki is not None, "start the control plane first"
    pair = issue_client_cert(plane.pki, user, groups)
    path = plane.workdir / "users" / f"{_slug(user)}.kubeconfig"
    path.parent.mkdir(exist_ok=True)
    return plane.write_kubeconfig(path, user, cert=pair.cert, key=pair.key)


def service_account_kubeconfig(
    plane: ControlPlane, namespace: str, name: str, *, expiration_seconds: int = 3600 * 6
) -> Path:
    """A kubeconfig that authenticates as ServiceAccount `namespace/name`.

    The account must exist; the token comes from the TokenRequest API.
    """
    with api_client(plane.kubeconfig) as admin:
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=["https://kubernetes.default.svc.cluster.local"],
                expiration_seconds=expiration_seconds,
            )
        )
        response = client.CoreV1Api(admin).create_namespaced_service_account_token(
            name, namespace, request
        )
    if response.status is None:
        raise RuntimeError(f"TokenRequest for {namespace}/{name} returned no token")
    path = plane.workdir / "users" / f"sa-{_slug(namespace)}-{_slug(name)}.kubeconfig"
    path.parent.mkdir(exist_ok=True)
    return plane.write_kubeconfig(
        path,
        f"system:serviceaccount:{namespace}:{name}",
        token=response.status.token,
        namespace=namespace,
    )
