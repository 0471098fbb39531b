"""Start and stop a real Kubernetes control plane made of local processes.

This is what envtest and kwokctl do, without containers: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as child
processes on loopback ports, with a throwaway PKI, RBAC, an audit log, and
service-account tokens. The test suite starts one per session; people start
one with ``python -m lmeval_sandbox up``. All state lives in one work
directory (``state.json`` names the PIDs), so `stop` works from another
process too, and each component's log is kept there; when a component fails
to become ready, the error carries the tail of its log.

This module supervises: start order, readiness, the cluster objects the
plane needs before it is usable (kwok's CRDs and nodes, the default
ServiceAccount), and stopping. What each component is told, its flags and
configuration files, is in `lmeval_sandbox.components`.

A plane runs one of the two Kubernetes releases `lmeval_sandbox.build`
makes: ``kubernetes="current"`` (the default) or ``"floor"``, the oldest
minor the project claims. ``LMEVAL_SANDBOX_KUBERNETES=floor`` changes the
default, so that any test suite can be run against the floor as it is.
The floor (1.31) takes the very flags and files the current release does
(`lmeval_sandbox.components`): checked by starting it, so nothing here
depends on the release but the binaries.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from lmeval_sandbox import build, kwok, nodeconfig
from lmeval_sandbox.audit import AuditLog
from lmeval_sandbox.components import (
    CONTROLLER_MANAGER_KUBECONFIG,
    SCHEDULER_KUBECONFIG,
    Ports,
    apiserver_argv,
    controller_manager_argv,
    etcd_argv,
    kubeconfig_yaml,
    kwok_argv,
    scheduler_argv,
)
from lmeval_sandbox.pki import Pki, make_pki
from lmeval_sandbox.supervise import Supervisor, http_ok, terminate

__all__ = ["ControlPlane", "ControlPlaneError", "StartupTimes", "default_kubernetes"]

# Which release a plane runs when its constructor does not say.
KUBERNETES_ENV = "LMEVAL_SANDBOX_KUBERNETES"


def default_kubernetes() -> build.Kubernetes:
    """``LMEVAL_SANDBOX_KUBERNETES`` (``current`` or ``floor``), else ``current``."""
    value = os.environ.get(KUBERNETES_ENV) or "current"
    for choice in build.KUBERNETES_CHOICES:
        if value == choice:
            return choice
    raise ValueError(
        f"{KUBERNETES_ENV}={value!r}: expected one of {', '.join(build.KUBERNETES_CHOICES)}"
    )


class ControlPlaneError(RuntimeError):
    """A component did not start; the message carries its log tail."""


@dataclass
class StartupTimes:
    """Seconds each phase of `start` took (printed by the CLI and the tests)."""

    binaries: float = 0.0
    etcd: float = 0.0
    apiserver: float = 0.0
    others: float = 0.0
    total: float = 0.0


class ControlPlane:
    """One local control plane rooted at `workdir`."""

    def __init__(
        self,
        workdir: Path,
        *,
        kwok_nodes: int = 2,
        die_with_parent: bool = True,
        extra_apiserver_args: Sequence[str] = (),
        real_node: bool = False,
        taint_kwok_nodes: bool | None = None,
        kubernetes: build.Kubernetes | None = None,
    ) -> None:
        self.workdir = workdir.resolve()
        # Which Kubernetes release's binaries run (lmeval_sandbox.build).
        self.kubernetes: build.Kubernetes = kubernetes or default_kubernetes()
        # Ready for a real node (lmeval_sandbox.realnode) to join: the
        # apiserver is reachable from its pods and talks to its kubelet.
        self.real_node = real_node
        # Tainted kwok nodes take only pods that ask for them: where a node
        # really runs pods (the real node, the sandbox's local runner), a job
        # without placement must never "run" on a node that runs nothing.
        self.taint_kwok_nodes = real_node if taint_kwok_nodes is None else taint_kwok_nodes
        self.kwok_nodes = kwok_nodes
        self.die_with_parent = die_with_parent
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.logs_dir = self.workdir / "logs"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.audit = AuditLog(self.workdir / "audit.log")
        self.state_file = self.workdir / "state.json"
        self.times = StartupTimes()
        self._supervisor = Supervisor(
            self.workdir, self.logs_dir, die_with_parent=die_with_parent, error=ControlPlaneError
        )
        self.ports = Ports()
        self.pki: Pki | None = None
        self.binaries: Path | None = None

    # -- lifecycle -----------------------------------------------------------

    def start(self, timeout: float = 90.0) -> None:
        """Build or find binaries, then start every component and wait for it."""
        begin = time.monotonic()
        self.binaries = build.ensure_binaries(self.kubernetes)
        self.times.binaries = time.monotonic() - begin
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        self.pki = make_pki(
            self.workdir / "pki",
            extra_server_names=(nodeconfig.NODE_IP,) if self.real_node else (),
        )
        try:
            phase = time.monotonic()
            self._start_etcd(timeout)
            self.times.etcd = time.monotonic() - phase
            phase = time.monotonic()
            self._start_apiserver(timeout)
            self.times.apiserver = time.monotonic() - phase
            phase = time.monotonic()
            self._write_kubeconfigs()
            self._apply_kwok_crds(timeout)
            self._start_controller_manager()
            self._start_scheduler()
            self._start_kwok()
            self._wait_https("kube-controller-manager", self.ports.controller_manager, timeout)
            self._wait_https("kube-scheduler", self.ports.scheduler, timeout)
            self._create_kwok_nodes(timeout)
            self._wait_for_default_service_account(timeout)
            self.times.others = time.monotonic() - phase
        except BaseException:
            self.stop()
            raise
        self.times.total = time.monotonic() - begin
        self._save_state()

    def stop(self) -> None:
        """Stop every component this object (or the state file) started."""
        pids = self._supervisor.pids()
        if not pids and self.state_file.exists():
            pids = json.loads(self.state_file.read_text()).get("pids", {})
        # Reverse start order: clients first, etcd last.
        for name in reversed(list(pids)):
            terminate(int(pids[name]))
        self._supervisor.reap()
        self.state_file.unlink(missing_ok=True)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def running(self) -> dict[str, bool]:
        """Which components are alive, by name."""
        return self._supervisor.running()

    # -- components ----------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        return self._supervisor.spawn(name, argv)

    def _bin(self, name: str) -> str:
        assert self.binaries is not None
        return str(self.binaries / name)

    def _start_etcd(self, timeout: float) -> None:
        self._spawn("etcd", etcd_argv(self._bin("etcd"), self.workdir, self.ports))
        client = f"http://127.0.0.1:{self.ports.etcd_client}"
        self._wait_until(
            "etcd",
            lambda: http_ok(f"{client}/health", None, lambda body: b'"health":"true"' in body),
            timeout,
        )

    def _start_apiserver(self, timeout: float) -> None:
        argv = apiserver_argv(
            self._bin("kube-apiserver"),
            self.workdir,
            self.ports,
            self._pki(),
            self.audit.path,
            [
                *(nodeconfig.apiserver_args(self._pki()) if self.real_node else []),
                *self.extra_apiserver_args,
            ],
        )
        self._spawn("kube-apiserver", argv)
        context = self._admin_ssl_context()
        self._wait_until(
            "kube-apiserver",
            lambda: http_ok(f"{self.server}/readyz", context, lambda body: body.strip() == b"ok"),
            timeout,
        )

    def _start_controller_manager(self) -> None:
        binary = self._bin("kube-controller-manager")
        argv = controller_manager_argv(binary, self.workdir, self.ports, self._pki())
        self._spawn("kube-controller-manager", argv)

    def _start_scheduler(self) -> None:
        argv = scheduler_argv(self._bin("kube-scheduler"), self.workdir, self.ports)
        self._spawn("kube-scheduler", argv)

    def _start_kwok(self) -> None:
        argv = kwok_argv(self._bin("kwok"), self.workdir, self.ports, self._pki(), self.kubeconfig)
        self._spawn("kwok", argv)

    # -- cluster objects -------------------------------------------------------

    def _write_kubeconfigs(self) -> None:
        pki = self._pki()
        self.write_kubeconfig(self.kubeconfig, "sandbox-admin", pki.admin.cert, pki.admin.key)
        self.write_kubeconfig(
            self.workdir / CONTROLLER_MANAGER_KUBECONFIG,
            "system:kube-controller-manager",
            pki.controller_manager.cert,
            pki.controller_manager.key,
        )
        self.write_kubeconfig(
            self.workdir / SCHEDULER_KUBECONFIG,
            "system:kube-scheduler",
            pki.scheduler.cert,
            pki.scheduler.key,
        )

    def write_kubeconfig(
        self,
        path: Path,
        user: str,
        cert: Path | None = None,
        key: Path | None = None,
        token: str | None = None,
        namespace: str = "default",
    ) -> Path:
        """Write a kubeconfig for this plane with a client cert or a bearer token."""
        ca_cert = self._pki().ca_cert
        path.write_text(kubeconfig_yaml(self.server, ca_cert, user, cert, key, token, namespace))
        path.chmod(0o600)
        return path

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        check: bool = True,
        input_text: str | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run the sandbox's own kubectl against this plane (argv, no shell)."""
        return subprocess.run(
            [self._bin("kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            check=check,
            capture_output=True,
            text=True,
            input=input_text,
            timeout=timeout,
        )

    def _apply_kwok_crds(self, timeout: float) -> None:
        assert self.binaries is not None
        crds = build.kwok_crds_dir(self.binaries)
        files = [str(crds / name) for name in build.KWOK_CRD_FILES]
        args: list[str] = ["apply", "--server-side"]
        for path in files:
            args += ["-f", path]
        self.kubectl(*args)
        names = [
            "logs.kwok.x-k8s.io",
            "clusterlogs.kwok.x-k8s.io",
            "execs.kwok.x-k8s.io",
            "clusterexecs.kwok.x-k8s.io",
        ]
        self.kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={int(timeout)}s",
            *[f"crd/{name}" for name in names],
        )

    def _create_kwok_nodes(self, timeout: float) -> None:
        documents = [
            kwok.node_body(f"kwok-node-{i}", tainted=self.taint_kwok_nodes)
            for i in range(self.kwok_nodes)
        ]
        self.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(documents))
        label, value = kwok.KWOK_NODE_LABEL
        self._wait_until(
            "kwok",
            lambda: self._ready_node_count(f"{label}={value}") >= self.kwok_nodes,
            timeout,
        )

    def _ready_node_count(self, selector: str) -> int:
        out = self.kubectl("get", "nodes", "-l", selector, "-o", "json", check=False)
        if out.returncode != 0:
            return 0
        count = 0
        for node in json.loads(out.stdout)["items"]:
            for condition in node.get("status", {}).get("conditions", []):
                if condition["type"] == "Ready" and condition["status"] == "True":
                    count += 1
        return count

    def _wait_for_default_service_account(self, timeout: float) -> None:
        # Pods cannot be created before the service-account controller has
        # made "default" in their namespace.
        self._wait_until(
            "kube-controller-manager",
            lambda: (
                self.kubectl(
                    "get", "serviceaccount", "default", "-n", "default", check=False
                ).returncode
                == 0
            ),
            timeout,
        )

    # -- helpers ---------------------------------------------------------------

    def _pki(self) -> Pki:
        assert self.pki is not None, "start() first"
        return self.pki

    def _admin_ssl_context(self) -> ssl.SSLContext:
        pki = self._pki()
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        context.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
        return context

    def _wait_https(self, name: str, port: int, timeout: float) -> None:
        # Components serve /healthz with a self-signed certificate; reachability
        # and "ok" are what matter here.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        self._wait_until(
            name,
            lambda: http_ok(
                f"https://127.0.0.1:{port}/healthz", context, lambda body: body.strip() == b"ok"
            ),
            timeout,
        )

    def _wait_until(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        self._supervisor.wait_until(name, ready, timeout)

    def log_tail(self, component: str, lines: int = 30) -> str:
        """The last lines of a component's log, for error messages."""
        return self._supervisor.log_tail(component, lines)

    def _save_state(self) -> None:
        state: dict[str, Any] = {
            "pids": self._supervisor.pids(),
            "ports": asdict(self.ports),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "audit_log": str(self.audit.path),
            "binaries": str(self.binaries),
            "kubernetes": self.kubernetes,
            "times": asdict(self.times),
        }
        self.state_file.write_text(json.dumps(state, indent=2))

    @classmethod
    def read_state(cls, workdir: Path) -> dict[str, Any] | None:
        """The state a running plane left in `workdir`, or None."""
        path = workdir / "state.json"
        if not path.exists():
            return None
        state: dict[str, Any] = json.loads(path.read_text())
        return state
