"""What the real node's parts are told: containerd, CNI, kubelet, kube-proxy, registry.

`lmeval_sandbox.realnode` runs the processes; this module holds the other
half, as `lmeval_sandbox.components` does for the control plane: the
configuration files and command lines, and the place to read where the
sandbox's node departs from a kubeadm node, and why.

- **Network.** Pods get addresses from `POD_SUBNET` on the bridge `BRIDGE`,
  which the node creates and which routes nowhere else: no masquerade, and a
  FORWARD rule drops whatever a pod sends out of the bridge. The host's end
  of the bridge, `NODE_IP`, is the node's InternalIP (the kubelet refuses a
  loopback node IP), the address the apiserver advertises for the
  ``kubernetes`` Service, and where the apiserver dials the kubelet.
- **State.** containerd's image store lives in the cache (pulled layers
  survive between runs: a warm node pulls nothing); its state, the kubelet's
  root and the pod logs live in the node's work directory. Network
  namespaces are mounted under containerd's state directory
  (``netns_mounts_under_state_dir``) so that stopping the node finds every
  mount it made under directories it owns.
- **cgroups.** The machines have cgroup v1 and no systemd: the ``cgroupfs``
  driver on both sides, and ``failCgroupV1: false`` (Kubernetes 1.34 still
  supports v1 with that switch).
- **Releases.** The same files serve the project's floor release (see
  `lmeval_sandbox.build`): a 1.31 kubelet and kube-proxy take them as they
  are (``failCgroupV1`` exists from 1.31 on; a 1.30 kubelet would only log
  that it decoded the file leniently).
- **Images** come from a `docker-registry` on loopback over plain HTTP
  (containerd's ``hosts.toml``), so ``imagePullPolicy`` and pull errors are
  the real ones; the pause image is our own (no registry.k8s.io here).
- **No CAP_SYS_RESOURCE.** Root on these machines lacks it, so containerd
  clamps the OOM score adjustments the kubelet asks for
  (``restrict_oom_score_adj``) instead of failing every pod sandbox.
- **DNS.** No CoreDNS: Debian's dnsmasq on `NODE_IP` answers
  ``<service>.<namespace>.svc.cluster.local`` from the Services
  (`lmeval_sandbox.servicedns`), and the kubelet's ``clusterDNS`` names it.
- **Logs.** ``containerLogMaxSize`` is a parameter: the end-to-end suite sets
  it small to prove that results survive CRI log rotation.

Every function only builds argv lists or writes files; none starts a process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lmeval_sandbox.components import free_port
from lmeval_sandbox.pki import Pki

__all__ = [
    "BRIDGE",
    "NODE_IP",
    "NODE_LABEL",
    "NODE_NAME",
    "POD_SUBNET",
    "NodePorts",
    "apiserver_args",
    "cni_conflist",
    "containerd_config",
    "kube_proxy_argv",
    "kube_proxy_config",
    "kubelet_argv",
    "kubelet_config",
    "registry_config",
    "write_registry_hosts",
]

NODE_NAME = "lmeval-node"
# Every real node carries this label (tests and the sandbox select on it).
NODE_LABEL = ("sandbox.lmeval.io/real-node", "true")
BRIDGE = "lmevalbr0"
POD_SUBNET = "10.244.0.0/24"
NODE_IP = "10.244.0.1"
CNI_NETWORK = "lmeval-pods"


def apiserver_args(pki: Pki) -> list[str]:
    """What the apiserver needs beyond the plane's defaults once a real node joins.

    Its pods reach it through the ``kubernetes`` Service, whose endpoint is
    the node's bridge address, so it listens beyond loopback (the address
    exists only on a bridge that routes nowhere). It dials kubelets with a
    client certificate and checks theirs; NodeRestriction limits what a
    kubelet may write to its own node and pods, as on any kubeadm cluster.
    """
    return [
        "--bind-address=0.0.0.0",
        f"--advertise-address={NODE_IP}",
        f"--kubelet-client-certificate={pki.apiserver_kubelet_client.cert}",
        f"--kubelet-client-key={pki.apiserver_kubelet_client.key}",
        f"--kubelet-certificate-authority={pki.ca_cert}",
        "--enable-admission-plugins=NodeRestriction",
    ]


@dataclass
class NodePorts:
    """The ports of one node: kubelet and kube-proxy on the node IP or loopback."""

    registry: int = field(default_factory=free_port)
    kubelet: int = field(default_factory=free_port)
    kubelet_healthz: int = field(default_factory=free_port)
    proxy_healthz: int = field(default_factory=free_port)
    proxy_metrics: int = field(default_factory=free_port)


def registry_config(storage: Path, port: int) -> str:
    """docker-registry's config: filesystem storage, HTTP on loopback, no auth."""
    config = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str(storage)},
            "delete": {"enabled": True},
        },
        "http": {"addr": f"127.0.0.1:{port}", "headers": {"X-Content-Type-Options": ["nosniff"]}},
    }
    return yaml.safe_dump(config, sort_keys=False)


def write_registry_hosts(certs_dir: Path, port: int) -> None:
    """containerd's per-registry ``hosts.toml``: our registry speaks plain HTTP."""
    host = f"127.0.0.1:{port}"
    directory = certs_dir / host
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "hosts.toml").write_text(
        f'server = "http://{host}"\n\n'
        f'[host."http://{host}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
    )


def containerd_config(
    *, root: Path, state: Path, socket: Path, cni_conf_dir: Path, certs_dir: Path, pause_image: str
) -> str:
    """containerd 1.6's config (version 2) for a CRI node of our own."""
    return f"""version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  level = "warn"

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  # The node's network namespaces live under state, which stop() unmounts.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  # These machines deny even root CAP_SYS_RESOURCE, so runc cannot lower a
  # container's oom_score_adj below the node's own (kubelet asks -998 for
  # the pause container): clamp, as rootless nodes do.
  restrict_oom_score_adj = true
  max_container_log_line_size = 16384

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{cni_conf_dir}"
  max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "{certs_dir}"
"""


def cni_conflist(ipam_dir: Path) -> str:
    """The pod network: one bridge, host-local addresses, nothing routed out."""
    conflist = {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                # No masquerade: pods reach the node and each other, nothing else.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                    # The default route only leads to the node, which forwards
                    # nothing out of the bridge; service IPs need it.
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(conflist, indent=2)


def kubelet_config(
    *,
    ports: NodePorts,
    ca_cert: Path,
    serving_cert: Path,
    serving_key: Path,
    socket: Path,
    pod_logs_dir: Path,
    container_log_max_size: str,
) -> str:
    """The KubeletConfiguration: authenticated API, cgroupfs on v1, no evictions for space."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        # The apiserver proves itself with a client cert from our CA, and its
        # requests (logs, exec) are authorised by a SubjectAccessReview.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "containerRuntimeEndpoint": f"unix://{socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "podLogsDir": str(pod_logs_dir),
        "containerLogMaxSize": container_log_max_size,
        "containerLogMaxFiles": 2,
        # The smallest interval the kubelet accepts: rotation shows up soon.
        "containerLogMonitorInterval": "3s",
        "resolvConf": "/etc/resolv.conf",
        # The node's dnsmasq answers Services' names (`lmeval_sandbox.servicedns`).
        "clusterDNS": [NODE_IP],
        "clusterDomain": "cluster.local",
        "maxPods": 60,
        "serializeImagePulls": False,
        "runtimeRequestTimeout": "10m",
        # A developer's disk is often fuller than a node's: evict for memory
        # only, and never collect images the suite just pulled.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "protectKernelDefaults": False,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
    }
    return yaml.safe_dump(config, sort_keys=False)


def kubelet_argv(
    binary: str, *, config: Path, kubeconfig: Path, root_dir: Path, cert_dir: Path
) -> list[str]:
    label, value = NODE_LABEL
    return [
        binary,
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={root_dir}",
        f"--cert-dir={cert_dir}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        f"--node-labels={label}={value}",
        "--v=1",
    ]


def kube_proxy_config(ports: NodePorts, kubeconfig: Path) -> str:
    """kube-proxy in iptables mode, Services for this node's pods and for the host."""
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": POD_SUBNET,
        "hostnameOverride": NODE_NAME,
        "healthzBindAddress": f"127.0.0.1:{ports.proxy_healthz}",
        "metricsBindAddress": f"127.0.0.1:{ports.proxy_metrics}",
        # NodePorts only on the bridge address, never on the machine's own.
        "nodePortAddresses": [f"{NODE_IP}/32"],
        # Leave the machine's conntrack sysctls alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"syncPeriod": "30s", "minSyncPeriod": "0s", "masqueradeAll": False},
    }
    return yaml.safe_dump(config, sort_keys=False)


def kube_proxy_argv(binary: str, config: Path) -> list[str]:
    return [binary, f"--config={config}", "--v=1"]
