"""`Kube`: the one class of the poller that talks to the Kubernetes API.

Everything above the I/O layer reaches the API through a `Kube`: the cycle's
reads (`poller.cycle.observe`), its actions (`poller.cycle.act`, `poller.cycle.statuswrites`),
the leader's Lease (`poller.leader`). Its reads, and the counted request
every call goes through, are `poller.kube.reads.KubeReads`; this module adds
what changes the cluster: creating, patching, replacing and deleting
objects, and recording Events. The writes are kept together, apart from the
reads, because each one is a decision about concurrency and ownership
rather than about bytes: a status patch carries the resourceVersion it was
decided on, so a stale write becomes Conflict; a create that meets a taken
name answers so (None, False, or the object of that name) where a retried
cycle meets its own object, and raises Conflict where the caller decides
(the identity Secret, the Lease); and an existing ConfigMap is only ever
updated when its controller is the manifest's (else NotOwned).

The names callers use with a `Kube` (the errors, `JobsPage`, `LogTail`,
`PAGE_SIZE`) are importable from here, so no caller imports
`poller.kube.reads`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from typing import Any

from poller import api, timefmt
from poller.decisions.ownership import controller_text, controller_uid
from poller.kube import pages
from poller.kube.errors import ApiError, Conflict, NotFound, NotOwned
from poller.kube.reads import JOBS_API, KUEUE_API, PAGE_SIZE, JobsPage, KubeReads, LogTail

__all__ = [
    "PAGE_SIZE",
    "ApiError",
    "Conflict",
    "JobsPage",
    "Kube",
    "LogTail",
    "NotFound",
    "NotOwned",
]

_LEASES = "/apis/coordination.k8s.io/v1"


class Kube(KubeReads):
    """Typed, counted access to exactly the API calls the poller makes: the reads of
    `KubeReads`, and the writes."""

    def create_pod(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Create the pod and return it as admitted (`views.PodObject`'s fields: after
        any mutating admission); None when the name was taken already."""
        namespace = manifest["metadata"]["namespace"]
        try:
            raw = self._request(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods",
                verb="create",
                resource="pods",
                body=manifest,
            )
        except Conflict:
            return None
        created: dict[str, Any] = pages.POD.validate_json(raw)
        return created

    def create_secret(
        self, namespace: str, name: str, data: dict[str, str], labels: dict[str, str]
    ) -> None:
        """Create a Secret (data already base64); Conflict when it exists."""
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "type": "Opaque",
            "data": data,
        }
        self._request(
            "POST",
            f"/api/v1/namespaces/{namespace}/secrets",
            verb="create",
            resource="secrets",
            body=body,
        )

    def patch_job_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> None:
        """Merge-patch /status; the resourceVersion turns a stale write into Conflict."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        self._request(
            "PATCH",
            f"{JOBS_API}/namespaces/{namespace}/{api.PLURAL}/{name}/status",
            verb="patch",
            resource=f"{api.PLURAL}/status",
            body=body,
            content_type="application/merge-patch+json",
        )

    def create_job(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Create an LMEvalJob (a suite's run); None when the name was taken already."""
        namespace = manifest["metadata"]["namespace"]
        try:
            raw = self._request(
                "POST",
                f"{JOBS_API}/namespaces/{namespace}/{api.PLURAL}",
                verb="create",
                resource=api.PLURAL,
                body=manifest,
            )
        except Conflict:
            return None
        created: dict[str, Any] = json.loads(raw)
        return created

    def patch_suite_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> None:
        """Replace a suite's status (a merge patch whose lists are whole); the
        resourceVersion turns a stale write into Conflict."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        self._request(
            "PATCH",
            f"{JOBS_API}/namespaces/{namespace}/{api.SUITE_PLURAL}/{name}/status",
            verb="patch",
            resource=f"{api.SUITE_PLURAL}/status",
            body=body,
            content_type="application/merge-patch+json",
        )

    def create_claim(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Create a PersistentVolumeClaim: None when created, else the one of that name."""
        path = f"/api/v1/namespaces/{manifest['metadata']['namespace']}/persistentvolumeclaims"
        resource = "persistentvolumeclaims"
        try:
            self._request("POST", path, verb="create", resource=resource, body=manifest)
            return None
        except Conflict:
            name = manifest["metadata"]["name"]
            raw = self._request("GET", f"{path}/{name}", verb="get", resource=resource)
        found: dict[str, Any] = json.loads(raw)
        return found

    def release_claim(self, namespace: str, name: str, owners: list[dict[str, Any]]) -> bool:
        """Remove the claim's owner references if they are exactly `owners` (a JSON
        patch whose test makes it atomic): False when the claim is gone, or its
        owners are not those (then it is left as it is)."""
        patch = [
            {"op": "test", "path": "/metadata/ownerReferences", "value": owners},
            {"op": "remove", "path": "/metadata/ownerReferences"},
        ]
        try:
            self._request(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}",
                verb="patch",
                resource="persistentvolumeclaims",
                body=patch,
                content_type="application/json-patch+json",
            )
        except NotFound:
            return False
        except ApiError as error:
            if error.status == 422:  # the test failed: someone changed its owners
                return False
            raise
        return True

    def create_configmap(self, manifest: dict[str, Any]) -> bool:
        """Create a ConfigMap; False when one of that name already exists."""
        namespace = manifest["metadata"]["namespace"]
        try:
            self._request(
                "POST",
                f"/api/v1/namespaces/{namespace}/configmaps",
                verb="create",
                resource="configmaps",
                body=manifest,
            )
        except Conflict:
            return False
        return True

    def apply_configmap(self, manifest: dict[str, Any], *, merge: bool = False) -> None:
        """Create a ConfigMap, or update it when it exists (a retried cycle).

        With `merge`, keys already in the ConfigMap and absent from `manifest`
        are kept (the log archive must not wipe stored results, nor the reverse).
        An existing ConfigMap is only ever updated when its controller is the
        manifest's (another user may have made one under that name first):
        else NotOwned.
        """
        namespace = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        try:
            self._request("POST", path, verb="create", resource="configmaps", body=manifest)
            return
        except Conflict:
            pass
        current = json.loads(
            self._request("GET", f"{path}/{name}", verb="get", resource="configmaps")
        )
        if controller_uid(current) != controller_uid(manifest):
            raise NotOwned(
                f"ConfigMap {name} in namespace {namespace} exists and is not owned by "
                f"{controller_text(manifest)}"
            )
        body = manifest
        if merge:
            body = {
                **manifest,
                "data": {**(current.get("data") or {}), **(manifest.get("data") or {})},
            }
            binary = {**(current.get("binaryData") or {}), **(manifest.get("binaryData") or {})}
            if binary:
                body["binaryData"] = binary
        self._request("PUT", f"{path}/{name}", verb="update", resource="configmaps", body=body)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod (gracefully: the driver gets SIGTERM); gone already is fine."""
        with contextlib.suppress(NotFound):
            self._request(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                verb="delete",
                resource="pods",
            )

    def create_workload(self, manifest: dict[str, Any]) -> bool:
        """Create a Kueue Workload; False when one of that name exists already."""
        namespace = manifest["metadata"]["namespace"]
        try:
            self._request(
                "POST",
                f"{KUEUE_API}/namespaces/{namespace}/workloads",
                verb="create",
                resource="workloads",
                body=manifest,
            )
        except Conflict:
            return False
        return True

    def patch_workload_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> None:
        """Merge-patch a Workload's /status; the resourceVersion makes a stale write Conflict."""
        self._request(
            "PATCH",
            f"{KUEUE_API}/namespaces/{namespace}/workloads/{name}/status",
            verb="patch",
            resource="workloads/status",
            body={"metadata": {"resourceVersion": resource_version}, "status": status},
            content_type="application/merge-patch+json",
        )

    def delete_workload(self, namespace: str, name: str) -> None:
        """Delete a Kueue Workload; gone already is fine."""
        with contextlib.suppress(NotFound):
            self._request(
                "DELETE",
                f"{KUEUE_API}/namespaces/{namespace}/workloads/{name}",
                verb="delete",
                resource="workloads",
            )

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete an LMEvalJob; its pod and ConfigMap follow by garbage collection."""
        with contextlib.suppress(NotFound):
            self._request(
                "DELETE",
                f"{JOBS_API}/namespaces/{namespace}/{api.PLURAL}/{name}",
                verb="delete",
                resource=api.PLURAL,
                body={"propagationPolicy": "Background"},
            )

    # The leader's Lease: read here with its writes, since the resourceVersion
    # of the read is what makes a lost race a Conflict (`poller.leader`).

    def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        lease: dict[str, Any] = json.loads(
            self._request(
                "GET",
                f"{_LEASES}/namespaces/{namespace}/leases/{name}",
                verb="get",
                resource="leases",
            )
        )
        return lease

    def create_lease(self, body: dict[str, Any]) -> None:
        namespace = body["metadata"]["namespace"]
        self._request(
            "POST",
            f"{_LEASES}/namespaces/{namespace}/leases",
            verb="create",
            resource="leases",
            body=body,
        )

    def update_lease(self, body: dict[str, Any]) -> None:
        """Replace the Lease; its resourceVersion makes a lost race a Conflict."""
        meta = body["metadata"]
        self._request(
            "PUT",
            f"{_LEASES}/namespaces/{meta['namespace']}/leases/{meta['name']}",
            verb="update",
            resource="leases",
            body=body,
        )

    def post_event(
        self,
        *,
        namespace: str,
        job_name: str,
        job_uid: str,
        event_type: str,
        reason: str,
        message: str,
        now: dt.datetime,
        kind: str = api.KIND,
    ) -> None:
        """Record a core/v1 Event on the job (what `kubectl describe` shows)."""
        stamp = timefmt.format_time(now)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{job_name[:200]}.{uuid.uuid4().hex[:12]}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
                "kind": kind,
                "name": job_name,
                "namespace": namespace,
                "uid": job_uid,
            },
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "lmeval-poller"},
            "reportingComponent": "lmeval-poller",
            "reportingInstance": "lmeval-poller",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self._request(
            "POST",
            f"/api/v1/namespaces/{namespace}/events",
            verb="create",
            resource="events",
            body=body,
        )
