"""The poller's connection to the Kubernetes apiserver: urllib3 for REST, a WebSocket for exec.

Why not the kubernetes client: importing the ``kubernetes`` package (37.x)
costs about 44 MiB of RSS, because its ``__init__`` imports every API model,
and the poller's budget is 150 MiB at 10000 jobs. The poller never used those
models (`poller.kube.client` sends plain dicts and parses the bytes itself), only the
client's plumbing: authentication, TLS and a connection pool. This module is
that plumbing and nothing more; `poller.kube.config` reads the settings and
credentials. The CLI, the sandbox and the tests keep the kubernetes client.

`ApiTransport` is thread-safe (the poller fetches the next LIST page on a
helper thread while it parses the current one): one urllib3 connection pool,
and a lock around the credentials. A 401 refreshes a token file or an exec
plugin's credential once and retries. Proxies from the environment are not
used: the apiserver is dialled directly, for REST and exec alike.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlencode, urlsplit

import urllib3
import websocket

from poller.kube import config
from poller.kube.config import Endpoint

__all__ = ["ApiTransport", "ExecOutputTooLarge", "ExecRefused", "Response"]

EXEC_PROTOCOLS = ["v5.channel.k8s.io", "v4.channel.k8s.io"]
# What an exec may send back (the command runs in a job pod, whose author
# controls its output). stdout beyond its limit ends the exec with
# ExecOutputTooLarge; callers that expect more pass their own limit. stderr
# and the status channel are only ever read for a message: cut, not refused.
EXEC_MAX_STDOUT_BYTES = 1024 * 1024
EXEC_MAX_STDERR_BYTES = 64 * 1024
# Reads of a capped response body, in pieces of this size.
_READ_PIECE = 64 * 1024
# urllib3's default retries (connection errors, and read errors of idempotent requests),
# but never a redirect: it would carry the token elsewhere. An idempotent request
# answered 429 or 503 with Retry-After (the apiserver while a resource's storage
# (re)initializes, API Priority and Fairness shedding load) is sent again after
# the time asked, at most twice, as client-go does; then that answer is returned.
_RETRIES = urllib3.Retry(
    total=3, redirect=False, status=2, raise_on_redirect=False, raise_on_status=False
)


@dataclass(frozen=True)
class Response:
    """An HTTP response, read to the end."""

    status: int
    reason: str
    headers: Mapping[str, str]
    data: bytes


class ExecRefused(Exception):
    """The apiserver answered the exec upgrade with an HTTP status instead of 101."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"exec refused: {status} {reason}: {body[:300]}")
        self.status, self.reason, self.body = status, reason, body


class ExecOutputTooLarge(Exception):
    """An exec's stdout passed its limit; the exec was abandoned there."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"exec output larger than {limit} bytes")
        self.limit = limit


class ApiTransport:
    """Requests to one apiserver, authenticated, pooled and thread-safe."""

    def __init__(self, endpoint: Endpoint) -> None:
        parts = urlsplit(endpoint.server)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"server {endpoint.server!r}: expected https://HOST[:PORT][/PATH]")
        self._endpoint = endpoint
        self._credentials = endpoint.credentials
        self._secure = parts.scheme == "https"
        self._host, self._netloc = parts.hostname, parts.netloc
        self._port = parts.port or (443 if self._secure else 80)
        self._prefix = parts.path.rstrip("/")  # an apiserver behind a path-routing proxy
        self._lock = threading.Lock()
        self._tmp: Path | None = None  # made on first use, for client certificates given as data
        self._cleanup: weakref.finalize[Any, Any] | None = None
        self._cert_files = endpoint.cert_files
        self._plugin_cert: tuple[bytes, bytes] | None = None
        if endpoint.cert_data is not None:
            self._cert_files = self._write_cert(endpoint.cert_data)
        self._pool = self._new_pool()
        self.user_agent = "lmeval-poller"

    @property
    def client_certificate(self) -> tuple[Path, Path] | None:
        """The files the client certificate and key were loaded from, if any."""
        return self._cert_files

    def _write_cert(self, pem: tuple[bytes, bytes]) -> tuple[Path, Path]:
        # ssl loads certificates only from files; the key must not be readable by others.
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="lmeval-transport-"))  # mode 0700
            # The files go even when close() is never called (at exit at the latest).
            self._cleanup = weakref.finalize(self, shutil.rmtree, self._tmp, ignore_errors=True)
        fd, name = tempfile.mkstemp(dir=self._tmp, suffix=".crt")  # mkstemp: mode 0600
        os.write(fd, pem[0])
        os.close(fd)
        key_fd, key_name = tempfile.mkstemp(dir=self._tmp, suffix=".key")
        os.write(key_fd, pem[1])
        os.close(key_fd)
        return Path(name), Path(key_name)

    def _new_pool(self) -> urllib3.HTTPConnectionPool:
        if not self._secure:
            return urllib3.HTTPConnectionPool(self._host, self._port, maxsize=4, retries=_RETRIES)
        endpoint = self._endpoint
        # With neither a CA file nor data: the system's CAs.
        context = ssl.create_default_context(cafile=endpoint.ca_file, cadata=endpoint.ca_data)
        if endpoint.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self._cert_files is not None:
            context.load_cert_chain(*self._cert_files)
        self._ssl = context
        return urllib3.HTTPSConnectionPool(
            self._host,
            self._port,
            maxsize=4,
            retries=_RETRIES,
            ssl_context=context,
            # urllib3 sets these on the context for every connection: keep them as made.
            cert_reqs="CERT_NONE" if endpoint.insecure else "CERT_REQUIRED",
            assert_hostname=False if endpoint.insecure else None,
            server_hostname=endpoint.server_name,
        )

    def _prepare(self, accept: str) -> tuple[urllib3.HTTPConnectionPool, dict[str, str]]:
        """The pool and headers for one request, with a fresh credential if due."""
        with self._lock:
            token = self._credentials.token()
            cert = self._credentials.cert
            if cert is not None and cert != self._plugin_cert:  # a plugin's new certificate
                old = self._cert_files
                self._cert_files, self._plugin_cert = self._write_cert(cert), cert
                self._pool.close()
                self._pool = self._new_pool()
                for path in old or ():
                    if path.parent == self._tmp:
                        path.unlink(missing_ok=True)
            headers = {"Accept": accept, "User-Agent": self.user_agent}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            return self._pool, headers

    def _refresh(self) -> bool:
        with self._lock:
            return self._credentials.invalidate()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float = 30.0,
        max_bytes: int | None = None,
    ) -> Response:
        """One request; never raises for an HTTP status (transport errors propagate).

        Query values that are None are left out, lists repeat the key; a body
        that is not bytes is sent as JSON, and never with NaN or Infinity in
        it (JSON cannot carry them; the apiserver would refuse the body): a
        ValueError says so before anything is sent. With `max_bytes`, at most
        that many bytes of the response body are read, whatever the server
        sends; the connection is dropped when more were on their way.
        """
        url = self._prefix + path + _query_string(query)
        payload = (
            body if body is None or isinstance(body, bytes) else _json_body(method, path, body)
        )
        for attempt in (1, 2):
            pool, headers = self._prepare(accept)
            if payload is not None:
                headers["Content-Type"] = content_type
            response = pool.urlopen(
                method,
                url,
                body=payload,
                headers=headers,
                timeout=urllib3.Timeout(connect=timeout, read=timeout),
                redirect=False,
                preload_content=max_bytes is None,
            )
            if response.status != 401 or attempt == 2 or not self._refresh():
                break
            if max_bytes is not None:
                _read_at_most(response, 0)  # not read: let the connection go
        data = response.data if max_bytes is None else _read_at_most(response, max_bytes)
        return Response(response.status, response.reason or "", response.headers, data)

    def exec(
        self,
        namespace: str,
        pod: str,
        container: str,
        argv: Sequence[str],
        *,
        timeout: float,
        max_stdout: int = EXEC_MAX_STDOUT_BYTES,
    ) -> tuple[int | None, str, str]:
        """Run `argv` (no shell) in a container: (exit code, stdout, stderr).

        The exit code is None when it is unknown: the command outlived
        `timeout` (seconds for the whole call), or the stream ended without a
        status, or the status is a failure without an exit code (its message
        then ends stderr). Raises ExecRefused when the upgrade is refused, and
        ExecOutputTooLarge when stdout passes `max_stdout` bytes (stderr is
        cut at EXEC_MAX_STDERR_BYTES).
        """
        deadline = time.monotonic() + timeout
        query = {"container": container, "stdin": False, "stdout": True, "stderr": True}
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/exec"
        target = self._prefix + path + _query_string({**query, "tty": False, "command": list(argv)})
        url = f"{'wss' if self._secure else 'ws'}://{self._netloc}{target}"
        for attempt in (1, 2):
            _, headers = self._prepare("*/*")
            sslopt: dict[str, Any] = {}
            if self._secure:
                sslopt = {"context": self._ssl, "server_hostname": self._endpoint.server_name}
            ws = websocket.WebSocket(sslopt=sslopt, skip_utf8_validation=True)
            try:
                # websocket-client's connect() takes untyped **options.
                ws.connect(  # type: ignore[no-untyped-call]
                    url,
                    header=[f"{name}: {value}" for name, value in headers.items()],
                    subprotocols=EXEC_PROTOCOLS,
                    timeout=max(deadline - time.monotonic(), 0.001),
                    http_no_proxy=["*"],  # like the REST requests: no proxy
                )
            except websocket.WebSocketBadStatusException as error:
                ws.close()
                if error.status_code == 401 and attempt == 1 and self._refresh():
                    continue
                body = (error.resp_body or b"").decode("utf-8", "replace")
                raise ExecRefused(error.status_code, error.status_message or "", body) from None
            try:
                return _read_exec(ws, deadline, max_stdout)
            finally:
                # Waits for the server's close frame, which is immediate unless the
                # command is still running (it then goes with the connection).
                ws.close(timeout=1.0)
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the pooled connections and remove the temporary files."""
        self._pool.close()
        if self._cleanup is not None:
            self._cleanup()

    def __enter__(self) -> ApiTransport:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- where the configuration comes from -------------------------------------

    @classmethod
    def from_environment(cls, kubeconfig_path: Path | None = None) -> ApiTransport:
        """The given kubeconfig; else in-cluster when in a pod; else the default kubeconfig."""
        if kubeconfig_path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster()
        return cls.from_kubeconfig(kubeconfig_path)

    @classmethod
    def in_cluster(cls, root: Path = config.SERVICE_ACCOUNT) -> ApiTransport:
        """The pod's service account (token and CA under `root`)."""
        return cls(config.in_cluster(root))

    @classmethod
    def from_kubeconfig(cls, path: Path | None = None, context: str | None = None) -> ApiTransport:
        """A kubeconfig's context (default: the current one).

        `path` None: the first file of $KUBECONFIG, else ~/.kube/config.
        """
        return cls(config.load(path, context))


def _query_string(query: Mapping[str, Any] | None) -> str:
    pairs: list[tuple[str, str]] = []
    for key, value in (query or {}).items():
        for item in value if isinstance(value, list | tuple) else [value]:
            if item is not None:
                pairs.append((key, str(item).lower() if isinstance(item, bool) else str(item)))
    return f"?{urlencode(pairs)}" if pairs else ""


def _json_body(method: str, path: str, body: Any) -> bytes:
    try:
        return json.dumps(body, allow_nan=False).encode()
    except ValueError as error:  # a NaN or an infinity reached a body: a bug upstream
        raise ValueError(
            f"{method} {path}: the request body holds a number JSON cannot carry "
            f"(NaN or Infinity); nothing was sent ({error})"
        ) from None


def _read_at_most(response: urllib3.BaseHTTPResponse, limit: int) -> bytes:
    """Up to `limit` bytes of a streamed body; the connection is closed if more remain."""
    data = bytearray()
    ended = False
    try:
        while len(data) < limit:
            piece = response.read(min(_READ_PIECE, limit - len(data)))
            if not piece:
                ended = True
                break
            data += piece
        if not ended and limit > 0 and not response.read(1):
            ended = True  # exactly `limit` bytes: the connection may be reused
    finally:
        if not ended:
            response.close()  # unread bytes must not reach the next request
        response.release_conn()
    return bytes(data)


def _read_exec(
    ws: websocket.WebSocket, deadline: float, max_stdout: int
) -> tuple[int | None, str, str]:
    """Collect the channels (1 stdout, 2 stderr, 3 status) until the server closes."""
    channels = {1: bytearray(), 2: bytearray(), 3: bytearray()}
    limits = {1: max_stdout, 2: EXEC_MAX_STDERR_BYTES, 3: EXEC_MAX_STDERR_BYTES}
    ended = False
    while not ended and (left := deadline - time.monotonic()) > 0:
        ws.settimeout(left)
        try:
            opcode, data = ws.recv_data()
        except websocket.WebSocketTimeoutException:
            break
        except websocket.WebSocketConnectionClosedException:
            ended = True  # closed without a close frame: the end all the same
            break
        ended = opcode == websocket.ABNF.OPCODE_CLOSE
        data = data.encode() if isinstance(data, str) else data
        if not ended and data and data[0] in channels:  # v5's 255 (close channel) is ignored
            channel = channels[data[0]]
            room = limits[data[0]] - len(channel)
            if data[0] == 1 and len(data) - 1 > room:
                raise ExecOutputTooLarge(max_stdout)
            channel += data[1 : 1 + max(room, 0)]
    stdout = channels[1].decode("utf-8", "replace")
    stderr = channels[2].decode("utf-8", "replace")
    if not ended:
        return None, stdout, stderr
    try:
        status = json.loads(channels[3] or b"null") or {}
    except ValueError:
        status = {}
    if status.get("status") == "Success":
        return 0, stdout, stderr
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode" and str(cause.get("message")).isdigit():
            return int(cause["message"]), stdout, stderr
    if status.get("message"):
        stderr += status["message"]
    return None, stdout, stderr
