"""Real Git servers on 127.0.0.1 for the tests: ``git daemon`` and ``git http-backend``.

`GitDaemon` runs ``git daemon`` (anonymous ``git://``) over a directory of
bare repositories. `GitHttp` serves the same directory through ``git
http-backend`` (the smart HTTP protocol, run as a CGI program per request, as
Apache or nginx would run it) behind Python's ``http.server``, which demands
HTTP basic authentication first: a request without the right user and
password gets 401 and never reaches git. With `tls` (a certificate chain and
key, e.g. `lmeval_sandbox.pki.service_serving_chain`'s) `GitHttp` speaks
HTTPS, on `host`, which the certificate must name: a clone then succeeds only
when git trusts the chain's CA. Both are started and stopped by the tests;
nothing here imitates git.
"""

from __future__ import annotations

import base64
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from lmeval_sandbox.components import free_port

from tests.waiting import wait_for

__all__ = ["GitDaemon", "GitHttp", "commit_files", "git"]

_IDENTITY = ["-c", "user.name=Test", "-c", "user.email=test@example.invalid"]


def git(*args: str, cwd: Path | None = None) -> str:
    """Run git; its stdout, stripped."""
    done = subprocess.run(
        ["git", *_IDENTITY, *args], cwd=cwd, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def commit_files(work: Path, files: dict[str, str], message: str) -> str:
    """Write `files` into work tree `work`, commit them; the new commit's hash."""
    for rel, text in files.items():
        path = work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", message, cwd=work)
    return git("rev-parse", "HEAD", cwd=work)


def _listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) == 0


class GitDaemon:
    """``git daemon`` serving every repository under `root` on `host` (127.0.0.1)."""

    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root, self.host = root, host
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, repo: str) -> str:
        return f"git://{self.host}:{self.port}/{repo}"

    def __enter__(self) -> GitDaemon:
        self.proc = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                f"--listen={self.host}",
                f"--port={self.port}",
                f"--base-path={self.root}",
                str(self.root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: _listening(self.port, self.host), timeout=20, what="git daemon listening")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        expected = base64.b64encode(self.server.credentials.encode()).decode()
        if self.headers.get("Authorization") != f"Basic {expected}":
            self.server.refused += 1
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.server.served += 1
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = {
            "PATH": "/usr/bin:/bin",
            "GIT_PROJECT_ROOT": str(self.server.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type") or "",
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": self.server.credentials.split(":", 1)[0],
            "REMOTE_ADDR": "127.0.0.1",
            "GIT_PROTOCOL": self.headers.get("Git-Protocol") or "",
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding") or "",
        }
        done = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
        )
        head, _, payload = done.stdout.partition(b"\r\n\r\n")
        status = 200
        headers: list[tuple[str, str]] = []
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _Server(ThreadingHTTPServer):
    root: Path
    credentials: str
    served: int = 0
    refused: int = 0


class GitHttp:
    """Smart HTTP (``git http-backend``) behind basic auth `user:password`, on `host`
    (127.0.0.1); HTTPS with `tls` (certificate chain, key)."""

    def __init__(
        self,
        root: Path,
        user: str,
        password: str,
        host: str = "127.0.0.1",
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.server = _Server((host, 0), _Handler)
        self.server.root = root
        self.server.credentials = f"{user}:{password}"
        self.host, self.scheme = host, "https" if tls is not None else "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            # The handshake happens on accept; a client that refuses the
            # certificate fails it there, and the server goes on.
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def served(self) -> int:
        """Requests that passed authentication and reached git."""
        return self.server.served

    @property
    def refused(self) -> int:
        return self.server.refused

    def url(self, repo: str) -> str:
        return f"{self.scheme}://{self.host}:{self.port}/{repo}"

    def __enter__(self) -> GitHttp:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def serving(root: Path, user: str, password: str) -> Iterator[tuple[GitDaemon, GitHttp]]:
    with GitDaemon(root) as daemon, GitHttp(root, user, password) as http:
        yield daemon, http
