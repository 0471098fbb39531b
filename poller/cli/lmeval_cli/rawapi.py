"""One raw Kubernetes API request through the kubernetes client's plumbing, without its models.

The CLI and the sandbox's node talk to the API this way: the client's
ApiClient supplies authentication, TLS and connection pooling, while bodies
go out as plain dicts and come back as bytes, because building the client's
typed models costs more than the request and loses nothing only when
skipped. Each caller keeps its own error handling (the CLI explains, the
node retries); this is the part they share. The poller process does not use
it: importing the kubernetes package alone costs it 44 MiB, so it has its
own connection, `poller.kube.transport.ApiTransport`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client

__all__ = ["send"]


def send(
    api_client: client.ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, Any] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    accept: str = "application/json",
    timeout: float | tuple[float, float] = 30.0,
) -> tuple[Any, bytes]:
    """Send one request; return the response (for its status and headers) and its body.

    `timeout` is seconds, or (connect, read) seconds. Query parameters whose
    value is None are left out. Never raises for an HTTP status: that is the
    caller's to judge.
    """
    headers = {"Accept": accept}
    if body is not None:
        headers["Content-Type"] = content_type
    params = api_client.param_serialize(
        method=method,
        resource_path=path,
        query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(*params, _request_timeout=timeout)
    data: bytes = response.read()  # type: ignore[no-untyped-call]
    return response, data
