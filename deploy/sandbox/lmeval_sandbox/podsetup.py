"""What a kubelet does before a container starts, for the sandbox runner.

A container on the sandbox node is a local process, but before it may start
the runner must do a kubelet's set-up work, and all of that work reads the
API server (as the admin, as a kubelet reads with its node identity). This
module is that work, apart from the runner's loop, so that the loop reads as
the pod lifecycle and the set-up as the set-up:

* the pod's volumes are materialised in a per-pod directory that plays the
  container's root filesystem (``<workdir>/pods/<ns>/<pod>-<uid>/root``):
  emptyDir volumes are directories, PVC volumes the directory of the claim's
  hostPath or local PersistentVolume (else a directory shared by the claim's
  pods), configMap, secret, downwardAPI and projected volumes
  (service account tokens included) are files; every other mount of a
  volume, and every ``subPath`` mount, is a symlink to it;
* configMap file contents get their mapped container paths rewritten to
  local paths (a task YAML's absolute ``data_files`` path), but for ``.json``
  files, which stay byte for byte;
* a kwok ``Logs`` object, owned by the pod, serves the log file of each
  container, so ``kubectl logs`` works as on a real node;
* a container's environment is built as the kubelet builds it: ``envFrom``,
  then ``env`` with ``valueFrom`` secrets, configMaps and field references
  resolved and ``$(VAR)`` expanded, mapped paths rewritten.

Whatever is missing (a configMap, a key, an unsupported volume kind) raises
`ConfigError`, which the runner reports as CreateContainerConfigError and
retries. The pure parts (path mapping, ``$(VAR)``, field references) are in
podfs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client
from lmeval_cli.rawapi import send

from lmeval_sandbox.localproc import Container, LocalPod
from lmeval_sandbox.podfs import (
    ConfigError,
    PathMapper,
    clean_path,
    expand_vars,
    field_value,
    volume_files,
)
from poller.kube import errors

__all__ = ["REQUEST_TIMEOUT", "ApiError", "JsonApi", "PodSetup"]

REQUEST_TIMEOUT = 15.0


# -- the raw API ---------------------------------------------------------------------


class ApiError(errors.ApiError):
    """The API server answered the sandbox with a status outside 2xx."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(status, "", body)

    def __str__(self) -> str:
        return f"HTTP {self.status}: {self.body[:500]}"


class JsonApi:
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


# -- before a container starts -------------------------------------------------------


class PodSetup:
    """A pod's volumes, its kwok ``Logs`` object and its containers' environment."""

    def __init__(self, api: JsonApi, workdir: Path) -> None:
        self.api = api
        self.workdir = workdir

    def prepare(self, pod: LocalPod) -> None:
        """Materialise the pod's volumes and serve its logs; raise ConfigError if not yet."""
        spec = pod.obj.get("spec") or {}
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts: list[tuple[str, str, str]] = []  # (mount path, volume, subPath)
        for c in pod.containers():
            for m in c.spec.get("volumeMounts") or []:
                if m["name"] not in volumes:
                    raise ConfigError(f"volume {m['name']!r} of container {c.name} is not defined")
                mounts.append((clean_path(m["mountPath"]), m["name"], m.get("subPath") or ""))
        pod.mapper = PathMapper(
            pod.root, [path for path, _, _ in mounts], self._shared_config_maps(pod, mounts)
        )
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

    def _shared_config_maps(
        self, pod: LocalPod, mounts: list[tuple[str, str, str]]
    ) -> dict[str, Path]:
        """Where each whole configMap mount's files are also kept for every pod that
        mounts the same ConfigMap: a kubelet mounts it at the same path in every
        pod, so a task file's absolute data path reads alike in all of them (the
        shards of a job compare their task configurations); here each pod has
        its own root, so the paths written into the files point at this copy."""
        volumes = {v["name"]: v for v in (pod.obj.get("spec") or {}).get("volumes") or []}
        shared: dict[str, Path] = {}
        for path, name, sub in mounts:
            source = volumes[name].get("configMap")
            if sub or not source:
                continue
            obj = self.api.get_or_none(
                f"/api/v1/namespaces/{pod.namespace}/configmaps/{source.get('name') or ''}"
            )
            if obj is None:
                continue  # _materialise says why
            meta = obj.get("metadata") or {}
            key = hashlib.sha256(
                f"{pod.namespace}/{meta.get('name')}/{meta.get('uid')}/{meta.get('resourceVersion')}"
                f"/{path}".encode()
            ).hexdigest()[:16]
            shared[path] = self.workdir / "configmaps" / key
        return shared

    def _materialise(self, pod: LocalPod, volume: dict[str, Any], home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in volume:
            return
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            shared = self._claim_directory(pod.namespace, claim)
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
        if "configMap" in volume and home.is_relative_to(pod.root):
            copy = pod.mapper.shared.get("/" + str(home.relative_to(pod.root)))
            if copy is not None and not copy.exists():
                _publish_copy(copy, files)

    def _claim_directory(self, namespace: str, claim: str) -> Path:
        """Where claim `namespace/claim`'s files are on this host.

        A claim bound to a hostPath or local PersistentVolume is that PV's
        directory (static provisioning, as on a real node); any other claim
        gets a directory of the runner's own, shared by the claim's pods. The
        runner cannot make a mount read-only (it links, it does not mount): a
        readOnly mount is read-only on a real node only.
        """
        obj = self.api.get_or_none(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        if obj is None:
            raise ConfigError(f'persistentvolumeclaim "{claim}" not found')
        bound = (obj.get("spec") or {}).get("volumeName")
        if bound and (obj.get("status") or {}).get("phase") == "Bound":
            volume = self.api.get_or_none(f"/api/v1/persistentvolumes/{bound}") or {}
            source = volume.get("spec") or {}
            path = (source.get("hostPath") or source.get("local") or {}).get("path")
            if path:
                if not Path(path).is_dir():
                    raise ConfigError(f"persistentvolume {bound}: {path} is not a directory")
                return Path(path)
        shared = self.workdir / "volumes" / namespace / claim
        shared.mkdir(parents=True, exist_ok=True)
        return shared

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
            # Task files name their data by absolute in-pod paths. A JSON document
            # is data and stays byte for byte (a suite's statement is signed only
            # if its digest is the one in the signing pod's command).
            for rel, data in files.items():
                if rel.endswith(".json"):
                    continue
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

    def env(self, pod: LocalPod, c: Container) -> dict[str, str]:
        """Container `c`'s environment; raise ConfigError when a source is missing."""
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


def _publish_copy(directory: Path, files: Mapping[str, bytes]) -> None:
    """Write `files` into a new `directory` whole (the copy every pod's rewritten
    paths name, `PodSetup._shared_config_maps`); a copy already there wins."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent))
    for rel, data in files.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(data)
    try:
        staging.rename(directory)
    except OSError:  # another pod's setup made it first: the same files
        shutil.rmtree(staging, ignore_errors=True)
