"""cosign, built from its Go module, to check the suite's signed verdicts.

An ``LMEvalSuite`` signs its verdict as a DSSE envelope of an in-toto
statement and pushes it beside the model the way cosign stores
attestations (``driver/attest.py``). That format is only proven when the
real ``cosign verify-attestation`` accepts what we push and refuses a
tampered copy. This machine has no download site for cosign's release
binaries, only the Go module proxy, so cosign is compiled like Helm
(`lmeval_sandbox.helm`): from the pinned wrapper module in
``deploy/sandbox/cosign`` (``github.com/sigstore/cosign/v2/cmd/cosign``
v2.6.5), cached outside the clone under ``cosign-<key>/``, keyed by the
module files, the link flags (which stamp the release into ``cosign
version``) and the Go version. ``LMEVAL_COSIGN_BIN`` may name a directory
that already holds a ``cosign`` binary instead.

`run_cosign` runs it with ``HOME`` (hence its TUF cache, ``~/.sigstore``)
and the Docker configuration in a directory of the caller's or a throwaway
one, without the variables that would point it at a user's state or at
Sigstore's public services, and with an HTTP(S) proxy that refuses every
connection: cosign reaches loopback registries (Go never proxies loopback)
and nothing else, so an attempt to go out fails at once, in its stderr.

`verify_attestation` checks with a key only: no transparency log
(``--insecure-ignore-tlog``) and an empty trusted root (``--trusted-root``).
Without one, ``cosign verify-attestation`` fetches Sigstore's root from its
TUF CDN even to verify with a key (``--offline`` does not stop that: it is
about the transparency log only), and warns when it cannot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from lmeval_sandbox import build

__all__ = [
    "COSIGN_MODULE",
    "CosignError",
    "cosign_version",
    "empty_trusted_root",
    "ensure_cosign",
    "isolated_env",
    "needs_build",
    "run_cosign",
    "verify_attestation",
]

COSIGN_MODULE = build.MODULES_DIR / "cosign"
_UPSTREAM = "github.com/sigstore/cosign/v2"
BINARY = "cosign"
# What would point cosign at a user's state or at Sigstore's public services
# (a user's shell may export them): TUF mirrors and roots, Rekor/Fulcio URLs,
# Docker credentials, a password that would silently unlock a key.
_STATE_OVERRIDES = (
    "COSIGN_EXPERIMENTAL",
    "COSIGN_PASSWORD",
    "COSIGN_REPOSITORY",
    "COSIGN_DOCKER_MEDIA_TYPES",
    "DOCKER_CONFIG",
    "REGISTRY_AUTH_FILE",
    "SIGSTORE_REKOR_URL",
    "SIGSTORE_FULCIO_URL",
    "SIGSTORE_ROOT_FILE",
    "SIGSTORE_CT_LOG_PUBLIC_KEY_FILE",
    "SIGSTORE_REKOR_PUBLIC_KEY",
    "SIGSTORE_TSA_CERTIFICATE_FILE",
    "TUF_ROOT",
    "TUF_MIRROR",
)
# Nothing listens there: any connection cosign tries beyond loopback is refused.
_NO_PROXY_ANSWERS = "http://127.0.0.1:9"
_LOOPBACK = "127.0.0.1,localhost,::1"
# A trusted root (sigstore's protobuf-specs TrustedRoot) that trusts nothing.
_EMPTY_TRUSTED_ROOT = {"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1"}


class CosignError(RuntimeError):
    """cosign could not be built, or a cosign command failed."""


def cosign_version() -> str:
    """The pinned release (``v2.6.5``), read from the wrapper module."""
    return build._required_version(COSIGN_MODULE, _UPSTREAM)


def _ldflags() -> str:
    # cosign's Makefile stamps these; without them `cosign version` says "devel".
    prefix = "sigs.k8s.io/release-utils/version"
    return f"-s -w -X {prefix}.gitVersion={cosign_version()} -X {prefix}.gitTreeState=clean"


def _build_key() -> str:
    return build.module_build_key((COSIGN_MODULE,), (_ldflags(),))


def _complete(directory: Path) -> bool:
    return (directory / BINARY).is_file()


def _build(target: Path) -> float:
    return build.staged_build(
        target,
        "cosign",
        lambda staging, log: build._run_go(
            ["build", "-ldflags", _ldflags(), "-o", f"{staging}/", "tool"], COSIGN_MODULE, log
        ),
        lambda staging: "" if _complete(staging) else BINARY,
        {"cosign": cosign_version()},
        CosignError,
    )


def needs_build() -> bool:
    """Whether `ensure_cosign` would build (a setup step says so before building)."""
    return not os.environ.get("LMEVAL_COSIGN_BIN") and not _complete(
        build.cache_root() / f"cosign-{_build_key()}"
    )


def ensure_cosign() -> Path:
    """The ``cosign`` binary; built at most once per key (others wait on a lock)."""
    override = os.environ.get("LMEVAL_COSIGN_BIN")
    if override:
        directory = Path(override)
        if not _complete(directory):
            raise CosignError(f"LMEVAL_COSIGN_BIN={override} holds no {BINARY} binary")
        return directory / BINARY
    target = build.cache_root() / f"cosign-{_build_key()}"
    if _complete(target):
        return target / BINARY
    with build._locked(build.cache_root() / "cosign-build.lock"):
        if _complete(target):
            return target / BINARY
        elapsed = _build(target)
        print(f"cosign built in {elapsed:.0f} s (cold)", file=sys.stderr)
    return target / BINARY


def isolated_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """cosign's environment: `home` as ``HOME`` (its TUF cache, ``~/.sigstore``, and
    ``~/.docker`` live there), none of `_STATE_OVERRIDES`, a proxy that refuses
    everything but loopback, then `extra`."""
    env = dict(os.environ)
    for variable in _STATE_OVERRIDES:
        env.pop(variable, None)
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    env["DOCKER_CONFIG"] = str(home / ".docker")
    for variable in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        env[variable] = _NO_PROXY_ANSWERS
    env["NO_PROXY"] = env["no_proxy"] = _LOOPBACK
    env.update(extra or {})
    return env


def empty_trusted_root(directory: Path) -> Path:
    """A trusted root that trusts no Fulcio, Rekor, CT log or TSA, written in
    `directory`: with it cosign verifies with the key alone and fetches nothing."""
    path = directory / "trusted_root.json"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_EMPTY_TRUSTED_ROOT))
    return path


def run_cosign(
    *args: str,
    home: Path | None = None,
    check: bool = True,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cosign ARGS`` with its state under `home` (a throwaway directory when None).

    With `check`, a non-zero exit raises `CosignError` with cosign's own message;
    otherwise the caller reads ``returncode``, ``stdout`` and ``stderr``.
    """
    binary = ensure_cosign()
    with tempfile.TemporaryDirectory(prefix="lmeval-cosign-") as scratch:
        done = subprocess.run(
            [str(binary), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=isolated_env(home or Path(scratch), env),
            cwd=cwd or home or Path(scratch),
            check=False,
            stdin=subprocess.DEVNULL,
        )
    if check and done.returncode != 0:
        raise CosignError(
            f"cosign {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}"
        )
    return done


def verify_attestation(
    reference: str,
    public_key: Path,
    predicate_type: str,
    *,
    home: Path,
    insecure_registry: bool = False,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """``cosign verify-attestation --key`` of `reference` for `predicate_type`,
    offline (see the module's docstring); the caller reads the exit status,
    stdout (one verified envelope a line) and stderr."""
    args = [
        "verify-attestation",
        "--key",
        str(public_key),
        "--type",
        predicate_type,
        "--insecure-ignore-tlog=true",
        "--trusted-root",
        str(empty_trusted_root(home)),
    ]
    if insecure_registry:
        args += ["--allow-insecure-registry", "--allow-http-registry"]
    return run_cosign(*args, reference, home=home, check=False, timeout=timeout)


if __name__ == "__main__":
    print(ensure_cosign())
