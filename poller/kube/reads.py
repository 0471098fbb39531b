"""The I/O layer's reads, and the one counted request every API call goes through.

`poller.kube.client.Kube`, the only code of the poller that talks to the Kubernetes
API, is this module's `KubeReads` with the writes added. The two halves are
kept apart because different things govern them: a read decides what a
cycle costs (requests, bytes, memory) and how much of what a job's author
controls is let in (a log tail, an exec'd file, a ConfigMap, each under a
byte limit); a write decides what the poller changes and on which
precondition (`poller.kube.client`). Everything above the I/O layer works on plain
dicts and the views in `poller.decisions.views`; everything that touches the network
is in these two modules, which is what makes the rest testable without a
cluster and what lets every request be counted in one place (`_request`,
and `exec_in_pod` for the one request that is not HTTP:
`on_request(verb, resource, code)`, wired to the
``lmeval_kube_requests_total`` metric).

Requests go through `poller.kube.transport.ApiTransport` (authentication, TLS,
pooling, exec over a WebSocket) rather than the kubernetes client, whose
import alone costs 44 MiB and whose typed models would cost more than the
request itself for thousands of objects. Bodies go out as the plain dicts
the pure layers produce; error statuses come back as `NotFound`, `Conflict`
or `ApiError`.

Lists are paged (``limit`` + ``continue``) and handed out page by page, so a
cycle never holds more than a page or two of raw objects. Each page is
parsed straight into the shape the views read (`poller.decisions.views.JobObject`,
`PodObject`): what no view reads, such as managedFields and pod specs, is
skipped by the parser instead of becoming Python objects. As soon as a
page's continue token is known, the next page is requested on a helper
thread, so the apiserver prepares it while this one is parsed and used; the
pages of one LIST are still requested one after the other, and a LIST starts
only when the previous one has ended (the parsing and the prefetch live in
`poller.kube.pages`). Other responses are parsed with ``json.loads``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from poller import api
from poller.decisions import kueueadmission
from poller.kube import pages
from poller.kube.errors import ApiError, Conflict, NotFound
from poller.kube.transport import (
    EXEC_MAX_STDOUT_BYTES,
    ApiTransport,
    ExecOutputTooLarge,
    ExecRefused,
)

__all__ = [
    "JOBS_API",
    "KUEUE_API",
    "PAGE_SIZE",
    "REQUEST_TIMEOUT",
    "JobsPage",
    "KubeReads",
    "LogTail",
    "RequestHook",
]

RequestHook = Callable[[str, str, str], None]
PAGE_SIZE = 500
# The API paths of the LMEvalJobs and of Kueue's objects (the writes use them too).
JOBS_API = f"/apis/{api.API_GROUP}/{api.API_VERSION}"
# KServe's API, read for a suite's model trigger (spec.triggers.modelChange).
KSERVE_API = "/apis/serving.kserve.io/v1beta1"
KUEUE_API = f"/apis/{kueueadmission.KUEUE_GROUP}/{kueueadmission.KUEUE_VERSION}"
REQUEST_TIMEOUT = 30.0
# A LIST answered as metadata only (kind PartialObjectMetadataList).
_METADATA_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"


@dataclass(frozen=True)
class LogTail:
    """The end of a container log as read: whole lines, and whether bytes cut it."""

    data: bytes
    # The window of lines asked for held more than the byte limit; `data` is
    # then its first complete lines within the limit (the apiserver's
    # limitBytes keeps the head of a tailLines window, not its end).
    cut: bool

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class JobsPage:
    """One page of a LIST of jobs (`Kube.list_jobs_page`)."""

    items: list[dict[str, Any]]
    # The token of the next page; None after the last.
    continue_token: str | None
    # Read after 410 Expired from the newest state, not the LIST's first snapshot.
    inconsistent: bool = False


def _noop(verb: str, resource: str, code: str) -> None:
    return None


class KubeReads:
    """Typed, counted reads: exactly the GETs, LISTs and execs the poller makes."""

    def __init__(self, transport: ApiTransport, on_request: RequestHook = _noop) -> None:
        self.transport = transport
        self.on_request = on_request

    def _request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        max_bytes: int | None = None,
    ) -> bytes:
        """One HTTP request; counted, and non-2xx turned into exceptions.

        Bodies go out as plain JSON and come back as bytes (lossless round
        trips, and no model building); at most `max_bytes` of them when given.
        """
        code = "error"
        try:
            response = self.transport.request(
                method,
                path,
                query=query,
                body=body,
                content_type=content_type,
                accept=accept,
                timeout=REQUEST_TIMEOUT,
                max_bytes=max_bytes,
            )
            code = str(response.status)
        finally:
            self.on_request(verb, resource, code)
        if response.status == 404:
            raise NotFound(f"{resource} {path} not found")
        if response.status == 409:
            raise Conflict(f"{resource} {path}: conflict")
        if not 200 <= response.status <= 299:
            raise ApiError(
                response.status, response.reason, response.data.decode("utf-8", "replace")
            )
        return response.data

    # -- reads -----------------------------------------------------------------

    def _list(
        self,
        path: str,
        resource: str,
        page: TypeAdapter[Any],
        page_size: int = PAGE_SIZE,
        unchanged: pages.Unchanged | None = None,
        accept: str = "application/json",
        **query: Any,
    ) -> Iterator[dict[str, Any]]:
        """Every item, one page at a time, the next page already on its way (the
        items of a page that `unchanged` accepts whole as metadata only, see
        `kubepages.paged`)."""

        def fetch(token: str | None) -> bytes:
            return self._request(
                "GET",
                path,
                verb="list",
                resource=resource,
                query={**query, "limit": page_size, "continue": token},
                accept=accept,
            )

        return pages.paged(fetch, page, unchanged)

    def list_jobs(
        self,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        page_size: int = PAGE_SIZE,
        unchanged: pages.Unchanged | None = None,
        metadata_only: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Every LMEvalJob (in `namespace`, or in all namespaces) that `field_selector`
        selects (the CRD makes status.state selectable), as `JobObject`s (metadata
        only on a page that `unchanged` accepts whole). `metadata_only` asks for
        PartialObjectMetadata instead (`pages.ObjectMetadata` of each job)."""
        where = f"/namespaces/{namespace}" if namespace else ""
        return self._list(
            f"{JOBS_API}{where}/{api.PLURAL}",
            api.PLURAL,
            pages.METADATA_PAGE if metadata_only else pages.JOB_PAGE,
            page_size,
            None if metadata_only else unchanged,
            accept=_METADATA_LIST if metadata_only else "application/json",
            fieldSelector=field_selector,
        )

    def list_jobs_page(
        self,
        namespace: str | None,
        *,
        field_selector: str,
        token: str | None,
        limit: int = PAGE_SIZE,
        metadata_only: bool = False,
    ) -> JobsPage:
        """One page of a LIST of jobs, for a LIST spread over minutes (the sweep of
        finished jobs, `poller.cycle.sweep`), without the next page prefetched.

        `metadata_only` asks for PartialObjectMetadata (no spec, no status: about
        a quarter of the bytes). A continue token older than the apiserver's
        compaction gets 410 Expired, whose body carries a token to go on from
        the same place in the newest state; that page is read instead and the
        page says `inconsistent`. Other errors propagate.
        """
        where = f"/namespaces/{namespace}" if namespace else ""
        path = f"{JOBS_API}{where}/{api.PLURAL}"
        accept = _METADATA_LIST if metadata_only else "application/json"
        adapter = pages.METADATA_PAGE if metadata_only else pages.JOB_PAGE
        inconsistent = False
        for _ in range(2):
            query = {"fieldSelector": field_selector, "limit": limit, "continue": token}
            try:
                raw = self._request(
                    "GET", path, verb="list", resource=api.PLURAL, query=query, accept=accept
                )
            except ApiError as error:
                renewed = _expired_continue(error) if token else None
                if renewed is None or inconsistent:
                    raise
                token, inconsistent = renewed, True
                continue
            page = adapter.validate_json(raw)
            following = (page.get("metadata") or {}).get("continue") or None
            return JobsPage(page.get("items") or [], following, inconsistent)
        raise AssertionError("unreachable")  # pragma: no cover

    def list_suites(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every LMEvalSuite (in `namespace`, or in all; few: one per model and
        team), whole."""
        where = f"/namespaces/{namespace}" if namespace else ""
        return self._list_whole(f"{JOBS_API}{where}/{api.SUITE_PLURAL}", api.SUITE_PLURAL)

    def list_suite_runs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The metadata of every LMEvalJob carrying a suite's label (in `namespace`,
        or in all): what proves a run is a suite's. Metadata only: a finished run's
        status holds its results (up to 256 KB), which a suite reads by name, and
        only for the few runs whose state it needs."""
        where = f"/namespaces/{namespace}" if namespace else ""
        return self._list_whole(
            f"{JOBS_API}{where}/{api.PLURAL}",
            api.PLURAL,
            accept=_METADATA_LIST,
            labelSelector=api.SUITE_LABEL,
        )

    def _list_whole(
        self, path: str, resource: str, accept: str = "application/json", **query: Any
    ) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            raw = self._request(
                "GET",
                path,
                verb="list",
                resource=resource,
                query={**query, "limit": PAGE_SIZE, "continue": token},
                accept=accept,
            )
            page = json.loads(raw)
            items.extend(item for item in page.get("items") or [] if isinstance(item, dict))
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return items

    def read_inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A KServe InferenceService (a suite's model trigger), or None when it, or
        KServe's CRD, does not exist."""
        try:
            raw = self._request(
                "GET",
                f"{KSERVE_API}/namespaces/{namespace}/inferenceservices/{name}",
                verb="get",
                resource="inferenceservices",
                max_bytes=1 << 20,
            )
        except NotFound:
            return None
        found: dict[str, Any] = json.loads(raw)
        return found

    def find_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The LMEvalJob `namespace/name` as a `JobObject`, or None (a LIST by name:
        the poller's role lists jobs and needs no GET)."""
        raw = self._request(
            "GET",
            f"{JOBS_API}/namespaces/{namespace}/{api.PLURAL}",
            verb="list",
            resource=api.PLURAL,
            query={"fieldSelector": f"metadata.name={name}", "limit": 1},
        )
        items: list[dict[str, Any]] = pages.JOB_PAGE.validate_json(raw).get("items") or []
        return items[0] if items else None

    def list_pods(
        self,
        label_selector: str,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        page_size: int = PAGE_SIZE,
        unchanged: pages.Unchanged | None = None,
        metadata_only: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Pods matching `label_selector` and `field_selector` (in `namespace`, or
        everywhere), as `PodObject`s (metadata only on a page that `unchanged`
        accepts whole). `metadata_only` asks for PartialObjectMetadata instead:
        each pod's identity and resourceVersion (`pages.ObjectMetadata`), about
        a third of a pod's bytes and a quarter of the CPU to read them."""
        where = f"/namespaces/{namespace}" if namespace else ""
        return self._list(
            f"/api/v1{where}/pods",
            "pods",
            pages.METADATA_PAGE if metadata_only else pages.POD_PAGE,
            page_size,
            None if metadata_only else unchanged,
            accept=_METADATA_LIST if metadata_only else "application/json",
            labelSelector=label_selector,
            fieldSelector=field_selector,
        )

    def list_workloads(
        self, label_selector: str, namespace: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Kueue Workloads matching `label_selector`, as `WorkloadObject`s (status and
        metadata only). NotFound when Kueue is not installed (no Workload CRD)."""
        where = f"/namespaces/{namespace}" if namespace else ""
        return self._list(
            f"{KUEUE_API}{where}/workloads",
            "workloads",
            pages.WORKLOAD_PAGE,
            labelSelector=label_selector,
        )

    def read_resource_flavor(self, name: str) -> dict[str, Any] | None:
        """A Kueue ResourceFlavor (cluster-scoped), or None when it does not exist."""
        try:
            raw = self._request(
                "GET", f"{KUEUE_API}/resourceflavors/{name}", verb="get", resource="resourceflavors"
            )
        except NotFound:
            return None
        found: dict[str, Any] = json.loads(raw)
        return found

    def read_workload_priority_class(self, name: str) -> dict[str, Any] | None:
        """A Kueue WorkloadPriorityClass (cluster-scoped), or None when it does not exist."""
        try:
            raw = self._request(
                "GET",
                f"{KUEUE_API}/workloadpriorityclasses/{name}",
                verb="get",
                resource="workloadpriorityclasses",
            )
        except NotFound:
            return None
        found: dict[str, Any] = json.loads(raw)
        return found

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's data, or None when it does not exist."""
        obj = self.read_configmap(namespace, name)
        if obj is None:
            return None
        data: dict[str, str] = obj.get("data") or {}
        return data

    def namespace_annotations(self, namespace: str) -> dict[str, str]:
        """A namespace's annotations (read only when a job pod is about to be made)."""
        try:
            raw = self._request(
                "GET", f"/api/v1/namespaces/{namespace}", verb="get", resource="namespaces"
            )
        except NotFound:
            return {}
        annotations: dict[str, str] = (json.loads(raw).get("metadata") or {}).get(
            "annotations"
        ) or {}
        return annotations

    def read_configmap(
        self, namespace: str, name: str, *, max_bytes: int | None = None
    ) -> dict[str, Any] | None:
        """A whole ConfigMap (metadata, data, binaryData, immutable), or None.

        With `max_bytes`, a response larger than that raises ValueError
        without being parsed.
        """
        try:
            raw = self._request(
                "GET",
                f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                verb="get",
                resource="configmaps",
                max_bytes=None if max_bytes is None else max_bytes + 1,
            )
        except NotFound:
            return None
        if max_bytes is not None and len(raw) > max_bytes:
            raise ValueError(f"ConfigMap {name} is larger than {max_bytes} bytes")
        obj: dict[str, Any] = json.loads(raw)
        return obj

    def read_secret(self, namespace: str, name: str) -> dict[str, Any]:
        """A whole Secret, data still base64-encoded (only the poller's own key is read)."""
        raw = self._request(
            "GET",
            f"/api/v1/namespaces/{namespace}/secrets/{name}",
            verb="get",
            resource="secrets",
        )
        secret: dict[str, Any] = json.loads(raw)
        return secret

    def find_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod `namespace/name` whatever its labels (a LIST: the poller may not GET pods)."""
        raw = self._request(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods",
            verb="list",
            resource="pods",
            query={"fieldSelector": f"metadata.name={name}", "limit": 1},
        )
        items: list[dict[str, Any]] = pages.POD_PAGE.validate_json(raw).get("items") or []
        return items[0] if items else None

    def read_log_tail(
        self, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int
    ) -> LogTail:
        """The last `tail_lines` lines of a container's log, read up to `limit_bytes`.

        The log is the job author's output: the byte limit is sent to the
        kubelet (limitBytes) and also enforced here while reading, so that a
        server that ignores it costs no more. One byte more is asked for, to
        tell a window of exactly `limit_bytes` from a longer one.
        """
        raw = self._request(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods/{pod}/log",
            verb="get",
            resource="pods/log",
            query={"container": container, "tailLines": tail_lines, "limitBytes": limit_bytes + 1},
            max_bytes=limit_bytes + 1,
        )
        if len(raw) <= limit_bytes:
            return LogTail(raw, cut=False)
        # Whole lines only: a line cut in two is not the line that was written.
        return LogTail(raw[: raw.rfind(b"\n", 0, limit_bytes) + 1], cut=True)

    def exec_in_pod(
        self,
        namespace: str,
        pod: str,
        container: str,
        argv: list[str],
        timeout: float = 30.0,
        max_stdout: int = EXEC_MAX_STDOUT_BYTES,
    ) -> tuple[int | None, str, str]:
        """Run `argv` (no shell) in a container; returns (exit code, stdout, stderr).

        The exit code is None when unknown (see `ApiTransport.exec`); a refused
        upgrade raises NotFound (404) or ApiError; stdout beyond `max_stdout`
        bytes raises ExecOutputTooLarge.
        """
        code = "error"
        try:
            result = self.transport.exec(
                namespace, pod, container, argv, timeout=timeout, max_stdout=max_stdout
            )
            code = "101"
        except ExecRefused as error:
            code = str(error.status)
            if error.status == 404:
                raise NotFound(f"pods/exec {namespace}/{pod}: {error.body[:200]}") from None
            raise ApiError(error.status, error.reason, error.body) from None
        except ExecOutputTooLarge:
            code = "101"  # the upgrade succeeded; the output was refused here
            raise
        finally:
            self.on_request("get", "pods/exec", code)
        return result


def _expired_continue(error: ApiError) -> str | None:
    """The continue token a 410 Expired LIST answer carries, else None."""
    if error.status != 410:
        return None
    try:
        body = json.loads(error.body)
    except ValueError:
        return None
    token = ((body or {}).get("metadata") or {}).get("continue") if isinstance(body, dict) else None
    return token if isinstance(token, str) and token else None
