"""A real node beside kwok: containerd, runc, CNI, a kubelet, kube-proxy and cluster DNS.

kwok's stages and the local runner are our imitation of a kubelet; this
module starts the real one, built from the same Kubernetes pin as the
control plane (`lmeval_sandbox.build`), on Debian's containerd and runc, so
that the end-to-end suite (tests/node) and ``python -m lmeval_sandbox run
--node real`` see what a cluster does: images pulled from a registry, the
restricted security context enforced by a runtime, OOM kills, log rotation,
``kubectl logs``/``exec`` through the apiserver and the kubelet's own
authorisation.

The node joins a `ControlPlane` started with ``real_node=True`` (which makes
the apiserver reachable from pods and able to dial the kubelet). There can be
one real node per machine at a time: the bridge, kube-proxy's iptables chains
and the cgroup tree are machine-wide, so `start` takes a lock and says who
holds it. `stop` ends everything the node started, by PID, kills what runs in
its pods' cgroups, unmounts what it mounted and removes its bridge and
firewall rule, even after a failed start; `stop` from another process works
from ``state.json``. Flags and files are in `lmeval_sandbox.nodeconfig`.

The kubelet and kube-proxy are of the plane's release unless `kubernetes`
says otherwise: an older node under a newer plane is a skew Kubernetes
supports (and one that upgrades go through), a newer one is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import grpc

from lmeval_sandbox import build, nodecleanup, nodeconfig, servicedns
from lmeval_sandbox.controlplane import ControlPlane, ControlPlaneError
from lmeval_sandbox.nodeconfig import BRIDGE, NODE_IP, NODE_NAME, POD_SUBNET, NodePorts
from lmeval_sandbox.pki import issue_cert
from lmeval_sandbox.supervise import Supervisor, http_ok, terminate

__all__ = ["NodeImage", "RealNode", "RealNodeError", "missing_prerequisites"]

LOCK_FILE = Path("/run/lmeval-real-node.lock")
# What the node runs that the project does not build, and the Debian
# package each comes from (deploy/sandbox/node-packages.sh installs them).
PREREQUISITES = {
    "/usr/bin/containerd": "containerd",
    "/usr/bin/ctr": "containerd",
    "/usr/sbin/runc": "runc",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "/usr/bin/docker-registry": "docker-registry",
    "/usr/bin/skopeo": "skopeo",
    "/usr/sbin/iptables": "iptables",
    "/usr/sbin/conntrack": "conntrack",
    "/usr/sbin/dnsmasq": "dnsmasq-base",
}
_FIREWALL_RULE = [
    "FORWARD",
    "-i",
    BRIDGE,
    "!",
    "-o",
    BRIDGE,
    "-m",
    "comment",
    "--comment",
    "lmeval-node: pods reach nothing beyond the bridge",
    "-j",
    "DROP",
]


def _tcp_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


class RealNodeError(ControlPlaneError):
    """The node did not start; the message says which part and carries its log."""


def missing_prerequisites() -> list[str]:
    """Debian packages the node needs that are not installed (empty: all there)."""
    missing = {package for path, package in PREREQUISITES.items() if not Path(path).exists()}
    return sorted(missing)


class NodeImage:
    """An image the node serves from its registry: an OCI archive and its name."""

    def __init__(self, archive: Path, name: str) -> None:
        self.archive = archive
        self.name = name


class RealNode:
    """One real node rooted at `workdir`, joined to `plane`."""

    def __init__(
        self,
        plane: ControlPlane,
        workdir: Path,
        *,
        container_log_max_size: str = "10Mi",
        die_with_parent: bool = True,
        registry_port: int | None = None,
        kubernetes: build.Kubernetes | None = None,
    ) -> None:
        if not plane.real_node:
            raise ValueError("the control plane must be started with real_node=True")
        # The kubelet's and kube-proxy's release: the plane's unless told.
        self.kubernetes: build.Kubernetes = kubernetes or plane.kubernetes
        if build.kubernetes_minor(self.kubernetes) > build.kubernetes_minor(plane.kubernetes):
            raise ValueError(
                f"a {self.kubernetes} node ({build.kubernetes_version(self.kubernetes)}) is newer "
                f"than its {plane.kubernetes} plane ({build.kubernetes_version(plane.kubernetes)}):"
                " a kubelet may be older than the apiserver, never newer"
            )
        self.plane = plane
        self.workdir = workdir.resolve()
        self.container_log_max_size = container_log_max_size
        # A fixed registry port keeps image references valid across nodes that
        # share the registry's storage (a release built once, installed on
        # several fresh planes).
        self.ports = NodePorts() if registry_port is None else NodePorts(registry=registry_port)
        self.logs_dir = self.workdir / "logs"
        self.state_file = self.workdir / "state.json"
        # Pulled layers and pushed images outlive the node: warm starts pull nothing.
        self.containerd_root = build.cache_root() / "node" / "containerd"
        self.registry_storage = build.cache_root() / "node" / "registry"
        self.containerd_state = self.workdir / "containerd-state"
        self.socket = self.workdir / "containerd.sock"
        self.kubelet_root = self.workdir / "kubelet"
        self.pod_logs = self.workdir / "pod-logs"
        self.times: dict[str, float] = {}
        self._supervisor = Supervisor(
            self.workdir, self.logs_dir, die_with_parent=die_with_parent, error=RealNodeError
        )
        self._lock: IO[str] | None = None

    # -- lifecycle -----------------------------------------------------------

    @property
    def registry(self) -> str:
        """The registry's host:port, the prefix of every image the node runs."""
        return f"127.0.0.1:{self.ports.registry}"

    def image(self, name: str) -> str:
        """The full reference of `name` (``repo/image:tag``) in the node's registry."""
        return f"{self.registry}/{name}"

    def start(self, images: Iterable[NodeImage], *, pause: str, timeout: float = 180.0) -> None:
        """Start the node with `images` in its registry; `pause` names the sandbox image."""
        missing = missing_prerequisites()
        if missing:
            raise RealNodeError(
                "the real node needs these Debian packages: "
                + " ".join(missing)
                + " (deploy/sandbox/node-packages.sh installs them, as root)"
            )
        if os.geteuid() != 0:
            raise RealNodeError("the real node runs containers: it must be started as root")
        self._take_lock()
        begin = time.monotonic()
        try:
            for directory in (self.logs_dir, self.containerd_root, self.registry_storage):
                directory.mkdir(parents=True, exist_ok=True)
            self._timed("network", self._start_network)
            self._timed("dns", lambda: self._start_dns(timeout))
            self._timed("registry", lambda: self._start_registry(timeout))
            self._timed("images", lambda: self._push(images))
            self._timed("containerd", lambda: self._start_containerd(self.image(pause), timeout))
            self._timed("kubelet", lambda: self._start_kubelet(timeout))
            self._timed("kube-proxy", lambda: self._start_kube_proxy(timeout))
        except BaseException:
            self.stop()
            raise
        self.times["total"] = time.monotonic() - begin
        self._save_state()

    def stop(self) -> None:
        """Stop everything, kill what the pods run, unmount, remove bridge and rule."""
        pids = self._supervisor.pids()
        if not pids and self.state_file.exists():
            pids = json.loads(self.state_file.read_text()).get("pids", {})
        for name in ("kube-proxy", "kubelet"):
            if name in pids:
                terminate(int(pids[name]))
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            # kube-proxy's own way of removing its iptables chains.
            subprocess.run([self._bin("kube-proxy"), "--cleanup"], capture_output=True, timeout=60)
        nodecleanup.kill_cgroup_tree("kubepods")
        self._remove_containers()
        for name in ("containerd", "registry", "service-dns", "dns"):
            if name in pids:
                terminate(int(pids[name]))
        nodecleanup.kill_shims(self.socket)
        nodecleanup.unmount_under([self.workdir, self.containerd_root])
        nodecleanup.remove_cgroup_tree("kubepods")
        nodecleanup.run_quiet(["iptables", "-D", *_FIREWALL_RULE])
        nodecleanup.remove_kube_chains()
        nodecleanup.run_quiet(["ip", "link", "del", BRIDGE])
        self._supervisor.reap()
        self.state_file.unlink(missing_ok=True)
        self._release_lock()

    def prepull(self, names: Iterable[str], timeout: float = 300.0) -> None:
        """Pull images from the node's registry into containerd's CRI store now.

        What a node image cache does: the first pod of a large image (the job
        image is 940 MiB) then starts in seconds instead of spending its
        pending time on the pull.
        """
        for name in names:
            result = self._ctr("images", "pull", "--plain-http", self.image(name), timeout=timeout)
            if result.returncode != 0:
                raise RealNodeError(f"pulling {name} failed: {result.stderr.strip()}")

    def runtime_spec(self, container_id: str) -> dict[str, Any]:
        """The OCI runtime spec containerd ran a container with (a pod status's
        ``containerID``, ``containerd://`` prefix or not): the mounts, user,
        capabilities and flags the kubelet actually asked for."""
        name = container_id.removeprefix("containerd://")
        result = self._ctr("containers", "info", name)
        if result.returncode != 0:
            raise RealNodeError(f"container {name}: {result.stderr.strip()}")
        spec: dict[str, Any] = json.loads(result.stdout)["Spec"]
        return spec

    def leftovers(self) -> list[str]:
        """What a stopped node left on the machine: empty after a clean `stop`."""
        return nodecleanup.leftovers([self.workdir, self.containerd_root], self.socket, BRIDGE)

    def running(self) -> dict[str, bool]:
        """Which of the node's processes are alive, by name."""
        return self._supervisor.running()

    # -- parts ---------------------------------------------------------------

    def _start_network(self) -> None:
        nodecleanup.run_quiet(["ip", "link", "del", BRIDGE])
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "addr", "add", f"{NODE_IP}/{POD_SUBNET.split('/')[1]}", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        nodecleanup.run_quiet(["iptables", "-D", *_FIREWALL_RULE])
        _run(["iptables", "-I", *_FIREWALL_RULE])
        cni = self.workdir / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        (cni / "net.d" / "10-lmeval.conflist").write_text(nodeconfig.cni_conflist(cni / "ipam"))

    def _start_registry(self, timeout: float) -> None:
        config = self.workdir / "registry.yaml"
        config.write_text(nodeconfig.registry_config(self.registry_storage, self.ports.registry))
        self._spawn("registry", ["docker-registry", "serve", str(config)])
        self._wait_until("registry", lambda: http_ok(f"http://{self.registry}/v2/"), timeout)

    def _push(self, images: Iterable[NodeImage]) -> None:
        for image in images:
            # skopeo skips the blobs the (cached) registry already holds.
            result = subprocess.run(
                [
                    "skopeo",
                    "copy",
                    "--quiet",
                    "--dest-tls-verify=false",
                    f"oci-archive:{image.archive}",
                    f"docker://{self.image(image.name)}",
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if result.returncode != 0:
                raise RealNodeError(f"pushing {image.name} failed: {result.stderr.strip()}")

    def _start_containerd(self, pause_image: str, timeout: float) -> None:
        certs = self.workdir / "registry-hosts"
        nodeconfig.write_registry_hosts(certs, self.ports.registry)
        config = self.workdir / "containerd.toml"
        config.write_text(
            nodeconfig.containerd_config(
                root=self.containerd_root,
                state=self.containerd_state,
                socket=self.socket,
                cni_conf_dir=self.workdir / "cni" / "net.d",
                certs_dir=certs,
                pause_image=pause_image,
            )
        )
        self._spawn("containerd", ["containerd", f"--config={config}"])
        # `ctr version` answers as soon as containerd's socket does, but its
        # CRI service refuses calls ("server is not initialized yet") until it
        # has recovered its state; a kubelet started before then exits.
        self._wait_until("containerd", lambda: cri_answers(self.socket), timeout)

    def _start_kubelet(self, timeout: float) -> None:
        pki = self.plane.pki
        assert pki is not None
        client = issue_cert(
            pki, "node-client", f"system:node:{NODE_NAME}", groups=("system:nodes",)
        )
        serving = issue_cert(
            pki, "node-serving", NODE_NAME, server_names=(NODE_IP, "127.0.0.1", NODE_NAME)
        )
        kubeconfig = self.plane.write_kubeconfig(
            self.workdir / "kubelet.kubeconfig", f"system:node:{NODE_NAME}", client.cert, client.key
        )
        config = self.workdir / "kubelet.yaml"
        config.write_text(
            nodeconfig.kubelet_config(
                ports=self.ports,
                ca_cert=pki.ca_cert,
                serving_cert=serving.cert,
                serving_key=serving.key,
                socket=self.socket,
                pod_logs_dir=self.pod_logs,
                container_log_max_size=self.container_log_max_size,
            )
        )
        self.pod_logs.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "kubelet",
            nodeconfig.kubelet_argv(
                self._bin("kubelet"),
                config=config,
                kubeconfig=kubeconfig,
                root_dir=self.kubelet_root,
                cert_dir=self.workdir / "kubelet-pki",
            ),
        )
        healthz = f"http://127.0.0.1:{self.ports.kubelet_healthz}/healthz"
        self._wait_until("kubelet", lambda: http_ok(healthz) and self._node_ready(), timeout)

    def restart_kubelet(self, *, container_log_max_size: str, timeout: float = 60.0) -> None:
        """Restart the kubelet with another ``containerLogMaxSize``; pods keep running.

        The size is node-wide: a test that needs a tiny one sets it for
        itself instead of exposing every other test to log rotation.
        """
        self.container_log_max_size = container_log_max_size
        process = self._supervisor.processes.pop("kubelet")
        terminate(process.pid)
        process.wait(timeout=10)
        self._start_kubelet(timeout)

    def _start_dns(self, timeout: float) -> None:
        """dnsmasq on the bridge and the Service sync that feeds it (`servicedns`)."""
        hosts = self.workdir / "dns-hosts"
        hosts.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "service-dns",
            [
                sys.executable,
                "-m",
                "lmeval_sandbox.servicedns",
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--hosts-dir={hosts}",
            ],
        )
        self._spawn("dns", servicedns.dnsmasq_argv(NODE_IP, hosts))
        listed = hosts / servicedns.HOSTS_FILE
        self._wait_until("service-dns", listed.exists, timeout)
        self._wait_until("dns", lambda: _tcp_open(NODE_IP, 53), timeout)

    def _start_kube_proxy(self, timeout: float) -> None:
        pki = self.plane.pki
        assert pki is not None
        client = issue_cert(pki, "kube-proxy", "system:kube-proxy")
        kubeconfig = self.plane.write_kubeconfig(
            self.workdir / "kube-proxy.kubeconfig", "system:kube-proxy", client.cert, client.key
        )
        config = self.workdir / "kube-proxy.yaml"
        config.write_text(nodeconfig.kube_proxy_config(self.ports, kubeconfig))
        self._spawn("kube-proxy", nodeconfig.kube_proxy_argv(self._bin("kube-proxy"), config))
        healthz = f"http://127.0.0.1:{self.ports.proxy_healthz}/healthz"
        self._wait_until("kube-proxy", lambda: http_ok(healthz), timeout)

    def _node_ready(self) -> bool:
        out = self.plane.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        conditions = json.loads(out.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _remove_containers(self) -> None:
        if not self.socket.exists():
            return
        for kind in ("tasks", "containers"):
            listed = self._ctr(kind, "ls", "-q")
            for name in listed.stdout.split():
                if kind == "tasks":
                    self._ctr("tasks", "rm", "-f", name)
                else:
                    self._ctr("containers", "rm", name)

    # -- helpers -------------------------------------------------------------

    def _ctr(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                ["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as error:
            return subprocess.CompletedProcess(error.cmd, 1, "", "timed out")

    def _bin(self, name: str) -> str:
        if self.kubernetes == self.plane.kubernetes and self.plane.binaries is not None:
            return str(self.plane.binaries / name)
        return str(build.ensure_binaries(self.kubernetes) / name)

    def _timed(self, name: str, step: Callable[[], None]) -> None:
        began = time.monotonic()
        step()
        self.times[name] = time.monotonic() - began

    def _spawn(self, name: str, argv: list[str]) -> None:
        self._supervisor.spawn(name, argv)
        self._save_state()

    def _wait_until(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        self._supervisor.wait_until(name, ready, timeout)

    def log_tail(self, component: str, lines: int = 30) -> str:
        """The last lines of a part's log, for error messages."""
        return self._supervisor.log_tail(component, lines)

    def _save_state(self) -> None:
        state: dict[str, Any] = {
            "pids": self._supervisor.pids(),
            "ports": asdict(self.ports),
            "registry": self.registry,
            "kubernetes": self.kubernetes,
            "times": self.times,
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(state, indent=2))

    def _take_lock(self) -> None:
        handle = LOCK_FILE.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise RealNodeError(
                f"another real node runs on this machine (PID {holder}, lock {LOCK_FILE}): "
                "stop it first (python -m lmeval_sandbox down)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock = handle

    def _release_lock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


def cri_answers(socket: Path, timeout: float = 2.0) -> bool:
    """Whether the CRI runtime service on `socket` answers a Version call, as the
    kubelet's first call does. The request is sent as raw bytes (an empty
    VersionRequest), so no generated CRI stubs are needed."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        version: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/runtime.v1.RuntimeService/Version"
        )
        try:
            version(b"", timeout=timeout)
        except grpc.RpcError:
            return False
    return True


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RealNodeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
