"""The poller's own apiserver connection (`poller.kube.transport`, `poller.kube.config`).

Checks, against a real local HTTPS server (ssl + http.server on 127.0.0.1
with a throwaway PKI) that also speaks the pods/exec WebSocket protocol:
kubeconfig variants (CA file or data, insecure, tls-server-name, client
certificate files or data in 0600 temporary files removed on close, token,
tokenFile re-read after a 401, relative paths, $KUBECONFIG), exec credential
plugins (a Python script printing an ExecCredential: env, cached until its
expiry, refreshed once on a 401, client certificates), refused fields
(auth-provider, basic auth, proxy-url) with a clear ValueError, in-cluster
configuration, request details (query, JSON body, user agent, no raising for
an HTTP status, thread safety), exec (channels, exit codes, unknown exit
code, timeout, refused upgrade), and the limits on what job pods write (a
capped read against a server that ignores limitBytes, log tails cut to
whole lines, exec stdout refused past its limit, no NaN in a request
body). That the poller never imports the kubernetes package is an import
contract (tests/unit/test_import_contracts.py).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import ssl
import stat
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import urllib3
import yaml
from lmeval_sandbox.pki import Pki, issue_client_cert, make_pki

from poller.kube import config
from poller.kube.client import ApiError, Kube, NotFound
from poller.kube.transport import ApiTransport, ExecOutputTooLarge, ExecRefused

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    client_cn: str | None


@dataclass
class Apiserver:
    """What the fake apiserver saw, and whom it turns away."""

    url: str
    port: int
    seen: list[Seen] = field(default_factory=list)
    rejected_tokens: set[str] = field(default_factory=set)
    # Requests answered so far by path (for answers that change on a retry).
    answered: dict[str, int] = field(default_factory=dict)


def _frame(payload: bytes, opcode: int = 0x2) -> bytes:
    """One unmasked server frame (FIN set)."""
    head = bytes([0x80 | opcode])
    if len(payload) < 126:
        return head + bytes([len(payload)]) + payload
    if len(payload) < 1 << 16:
        return head + bytes([126]) + len(payload).to_bytes(2, "big") + payload
    return head + bytes([127]) + len(payload).to_bytes(8, "big") + payload


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the client's pool is used
    state: Apiserver

    def log_message(self, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        parts = urlsplit(self.path)
        peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        subject = dict(item[0] for item in (peer or {}).get("subject", ()))
        seen = Seen(
            self.command,
            parts.path,
            parse_qs(parts.query),
            {k.lower(): v for k, v in self.headers.items()},
            self.rfile.read(length) if length else b"",
            subject.get("commonName"),
        )
        self.state.seen.append(seen)
        token = seen.headers.get("authorization", "").removeprefix("Bearer ")
        if token in self.state.rejected_tokens:
            return self._reply(401, {"kind": "Status", "message": "Unauthorized"})
        if parts.path.endswith("/exec"):
            if parts.path.startswith("/api/v1/namespaces/forbidden/"):
                return self._reply(403, {"kind": "Status", "message": "pods/exec is forbidden"})
            if parts.path.startswith("/api/v1/namespaces/gone/"):
                return self._reply(404, {"kind": "Status", "message": 'pods "p" not found'})
            return self._exec(seen)
        if parts.path.startswith("/status/"):
            code = int(parts.path.rsplit("/", 1)[1])
            return self._reply(code, {"kind": "Status", "message": f"status {code}"})
        if parts.path.startswith("/busy/"):  # 429 with Retry-After, the first n times
            count = self.state.answered.get(parts.path, 0)
            self.state.answered[parts.path] = count + 1
            if count < int(parts.path.rsplit("/", 1)[1]):
                message = "storage is (re)initializing"
                return self._reply(429, {"kind": "Status", "message": message}, retry_after="0")
        if parts.path.endswith("/lmevaljobs"):  # pages; a stale token gets 410 Expired
            return self._pages(seen.query.get("continue", [""])[0])
        if parts.path.startswith("/lines/"):  # a server that ignores limitBytes
            return self._lines(int(parts.path.rsplit("/", 1)[1]))
        if parts.path.endswith("/log"):
            return self._lines(int(seen.query.get("size", ["5000"])[0]))
        self._reply(200, {"method": seen.method, "path": seen.path})

    def _lines(self, size: int) -> None:
        """`size` bytes of 12-byte lines, all of them whatever was asked."""
        data = b"".join(b"line %06d\n" % i for i in range(size // 12 + 1))[:size]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    def _pages(self, token: str) -> None:
        def item(name: str) -> dict[str, Any]:
            meta = {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": "7"}
            return {"metadata": meta, "spec": {"model": "hf"}}

        if token == "stale":
            expired = {"kind": "Status", "reason": "Expired", "metadata": {"continue": "fresh"}}
            return self._reply(410, expired)
        if token == "fresh":
            return self._reply(200, {"metadata": {}, "items": [item("b")]})
        return self._reply(200, {"metadata": {"continue": "stale"}, "items": [item("a")]})

    def _reply(self, code: int, body: dict[str, Any], retry_after: str = "") -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        if retry_after:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _exec(self, seen: Seen) -> None:
        """A kubelet's exec on channels 1-3, driven by the command's first word."""
        key = seen.headers["sec-websocket-key"]
        offered = [p.strip() for p in seen.headers.get("sec-websocket-protocol", "").split(",")]
        assert "v4.channel.k8s.io" in offered
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_header("Sec-WebSocket-Accept", accept)
        self.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
        self.end_headers()
        argv = seen.query["command"]
        out = self.wfile
        status: dict[str, Any] = {"status": "Success"}
        if argv[0] == "echo":
            out.write(_frame(b"\x01" + " ".join(argv[1:]).encode() + b"\n"))
        elif argv[0] == "big":  # many frames, and a character split across two of them
            text = ("x" * 9 + "é") * (int(argv[1]) // 10)
            data = text.encode()
            for start in range(0, len(data), 4097):
                out.write(_frame(b"\x01" + data[start : start + 4097]))
        elif argv[0] == "fail":
            out.write(_frame(b"\x02" + argv[2].encode()))
            cause = {"reason": "ExitCode", "message": argv[1]}
            status = {"status": "Failure", "details": {"causes": [cause]}}
        elif argv[0] == "internal":  # kwok: a failure without an exit code
            status = {"status": "Failure", "message": "Internal error occurred: exit status 1"}
        elif argv[0] == "hang":  # until the client gives up and closes
            self.close_connection = True
            self.connection.settimeout(10)
            self.rfile.read(1)
            return
        out.write(_frame(b"\x03" + json.dumps(status).encode()))
        out.write(_frame(b"", opcode=0x8))
        out.flush()
        self.close_connection = True


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def apiserver(pki: Pki) -> Iterator[Apiserver]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=pki.ca_cert)
    context.verify_mode = ssl.CERT_OPTIONAL  # client certificates are seen, not required
    context.load_cert_chain(pki.apiserver.cert, pki.apiserver.key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    state = Apiserver(f"https://127.0.0.1:{port}", port)
    _Handler.state = state
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture
def seen(apiserver: Apiserver) -> Iterator[list[Seen]]:
    apiserver.seen.clear()
    apiserver.rejected_tokens.clear()
    yield apiserver.seen


def write_kubeconfig(
    path: Path, server: str, cluster: dict[str, Any], user: dict[str, Any] | None
) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "namespace": "ignored"}}],
        "current-context": "ctx",
        "users": [],
    }
    if user is not None:
        doc["users"] = [{"name": "u", "user": user}]
        doc["contexts"][0]["context"]["user"] = "u"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def get(transport: ApiTransport, path: str = "/version") -> int:
    with transport:
        return transport.request("GET", path).status


# -- TLS and credentials from a kubeconfig ---------------------------------------


def test_ca_from_a_relative_file_or_from_data(
    apiserver: Apiserver, pki: Pki, tmp_path: Path, seen: list[Seen]
) -> None:
    (tmp_path / "conf" / "pki").mkdir(parents=True)
    (tmp_path / "conf" / "pki" / "ca.crt").write_bytes(pki.ca_cert.read_bytes())
    as_file = {"certificate-authority": "pki/ca.crt"}  # relative to the kubeconfig
    path = write_kubeconfig(tmp_path / "conf" / "k1", apiserver.url, as_file, {"token": "t"})
    assert get(ApiTransport.from_kubeconfig(path)) == 200
    as_data = {"certificate-authority-data": b64(pki.ca_cert)}
    path = write_kubeconfig(tmp_path / "k2", apiserver.url, as_data, {"token": "t"})
    assert get(ApiTransport.from_kubeconfig(path)) == 200
    assert [s.headers["authorization"] for s in seen] == ["Bearer t", "Bearer t"]


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_an_unknown_ca_or_server_name_is_refused_unless_insecure(
    apiserver: Apiserver, pki: Pki, tmp_path: Path
) -> None:
    other = make_pki(tmp_path / "other")
    wrong = {"certificate-authority": str(other.ca_cert)}
    path = write_kubeconfig(tmp_path / "k1", apiserver.url, wrong, None)
    with pytest.raises(urllib3.exceptions.MaxRetryError, match="CERTIFICATE_VERIFY_FAILED"):
        get(ApiTransport.from_kubeconfig(path))
    insecure = {"insecure-skip-tls-verify": True}
    path = write_kubeconfig(tmp_path / "k2", apiserver.url, insecure, None)
    assert get(ApiTransport.from_kubeconfig(path)) == 200
    # tls-server-name: the name checked against the certificate (which names "kubernetes").
    ca = {"certificate-authority": str(pki.ca_cert)}
    named = write_kubeconfig(
        tmp_path / "k3", apiserver.url, {**ca, "tls-server-name": "kubernetes"}, None
    )
    assert get(ApiTransport.from_kubeconfig(named)) == 200
    misnamed = write_kubeconfig(
        tmp_path / "k4", apiserver.url, {**ca, "tls-server-name": "other.example"}, None
    )
    with pytest.raises(urllib3.exceptions.MaxRetryError, match=r"other\.example"):
        get(ApiTransport.from_kubeconfig(misnamed))


def test_client_certificate_from_files_and_from_data(
    apiserver: Apiserver, pki: Pki, tmp_path: Path, seen: list[Seen]
) -> None:
    pair = issue_client_cert(pki, "alice")
    ca = {"certificate-authority": str(pki.ca_cert)}
    files = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    path = write_kubeconfig(tmp_path / "k1", apiserver.url, ca, files)
    with ApiTransport.from_kubeconfig(path) as transport:
        assert transport.client_certificate == (pair.cert, pair.key)
        assert transport.request("GET", "/version").status == 200

    data = {"client-certificate-data": b64(pair.cert), "client-key-data": b64(pair.key)}
    path = write_kubeconfig(tmp_path / "k2", apiserver.url, ca, data)
    transport = ApiTransport.from_kubeconfig(path)
    assert transport.client_certificate is not None
    for written in transport.client_certificate:
        assert stat.S_IMODE(written.stat().st_mode) == 0o600
        assert stat.S_IMODE(written.parent.stat().st_mode) == 0o700
    assert transport.client_certificate[1].read_bytes() == pair.key.read_bytes()
    assert transport.request("GET", "/version").status == 200
    transport.close()
    assert not any(p.exists() for p in transport.client_certificate)
    assert [s.client_cn for s in seen] == ["alice", "alice"]


def test_token_wins_over_token_file_which_is_read_again_after_a_401(
    apiserver: Apiserver, pki: Pki, tmp_path: Path, seen: list[Seen]
) -> None:
    ca = {"certificate-authority": str(pki.ca_cert)}
    (tmp_path / "token").write_text("first\n")
    both = write_kubeconfig(
        tmp_path / "k1", apiserver.url, ca, {"token": "t", "tokenFile": "token"}
    )
    assert get(ApiTransport.from_kubeconfig(both)) == 200
    path = write_kubeconfig(tmp_path / "k2", apiserver.url, ca, {"tokenFile": "token"})
    with ApiTransport.from_kubeconfig(path) as transport:
        assert transport.request("GET", "/a").status == 200
        (tmp_path / "token").write_text("second\n")  # rotated; the old one is now refused
        apiserver.rejected_tokens.add("first")
        assert transport.request("GET", "/b").status == 200
    tokens = [(s.path, s.headers["authorization"]) for s in seen]
    assert tokens == [
        ("/version", "Bearer t"),
        ("/a", "Bearer first"),
        ("/b", "Bearer first"),
        ("/b", "Bearer second"),
    ]


def test_a_static_token_is_not_retried_and_a_401_is_returned(
    apiserver: Apiserver, pki: Pki, tmp_path: Path, seen: list[Seen]
) -> None:
    apiserver.rejected_tokens.add("bad")
    path = write_kubeconfig(
        tmp_path / "k", apiserver.url, {"certificate-authority": str(pki.ca_cert)}, {"token": "bad"}
    )
    assert get(ApiTransport.from_kubeconfig(path)) == 401
    assert len(seen) == 1
    assert not config.Credentials(token="bad").invalidate()  # nothing else to try


PLUGIN = """\
import datetime as dt, json, os, pathlib, sys
counter = pathlib.Path(sys.argv[1])
count = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(count))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
status = {"token": f"{os.environ['GREETING']}-{count}"}
lifetime = float(os.environ.get("LIFETIME", "3600"))
expiry = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=lifetime)
status["expirationTimestamp"] = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
if os.environ.get("CERT"):
    status = {"clientCertificateData": pathlib.Path(os.environ["CERT"]).read_text(),
              "clientKeyData": pathlib.Path(os.environ["KEY"]).read_text()}
assert info["spec"]["interactive"] is False
assert info["spec"]["cluster"]["server"].startswith("https://127.0.0.1:")
print(json.dumps({"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}))
"""


def plugin_kubeconfig(
    tmp_path: Path, apiserver: Apiserver, pki: Pki, api_version: str, **env: str
) -> Path:
    script = tmp_path / "bin" / "plugin"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!{sys.executable}\n{PLUGIN}")
    script.chmod(0o755)
    plugin = {
        "apiVersion": api_version,
        "command": "./bin/plugin",  # relative to the kubeconfig's folder
        "args": [str(tmp_path / "count")],
        "env": [{"name": "GREETING", "value": "hello"}]
        + [{"name": k, "value": v} for k, v in env.items()],
        "provideClusterInfo": True,
        "interactiveMode": "Never",
    }
    ca = {"certificate-authority": str(pki.ca_cert)}
    return write_kubeconfig(tmp_path / "kubeconfig", apiserver.url, ca, {"exec": plugin})


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_exec_plugin_token_is_cached_until_expiry_and_refreshed_on_a_401(
    apiserver: Apiserver, pki: Pki, tmp_path: Path, seen: list[Seen], version: str
) -> None:
    path = plugin_kubeconfig(tmp_path, apiserver, pki, f"client.authentication.k8s.io/{version}")
    with ApiTransport.from_kubeconfig(path) as transport:
        for _ in range(3):
            assert transport.request("GET", "/version").status == 200
        assert (tmp_path / "count").read_text() == "1"  # one run, valid for an hour
        apiserver.rejected_tokens.add("hello-1")  # revoked before its expiry
        assert transport.request("GET", "/version").status == 200
        assert transport.exec("ns", "p", "main", ["echo", "hi"], timeout=10)[0] == 0
    tokens = [s.headers["authorization"] for s in seen]
    assert tokens == ["Bearer hello-1"] * 4 + ["Bearer hello-2"] * 2


def test_an_expired_plugin_credential_is_fetched_again(
    apiserver: Apiserver, pki: Pki, tmp_path: Path, seen: list[Seen]
) -> None:
    path = plugin_kubeconfig(
        tmp_path, apiserver, pki, "client.authentication.k8s.io/v1", LIFETIME="-60"
    )
    with ApiTransport.from_kubeconfig(path) as transport:
        for _ in range(2):
            assert transport.request("GET", "/version").status == 200
    assert [s.headers["authorization"] for s in seen] == ["Bearer hello-1", "Bearer hello-2"]


def test_exec_plugin_client_certificate(
    apiserver: Apiserver, pki: Pki, tmp_path: Path, seen: list[Seen]
) -> None:
    pair = issue_client_cert(pki, "plugin-user")
    path = plugin_kubeconfig(
        tmp_path,
        apiserver,
        pki,
        "client.authentication.k8s.io/v1",
        CERT=str(pair.cert),
        KEY=str(pair.key),
    )
    with ApiTransport.from_kubeconfig(path) as transport:
        assert transport.request("GET", "/version").status == 200
        assert transport.exec("ns", "p", "main", ["echo", "hi"], timeout=10)[0] == 0
        written = transport.client_certificate
        assert written is not None and written[1].read_bytes() == pair.key.read_bytes()
    assert not written[1].exists()
    assert [(s.client_cn, "authorization" in s.headers) for s in seen] == [
        ("plugin-user", False)
    ] * 2


@pytest.mark.parametrize(
    ("section", "entry", "words"),
    [
        (
            "user",
            {"auth-provider": {"name": "oidc"}},
            ["'auth-provider'", "exec credential plugin"],
        ),
        ("user", {"username": "basic-auth"}, ["'username'", "token"]),
        ("user", {"as": "someone"}, ["'as'", "not supported"]),
        ("cluster", {"proxy-url": "http://proxy:3128"}, ["'proxy-url'", "directly"]),
        (
            "user",
            {"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}},
            ["v1alpha1", "client.authentication.k8s.io/v1"],
        ),
        ("user", {"client-certificate": "c.crt"}, ["client-key"]),
    ],
)
def test_unsupported_fields_are_refused_by_name(
    tmp_path: Path, section: str, entry: dict[str, Any], words: list[str]
) -> None:
    cluster = entry if section == "cluster" else {}
    user = entry if section == "user" else {}
    path = write_kubeconfig(tmp_path / "k", "https://127.0.0.1:1", cluster, user)
    with pytest.raises(ValueError) as refused:
        ApiTransport.from_kubeconfig(path)
    for word in words:
        assert word in str(refused.value)
    assert str(path) in str(refused.value)


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_context_choice_and_the_kubeconfig_variable(
    apiserver: Apiserver, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_kubeconfig(tmp_path / "k", apiserver.url, {"insecure-skip-tls-verify": True}, None)
    with pytest.raises(ValueError, match="no context named 'elsewhere'"):
        ApiTransport.from_kubeconfig(path, context="elsewhere")
    assert get(ApiTransport.from_kubeconfig(path, context="ctx")) == 200
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(path), str(tmp_path / "missing")]))
    assert get(ApiTransport.from_environment(None)) == 200  # the first file of $KUBECONFIG
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError):
        ApiTransport.from_environment(None)
    assert get(ApiTransport.from_environment(path)) == 200


def test_in_cluster_reads_the_service_account_and_rereads_a_rotated_token(
    apiserver: Apiserver,
    pki: Pki,
    tmp_path: Path,
    seen: list[Seen],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "ca.crt").write_bytes(pki.ca_cert.read_bytes())
    (tmp_path / "token").write_text("bound-1")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="KUBERNETES_SERVICE_HOST"):
        ApiTransport.in_cluster(tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(apiserver.port))
    with ApiTransport.in_cluster(tmp_path) as transport:
        assert transport.request("GET", "/version").status == 200
        (tmp_path / "token").write_text("bound-2")
        assert transport.request("GET", "/version").status == 200  # within the minute
        # A minute later, as far as the credentials can tell:
        later = SimpleNamespace(monotonic=lambda: time.monotonic() + 61, time=time.time)
        monkeypatch.setattr(config, "time", later)
        assert transport.request("GET", "/version").status == 200
    tokens = [s.headers["authorization"] for s in seen]
    assert tokens == ["Bearer bound-1", "Bearer bound-1", "Bearer bound-2"]
    # from_environment in a pod: the real service account, which this machine lacks.
    with pytest.raises(FileNotFoundError, match="serviceaccount/token"):
        ApiTransport.from_environment(None)


# -- requests ---------------------------------------------------------------------


@pytest.fixture
def transport(apiserver: Apiserver, pki: Pki, tmp_path: Path) -> Iterator[ApiTransport]:
    path = write_kubeconfig(
        tmp_path / "k", apiserver.url, {"certificate-authority": str(pki.ca_cert)}, {"token": "t"}
    )
    with ApiTransport.from_kubeconfig(path) as made:
        made.user_agent = "lmeval-poller/test"
        yield made


def test_request_query_body_headers_and_statuses(transport: ApiTransport, seen: list[Seen]) -> None:
    query = {"limit": 500, "continue": None, "watch": False, "command": ["a", "b c"]}
    response = transport.request("POST", "/apis/x", query=query, body={"k": "é"})
    assert response.status == 200 and json.loads(response.data)["path"] == "/apis/x"
    assert response.headers["Content-Type"] == "application/json"
    first = seen[0]
    assert first.query == {"limit": ["500"], "watch": ["false"], "command": ["a", "b c"]}
    assert json.loads(first.body) == {"k": "é"}
    assert first.headers["content-type"] == "application/json"
    assert first.headers["user-agent"] == "lmeval-poller/test"
    patch = transport.request(
        "PATCH", "/p", body={"a": 1}, content_type="application/merge-patch+json"
    )
    assert patch.status == 200 and seen[1].headers["content-type"] == "application/merge-patch+json"
    transport.request("GET", "/g")
    assert "content-type" not in seen[2].headers  # no body, no content type
    refused = transport.request("GET", "/status/422")
    assert (refused.status, refused.reason) == (422, "Unprocessable Entity")
    assert json.loads(refused.data)["message"] == "status 422"


def test_too_many_requests_is_retried_after_the_time_it_asks(
    transport: ApiTransport, seen: list[Seen]
) -> None:
    # The apiserver answers 429 with Retry-After while a resource's storage
    # (re)initializes, and when API Priority and Fairness sheds load.
    assert transport.request("GET", "/busy/2").status == 200
    assert [s.path for s in seen] == ["/busy/2"] * 3
    assert transport.request("GET", "/busy/9").status == 429  # given up: returned, not raised
    assert transport.request("POST", "/busy/1", body={}).status == 429  # never re-sent


def test_a_page_after_an_expired_continue_token(transport: ApiTransport, seen: list[Seen]) -> None:
    kube = Kube(transport)
    first = kube.list_jobs_page(None, field_selector="status.state=Complete", token=None)
    assert [i["metadata"]["name"] for i in first.items] == ["a"]
    assert first.continue_token == "stale" and not first.inconsistent
    second = kube.list_jobs_page(
        None, field_selector="status.state=Complete", token="stale", metadata_only=True
    )
    assert [i["metadata"] for i in second.items] == [
        {"name": "b", "namespace": "ns", "uid": "u-b", "resourceVersion": "7"}
    ]
    assert second.continue_token is None and second.inconsistent
    asked = [(s.query.get("continue"), s.headers["accept"]) for s in seen]
    metadata = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
    assert asked == [(None, "application/json"), (["stale"], metadata), (["fresh"], metadata)]
    assert seen[0].query["fieldSelector"] == ["status.state=Complete"]


def test_concurrent_requests_share_the_pool(transport: ApiTransport, seen: list[Seen]) -> None:
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: transport.request("GET", f"/n/{i}").status, range(80)))
    assert statuses == [200] * 80
    assert sorted(s.path for s in seen) == sorted(f"/n/{i}" for i in range(80))


def test_kube_turns_statuses_into_its_exceptions(transport: ApiTransport) -> None:
    counted: list[tuple[str, str, str]] = []
    kube = Kube(transport, on_request=lambda *args: counted.append(args))
    with pytest.raises(ApiError) as error:
        kube._request("GET", "/status/403", verb="get", resource="pods")
    assert (error.value.status, error.value.reason) == (403, "Forbidden")
    assert str(error.value) == "403 Forbidden: status 403"
    with pytest.raises(NotFound):
        kube._request("GET", "/status/404", verb="get", resource="pods")
    assert kube.exec_in_pod("ns", "p", "main", ["echo", "ok"]) == (0, "ok\n", "")
    with pytest.raises(ApiError) as refused:
        kube.exec_in_pod("forbidden", "p", "main", ["echo"])
    assert refused.value.status == 403 and "pods/exec is forbidden" in str(refused.value)
    with pytest.raises(NotFound):
        kube.exec_in_pod("gone", "p", "main", ["echo"])
    assert counted == [
        ("get", "pods", "403"),
        ("get", "pods", "404"),
        ("get", "pods/exec", "101"),
        ("get", "pods/exec", "403"),
        ("get", "pods/exec", "404"),
    ]


# -- exec -------------------------------------------------------------------------


def test_exec_channels_and_exit_codes(transport: ApiTransport, seen: list[Seen]) -> None:
    argv = ["echo", "a b", "--flag=$(x)"]  # never a shell: each word is its own parameter
    assert transport.exec("ns", "pod", "main", argv, timeout=10) == (0, "a b --flag=$(x)\n", "")
    assert seen[0].path == "/api/v1/namespaces/ns/pods/pod/exec"
    assert seen[0].query["command"] == argv
    assert seen[0].query["container"] == ["main"]
    assert seen[0].headers["user-agent"] == "lmeval-poller/test"
    assert seen[0].headers["authorization"] == "Bearer t"
    assert transport.exec("ns", "pod", "main", ["fail", "3", "oops"], timeout=10) == (3, "", "oops")
    code, out, err = transport.exec("ns", "pod", "main", ["big", "300000"], timeout=10)
    assert (code, out, err) == (0, ("x" * 9 + "é") * 30000, "")
    # A failure without an exit code (kwok's way): unknown, with the reason on stderr.
    code, out, err = transport.exec("ns", "pod", "main", ["internal"], timeout=10)
    assert (code, out) == (None, "") and "Internal error occurred" in err


def test_exec_timeout_and_refusals(transport: ApiTransport) -> None:
    assert transport.exec("ns", "pod", "main", ["hang"], timeout=0.5) == (None, "", "")
    with pytest.raises(ExecRefused) as refused:
        transport.exec("forbidden", "pod", "main", ["echo"], timeout=10)
    assert refused.value.status == 403 and "forbidden" in refused.value.body


# -- what job pods write: never read beyond a limit -------------------------------


def test_a_capped_read_stops_at_its_limit_and_the_pool_recovers(
    transport: ApiTransport, seen: list[Seen]
) -> None:
    capped = transport.request("GET", "/lines/5000000", max_bytes=1000)
    assert (
        capped.status == 200
        and capped.data == b"".join(b"line %06d\n" % i for i in range(84))[:1000]
    )
    # The dropped connection's unread bytes never reach the next response.
    assert json.loads(transport.request("GET", "/after").data)["path"] == "/after"
    exact = transport.request("GET", "/lines/1000", max_bytes=1000)
    assert len(exact.data) == 1000
    assert transport.request("GET", "/again").status == 200


def test_log_tails_send_limit_bytes_and_enforce_it(
    transport: ApiTransport, seen: list[Seen]
) -> None:
    kube = Kube(transport)
    tail = kube.read_log_tail("ns", "p", "main", 400, 100)
    assert seen[0].path == "/api/v1/namespaces/ns/pods/p/log"
    assert seen[0].query["limitBytes"] == ["101"] and seen[0].query["tailLines"] == ["400"]
    assert tail.cut and tail.data == b"".join(b"line %06d\n" % i for i in range(8))
    whole = kube.read_log_tail("ns", "p", "main", 400, 5000)
    assert not whole.cut and len(whole.data) == 5000 and whole.text.startswith("line 000000")


def test_a_non_finite_number_is_never_sent(transport: ApiTransport, seen: list[Seen]) -> None:
    for number in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"PATCH /p: .* \(NaN or Infinity\); nothing was sent"):
            transport.request("PATCH", "/p", body={"status": {"progress": {"percent": number}}})
    assert seen == []


def test_exec_stdout_is_capped(transport: ApiTransport) -> None:
    with pytest.raises(ExecOutputTooLarge, match="exec output larger than 1000 bytes"):
        transport.exec("ns", "pod", "main", ["big", "300000"], timeout=10, max_stdout=1000)
    counted: list[tuple[str, str, str]] = []
    kube = Kube(transport, on_request=lambda *args: counted.append(args))
    with pytest.raises(ExecOutputTooLarge):
        kube.exec_in_pod("ns", "pod", "main", ["big", "300000"], max_stdout=329_999)
    assert counted == [("get", "pods/exec", "101")]
    code, out, _ = transport.exec("ns", "pod", "main", ["big", "300000"], timeout=10)
    assert code == 0 and len(out.encode()) == 330_000  # within the default limit (1 MiB)
