"""A real OCI registry on loopback for tests: Debian's ``docker-registry``.

``docker-registry`` is the CNCF distribution registry (2.8), serving plain
HTTP on 127.0.0.1 from a temporary directory; with `users` it asks for
Basic auth from an htpasswd file (bcrypt hashes, made with the C library's
crypt, whose ``$2b$`` hashes the registry's Go bcrypt reads). Artifacts are
read back with ``skopeo``, a real client, and blobs with plain HTTP GETs.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from poller.sandbox.components import free_port
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
    def __init__(self, root: Path, port: int, users: Mapping[str, str]) -> None:
        self.root, self.port, self.users = root, port, dict(users)
        self.address = f"127.0.0.1:{port}"

    def _auth(self) -> dict[str, str]:
        if not self.users:
            return {}
        user, password = next(iter(self.users.items()))
        return {
            "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        }

    def get(self, path: str, accept: str | None = None) -> bytes:
        headers = self._auth()
        if accept:
            headers["Accept"] = accept
        req = urllib.request.Request(f"http://{self.address}{path}", headers=headers)
        with urllib.request.urlopen(req, timeout=30) as resp:
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


def _ready(address: str) -> bool:
    try:
        urllib.request.urlopen(f"http://{address}/v2/", timeout=2).close()
    except urllib.error.HTTPError as error:
        return error.code == 401  # up, and asking for credentials
    except OSError:
        return False
    return True


@contextmanager
def running(root: Path, users: Mapping[str, str] | None = None) -> Iterator[Registry]:
    """A registry on a free loopback port, stopped on exit."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(root / "storage")}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "test-only-upload-secret"},
    }
    if users:
        htpasswd = root / "htpasswd"
        htpasswd.write_text("".join(f"{u}:{_bcrypt(p)}\n" for u, p in users.items()))
        config["auth"] = {"htpasswd": {"realm": "lmeval-test", "path": str(htpasswd)}}
    (root / "config.json").write_text(json.dumps(config))  # YAML reads JSON
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen([REGISTRY, "serve", str(root / "config.json")], stdout=log, stderr=log)
    try:
        registry = Registry(root, port, users or {})
        wait_for(
            lambda: _ready(registry.address) or proc.poll() is not None,
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
