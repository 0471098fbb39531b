"""krew, the kubectl plugin manager, built from its Go module, for the release's plugin.

A release publishes ``kubectl lmeval`` as a krew plugin (`lmeval_sandbox.
krewplugin`: ``lmeval.yaml`` and one archive per platform). That is proven
only when the real krew installs it, and when the validator the krew index
runs on every submitted manifest accepts it. This machine has no download
site for krew's release archives, only the Go module proxy, so both are
compiled like Helm (`lmeval_sandbox.helm`): from the pinned wrapper module
in ``deploy/sandbox/krew``, cached outside the clone under ``krew-<key>/``,
keyed by the module files, the link flags (which stamp the release into
``krew version``) and the Go version. ``LMEVAL_KREW_BIN`` may name a
directory that already holds both binaries instead.

`run_krew` runs krew with ``KREW_ROOT`` in a directory of the caller's and
without its upgrade check (a request to GitHub): a test leaves no state in
``~/.krew`` and sees none of a user's plugins.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from lmeval_sandbox import build

__all__ = [
    "BINARIES",
    "KREW_MODULE",
    "KrewError",
    "ensure",
    "krew_env",
    "krew_version",
    "needs_build",
    "run_krew",
]

KREW_MODULE = build.MODULES_DIR / "krew"
_UPSTREAM = "sigs.k8s.io/krew"
# krew itself, and the krew index's check of a plugin manifest.
BINARIES = ("krew", "validate-krew-manifest")


class KrewError(RuntimeError):
    """krew could not be built, or a krew command failed."""


def krew_version() -> str:
    """The pinned release (``v0.4.3``), read from the wrapper module."""
    return build._required_version(KREW_MODULE, _UPSTREAM)


def _ldflags() -> str:
    # krew's release script stamps these; without them `krew version` says "unknown".
    return f"-s -w -X {_UPSTREAM}/internal/version.gitTag={krew_version()}"


def _build_key() -> str:
    return build.module_build_key((KREW_MODULE,), (_ldflags(),))


def _complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in BINARIES)


def _build(target: Path) -> float:
    return build.staged_build(
        target,
        "krew",
        lambda staging, log: build._run_go(
            ["build", "-ldflags", _ldflags(), "-o", f"{staging}/", "tool"], KREW_MODULE, log
        ),
        lambda staging: ", ".join(n for n in BINARIES if not (staging / n).is_file()),
        {"krew": krew_version()},
        KrewError,
    )


def needs_build() -> bool:
    """Whether `ensure` would build (a setup step says so before building)."""
    return not os.environ.get("LMEVAL_KREW_BIN") and not _complete(
        build.cache_root() / f"krew-{_build_key()}"
    )


def ensure() -> Path:
    """The directory holding `BINARIES`; built at most once per key (others wait on a lock)."""
    override = os.environ.get("LMEVAL_KREW_BIN")
    if override:
        directory = Path(override)
        if not _complete(directory):
            raise KrewError(f"LMEVAL_KREW_BIN={override} lacks one of {', '.join(BINARIES)}")
        return directory
    target = build.cache_root() / f"krew-{_build_key()}"
    if _complete(target):
        return target
    with build._locked(build.cache_root() / "krew-build.lock"):
        if _complete(target):
            return target
        elapsed = _build(target)
        print(f"krew built in {elapsed:.0f} s (cold)", file=sys.stderr)
    return target


def krew_env(root: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment krew (and the plugins it installed) run with: its root,
    its bin directory first on PATH, no upgrade check."""
    env = dict(os.environ)
    env["KREW_ROOT"] = str(root)
    env["KREW_NO_UPGRADE_CHECK"] = "1"
    env["PATH"] = os.pathsep.join([str(root / "bin"), env.get("PATH", "")])
    for variable in ("KREW_OS", "KREW_ARCH"):
        env.pop(variable, None)
    env.update(extra or {})
    return env


def run_krew(
    *args: str,
    root: Path,
    check: bool = True,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``krew ARGS`` with ``KREW_ROOT=root``.

    With `check`, a non-zero exit raises `KrewError` with krew's own message;
    otherwise the caller reads ``returncode``, ``stdout`` and ``stderr``.
    """
    binary = ensure() / "krew"
    done = subprocess.run(
        [str(binary), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=krew_env(root, env),
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if check and done.returncode != 0:
        raise KrewError(f"krew {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done


if __name__ == "__main__":
    print(ensure())
