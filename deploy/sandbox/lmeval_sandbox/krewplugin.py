"""The krew plugin of a release: ``lmeval.yaml`` and one archive per platform.

krew (the kubectl plugin manager) installs a plugin from a manifest that
names, per operating system and architecture, an archive by URL and
SHA-256, and the executable inside it. The CLI is Python, so the
executable is a small launcher script (``#!/usr/bin/env python3``) beside
the packages it runs: the CLI's own three distributions (lmeval-cli,
lmeval-operator, lmeval-driver, built as wheels from the checkout) and
their dependencies, installed from PyPI's wheels by ``pip install
--target``. Not a single zipapp: Python cannot import compiled extension
modules (pydantic-core's, PyYAML's...) from inside a zip file, while krew
unpacks the archive anyway.

Compiled wheels are specific to a platform and to a CPython minor, so each
archive holds ``lib/common`` (every wheel that is the same for all the
Python versions of `PYTHON_VERSIONS`) and ``lib/cpXY`` (the rest, for
CPython X.Y); the launcher puts its Python's directory and the common one
first on ``sys.path`` and refuses, in one line, a Python it has no
directory for. Platforms are those whose wheels PyPI serves for every one
of these versions (`PLATFORMS`); Windows is left out, because krew and
kubectl run a plugin there only as an ``.exe``.

The archives are reproducible like the chart's (sorted entries, the
commit's time, no owner, gzip without a timestamp, no bytecode), so two
builds of one commit, minutes apart, give the same bytes; like the images,
they hold the dependency versions PyPI serves at build time.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from lmeval_cli import launch
from packaging.utils import parse_wheel_filename

from lmeval_sandbox import build, images

__all__ = [
    "API_VERSION",
    "EXECUTABLE",
    "MANIFEST_NAME",
    "PLATFORMS",
    "PLUGIN_NAME",
    "PYTHON_VERSIONS",
    "Platform",
    "Plugin",
    "PluginError",
    "archive_name",
    "build_plugin",
    "download_url",
    "dump_manifest",
    "has_cli",
    "launcher",
    "manifest",
]

PLUGIN_NAME = "lmeval"  # `kubectl lmeval`; the manifest is PLUGIN_NAME.yaml, as the index wants
MANIFEST_NAME = f"{PLUGIN_NAME}.yaml"
EXECUTABLE = f"kubectl-{PLUGIN_NAME}"
API_VERSION = "krew.googlecontainertools.github.com/v1alpha2"
HOMEPAGE = images.SOURCE
# CPython minors with a directory of compiled packages in every archive. The
# first is the CLI's own floor (poller/cli/pyproject.toml's requires-python,
# as a unit test checks); the last is the newest PyPI has
# wheels of every compiled dependency for.
PYTHON_VERSIONS = ("3.11", "3.12", "3.13", "3.14", "3.15")
# The distributions built from the checkout (directories holding a pyproject.toml).
_SOURCES = (Path("driver"), Path("poller"), Path("poller") / "cli")
_CLI_PROJECT = Path("poller") / "cli" / "pyproject.toml"
_OWN_NAMES = ("lmeval-cli", "lmeval-operator", "lmeval-driver")
# Where the launcher looks for its packages, relative to itself.
_LIB = "lib"
_COMMON = "common"
# gzip's own default: level 9 takes four times as long for 1% less.
_GZIP_LEVEL = 6
_LOG_LOCK = threading.Lock()
_PARALLEL_DOWNLOADS = 8


@dataclass(frozen=True)
class Platform:
    """One krew platform and the pip platform tags its wheels may carry."""

    os: str
    arch: str
    pip_platforms: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.os}-{self.arch}"


# glibc 2.17 (manylinux2014) on Linux, macOS 11 on both Macs: the oldest
# systems every compiled dependency has wheels for. pip takes the older
# macOS tags as compatible by itself, not the older manylinux ones.
PLATFORMS = (
    Platform("linux", "amd64", ("manylinux_2_17_x86_64", "manylinux2014_x86_64")),
    Platform("linux", "arm64", ("manylinux_2_17_aarch64", "manylinux2014_aarch64")),
    Platform("darwin", "amd64", ("macosx_11_0_x86_64",)),
    Platform("darwin", "arm64", ("macosx_11_0_arm64",)),
)


class PluginError(RuntimeError):
    """The plugin cannot be built; the message says why (and where the log is)."""


@dataclass(frozen=True)
class Plugin:
    """A built plugin: its manifest and each platform's archive."""

    manifest: Path
    archives: dict[Platform, Path]


def download_url(version: str) -> str:
    """Where a release's files are published (the README's ``RELEASE=`` line)."""
    return f"{images.SOURCE}/releases/download/v{version}"


def archive_name(version: str, platform: Platform) -> str:
    return f"{EXECUTABLE}-{version}-{platform.name}.tar.gz"


def has_cli(tree: Path) -> bool:
    """Whether the checkout has the CLI's distribution (every release since 0.1.0 has)."""
    return (tree / _CLI_PROJECT).is_file()


# -- the launcher ----------------------------------------------------------------------------

# Written for any python3 (no f-strings, no annotations): the one it refuses
# must still be able to read it and say why.
_LAUNCHER = """\
#!/usr/bin/env python3
# {executable} {version}: the lmeval-poller command line as a kubectl plugin.
# Its packages are beside it: lib/common for every Python, lib/cpXY for what
# is compiled for CPython X.Y.
import os
import sys

here = os.path.dirname(os.path.realpath(__file__))
tag = "cp%d%d%s" % (sys.version_info[0], sys.version_info[1], getattr(sys, "abiflags", ""))
compiled = os.path.join(here, "{lib}", tag)
if sys.implementation.name != "cpython" or not os.path.isdir(compiled):
    sys.stderr.write(
        "{executable}: needs CPython {floor} to {newest} as python3 on PATH; "
        "%s is %s %s\\n"
        % (sys.executable, sys.implementation.name, sys.version.split()[0])
    )
    sys.exit({exit_code})
# This build's source revision, for `version` (as the images set it).
os.environ.setdefault("LMEVAL_REVISION", "{revision}")
# Its packages first; not its own directory, which Python put there (unless -P).
sys.path[:] = [compiled, os.path.join(here, "{lib}", "{common}")] + [
    entry for entry in sys.path if os.path.realpath(entry or ".") != here
]

from lmeval_cli.launch import main

sys.exit(main())
"""


def launcher(version: str, revision: str) -> str:
    """The plugin's executable: picks its Python's packages, then runs the CLI."""
    return _LAUNCHER.format(
        executable=EXECUTABLE,
        version=version,
        lib=_LIB,
        common=_COMMON,
        floor=PYTHON_VERSIONS[0],
        newest=PYTHON_VERSIONS[-1],
        exit_code=int(launch.EXIT_MISSING_PACKAGES),
        revision=revision,
    )


# -- building --------------------------------------------------------------------------------


def _run(argv: list[str], log: Path) -> None:
    """Run one step; its output goes to `log` in one piece (platforms build in parallel)."""
    done = subprocess.run(argv, capture_output=True, text=True)
    with _LOG_LOCK, log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).splitlines()[-30:]
        raise PluginError(f"{' '.join(argv[2:4])} failed (log: {log}):\n" + "\n".join(tail))


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "--progress-bar=off"]


def _target_flags(platform: Platform, python: str) -> list[str]:
    """pip's flags for wheels of another machine: only wheels, for its tags."""
    flags = ["--only-binary=:all:", "--implementation=cp", f"--python-version={python}"]
    return flags + [f"--platform={tag}" for tag in platform.pip_platforms]


def _own_wheels(tree: Path, work: Path, log: Path) -> list[Path]:
    """The checkout's three distributions as wheels, built from a copy (a build
    writes build/ and *.egg-info beside the sources)."""
    sources = work / "src"
    # driver/ and poller/ (with the CLI's poller/cli/); the sandbox ships in no distribution.
    for relative in (Path("driver"), Path("poller")):
        shutil.copytree(
            tree / relative,
            sources / relative,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
        )
    wheels = work / "own"
    _run(
        _pip("wheel", "--no-deps", f"--wheel-dir={wheels}", *(str(sources / s) for s in _SOURCES)),
        log,
    )
    built = sorted(wheels.glob("*.whl"))
    names = sorted(str(parse_wheel_filename(w.name)[0]) for w in built)
    if names != sorted(_OWN_NAMES):
        raise PluginError(f"expected wheels of {', '.join(_OWN_NAMES)}, built {names}")
    return built


def _requirement(wheel: Path) -> str:
    name, version, _, _ = parse_wheel_filename(wheel.name)
    return f"{name}=={version}"


def _install(
    wheels: Sequence[Path], found_in: Path, target: Path, platform: Platform, python: str, log: Path
) -> None:
    """Install `wheels` (by name from `found_in`, so pip records no file URL)
    into `target`, without the console scripts (they name this machine's Python)."""
    _run(
        _pip(
            "install",
            f"--target={target}",
            "--no-deps",
            "--no-index",
            f"--find-links={found_in}",
            "--no-compile",
            *_target_flags(platform, python),
            *sorted(_requirement(w) for w in wheels),
        ),
        log,
    )
    shutil.rmtree(target / "bin", ignore_errors=True)
    for record in target.glob("*.dist-info/RECORD"):
        rows = record.read_text().splitlines(keepends=True)
        kept = [row for row in rows if not row.startswith("../../bin/")]
        if kept != rows:
            record.write_text("".join(kept))


def _requires(wheel: Path) -> list[str]:
    """A wheel's Requires-Dist lines, as its METADATA declares them."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    return sorted(line for line in text.splitlines() if line.startswith("Requires-Dist:"))


def _dependencies_key(platform: Platform, python: str, own: Sequence[Path]) -> str:
    """What a resolution of the dependencies depends on: the requirements the
    checkout's distributions declare (not their code, which changes with every
    commit), the target, and pip's version."""
    parts = [platform.name, *platform.pip_platforms, python, importlib.metadata.version("pip")]
    for wheel in own:
        parts += [str(parse_wheel_filename(wheel.name)[0]), *_requires(wheel)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _download(platform: Platform, python: str, own: Sequence[Path], work: Path) -> Path:
    """Every wheel the checkout's distributions need on `platform` under CPython
    `python`, resolved for that version (markers may differ between versions).

    The dependencies' wheels are cached outside the checkout, keyed by what the
    distributions require (``_dependencies_key``): resolving 20 targets against
    PyPI costs about a minute per release build, staging from the cache a few
    seconds. A release therefore carries the versions PyPI served when its
    requirements were first resolved here, until they change."""
    dest = work / platform.name / python
    cached = build.cache_root() / "krew-wheels" / _dependencies_key(platform, python, own)
    own_names = {w.name for w in own}

    def resolve(staging: Path, build_log: Path) -> None:
        flags = _target_flags(platform, python)
        _run(_pip("download", f"--dest={staging}", *flags, *map(str, own)), build_log)
        for wheel in staging.glob("*.whl"):
            if wheel.name in own_names:  # the checkout's own change with every commit
                wheel.unlink()

    if not cached.is_dir():
        try:
            build.staged_build(
                cached,
                f"the wheels of {platform.name}, CPython {python}",
                resolve,
                lambda staging: "" if any(staging.glob("*.whl")) else "any wheel",
                {"platform": platform.name, "python": python},
                PluginError,
            )
        except OSError:  # another build cached the same resolution first
            if not cached.is_dir():
                raise
    dest.mkdir(parents=True)
    for wheel in [*cached.glob("*.whl"), *own]:
        shutil.copy2(wheel, dest / wheel.name)
    return dest


def _stage(platform: Platform, downloads: Mapping[str, Path], stage: Path, log: Path) -> None:
    """Fill `stage`'s lib/ for `platform` from each Python version's `downloads`:
    lib/common with the wheels all versions chose, lib/cpXY with the others."""
    chosen = {python: {w.name for w in dest.glob("*.whl")} for python, dest in downloads.items()}
    common = set.intersection(*chosen.values())
    floor = PYTHON_VERSIONS[0]
    wheels = [downloads[floor] / name for name in common]
    _install(wheels, downloads[floor], stage / _LIB / _COMMON, platform, floor, log)
    for python, dest in downloads.items():
        target = stage / _LIB / ("cp" + python.replace(".", ""))
        if chosen[python] - common:
            wheels = [dest / name for name in chosen[python] - common]
            _install(wheels, dest, target, platform, python, log)
        # An empty lib/cpXY still tells the launcher its Python is supported.
        target.mkdir(parents=True, exist_ok=True)


def _tar_gz(stage: Path, out: Path, mtime: int) -> None:
    """`stage` as a .tar.gz: sorted entries with their directories, the given
    time, no owner, executables 0755 and the rest 0644, gzip without a timestamp."""
    buffer = io.BytesIO()
    paths = sorted(stage.rglob("*"), key=lambda p: p.relative_to(stage).as_posix())
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in paths:
            info = tarfile.TarInfo(path.relative_to(stage).as_posix())
            info.mtime = mtime
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            data = path.read_bytes()
            info.size = len(data)
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            tar.addfile(info, io.BytesIO(data))
    out.write_bytes(gzip.compress(buffer.getvalue(), compresslevel=_GZIP_LEVEL, mtime=0))


def _archive(
    tree: Path,
    out: Path,
    *,
    version: str,
    revision: str,
    mtime: int,
    platform: Platform,
    downloads: Mapping[str, Path],
    stage: Path,
    log: Path,
) -> Path:
    """One platform's archive in `out`: the launcher, its packages, the licence."""
    _stage(platform, downloads, stage, log)
    executable = stage / EXECUTABLE
    executable.write_text(launcher(version, revision))
    executable.chmod(0o755)
    for name in ("LICENSE", "LICENSE.txt", "LICENSE.md"):
        if (tree / name).is_file():
            shutil.copyfile(tree / name, stage / name)
    archive = out / archive_name(version, platform)
    _tar_gz(stage, archive, mtime)
    return archive


# -- the manifest ----------------------------------------------------------------------------


def _description() -> str:
    return (
        "Submit, follow and compare lm-evaluation-harness evaluations that the\n"
        "lmeval-poller operator runs on Kubernetes as LMEvalJob resources.\n"
        "\n"
        "kubectl lmeval submits a job from a few flags or a file, waits for it,\n"
        "prints its logs and scores, runs it again, and compares two runs item\n"
        "by item with paired statistics. It finds the cluster as kubectl does\n"
        "(--kubeconfig, --context, -n).\n"
        "\n"
        "The operator itself is installed into the cluster separately:\n"
        f"{HOMEPAGE}#install\n"
    )


def _caveats() -> str:
    return (
        f"This plugin runs on the python3 found on PATH: CPython {PYTHON_VERSIONS[0]} to\n"
        f"{PYTHON_VERSIONS[-1]}, with glibc 2.17 or newer on Linux, macOS 11 or newer on a Mac.\n"
        "It needs the lmeval-poller operator (the LMEvalJob API) in the\n"
        f"cluster: {HOMEPAGE}#install\n"
        "\n"
        "Check the plugin without a cluster:\n"
        "  kubectl lmeval version --client\n"
    )


def manifest(version: str, archives: Mapping[Platform, Path]) -> dict[str, Any]:
    """The krew manifest of `archives`, each named by its URL under the release."""
    base = download_url(version)
    platforms = [
        {
            "selector": {"matchLabels": {"os": platform.os, "arch": platform.arch}},
            "uri": f"{base}/{archive.name}",
            "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
            "bin": EXECUTABLE,
        }
        for platform, archive in archives.items()
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "Plugin",
        "metadata": {"name": PLUGIN_NAME},
        "spec": {
            "version": f"v{version}",
            "homepage": HOMEPAGE,
            "shortDescription": "Submit, follow and compare LMEvalJob evaluations",
            "description": _description(),
            "caveats": _caveats(),
            "platforms": platforms,
        },
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks: the manifest is read in a pull request."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def dump_manifest(document: Mapping[str, Any]) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=1000)


def build_plugin(
    tree: Path,
    out: Path,
    *,
    version: str,
    revision: str,
    mtime: int,
    log: Path,
    platforms: Sequence[Platform] = PLATFORMS,
) -> Plugin:
    """Write each platform's archive and ``lmeval.yaml`` naming them into `out`."""
    with tempfile.TemporaryDirectory(prefix="lmeval-krew-") as tmp:
        work = Path(tmp)
        own = _own_wheels(tree, work, log)
        # Downloads wait on the network, so more of them run at once than
        # there are cores; staging and gzip (which releases the GIL) use the cores.
        pairs = [(platform, python) for platform in platforms for python in PYTHON_VERSIONS]
        with ThreadPoolExecutor(max_workers=_PARALLEL_DOWNLOADS) as pool:
            fetched = pool.map(lambda pair: _download(pair[0], pair[1], own, work), pairs)
            downloads: dict[Platform, dict[str, Path]] = {platform: {} for platform in platforms}
            for (platform, python), dest in zip(pairs, fetched, strict=True):
                downloads[platform][python] = dest

        def one(platform: Platform) -> Path:
            return _archive(
                tree,
                out,
                version=version,
                revision=revision,
                mtime=mtime,
                platform=platform,
                downloads=downloads[platform],
                stage=work / platform.name / "stage",
                log=log,
            )

        with ThreadPoolExecutor(max_workers=min(len(platforms), os.cpu_count() or 1)) as pool:
            archives = dict(zip(platforms, pool.map(one, platforms), strict=True))
    path = out / MANIFEST_NAME
    document = manifest(version, archives)
    path.write_text(dump_manifest(document))
    return Plugin(path, archives)
