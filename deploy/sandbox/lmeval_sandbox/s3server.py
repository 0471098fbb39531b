"""A real S3 server on loopback for the tests: versitygw, built from its Go module.

Why this module exists: ``spec.offline.storage.s3`` is tested against a real
S3-compatible server, not a mock library. Versity's S3 gateway (Apache-2.0)
serves a directory through its ``posix`` backend: each top-level folder is a
bucket and each file an object, so a test lays out its bucket with plain
file writes and the server answers SigV4-signed ``ListObjectsV2`` and
``GetObject`` requests over it like any S3 endpoint. Like the control plane
and Prometheus (``lmeval_sandbox.build``), the binary is built from the
pinned module in ``deploy/sandbox/s3`` and cached outside the clone, keyed by
the module files, the link flags and the Go version; ``LMEVAL_VERSITYGW``
names a ready binary instead.

With `tls` (a certificate chain and its key, e.g. `pki.service_serving_chain`'s
``served`` and ``key``) the server speaks HTTPS only (versitygw's ``--cert``
and ``--key``), so a client must trust the chain's CA: what the tests of
``offline.storage.s3.caBundle`` and the setting ``trusted-ca-bundles`` need.
Bound to `host`, which the certificate must name (the real node's pods reach
the bridge address).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from lmeval_sandbox import build
from lmeval_sandbox.components import free_port
from lmeval_sandbox.supervise import die_with_parent, terminate

__all__ = ["S3_MODULE", "S3Server", "ensure_versitygw"]

S3_MODULE = build.MODULES_DIR / "s3"
BINARY = "versitygw"
_LDFLAGS = "-s -w"


def _build_key() -> str:
    return build.module_build_key((S3_MODULE,), (_LDFLAGS,))


def ensure_versitygw() -> Path:
    """The versitygw binary; built (a few minutes, once per module version) when missing."""
    override = os.environ.get("LMEVAL_VERSITYGW")
    if override:
        if not Path(override).is_file():
            raise RuntimeError(f"LMEVAL_VERSITYGW={override} is not a file")
        return Path(override)
    target = build.cache_root() / f"versitygw-{_build_key()}"
    binary = target / BINARY
    if binary.is_file():
        return binary
    with build._locked(build.cache_root() / "versitygw-build.lock"):
        if binary.is_file():
            return binary
        elapsed = build.staged_build(
            target,
            "versitygw",
            lambda staging, log: build._run_go(
                ["build", "-ldflags", _LDFLAGS, "-o", f"{staging}/", "tool"], S3_MODULE, log
            ),
            lambda staging: "" if (staging / BINARY).is_file() else BINARY,
            {},
        )
        print(f"versitygw built in {elapsed:.0f} s (cold)", file=sys.stderr)
    return binary


class S3Server:
    """versitygw on `host` (127.0.0.1; the real node's pods reach its bridge
    address) serving directory `root` (a folder per bucket)."""

    def __init__(
        self,
        root: Path,
        access_key: str = "lmeval",
        secret_key: str | None = None,
        host: str = "127.0.0.1",
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.root, self.host, self.tls = root, host, tls
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(16)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = root.parent / f"{root.name}-versitygw.log"

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def bucket(self, name: str) -> Path:
        """The directory of bucket `name` (created)."""
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def start(self, timeout: float = 30.0) -> S3Server:
        binary = ensure_versitygw()
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "ROOT_ACCESS_KEY_ID": self.access_key,
            "ROOT_SECRET_ACCESS_KEY": self.secret_key,
        }
        argv = [str(binary), "--port", f"{self.host}:{self.port}"]
        if self.tls is not None:
            cert, key = self.tls
            argv += ["--cert", str(cert), "--key", str(key)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [*argv, "posix", str(self.root)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while not self._listening():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace").splitlines()[-30:]
                self.stop()
                raise RuntimeError("versitygw did not start:\n" + "\n".join(tail))
            time.sleep(0.1)
        return self

    def _listening(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process.pid)
            self.process.wait(10)
            self.process = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def main() -> int:
    """``python -m lmeval_sandbox.s3server``: build (or find) versitygw and print its path."""
    print(ensure_versitygw())
    return 0


if __name__ == "__main__":
    sys.exit(main())
