"""Build (or find) the control-plane binaries the sandbox runs.

The machines this project is developed and tested on have no container engine
and no download sites, only the Go module proxy. So the upstream components
are compiled from their published Go modules (`deploy/sandbox/controlplane`
and `deploy/sandbox/kwok`) and cached *outside* the clone, keyed by a hash of
everything that determines the output: the module files, the link flags and
the Go version. A second run on the same machine is instant; a fresh machine,
or a changed pin, rebuilds. A directory of ready binaries can be supplied
instead (``LMEVAL_SANDBOX_BIN``, or envtest's ``KUBEBUILDER_ASSETS`` when it
holds every binary), in which case nothing is built.

Two Kubernetes releases are built, because the project claims more than the
one it is developed on: ``current`` (`deploy/sandbox/controlplane`, what
every test runs by default) and ``floor`` (`deploy/sandbox/controlplane-floor`,
the oldest minor the project supports, which a test starts to keep that
claim honest). Each has its own cache directory; kwok does not depend on the
Kubernetes release, so the floor's directory gets a copy of the current one's
instead of a second build.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, get_args

__all__ = [
    "BINARIES",
    "KUBERNETES_CHOICES",
    "KWOK_CRD_FILES",
    "Kubernetes",
    "binaries_dir",
    "cache_root",
    "ensure_binaries",
    "kubernetes_minor",
    "kubernetes_version",
    "needs_build",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
MODULES_DIR = REPO_ROOT / "deploy" / "sandbox"
CONTROLPLANE_MODULE = MODULES_DIR / "controlplane"
# The oldest Kubernetes minor the project supports (see that go.mod's comment
# for why it is the floor).
FLOOR_MODULE = MODULES_DIR / "controlplane-floor"
KWOK_MODULE = MODULES_DIR / "kwok"

# Which control plane: the one the project is developed on, or its floor.
Kubernetes = Literal["current", "floor"]
KUBERNETES_CHOICES: tuple[Kubernetes, ...] = get_args(Kubernetes)
_MODULES: dict[Kubernetes, Path] = {"current": CONTROLPLANE_MODULE, "floor": FLOOR_MODULE}
# A directory of ready binaries instead of a build, per choice.
_OVERRIDES: dict[Kubernetes, tuple[str, ...]] = {
    "current": ("LMEVAL_SANDBOX_BIN", "KUBEBUILDER_ASSETS"),
    "floor": ("LMEVAL_SANDBOX_FLOOR_BIN",),
}
# What the floor's directory takes from the current one's build: kwok is the
# same program whatever release it simulates nodes for.
_SHARED = ("kwok",)

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
    "kwok",
)
# kwok's own CRDs for pod logs and exec; they ship in kwok's module zip and are
# applied to the apiserver before kwok starts watching them.
KWOK_CRD_FILES = (
    "kwok.x-k8s.io_logs.yaml",
    "kwok.x-k8s.io_clusterlogs.yaml",
    "kwok.x-k8s.io_execs.yaml",
    "kwok.x-k8s.io_clusterexecs.yaml",
)


def _required_version(module_dir: Path, module: str) -> str:
    text = (module_dir / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
    if not match:
        raise RuntimeError(f"{module} is not required in {module_dir / 'go.mod'}")
    return match.group(1)


def kubernetes_version(kind: Kubernetes = "current") -> str:
    """The pinned Kubernetes release (``v1.34.4``), read from the wrapper module."""
    return _required_version(_MODULES[kind], "k8s.io/kubernetes")


def kubernetes_minor(kind: Kubernetes = "current") -> int:
    """The minor of the pinned release (34 for v1.34.4), to compare releases by
    (a kubelet may be older than its apiserver, never newer)."""
    return int(kubernetes_version(kind).lstrip("v").split(".")[1])


def _controlplane_ldflags(kind: Kubernetes = "current") -> str:
    version = kubernetes_version(kind)
    major, minor = version.lstrip("v").split(".")[:2]
    prefix = "k8s.io/component-base/version"
    # -X makes /version report the pinned release instead of v0.0.0.
    return " ".join(
        [
            "-s -w",
            f"-X {prefix}.gitVersion={version}",
            f"-X {prefix}.gitMajor={major}",
            f"-X {prefix}.gitMinor={minor}",
            f"-X {prefix}.gitTreeState=clean",
        ]
    )


def _kwok_ldflags() -> str:
    version = _required_version(KWOK_MODULE, "sigs.k8s.io/kwok").lstrip("v")
    return f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={version}"


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(
            "the Go toolchain is needed to build the sandbox binaries (`go` not found)"
        )
    return go


def cache_root() -> Path:
    """Where builds are cached: ``LMEVAL_SANDBOX_CACHE`` or ``~/.cache/lmeval-poller``."""
    explicit = os.environ.get("LMEVAL_SANDBOX_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lmeval-poller"


def module_build_key(modules: Sequence[Path], ldflags: Sequence[str]) -> str:
    """The cache key of Go tools built from wrapper modules: their go.mod and
    go.sum, the link flags (versions stamped in) and the Go toolchain's version.
    One recipe for the control plane, Prometheus, Kueue and the S3 server."""
    digest = hashlib.sha256()
    for module in modules:
        for name in ("go.mod", "go.sum"):
            digest.update(name.encode())
            digest.update((module / name).read_bytes())
    for flags in ldflags:
        digest.update(flags.encode())
    go_version = subprocess.run(
        [_go(), "env", "GOVERSION"], check=True, capture_output=True, text=True
    ).stdout.strip()
    digest.update(go_version.encode())
    return digest.hexdigest()[:16]


def _build_key(kind: Kubernetes = "current") -> str:
    # The floor's key covers kwok's module too: its directory holds a copy.
    return module_build_key(
        (_MODULES[kind], KWOK_MODULE), (_controlplane_ldflags(kind), _kwok_ldflags())
    )


def binaries_dir(kind: Kubernetes = "current") -> Path:
    """The cache directory for the module files of `kind` (it may not exist yet):
    ``bin-<key>`` for the current release, ``bin-floor-<key>`` for the floor."""
    prefix = "bin" if kind == "current" else f"bin-{kind}"
    return cache_root() / f"{prefix}-{_build_key(kind)}"


def _override_dir(kind: Kubernetes = "current") -> Path | None:
    for variable in _OVERRIDES[kind]:
        value = os.environ.get(variable)
        if not value:
            continue
        directory = Path(value)
        missing = [name for name in BINARIES if not (directory / name).is_file()]
        if variable == "KUBEBUILDER_ASSETS" and missing:
            # envtest's assets hold only etcd/kube-apiserver/kubectl: not enough.
            print(
                f"KUBEBUILDER_ASSETS={value} lacks {', '.join(missing)}; building instead",
                file=sys.stderr,
            )
            continue
        if missing:
            raise RuntimeError(f"{variable}={value} lacks {', '.join(missing)}")
        return directory
    return None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_go(args: list[str], cwd: Path, log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ go {' '.join(args)}  (in {cwd})\n")
        out.flush()
        result = subprocess.run([_go(), *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        raise RuntimeError(
            f"go {args[0]} failed in {cwd}; last lines of {log}:\n" + "\n".join(tail)
        )


def go_module_dir(
    module: str, version: str, cwd: Path, log: Path, error: type[Exception] = RuntimeError
) -> Path:
    """Where Go's module cache holds `module`@`version` (downloaded when missing):
    the CRDs and manifests a tool ships beside its code are read from there."""
    out = subprocess.run(
        [_go(), "mod", "download", "-json", f"{module}@{version}"],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        with log.open("a") as handle:
            handle.write(out.stdout + out.stderr)
        raise error(f"cannot download {module}@{version}: {out.stderr.strip()}")
    return Path(json.loads(out.stdout)["Dir"])


def staged_build(
    target: Path,
    what: str,
    steps: Callable[[Path, Path], None],
    missing: Callable[[Path], str],
    info: dict[str, str],
    error: type[Exception] = RuntimeError,
) -> float:
    """Build `what` into a staging directory beside `target`, then rename it into
    place, so that a directory named by its key is always complete. `steps`
    builds into (staging, log); `missing` names what the result lacks (empty:
    nothing). Writes BUILD_INFO.json (`info` and the seconds); returns them."""
    started = time.monotonic()
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    log = target.with_name(target.name + ".build.log")
    log.write_text("")
    print(f"building {what} into {target} (log: {log})", file=sys.stderr)
    steps(staging, log)
    lacking = missing(staging)
    if lacking:
        raise error(f"build finished without {lacking}; see {log}")
    elapsed = time.monotonic() - started
    (staging / "BUILD_INFO.json").write_text(
        json.dumps({**info, "build_seconds": round(elapsed, 1)})
    )
    staging.rename(target)
    return elapsed


def _copy_kwok_crds(target: Path, log: Path) -> None:
    version = _required_version(KWOK_MODULE, "sigs.k8s.io/kwok")
    source = go_module_dir("sigs.k8s.io/kwok", version, KWOK_MODULE, log) / "kustomize" / "crd"
    source = source / "bases"
    (target / "crds").mkdir(exist_ok=True)
    for name in KWOK_CRD_FILES:
        shutil.copyfile(source / name, target / "crds" / name)


def _build_controlplane(kind: Kubernetes, staging: Path, log: Path) -> None:
    _run_go(
        ["build", "-ldflags", _controlplane_ldflags(kind), "-o", f"{staging}/", "tool"],
        _MODULES[kind],
        log,
    )
    # etcd's main package is go.etcd.io/etcd/server/v3, so Go names it "server".
    (staging / "server").rename(staging / "etcd")


def _build_steps(staging: Path, log: Path) -> None:
    _build_controlplane("current", staging, log)
    _run_go(["build", "-ldflags", _kwok_ldflags(), "-o", f"{staging}/", "tool"], KWOK_MODULE, log)
    _copy_kwok_crds(staging, log)


def _floor_steps(current: Path) -> Callable[[Path, Path], None]:
    def steps(staging: Path, log: Path) -> None:
        _build_controlplane("floor", staging, log)
        for name in _SHARED:
            _link_or_copy(current / name, staging / name)
        (staging / "crds").mkdir()
        for name in KWOK_CRD_FILES:
            shutil.copyfile(kwok_crds_dir(current) / name, staging / "crds" / name)

    return steps


def _link_or_copy(source: Path, target: Path) -> None:
    # A hard link when both are in the cache's file system; a copy otherwise
    # (an override directory elsewhere). Never a symlink: the floor's
    # directory stays whole when the current one is rebuilt or removed.
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _build(target: Path, kind: Kubernetes = "current") -> float:
    steps = _build_steps if kind == "current" else _floor_steps(ensure_binaries("current"))
    return staged_build(
        target,
        f"control-plane binaries ({kind}: Kubernetes {kubernetes_version(kind)})",
        steps,
        lambda staging: ", ".join(n for n in BINARIES if not (staging / n).is_file()),
        {"kubernetes": kubernetes_version(kind), "kind": kind},
    )


def needs_build(kind: Kubernetes = "current") -> bool:
    """Whether `ensure_binaries` would build (setup.sh warns before a long build)."""
    return _override_dir(kind) is None and not binaries_dir(kind).is_dir()


def ensure_binaries(kind: Kubernetes = "current") -> Path:
    """Return a directory holding every binary in `BINARIES` plus kwok's CRDs,
    of the Kubernetes release `kind` names.

    Builds at most once per set of module files; concurrent callers wait on
    a lock instead of building twice. The floor's build first makes sure of
    the current one (it takes kwok from there).
    """
    override = _override_dir(kind)
    if override is not None:
        if not (override / "crds").is_dir():
            log = cache_root() / "kwok-crds.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            crd_dir = cache_root() / "kwok-crds"
            crd_dir.mkdir(parents=True, exist_ok=True)
            _copy_kwok_crds(crd_dir, log)
        return override
    target = binaries_dir(kind)
    if target.is_dir():
        return target
    if kind != "current":
        ensure_binaries("current")  # before this build's lock: it takes its own
    lock = "build.lock" if kind == "current" else f"build-{kind}.lock"
    with _locked(cache_root() / lock):
        if target.is_dir():
            return target
        elapsed = _build(target, kind)
        print(f"control-plane binaries ({kind}) built in {elapsed:.0f} s (cold)", file=sys.stderr)
    return target


def kwok_crds_dir(binaries: Path) -> Path:
    """Where kwok's CRDs live for a given binaries directory."""
    if (binaries / "crds").is_dir():
        return binaries / "crds"
    return cache_root() / "kwok-crds" / "crds"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lmeval_sandbox.build [current|floor]``: build or find, print the directory."""
    parser = argparse.ArgumentParser(
        prog="python -m lmeval_sandbox.build",
        description="Build (or find) the control-plane binaries; print their directory.",
    )
    parser.add_argument("kubernetes", nargs="?", default="current", choices=KUBERNETES_CHOICES)
    args = parser.parse_args(argv)
    kind: Kubernetes = args.kubernetes
    print(ensure_binaries(kind))
    return 0


if __name__ == "__main__":
    sys.exit(main())
