"""Cluster DNS for the real node: Services' names answered by Debian's dnsmasq.

A kubeadm cluster runs CoreDNS, whose kubernetes plugin answers
``<service>.<namespace>.svc.cluster.local`` with the Service's ClusterIP.
The sandbox's node has no CoreDNS (its module graph is far too large to
build here), so this module does the same with two small parts:

* **dnsmasq** (a real DNS server, from Debian's ``dnsmasq-base``) listens on
  the bridge's host address `NODE_IP`, which the kubelet's ``clusterDNS``
  names, so every ``ClusterFirst`` pod's ``resolv.conf`` points at it with the
  cluster's search path. It answers from a hosts directory (re-read through
  inotify when a file changes), is authoritative for ``cluster.local`` (an
  unknown Service is NXDOMAIN at once) and forwards nothing: the node's pods
  reach nothing beyond the bridge anyway;
* **the Service sync** (`main`, run as a process beside the node) watches
  Services in every namespace and rewrites one hosts file with each
  Service's ClusterIP and fully qualified name, as CoreDNS would answer it.
  Headless Services (no ClusterIP) are not answered.

So a pod that dials ``https://model.team.svc:8443`` resolves the name
through the kubelet's search path and reaches the Service through
kube-proxy, as on any cluster: what OpenShift's service-serving
certificates are issued for.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CLUSTER_DOMAIN", "HOSTS_FILE", "dnsmasq_argv", "hosts_text", "main"]

CLUSTER_DOMAIN = "cluster.local"
HOSTS_FILE = "services"


def dnsmasq_argv(listen: str, hosts_dir: Path) -> list[str]:
    """dnsmasq in the foreground on `listen`:53, answering from `hosts_dir` only."""
    return [
        "dnsmasq",
        "--keep-in-foreground",
        "--log-facility=-",
        "--pid-file=",
        "--user=root",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--no-poll",
        "--bind-interfaces",
        f"--listen-address={listen}",
        "--port=53",
        f"--hostsdir={hosts_dir}",
        f"--local=/{CLUSTER_DOMAIN}/",
        "--domain-needed",
        # Answers change as Services come and go: no caching by clients.
        "--local-ttl=1",
    ]


def hosts_text(services: Mapping[tuple[str, str], str]) -> str:
    """The hosts file for `services` ((namespace, name) -> ClusterIP), sorted."""
    lines = [
        f"{ip} {name}.{namespace}.svc.{CLUSTER_DOMAIN}\n"
        for (namespace, name), ip in sorted(services.items())
    ]
    return "".join(lines)


def _write(path: Path, text: str) -> None:
    # dnsmasq re-reads on inotify's close-write/move: a whole file at once.
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _entry(service: dict[str, Any]) -> tuple[tuple[str, str], str | None]:
    """((namespace, name), its ClusterIP or None when headless) of a Service."""
    meta, spec = service.get("metadata", {}), service.get("spec", {})
    ip = spec.get("clusterIP")
    key = (str(meta.get("namespace")), str(meta.get("name")))
    return key, ip if isinstance(ip, str) and ip and ip != "None" else None


def sync(kubeconfig: Path, hosts_dir: Path) -> None:
    """Keep `hosts_dir`/services equal to the cluster's Services, forever."""
    from kubernetes import client, config

    # Raw JSON (no model classes): a LIST, then a watch from its resourceVersion.
    api: Any = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))  # type: ignore[no-untyped-call]
    target = hosts_dir / HOSTS_FILE
    while True:
        try:
            listed = json.loads(api.list_service_for_all_namespaces(_preload_content=False).data)
            services: dict[tuple[str, str], str] = {}
            for item in listed["items"]:
                key, ip = _entry(item)
                if ip is not None:
                    services[key] = ip
            _write(target, hosts_text(services))
            stream = api.list_service_for_all_namespaces(
                watch=True,
                resource_version=listed["metadata"]["resourceVersion"],
                timeout_seconds=300,
                _preload_content=False,
            )
            for line in stream:
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    break  # e.g. 410 Gone: list again
                key, ip = _entry(event["object"])
                if event["type"] == "DELETED" or ip is None:
                    changed = services.pop(key, None) is not None
                else:
                    changed = services.get(key) != ip
                    services[key] = ip
                if changed:
                    _write(target, hosts_text(services))
        except Exception as exc:  # the apiserver restarted or the watch broke: list again
            print(f"service sync: {type(exc).__name__}: {exc}; listing again", flush=True)
            time.sleep(1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lmeval_sandbox.servicedns",
        description="Write the cluster's Services as a hosts file for the node's dnsmasq.",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--hosts-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.hosts_dir.mkdir(parents=True, exist_ok=True)
    sync(args.kubeconfig, args.hosts_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
