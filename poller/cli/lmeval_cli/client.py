"""The API calls the command line makes, and nothing else.

Why this module exists: every command needs the same few requests (jobs,
their events, the pod log, the results ConfigMap; for ``lmeval version`` the
server's version and the poller's Deployment) and the same error handling,
and an error is only explainable if we know what we asked for. So each
request carries its verb, resource and namespace, and a non-2xx answer
becomes an :class:`~lmeval_cli.errors.ApiError` holding the apiserver's
Status body next to that intent; :func:`errors.explain` turns it
into words; :func:`fetch_job` adds what a person needs when the name they
typed matches no job. Every object read besides the job itself (its results
ConfigMap, its pod) goes through :func:`owned_object`, which shows nothing
of an object whose controller ownerReference is not the job: names are
predictable, and a co-tenant may create one first or replace it (the claims
admission policy keeps anyone but the poller from naming an LMEvalJob as
owner, and the apiserver allows one controller per object). Requests use
the client's plumbing (TLS, credentials, pooling) with plain JSON in and
out, like ``poller.kube.client``: the typed models would drop unknown fields and
cost more than they give a printer. LMEvalSuites (``lmeval suite``) are read
and patched the same way (:func:`fetch_suite`, :meth:`Cluster.patch_suite`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client

from lmeval_cli.errors import (
    ApiError,
    CliError,
    ExitCode,
    explain,
    job_not_found,
    not_owned,
    parse_status,
    suggest,
    suite_not_found,
)
from lmeval_cli.rawapi import send
from poller.cliapi import api, controller_text, controller_uid, results_configmap_name

__all__ = [
    "JOBS_PREFIX",
    "Cluster",
    "controller_text",
    "fetch_job",
    "fetch_suite",
    "owned_object",
    "results_configmap",
    "results_configmap_of",
    "split_ref",
    "split_suite_ref",
]

JOBS_PREFIX = f"/apis/{api.API_GROUP}/{api.API_VERSION}"
PAGE_SIZE = 500
# Connect fast, read at leisure: a log or a big list can take a while.
REQUEST_TIMEOUT = (10.0, 60.0)


class Cluster:
    """Plain-JSON access to LMEvalJobs, LMEvalSuites and what belongs to them, in one context."""

    def __init__(self, api_client: client.ApiClient, namespace: str, server: str = "") -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.server = server or str(api_client.configuration.host)

    # -- plumbing --------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        group: str = "",
        namespace: str | None = None,
        name: str | None = None,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> bytes:
        """One request; the raw body of a 2xx answer, else ApiError."""
        try:
            response, data = send(
                self.api_client,
                method,
                path,
                query=query,
                body=body,
                content_type=content_type,
                accept="application/json, */*",
                timeout=REQUEST_TIMEOUT,
            )
        except urllib3.exceptions.HTTPError as error:
            reason = getattr(error, "reason", None) or error
            raise CliError(
                f"cannot reach the API server at {self.server}: {reason}", ExitCode.CLUSTER
            ) from error
        if not 200 <= response.status <= 299:
            raise ApiError(
                status=response.status,
                body=parse_status(data),
                verb=verb,
                resource=resource,
                group=group,
                namespace=namespace,
                name=name,
            )
        return data

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return json.loads(self.request(method, path, **kwargs))

    @staticmethod
    def _jobs_path(namespace: str | None, name: str | None = None) -> str:
        where = f"/namespaces/{namespace}" if namespace else ""
        return f"{JOBS_PREFIX}{where}/{api.PLURAL}" + (f"/{name}" if name else "")

    def _pages(
        self, path: str, *, resource: str, group: str, namespace: str | None, **query: Any
    ) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            page = self._json(
                "GET",
                path,
                verb="list",
                resource=resource,
                group=group,
                namespace=namespace,
                query={**query, "limit": PAGE_SIZE, "continue": token},
            )
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    # -- LMEvalJobs ------------------------------------------------------------

    def list_jobs(
        self, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Jobs in `namespace` (None: all namespaces), paged."""
        return list(
            self._pages(
                self._jobs_path(namespace),
                resource=api.PLURAL,
                group=api.API_GROUP,
                namespace=namespace,
                labelSelector=label_selector,
            )
        )

    def get_job(self, name: str, namespace: str) -> dict[str, Any]:
        found: dict[str, Any] = self._json(
            "GET",
            self._jobs_path(namespace, name),
            verb="get",
            resource=api.PLURAL,
            group=api.API_GROUP,
            namespace=namespace,
            name=name,
        )
        return found

    def create_job(
        self, body: dict[str, Any], namespace: str, *, server_dry_run: bool = False
    ) -> dict[str, Any]:
        created: dict[str, Any] = self._json(
            "POST",
            self._jobs_path(namespace),
            verb="create",
            resource=api.PLURAL,
            group=api.API_GROUP,
            namespace=namespace,
            query={"dryRun": "All" if server_dry_run else None, "fieldManager": "lmeval-cli"},
            body=body,
        )
        return created

    def patch_job(self, name: str, namespace: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the job (spec fields such as cancel and suspend)."""
        patched: dict[str, Any] = self._json(
            "PATCH",
            self._jobs_path(namespace, name),
            verb="patch",
            resource=api.PLURAL,
            group=api.API_GROUP,
            namespace=namespace,
            name=name,
            query={"fieldManager": "lmeval-cli"},
            body=patch,
            content_type="application/merge-patch+json",
        )
        return patched

    def delete_job(self, name: str, namespace: str) -> dict[str, Any]:
        """Delete the job; its pod and results ConfigMap follow (ownerReferences).

        Background propagation, kubectl's default: the garbage collector
        deletes what the job owns once the job is gone. The answer is the job
        (still there while a finalizer holds it) or a Status.
        """
        answer: dict[str, Any] = self._json(
            "DELETE",
            self._jobs_path(namespace, name),
            verb="delete",
            resource=api.PLURAL,
            group=api.API_GROUP,
            namespace=namespace,
            name=name,
            body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
        )
        return answer

    # -- LMEvalSuites ----------------------------------------------------------

    @staticmethod
    def _suites_path(namespace: str | None, name: str | None = None) -> str:
        where = f"/namespaces/{namespace}" if namespace else ""
        return f"{JOBS_PREFIX}{where}/{api.SUITE_PLURAL}" + (f"/{name}" if name else "")

    def list_suites(
        self, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Suites in `namespace` (None: all namespaces), paged."""
        return list(
            self._pages(
                self._suites_path(namespace),
                resource=api.SUITE_PLURAL,
                group=api.API_GROUP,
                namespace=namespace,
                labelSelector=label_selector,
            )
        )

    def get_suite(self, name: str, namespace: str) -> dict[str, Any]:
        found: dict[str, Any] = self._json(
            "GET",
            self._suites_path(namespace, name),
            verb="get",
            resource=api.SUITE_PLURAL,
            group=api.API_GROUP,
            namespace=namespace,
            name=name,
        )
        return found

    def patch_suite(self, name: str, namespace: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch of the suite (its run-requested annotation)."""
        patched: dict[str, Any] = self._json(
            "PATCH",
            self._suites_path(namespace, name),
            verb="patch",
            resource=api.SUITE_PLURAL,
            group=api.API_GROUP,
            namespace=namespace,
            name=name,
            query={"fieldManager": "lmeval-cli"},
            body=patch,
            content_type="application/merge-patch+json",
        )
        return patched

    # -- the cluster and the poller (lmeval version) ----------------------------

    def server_version(self) -> dict[str, Any]:
        """The apiserver's ``GET /version`` (gitVersion, major, minor, platform...).

        Every user may read it: the built-in ``system:public-info-viewer``
        role grants it to authenticated and anonymous users alike.
        """
        found: dict[str, Any] = self._json("GET", "/version", verb="get", resource="version")
        return found

    def get_deployment(self, name: str, namespace: str) -> dict[str, Any]:
        """An apps/v1 Deployment; ApiError when absent (404) or refused (403)."""
        found: dict[str, Any] = self._json(
            "GET",
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
            verb="get",
            resource="deployments",
            group="apps",
            namespace=namespace,
            name=name,
        )
        return found

    # -- what belongs to a job -------------------------------------------------

    def list_events(
        self, name: str, namespace: str, uid: str = "", kind: str = api.KIND
    ) -> list[dict[str, Any]]:
        """core/v1 Events about the `kind` (a job, or a suite) named `name`
        (with `uid`: about that object only).

        The UID leaves out events about an earlier object of the same name. An
        Event is not owned by anything, and whoever may create Events can
        write one about any object: events are shown as what they are,
        reports, never read as results.
        """
        selector = f"involvedObject.name={name},involvedObject.kind={kind}"
        if uid:
            selector += f",involvedObject.uid={uid}"
        return list(
            self._pages(
                f"/api/v1/namespaces/{namespace}/events",
                resource="events",
                group="",
                namespace=namespace,
                fieldSelector=selector,
            )
        )

    def get_core(self, resource: str, name: str, namespace: str) -> dict[str, Any] | None:
        """A core/v1 object (`resource`: configmaps, pods), or None when it does not exist.

        Unchecked: what belongs to a job is read through `owned_object`.
        """
        try:
            found: dict[str, Any] = self._json(
                "GET",
                f"/api/v1/namespaces/{namespace}/{resource}/{name}",
                verb="get",
                resource=resource,
                namespace=namespace,
                name=name,
            )
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found

    def pod_exists(self, name: str, namespace: str) -> bool:
        try:
            self.request(
                "GET",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                verb="get",
                resource="pods",
                namespace=namespace,
                name=name,
            )
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    def read_log(
        self,
        pod: str,
        namespace: str,
        container: str,
        *,
        tail_lines: int | None = None,
        since_time: str | None = None,
        timestamps: bool = False,
    ) -> str:
        """A container's log (never `follow`: the caller polls)."""
        raw = self.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods/{pod}/log",
            verb="get",
            resource="pods/log",
            namespace=namespace,
            name=pod,
            query={
                "container": container,
                "tailLines": tail_lines,
                "sinceTime": since_time,
                "timestamps": "true" if timestamps else None,
            },
        )
        return raw.decode("utf-8", errors="replace")


# -- the job a person named ------------------------------------------------------

_TYPE_PREFIXES = ("lmevaljob/", "lmevaljobs/", "lmej/", f"lmevaljob.{api.API_GROUP}/")


_SUITE_PREFIXES = (
    f"{api.SUITE_KIND.lower()}/",
    f"{api.SUITE_PLURAL}/",
    f"{api.SUITE_SHORT_NAME}/",
    f"{api.SUITE_KIND.lower()}.{api.API_GROUP}/",
)


def split_ref(
    ref: str, namespace: str, prefixes: tuple[str, ...] = _TYPE_PREFIXES
) -> tuple[str, str]:
    """'name', 'lmevaljob/name' or 'namespace/name' -> (namespace, name)."""
    for prefix in prefixes:
        if ref.startswith(prefix):
            ref = ref[len(prefix) :]
            break
    if "/" in ref:
        space, _, name = ref.partition("/")
        return space, name
    return namespace, ref


def _names_elsewhere(cluster: Cluster, name: str) -> list[str]:
    try:
        everywhere = cluster.list_jobs(None)
    except ApiError:
        return []  # no right to list across namespaces: no hint, no failure
    return sorted(
        str(j["metadata"].get("namespace"))
        for j in everywhere
        if j.get("metadata", {}).get("name") == name
    )


def fetch_job(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    """The job, or CliError: not found (did you mean ...), forbidden, not installed."""
    try:
        return cluster.get_job(name, namespace)
    except ApiError as error:
        if error.status != 404 or not error.details.get("name"):
            raise explain(error) from error
        try:
            names = [str(j["metadata"]["name"]) for j in cluster.list_jobs(namespace)]
        except ApiError:
            names = []
        elsewhere = [] if suggest(name, names) else _names_elsewhere(cluster, name)
        raise job_not_found(name, namespace, names, elsewhere) from error


# -- the suite a person named -----------------------------------------------------


def split_suite_ref(ref: str, namespace: str) -> tuple[str, str]:
    """'name', 'lmevalsuite/name' (or lmes/, lmevalsuites/) or 'namespace/name'
    -> (namespace, name)."""
    return split_ref(ref, namespace, _SUITE_PREFIXES)


def fetch_suite(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    """The suite, or CliError: not found (did you mean ...), forbidden, not installed."""
    try:
        return cluster.get_suite(name, namespace)
    except ApiError as error:
        if error.status != 404 or not error.details.get("name"):
            raise explain(error) from error
        try:
            names = [str(s["metadata"]["name"]) for s in cluster.list_suites(namespace)]
        except ApiError:
            names = []
        elsewhere: list[str] = []
        if not suggest(name, names):
            try:
                everywhere = cluster.list_suites(None)
            except ApiError:
                everywhere = []  # no right to list across namespaces: no hint
            elsewhere = sorted(
                str(s["metadata"].get("namespace"))
                for s in everywhere
                if s.get("metadata", {}).get("name") == name
            )
        raise suite_not_found(name, namespace, names, elsewhere) from error


# -- what belongs to a job: checked by its controller ------------------------------


def owned_object(
    cluster: Cluster, job: dict[str, Any], resource: str, name: str
) -> dict[str, Any] | None:
    """The object `name` of `resource` in the job's namespace, when the job is its controller.

    None when it does not exist; CliError (NOT_OWNED) naming its actual
    controller when that is not the job (by UID: a job deleted and created
    again under its name is another job); ApiError for any other failure.
    The one read of a job's objects: nothing else reads them.
    """
    meta = job["metadata"]
    namespace, uid = str(meta["namespace"]), str(meta.get("uid") or "")
    found = cluster.get_core(resource, name, namespace)
    if found is None:
        return None
    if not uid or controller_uid(found) != uid:
        raise not_owned(resource, name, namespace, str(meta["name"]), uid, controller_text(found))
    return found


def results_configmap_of(job: dict[str, Any]) -> str:
    """The name of the job's results ConfigMap: as its status names it, else the poller's."""
    status = job.get("status")
    named = status.get("resultsConfigMap") if isinstance(status, dict) else None
    return str(named or results_configmap_name(str(job["metadata"]["name"])))


def results_configmap(cluster: Cluster, job: dict[str, Any]) -> dict[str, Any] | None:
    """The job's results ConfigMap, checked (`owned_object`); None when absent."""
    return owned_object(cluster, job, "configmaps", results_configmap_of(job))
