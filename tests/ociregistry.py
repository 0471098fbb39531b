"""A real OCI registry on loopback for tests: Debian's ``docker-registry``.

``docker-registry`` is the CNCF distribution registry (2.8), serving plain
HTTP on 127.0.0.1 from a temporary directory, or HTTPS with `tls` (its
``http.tls``: a certificate chain and key, e.g. those of
`lmeval_sandbox.pki.service_serving_chain`) on a given `host`, which the
certificate must name; with `users` it asks for
Basic auth from an htpasswd file (bcrypt hashes, made with the C library's
crypt, whose ``$2b$`` hashes the registry's Go bcrypt reads). Artifacts are
read back with ``skopeo``, a real client, and blobs with plain HTTP GETs.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import json
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID
from lmeval_sandbox.components import free_port

from tests.waiting import wait_for

REGISTRY = "/usr/bin/docker-registry"


def available() -> bool:
    return Path(REGISTRY).exists() and shutil.which("skopeo") is not None


def _bcrypt(password: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))


class Registry:
    def __init__(
        self,
        root: Path,
        port: int,
        users: Mapping[str, str],
        host: str = "127.0.0.1",
        ca: Path | None = None,
        tls: bool = False,
    ) -> None:
        self.root, self.port, self.users = root, port, dict(users)
        self.address = f"{host}:{port}"
        self.scheme = "https" if tls else "http"
        # The tests' own reads trust the registry's CA (the same store for all).
        self.context = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
        self.tokens: TokenService | None = None

    def _auth(self) -> dict[str, str]:
        if not self.users:
            return {}
        user, password = next(iter(self.users.items()))
        return {
            "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        }

    def get(self, path: str, accept: str | None = None) -> bytes:
        headers = self._auth()
        if self.tokens is not None:  # /v2/<name>/blobs/... or /v2/<name>/manifests/...
            name = path.removeprefix("/v2/").rsplit("/", 2)[0]
            user = next(iter(self.users))
            headers["Authorization"] = (
                f"Bearer {self.tokens.token(user, f'repository:{name}:pull')}"
            )
        if accept:
            headers["Accept"] = accept
        req = urllib.request.Request(f"{self.scheme}://{self.address}{path}", headers=headers)
        with urllib.request.urlopen(req, timeout=30, context=self.context) as resp:
            data: bytes = resp.read()
            return data

    def skopeo_raw(self, reference: str) -> dict[str, object]:
        """The manifest of `reference` (repository:tag or @digest), as skopeo reads it."""
        argv = ["skopeo", "inspect", "--raw", "--tls-verify=false"]
        if self.users:
            user, password = next(iter(self.users.items()))
            argv.append(f"--creds={user}:{password}")
        argv.append(f"docker://{self.address}/{reference}")
        out = subprocess.run(argv, capture_output=True, check=True, timeout=60)
        manifest: dict[str, object] = json.loads(out.stdout)
        return manifest

    def docker_config(self, path: Path, password: str | None = None) -> Path:
        """A .dockerconfigjson for the registry's first user (`password` overrides)."""
        user, real = next(iter(self.users.items()))
        auth = base64.b64encode(f"{user}:{password or real}".encode()).decode()
        path.write_text(json.dumps({"auths": {self.address: {"auth": auth}}}))
        return path


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenService:
    """A registry token service (distribution's token auth spec): Basic auth in,
    an RS256 JWT out, its certificate in the header (``x5c``), which the
    registry verifies against the same certificate in its ``rootcertbundle``."""

    ISSUER = "lmeval-test-issuer"
    SERVICE = "lmeval-test-registry"

    def __init__(self, root: Path, users: Mapping[str, str]) -> None:
        self.users = dict(users)
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "token-signer")])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.bundle = root / "token-signer.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.requests: list[dict[str, str]] = []
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = dict(
                    p.split("=", 1) for p in self.path.partition("?")[2].split("&") if "=" in p
                )
                query = {k: urllib.parse.unquote_plus(v) for k, v in query.items()}
                service.requests.append(query)
                user = service.user(self.headers.get("Authorization"))
                if user is None:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"token": service.token(user, query.get("scope", ""))})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def user(self, header: str | None) -> str | None:
        if not header or not header.startswith("Basic "):
            return None
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        return user if self.users.get(user) == password else None

    def token(self, user: str, scope: str) -> str:
        access = []
        if scope.startswith("repository:"):
            _kind, name, actions = scope.split(":", 2)
            access.append({"type": "repository", "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {
            "iss": self.ISSUER,
            "sub": user,
            "aud": self.SERVICE,
            "exp": now + 600,
            "nbf": now - 60,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = self.key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing}.{_b64url(signature)}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _ready(url: str, context: ssl.SSLContext | None) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2, context=context).close()
    except urllib.error.HTTPError as error:
        return error.code == 401  # up, and asking for credentials
    except OSError:
        return False
    return True


@contextmanager
def running(
    root: Path,
    users: Mapping[str, str] | None = None,
    *,
    bearer: bool = False,
    host: str = "127.0.0.1",
    tls: tuple[Path, Path] | None = None,
    ca: Path | None = None,
) -> Iterator[Registry]:
    """A registry on a free port of `host`, stopped on exit; with `users`, Basic
    auth, or with `bearer` token auth (a `TokenService` that knows the users);
    with `tls` (certificate chain, key), HTTPS only, and `ca` the CA that the
    tests' own reads trust."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    http: dict[str, object] = {"addr": f"{host}:{port}", "secret": "test-only-upload-secret"}
    if tls is not None:
        http["tls"] = {"certificate": str(tls[0]), "key": str(tls[1])}
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(root / "storage")}},
        "http": http,
    }
    tokens = TokenService(root, users or {}) if bearer else None
    if tokens is not None:
        config["auth"] = {
            "token": {
                "realm": tokens.realm,
                "service": TokenService.SERVICE,
                "issuer": TokenService.ISSUER,
                "rootcertbundle": str(tokens.bundle),
            }
        }
    elif users:
        htpasswd = root / "htpasswd"
        htpasswd.write_text("".join(f"{u}:{_bcrypt(p)}\n" for u, p in users.items()))
        config["auth"] = {"htpasswd": {"realm": "lmeval-test", "path": str(htpasswd)}}
    (root / "config.json").write_text(json.dumps(config))  # YAML reads JSON
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen([REGISTRY, "serve", str(root / "config.json")], stdout=log, stderr=log)
    try:
        registry = Registry(root, port, users or {}, host, ca, tls is not None)
        registry.tokens = tokens
        url = f"{registry.scheme}://{registry.address}/v2/"
        probe = registry.context
        if tls is not None and probe is None:
            # Up is all this asks: whether the tests trust it is theirs to say.
            probe = ssl.create_default_context()
            probe.check_hostname, probe.verify_mode = False, ssl.CERT_NONE
        wait_for(
            lambda: _ready(url, probe) or proc.poll() is not None,
            timeout=30,
            what="docker-registry to serve /v2/",
        )
        assert proc.poll() is None, (root / "registry.log").read_text()
        yield registry
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        if tokens is not None:
            tokens.close()
