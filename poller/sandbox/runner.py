"""A tiny kubelet for the sandbox: run one node's pods as local processes.

kwok simulates pods: cheap, good for scale tests, but nothing runs. For true
end-to-end runs (the real driver, real lm_eval, real exit codes) the sandbox
has one more node, ``lmeval-sandbox``, that kwok leaves alone (it lacks kwok's
``type=kwok`` label) and that this runner serves instead. A pod lands there
only when it asks to (the node is tainted): the sample jobs carry a
nodeSelector and a toleration for it.

For each pod bound to the node the runner does what a kubelet does, with
local processes instead of containers:

* materialises the pod's volumes in a per-pod directory that plays the
  container's root filesystem (``<workdir>/pods/<ns>/<pod>-<uid>/root``):
  emptyDir and PVC volumes are directories, configMap and secret volumes are
  files (read as the admin, as a kubelet reads them with its node identity);
* rewrites every container path that a volume provides (and their parent
  directories) in the command line, in environment values and in configMap
  file contents to the local path, so ``--output-root=/outputs`` and an
  absolute ``data_files`` path in a task YAML both work;
* runs ``python`` as this interpreter and ``lmeval-driver`` as
  ``<this interpreter> -m driver``; init containers that only copy files
  (``cp ...``, the poller's ``install-driver``) are reported Completed
  without running, since the driver is already installed here;
* starts each container in its own session with the pod's environment
  (``valueFrom`` secrets and configMaps resolved, ``$(VAR)`` expanded) and
  writes its output in the container runtime's log format to a file that a
  kwok ``Logs`` object serves, so ``kubectl logs`` and the poller's
  ``pods/log`` reads work exactly as on a real node (the node's status sends
  the apiserver to kwok's kubelet port);
* reports the pod's status through ``pods/status``: Running with
  ``startedAt``, then terminated with the real exit code, ``signal`` when it
  was killed, ``finishedAt``, the log tail as message for
  ``FallbackToLogsOnError``, and phase Succeeded or Failed;
* on deletion sends SIGTERM to the container's main process, SIGKILL to
  everything it started once the pod's grace period is over (as a cgroup
  kill would), reports the termination, then removes the pod with grace
  period 0, as the kubelet finalises a deletion.

Run it with ``python -m poller.sandbox.runner --kubeconfig K --workdir D
--kwok-port P`` or in-process with ``LocalRunner(...).start()``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from poller.rawapi import send
from poller.sandbox.identities import api_client
from poller.sandbox.localproc import (
    Container,
    LocalPod,
    alive,
    cri_line,
    die_with_parent,
    memory_kib,
    process_table,
    pump,
    remember_family,
    rfc3339,
    utc_now,
    wait_for_exit,
)
from poller.sandbox.podfs import (
    HOST_IP,
    ConfigError,
    PathMapper,
    clean_path,
    copies_only,
    expand_vars,
    field_value,
    local_argv,
    termination_message,
    volume_files,
)

__all__ = [
    "NODE_LABEL",
    "NODE_NAME",
    "NODE_TAINT",
    "LocalRunner",
    "PathMapper",
    "expand_vars",
    "local_argv",
    "placement",
    "termination_message",
]

log = logging.getLogger(__name__)

NODE_NAME = "lmeval-sandbox"
NODE_LABEL = ("sandbox.lmeval.io/local", "true")
NODE_TAINT = {"key": NODE_LABEL[0], "value": NODE_LABEL[1], "effect": "NoSchedule"}
# A start error as containerd reports it.
START_ERROR_CODE = 128
REQUEST_TIMEOUT = 15.0
NODE_REFRESH_SECONDS = 20.0
CONFIG_RETRY_SECONDS = 2.0


def placement() -> dict[str, Any]:
    """The `spec.pod` fields that put a job on the sandbox's local node."""
    return {
        "nodeSelector": {NODE_LABEL[0]: NODE_LABEL[1]},
        "tolerations": [{**NODE_TAINT, "operator": "Equal"}],
    }


# -- the raw API ---------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class _Api:
    """Plain-JSON requests through the client's plumbing (no typed models)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        response, data = send(
            self.api,
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            timeout=REQUEST_TIMEOUT,
        )
        if not 200 <= response.status <= 299:
            raise ApiError(int(response.status), data.decode("utf-8", "replace"))
        return json.loads(data) if data else None

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query)

    def get_or_none(self, path: str) -> Any:
        try:
            return self.get(path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise


class LocalRunner:
    """Serve node `node_name`: run its pods as local processes, report like a kubelet."""

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        kwok_port: int,
        *,
        node_name: str = NODE_NAME,
        interval: float = 0.3,
        python: str = sys.executable,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir.resolve()
        self.kwok_port = kwok_port
        self.node_name = node_name
        self.interval = interval
        self.python = python
        self._api_client: client.ApiClient | None = None
        self._pods: dict[str, LocalPod] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._node_refreshed = 0.0
        self.errors = 0

    # -- lifecycle -------------------------------------------------------------------

    @property
    def api(self) -> _Api:
        if self._api_client is None:
            self._api_client = api_client(self.kubeconfig)
        return _Api(self._api_client)

    def start(self) -> LocalRunner:
        """Register the node and serve it from a background thread."""
        self.ensure_node()
        self._thread = threading.Thread(target=self.serve, name="sandbox-runner", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving: running pods are stopped (and reported) first."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> LocalRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve(self) -> None:
        """Poll until stopped (runs in the calling thread)."""
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    self.sync()
                except Exception:  # the API may be briefly unreachable
                    self.errors += 1
                    log.exception("runner sync failed")
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
        finally:
            self._shutdown()
            if self._api_client is not None:
                self._api_client.close()  # type: ignore[no-untyped-call]
                self._api_client = None

    # -- queries for tests and tools --------------------------------------------------

    def pid(self, namespace: str, name: str, container: str | None = None) -> int | None:
        """PID of a pod's (main) container process, if it was started."""
        with self._lock:
            for pod in self._pods.values():
                if (pod.namespace, pod.name) != (namespace, name):
                    continue
                for c in pod.main:
                    if (container is None or c.name == container) and c.proc is not None:
                        return c.proc.pid
        return None

    def pod_root(self, namespace: str, name: str) -> Path | None:
        """The directory that plays a pod's root filesystem."""
        with self._lock:
            for pod in self._pods.values():
                if (pod.namespace, pod.name) == (namespace, name):
                    return pod.root
        return None

    # -- the node --------------------------------------------------------------------

    def node_body(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {
                    NODE_LABEL[0]: NODE_LABEL[1],
                    "kubernetes.io/hostname": self.node_name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
                "annotations": {"sandbox.lmeval.io/runner": "local processes"},
            },
            "spec": {"taints": [dict(NODE_TAINT)]},
        }

    def node_status(self, ready: bool = True) -> dict[str, Any]:
        now = rfc3339(utc_now())
        capacity = {
            "cpu": str(os.cpu_count() or 1),
            "memory": f"{memory_kib()}Ki",
            "pods": "110",
            "ephemeral-storage": "100Gi",
        }

        def condition(kind: str, status: bool, reason: str, message: str) -> dict[str, Any]:
            return {
                "type": kind,
                "status": "True" if status else "False",
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }

        return {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": self.node_name},
            ],
            # The apiserver sends pods/log and pods/exec for this node to kwok,
            # which serves the logs the runner writes.
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kwok_port}},
            "conditions": [
                condition("MemoryPressure", False, "KubeletHasSufficientMemory", ""),
                condition("DiskPressure", False, "KubeletHasNoDiskPressure", ""),
                condition("PIDPressure", False, "KubeletHasSufficientPID", ""),
                condition(
                    "Ready",
                    ready,
                    "KubeletReady" if ready else "KubeletNotReady",
                    "sandbox runner is serving" if ready else "sandbox runner stopped",
                ),
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "lmeval sandbox (local processes)",
                "kernelVersion": os.uname().release,
                "containerRuntimeVersion": "sandbox-runner://1",
                "kubeletVersion": "sandbox",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        }

    def ensure_node(self, ready: bool = True) -> None:
        """Create the node if needed and (re)write its status."""
        path = f"/api/v1/nodes/{self.node_name}"
        if ready and self.api.get_or_none(path) is None:
            with contextlib.suppress(ApiError):
                self.api.request("POST", "/api/v1/nodes", body=self.node_body())
        self.api.request(
            "PATCH",
            f"{path}/status",
            body={"status": self.node_status(ready)},
            content_type="application/strategic-merge-patch+json",
        )
        self._node_refreshed = time.monotonic()

    # -- one poll --------------------------------------------------------------------

    def sync(self) -> None:
        """One poll: list the node's pods, move each one along."""
        if time.monotonic() - self._node_refreshed > NODE_REFRESH_SECONDS:
            self.ensure_node()
        listed = self.api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node_name}")
        objects = {obj["metadata"]["uid"]: obj for obj in listed.get("items") or []}
        table: dict[int, tuple[int, str]] | None = None
        for uid, obj in objects.items():
            pod = self._pods.get(uid)
            if pod is None:
                pod = self._admit(obj)
                if pod is None:
                    continue
            pod.obj = obj
            if pod.running() and table is None:
                table = process_table()
            try:
                self._advance(pod, table or {})
            except ApiError as error:
                if error.status not in (404, 409):  # gone, or a new pod of that name
                    self.errors += 1
                    log.warning("pod %s: %s", pod.key, error)
            except Exception:
                self.errors += 1
                log.exception("pod %s", pod.key)
        for uid in list(self._pods):
            if uid not in objects:
                # Force-deleted, or finalised by us: nothing may keep running.
                pod = self._pods[uid]
                self._kill(pod, process_table())
                with self._lock:
                    del self._pods[uid]

    def _admit(self, obj: dict[str, Any]) -> LocalPod | None:
        meta = obj["metadata"]
        status = obj.get("status") or {}
        deleting = bool(meta.get("deletionTimestamp"))
        if status.get("phase") in ("Succeeded", "Failed"):
            if deleting:
                self._finalize(meta["namespace"], meta["name"], meta["uid"])
            return None
        pod_dir = self.workdir / "pods" / meta["namespace"] / f"{meta['name']}-{meta['uid'][:8]}"
        pod = LocalPod(obj, pod_dir)
        started_elsewhere = any(
            "running" in (cs.get("state") or {}) or "terminated" in (cs.get("state") or {})
            for cs in status.get("containerStatuses") or []
        )
        if started_elsewhere:
            # A previous runner started it; its processes are gone with it.
            pod.lost = True
            for c in pod.main:
                c.exit_code, c.reason = 137, "ContainerStatusUnknown"
                c.message = "The container could not be located when the pod was terminated"
                c.finished_at = utc_now()
        elif deleting:
            self._finalize(pod.namespace, pod.name, pod.uid)
            return None
        with self._lock:
            self._pods[pod.uid] = pod
        log.info("admitted pod %s", pod.key)
        return pod

    def _advance(self, pod: LocalPod, table: dict[int, tuple[int, str]]) -> None:
        meta = pod.obj["metadata"]
        deleting = bool(meta.get("deletionTimestamp"))
        for c in pod.running():
            remember_family(c, table)
        if deleting and not pod.finished():
            self._terminate(pod, meta, table)
        elif not pod.prepared and not pod.lost and time.monotonic() >= pod.retry_at:
            self._try_prepare(pod)
        self._start_next(pod)
        self._collect(pod, table)
        self._report(pod)
        if deleting and (pod.finished() or not pod.running()) and not pod.deleted:
            self._finalize(pod.namespace, pod.name, pod.uid)
            pod.deleted = True

    def _terminate(
        self, pod: LocalPod, meta: dict[str, Any], table: dict[int, tuple[int, str]]
    ) -> None:
        if not pod.term_sent:
            grace = meta.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = (pod.obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            pod.term_sent = True
            pod.kill_at = time.monotonic() + float(grace)
            log.info("pod %s deleted: SIGTERM, SIGKILL in %s s", pod.key, grace)
            # Like a container runtime: SIGTERM to the main process only (it
            # owns the orderly shutdown); containers not started never will be.
            for c in pod.running():
                assert c.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.proc.pid, signal.SIGTERM)
        elif pod.kill_at is not None and time.monotonic() >= pod.kill_at and not pod.killed:
            self._kill(pod, table)

    def _kill(self, pod: LocalPod, table: dict[int, tuple[int, str]]) -> None:
        """SIGKILL every process of the pod, as removing its cgroup would."""
        pod.killed = True
        for c in pod.containers():
            if c.proc is None:
                continue
            remember_family(c, table)
            victims = {c.proc.pid: None, **c.family}
            for pid, start in victims.items():
                if pid == c.proc.pid and c.proc.poll() is not None:
                    continue
                if pid != c.proc.pid and not alive(pid, start):
                    continue
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    # -- set-up ----------------------------------------------------------------------

    def _try_prepare(self, pod: LocalPod) -> None:
        try:
            self._prepare(pod)
        except ConfigError as error:
            log.info("pod %s cannot start yet: %s", pod.key, error)
            for c in pod.containers():
                if c.state == "waiting":
                    c.waiting_reason, c.waiting_message = "CreateContainerConfigError", str(error)
            pod.retry_at = time.monotonic() + CONFIG_RETRY_SECONDS
            return
        pod.prepared = True
        pod.start_time = utc_now()

    def _prepare(self, pod: LocalPod) -> None:
        spec = pod.obj.get("spec") or {}
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts: list[tuple[str, str, str]] = []  # (mount path, volume, subPath)
        for c in pod.containers():
            for m in c.spec.get("volumeMounts") or []:
                if m["name"] not in volumes:
                    raise ConfigError(f"volume {m['name']!r} of container {c.name} is not defined")
                mounts.append((clean_path(m["mountPath"]), m["name"], m.get("subPath") or ""))
        pod.mapper = PathMapper(pod.root, [path for path, _, _ in mounts])
        pod.root.mkdir(parents=True, exist_ok=True)
        (pod.dir / "logs").mkdir(exist_ok=True)
        (pod.root / "tmp").mkdir(exist_ok=True)
        # Each volume lives at its first whole mount, or in volumes/ when only
        # sub-paths of it are mounted; other mounts are symlinks to it.
        homes: dict[str, Path] = {}
        for path, name, sub in sorted(mounts, key=lambda m: (m[0].count("/"), m[0])):
            if name not in homes and not sub:
                homes[name] = pod.root / path.lstrip("/")
        for _path, name, _sub in mounts:
            homes.setdefault(name, pod.dir / "volumes" / name)
        for name, home in homes.items():
            self._materialise(pod, volumes[name], home)
        placed: dict[str, tuple[str, str]] = {}
        for path, name, sub in mounts:
            if placed.setdefault(path, (name, sub)) != (name, sub):
                raise ConfigError(f"two different volumes are mounted at {path}")
            target = homes[name] / sub if sub else homes[name]
            where = pod.root / path.lstrip("/")
            if where == target:
                continue
            where.parent.mkdir(parents=True, exist_ok=True)
            if not where.exists() and not where.is_symlink():
                where.symlink_to(target)
        self._create_logs_object(pod)

    def _materialise(self, pod: LocalPod, volume: dict[str, Any], home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in volume:
            return
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            shared = self.workdir / "volumes" / pod.namespace / claim
            shared.mkdir(parents=True, exist_ok=True)
            home.rmdir()
            home.symlink_to(shared, target_is_directory=True)
            return
        if "projected" in volume:
            sources = volume["projected"].get("sources") or []
        elif any(k in volume for k in ("configMap", "secret", "downwardAPI")):
            sources = [volume]
        else:
            kinds = sorted(k for k in volume if k != "name")
            raise ConfigError(
                f"volume {volume['name']!r}: {', '.join(kinds)} is not supported here"
            )
        files: dict[str, bytes] = {}
        for source in sources:
            files.update(self._source_files(pod, source))
        for rel, data in files.items():
            target = home / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o444)

    def _source_files(self, pod: LocalPod, source: dict[str, Any]) -> dict[str, bytes]:
        """The files one volume source (or projection source) provides."""
        if "serviceAccountToken" in source:
            # What the kubelet does for a projected token: a TokenRequest
            # bound to the pod, as the admin.
            spec = source["serviceAccountToken"]
            account = (pod.obj.get("spec") or {}).get("serviceAccountName") or "default"
            response = self.api.request(
                "POST",
                f"/api/v1/namespaces/{pod.namespace}/serviceaccounts/{account}/token",
                body={
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {
                        "audiences": [spec["audience"]] if spec.get("audience") else None,
                        "expirationSeconds": spec.get("expirationSeconds", 3600),
                        "boundObjectRef": {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": pod.name,
                            "uid": pod.uid,
                        },
                    },
                },
            )
            return {spec["path"]: response["status"]["token"].encode()}
        if "downwardAPI" in source:
            return {
                item["path"]: field_value(pod.obj, item["fieldRef"]["fieldPath"]).encode()
                for item in source["downwardAPI"].get("items") or []
                if "fieldRef" in item
            }
        kind = "configMap" if "configMap" in source else "secret"
        ref = source[kind]
        name = ref.get("name") or ref.get("secretName") or ""
        plural = "configmaps" if kind == "configMap" else "secrets"
        obj = self.api.get_or_none(f"/api/v1/namespaces/{pod.namespace}/{plural}/{name}")
        if obj is None:
            if ref.get("optional"):
                return {}
            raise ConfigError(f'{kind} "{name}" not found')
        files = volume_files(obj, kind == "secret")
        if ref.get("items"):
            chosen: dict[str, bytes] = {}
            for item in ref["items"]:
                if item["key"] in files:
                    chosen[item["path"]] = files[item["key"]]
                elif not ref.get("optional"):
                    raise ConfigError(f'{kind} "{name}" has no key {item["key"]!r}')
            files = chosen
        if kind == "configMap":
            # Task files name their data by absolute in-pod paths.
            for rel, data in files.items():
                with contextlib.suppress(UnicodeDecodeError):
                    files[rel] = pod.mapper.rewrite(data.decode("utf-8")).encode("utf-8")
        return files

    def _create_logs_object(self, pod: LocalPod) -> None:
        entries = []
        for c in pod.containers():
            c.log_path = pod.dir / "logs" / f"{c.name}.log"
            c.log_path.touch()
            entries.append({"containers": [c.name], "logsFile": str(c.log_path), "follow": False})
        body: dict[str, Any] = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {
                "name": pod.name,
                "namespace": pod.namespace,
                # Garbage-collected with the pod.
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
                ],
            },
            "spec": {"logs": entries},
        }
        path = f"/apis/kwok.x-k8s.io/v1alpha1/namespaces/{pod.namespace}/logs"
        try:
            self.api.request("POST", path, body=body)
        except ApiError as error:
            if error.status != 409:
                raise
            # A same-named pod's leftover (its garbage collection is pending).
            old = self.api.get(f"{path}/{pod.name}")
            body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            self.api.request("PUT", f"{path}/{pod.name}", body=body)

    def _env(self, pod: LocalPod, c: Container) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in c.spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, plural in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
                if kind not in source:
                    continue
                name = source[kind]["name"]
                obj = self.api.get_or_none(f"/api/v1/namespaces/{pod.namespace}/{plural}/{name}")
                if obj is None:
                    if source[kind].get("optional"):
                        continue
                    raise ConfigError(f'{plural[:-1]} "{name}" not found')
                for key, data in volume_files(obj, kind == "secretRef").items():
                    env[prefix + key] = data.decode("utf-8", "replace")
        for item in c.spec.get("env") or []:
            if "valueFrom" in item:
                value = self._value_from(pod, item["name"], item["valueFrom"])
                if value is None:
                    continue
            else:
                value = expand_vars(item.get("value", ""), env)
            env[item["name"]] = value
        return {key: pod.mapper.rewrite(value) for key, value in env.items()}

    def _value_from(self, pod: LocalPod, name: str, source: dict[str, Any]) -> str | None:
        for kind, plural, binary in (
            ("secretKeyRef", "secrets", True),
            ("configMapKeyRef", "configmaps", False),
        ):
            if kind not in source:
                continue
            ref = source[kind]
            obj = self.api.get_or_none(f"/api/v1/namespaces/{pod.namespace}/{plural}/{ref['name']}")
            files = volume_files(obj, binary) if obj is not None else {}
            if ref["key"] not in files:
                if ref.get("optional"):
                    return None
                what = "secret" if binary else "configmap"
                if obj is None:
                    raise ConfigError(f'{what} "{ref["name"]}" not found')
                raise ConfigError(f"couldn't find key {ref['key']} in {what} {ref['name']}")
            return files[ref["key"]].decode("utf-8", "replace")
        if "fieldRef" in source:
            return field_value(pod.obj, source["fieldRef"]["fieldPath"])
        raise ConfigError(f"env {name}: {', '.join(source)} is not supported here")

    # -- processes -------------------------------------------------------------------

    def _start_next(self, pod: LocalPod) -> None:
        """Start the next init container, or every main container once init is done."""
        if not pod.prepared or pod.term_sent or pod.lost or time.monotonic() < pod.retry_at:
            return
        for c in pod.init:
            if c.state == "terminated":
                if c.exit_code != 0:
                    return  # restartPolicy Never: the pod has failed
                continue
            if c.state == "running":
                return
            if copies_only(c.spec):
                # The driver is installed in this environment already.
                c.started_at = c.finished_at = utc_now()
                c.exit_code, c.reason = 0, "Completed"
                continue
            self._spawn(pod, c)
            return
        for c in pod.main:
            if c.state == "waiting":
                self._spawn(pod, c)

    def _spawn(self, pod: LocalPod, c: Container) -> None:
        try:
            env = self._env(pod, c)
        except ConfigError as error:
            c.waiting_reason, c.waiting_message = "CreateContainerConfigError", str(error)
            pod.retry_at = time.monotonic() + CONFIG_RETRY_SECONDS
            return
        c.waiting_reason = c.waiting_message = ""
        words = [expand_vars(w, env) for w in [*c.spec.get("command", []), *c.spec.get("args", [])]]
        argv = local_argv(words, pod.mapper, self.python)
        base = {
            "PATH": os.pathsep.join(
                [os.path.dirname(self.python), os.environ.get("PATH", "/usr/bin:/bin")]
            ),
            "HOSTNAME": pod.name,
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "TMPDIR": str(pod.root / "tmp"),
        }
        env = {**base, **env}
        cwd = pod.mapper.local(c.spec.get("workingDir") or "/")
        if cwd == "/":
            cwd = str(pod.root)
        Path(cwd).mkdir(parents=True, exist_ok=True)
        assert c.log_path is not None
        c.started_at = utc_now()
        if not c.spec.get("command"):
            self._start_failed(
                c,
                "the sandbox runner cannot run an image's entrypoint: "
                "the container needs a command",
            )
            return
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        except OSError as error:
            self._start_failed(c, f"failed to start container process: {error}")
            return
        c.proc = proc
        log.info("pod %s: container %s runs as pid %d: %s", pod.key, c.name, proc.pid, argv)
        handle = c.log_path.open("ab", buffering=0)
        lock = threading.Lock()
        assert proc.stdout is not None and proc.stderr is not None
        readers = [
            threading.Thread(
                target=pump, args=(proc.stdout, "stdout", handle, lock, c), daemon=True
            ),
            threading.Thread(
                target=pump, args=(proc.stderr, "stderr", handle, lock, c), daemon=True
            ),
        ]
        c.readers = readers
        for reader in readers:
            reader.start()
        threading.Thread(target=wait_for_exit, args=(c, readers, handle, lock), daemon=True).start()

    def _start_failed(self, c: Container, message: str) -> None:
        c.exit_code, c.reason, c.message = START_ERROR_CODE, "StartError", message
        c.finished_at = utc_now()
        if c.log_path is not None:
            with c.log_path.open("ab") as handle:
                handle.write(cri_line(b"stderr", message.encode()))

    def _collect(self, pod: LocalPod, table: dict[int, tuple[int, str]]) -> None:
        """Turn exited processes into terminated container states."""
        for c in pod.containers():
            if c.exit_code is not None or c.proc is None or c.proc.poll() is None:
                continue
            if not c.orphans_killed:
                # As when a container's PID 1 exits: nothing it started survives
                # (and nothing keeps its output pipes open).
                c.orphans_killed = True
                remember_family(c, table)
                for pid, start in c.family.items():
                    if alive(pid, start):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, signal.SIGKILL)
            if not c.drained():
                continue
            code = c.proc.returncode
            assert code is not None
            if code < 0:
                c.signal = -code
                c.exit_code = 128 - code
            else:
                c.exit_code = code
            c.reason = "Completed" if c.exit_code == 0 else "Error"
            policy = c.spec.get("terminationMessagePolicy")
            if c.exit_code != 0 and policy == "FallbackToLogsOnError":
                with c._lock:
                    c.message = termination_message(c.tail)
            log.info("pod %s: container %s exited with %d", pod.key, c.name, c.exit_code)

    # -- reporting -------------------------------------------------------------------

    def _condition(self, pod: LocalPod, kind: str, ok: bool, reason: str = "") -> dict[str, Any]:
        status = "True" if ok else "False"
        previous = pod.transitions.get(kind)
        when = previous[1] if previous and previous[0] == status else rfc3339(utc_now())
        pod.transitions[kind] = (status, when)
        out = {"type": kind, "status": status, "lastTransitionTime": when, "lastProbeTime": None}
        if reason:
            out["reason"] = reason
        return out

    def _report(self, pod: LocalPod) -> None:
        phase = pod.phase()
        initialized = all(c.state == "terminated" and c.exit_code == 0 for c in pod.init)
        ready = phase == "Running" and all(c.state == "running" for c in pod.main)
        done = phase in ("Succeeded", "Failed")
        not_ready = "PodCompleted" if done else "ContainersNotReady"
        status: dict[str, Any] = {
            "phase": phase,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "conditions": [
                self._condition(pod, "PodReadyToStartContainers", pod.prepared),
                self._condition(
                    pod,
                    "Initialized",
                    initialized,
                    "" if initialized else "ContainersNotInitialized",
                ),
                self._condition(pod, "ContainersReady", ready, "" if ready else not_ready),
                self._condition(pod, "Ready", ready, "" if ready else not_ready),
            ],
            "containerStatuses": [c.status() for c in pod.main],
        }
        if pod.init:
            status["initContainerStatuses"] = [c.status() for c in pod.init]
        if pod.start_time is not None:
            status["startTime"] = rfc3339(pod.start_time)
        if pod.lost:
            status["reason"] = "ContainerStatusUnknown"
        comparable = json.loads(json.dumps(status))
        for condition in comparable["conditions"]:
            condition.pop("lastTransitionTime", None)
        if comparable == pod.reported:
            return
        self.api.request(
            "PATCH",
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status",
            body={"metadata": {"uid": pod.uid}, "status": status},
            content_type="application/strategic-merge-patch+json",
        )
        pod.reported = comparable
        log.info("pod %s: reported phase %s", pod.key, phase)

    def _finalize(self, namespace: str, name: str, uid: str) -> None:
        """Remove a deleted pod for good, as the kubelet does once it has stopped."""
        try:
            self.api.request(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
            )
            log.info("pod %s/%s finalised", namespace, name)
        except ApiError as error:
            if error.status not in (404, 409):
                raise

    def _shutdown(self) -> None:
        """Stop every running pod; report what happened when the API still answers."""
        running = [pod for pod in self._pods.values() if pod.running()]
        for pod in running:
            for c in pod.running():
                assert c.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(p.running() for p in running):
            table = process_table()
            for pod in running:
                self._collect(pod, table)
            time.sleep(0.1)
        table = process_table()
        for pod in running:
            self._kill(pod, table)
            for c in pod.running():
                assert c.proc is not None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(5)
            self._collect(pod, table)
            with contextlib.suppress(Exception):
                self._report(pod)
        with contextlib.suppress(Exception):
            self.ensure_node(ready=False)


# -- process plumbing ------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m poller.sandbox.runner",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kubeconfig", type=Path, required=True, help="an admin kubeconfig")
    parser.add_argument("--workdir", type=Path, required=True, help="where pod files go")
    parser.add_argument(
        "--kwok-port", type=int, required=True, help="kwok's kubelet port (serves pod logs)"
    )
    parser.add_argument("--node-name", default=NODE_NAME)
    parser.add_argument("--interval", type=float, default=0.3, help="seconds between polls")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    runner = LocalRunner(
        args.kubeconfig,
        args.workdir,
        args.kwok_port,
        node_name=args.node_name,
        interval=args.interval,
    )

    def request_stop(signum: int, _frame: object) -> None:
        log.info("received %s: stopping pods and exiting", signal.Signals(signum).name)
        runner._stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    runner.ensure_node()
    log.info("serving node %s (kwok port %d)", runner.node_name, runner.kwok_port)
    runner.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
