"""A real MLflow tracking server on loopback for tests: ``mlflow server``.

The ``mlflow`` package's own server (a development requirement), started
with its basic-auth app so that a wrong credential is refused as it is in
production: a SQLite backend store, a SQLite user store and a local
artifact root under a temporary directory, the artifacts served by the
server itself (``--serve-artifacts``, as the job pod's client needs), on a
free port of 127.0.0.1. The admin user is made from the auth app's
configuration file (``MLFLOW_AUTH_CONFIG_PATH``); `Server.add_user` makes
others through the auth REST API.

One server per test process (`shared`): it takes some 20 s to start on a
busy machine, so every module that needs one (the driver's tests, the
end-to-end ones) gets the same, and it is stopped when the process exits.
It runs in a process group of its own (the CLI starts uvicorn as a child),
which is what is stopped. MLflow's job runner (huey consumers) is switched
off: no test needs it and it starts a dozen processes.

Reading back: `Server.client` is MLflow's own ``MlflowClient`` with the
admin's credentials, given to the client in MLflow's variables only while
it runs (`Server.admin`), so that no other test's process inherits them.

HTTPS: `tls_front` terminates TLS on a port of its own with a given
certificate and relays the bytes to the server, as an ingress would, so
that a client's trust can be tested without a second server.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import importlib.util
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmeval_sandbox.components import free_port

from tests.waiting import wait_for

ADMIN = "admin"
START_TIMEOUT = 180.0
# What the server and its client read besides their options.
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}


def available() -> bool:
    """Whether the mlflow package with its server and basic-auth app is installed
    (looked up without importing it: it takes seconds, and collection calls this)."""
    spec = importlib.util.find_spec("mlflow")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return any((Path(root) / "server" / "auth" / "__init__.py").is_file() for root in roots)


class Server:
    """A running tracking server: its URI, its admin's credentials, its files."""

    def __init__(self, root: Path, port: int, password: str) -> None:
        self.root, self.port = root, port
        self.uri = f"http://127.0.0.1:{port}"
        self.username, self.password = ADMIN, password
        self.process: subprocess.Popen[bytes] | None = None

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A request of the auth app's REST API, as the admin."""
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        request = urllib.request.Request(
            f"{self.uri}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
        return json.loads(text) if text else None

    def add_user(self, username: str, password: str) -> None:
        """A user of the server with `password`, made, or given it when it exists
        (another module of this process may have made it)."""
        body = {"username": username, "password": password}
        try:
            self._request("POST", "/api/2.0/mlflow/users/create", body)
        except urllib.error.HTTPError as error:
            said = error.read().decode(errors="replace")
            if "RESOURCE_ALREADY_EXISTS" not in said:
                raise AssertionError(f"mlflow users/create: {error}: {said}") from None
            self._request("PATCH", "/api/2.0/mlflow/users/update-password", body)

    @contextlib.contextmanager
    def admin(self) -> Iterator[None]:
        """MLflow's client variables set to the admin's credentials, for a while."""
        values = {
            "MLFLOW_TRACKING_USERNAME": self.username,
            "MLFLOW_TRACKING_PASSWORD": self.password,
            **QUIET,
        }
        before = {name: os.environ.get(name) for name in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def client(self) -> Any:
        """MLflow's own client for this server (use it inside `admin`)."""
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        # The CLI and the uvicorn it started: the whole group (its own session).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        # Workers the CLI left behind (same group) get no second chance.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def _healthy(server: Server) -> bool:
    process = server.process
    if process is not None and process.poll() is not None:
        return True  # exited: the caller says so
    try:
        with urllib.request.urlopen(f"{server.uri}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def start(root: Path) -> Server:
    """Start a server under `root` and wait until it answers; `Server.stop` ends it."""
    root.mkdir(parents=True, exist_ok=True)
    server = Server(root, free_port(), f"admin-{secrets.token_hex(8)}")
    config = root / "basic_auth.ini"
    config.write_text(
        "[mlflow]\n"
        "default_permission = READ\n"
        f"database_uri = sqlite:///{root / 'auth.db'}\n"
        f"admin_username = {server.username}\n"
        f"admin_password = {server.password}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = {
        **os.environ,
        **QUIET,
        "MLFLOW_AUTH_CONFIG_PATH": str(config),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    argv = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--app-name=basic-auth",
        f"--backend-store-uri=sqlite:///{root / 'mlflow.db'}",
        f"--artifacts-destination={root / 'artifacts'}",
        "--serve-artifacts",
        "--host=127.0.0.1",
        f"--port={server.port}",
        "--workers=1",
    ]
    with (root / "server.log").open("wb") as log:
        server.process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True
        )
    try:
        wait_for(lambda: _healthy(server), timeout=START_TIMEOUT, what="mlflow server /health")
        assert server.process.poll() is None, f"mlflow server exited:\n{server.log()}"
    except BaseException:
        server.stop()
        raise
    return server


_SHARED: Server | None = None


def shared(root: Path) -> Server:
    """The test process's one server (started under `root` the first time), stopped at exit."""
    global _SHARED
    if _SHARED is None or _SHARED.process is None or _SHARED.process.poll() is not None:
        _SHARED = start(root)
        atexit.register(_SHARED.stop)
    return _SHARED


def _pipe(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)


def _relay(client: socket.socket, context: ssl.SSLContext, port: int) -> None:
    try:
        secure = context.wrap_socket(client, server_side=True)
    except (OSError, ssl.SSLError):  # a client that does not trust us hangs up
        client.close()
        return
    with secure, socket.create_connection(("127.0.0.1", port), timeout=30) as upstream:
        back = threading.Thread(target=_pipe, args=(upstream, secure), daemon=True)
        back.start()
        _pipe(secure, upstream)
        back.join(timeout=30)


@contextlib.contextmanager
def tls_front(server: Server, cert: Path, key: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """An https:// URI of `server` on `host` (TLS with `cert` and `key`), closed on exit."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    listener = socket.create_server((host, 0))
    listener.settimeout(0.2)
    stopped = threading.Event()

    def accept() -> None:
        while not stopped.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(30)
            threading.Thread(
                target=_relay, args=(client, context, server.port), daemon=True
            ).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"https://{host}:{listener.getsockname()[1]}"
    finally:
        stopped.set()
        thread.join(timeout=5)
        listener.close()


def free_loopback_uri() -> str:
    """A tracking URI nothing listens on (a server that is down)."""
    return f"http://127.0.0.1:{free_port()}"
