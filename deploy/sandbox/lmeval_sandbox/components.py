"""What each component of the local control plane is told: its flags and files.

`lmeval_sandbox.controlplane` runs the processes (start order, readiness,
stop, ``state.json``); this module holds the other half, the command line of
etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, the
configuration files they read and the kubeconfigs they connect with. It is
kept apart because it is data rather than supervision, and the place to read
where the sandbox departs from a real cluster, and why: a throwaway etcd
without fsync, kwok nodes that no node-lifecycle controller may taint, an
audit log written in blocking mode so the tests can read every request.
Every function only builds argv lists or writes files in the plane's work
directory; none starts a process.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lmeval_sandbox import kwok
from lmeval_sandbox.audit import AUDIT_POLICY_YAML
from lmeval_sandbox.pki import Pki

__all__ = [
    "CONTROLLER_MANAGER_KUBECONFIG",
    "SCHEDULER_KUBECONFIG",
    "Ports",
    "apiserver_argv",
    "controller_manager_argv",
    "etcd_argv",
    "free_port",
    "kubeconfig_yaml",
    "kwok_argv",
    "scheduler_argv",
]

# The kubeconfigs of the two components that authenticate with a client
# certificate of their own, in the plane's work directory.
CONTROLLER_MANAGER_KUBECONFIG = "controller-manager.kubeconfig"
SCHEDULER_KUBECONFIG = "scheduler.kubeconfig"


def free_port(preferred: int | None = None) -> int:
    """`preferred` when it is free, else a loopback port nothing listens on right now.

    The one way the sandbox and the tests pick a port: the plane's
    components take any, the sandbox's model server and metrics the port
    its printed instructions name, when it can.
    """
    if preferred is not None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As the server will: a recent run's TIME_WAIT connections do not block it.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with contextlib.suppress(OSError):
                sock.bind(("127.0.0.1", preferred))
                return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Ports:
    """The loopback ports of one plane, chosen free when it is created."""

    etcd_client: int = field(default_factory=free_port)
    etcd_peer: int = field(default_factory=free_port)
    apiserver: int = field(default_factory=free_port)
    controller_manager: int = field(default_factory=free_port)
    scheduler: int = field(default_factory=free_port)
    kwok_server: int = field(default_factory=free_port)


def etcd_argv(binary: str, workdir: Path, ports: Ports) -> list[str]:
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    client = f"http://127.0.0.1:{ports.etcd_client}"
    return [
        binary,
        "--name=sandbox",
        f"--data-dir={workdir / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=sandbox={peer}",
        # A throwaway store: durability is not worth the fsync latency.
        "--unsafe-no-fsync",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]


def apiserver_argv(
    binary: str,
    workdir: Path,
    ports: Ports,
    pki: Pki,
    audit_log: Path,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """kube-apiserver's command line; writes its audit policy into `workdir`."""
    policy = workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY_YAML)
    return [
        binary,
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca_cert}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_public_key}",
        f"--service-account-signing-key-file={pki.sa_private_key}",
        "--service-cluster-ip-range=10.96.0.0/16",
        # kwok's nodes would otherwise be tainted NotReady at creation.
        "--disable-admission-plugins=TaintNodesByCondition",
        # kwok answers logs/exec on 127.0.0.1; node names do not resolve.
        "--kubelet-preferred-address-types=InternalIP",
        f"--audit-policy-file={policy}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
        "--audit-log-maxsize=0",
        "--audit-log-mode=blocking",
        "--profiling=false",
        "--allow-privileged=false",
        *extra_args,
    ]


def controller_manager_argv(binary: str, workdir: Path, ports: Ports, pki: Pki) -> list[str]:
    config = workdir / CONTROLLER_MANAGER_KUBECONFIG
    return [
        binary,
        f"--kubeconfig={config}",
        f"--authentication-kubeconfig={config}",
        f"--authorization-kubeconfig={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.sa_private_key}",
        f"--root-ca-file={pki.ca_cert}",
        # kwok nodes have no real kubelet: never let node lifecycle
        # taint or evict them.
        "--controllers=*,-node-lifecycle-controller",
        "--concurrent-gc-syncs=5",
    ]


def scheduler_argv(binary: str, workdir: Path, ports: Ports) -> list[str]:
    config = workdir / SCHEDULER_KUBECONFIG
    return [
        binary,
        f"--kubeconfig={config}",
        f"--authentication-kubeconfig={config}",
        f"--authorization-kubeconfig={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.scheduler}",
        "--leader-elect=false",
    ]


def kwok_argv(binary: str, workdir: Path, ports: Ports, pki: Pki, kubeconfig: Path) -> list[str]:
    """kwok's command line (as the admin); writes its stages config into `workdir`."""
    config = workdir / "kwok.yaml"
    config.write_text(kwok.kwok_config_yaml())
    label, value = kwok.KWOK_NODE_LABEL
    return [
        binary,
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        f"--manage-nodes-with-label-selector={label}={value}",
        "--node-ip=127.0.0.1",
        f"--node-port={ports.kwok_server}",
        f"--server-address=127.0.0.1:{ports.kwok_server}",
        f"--tls-cert-file={pki.kwok_server.cert}",
        f"--tls-private-key-file={pki.kwok_server.key}",
        "--enable-crds=Logs,ClusterLogs,Exec,ClusterExec",
        "--cidr=10.0.0.1/16",
        "--node-lease-duration-seconds=40",
    ]


def kubeconfig_yaml(
    server: str,
    ca_cert: Path,
    user: str,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> str:
    """A kubeconfig for `server` with a client cert or a bearer token (the token wins)."""
    credentials: dict[str, str] = {}
    if cert and key:
        credentials = {"client-certificate": str(cert), "client-key": str(key)}
    if token:
        credentials = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sandbox",
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {
                "name": "sandbox",
                "context": {"cluster": "sandbox", "user": user, "namespace": namespace},
            }
        ],
        "current-context": "sandbox",
    }
    return yaml.safe_dump(config, sort_keys=False)
