"""Build the project's container images without a registry: bases from Debian, then the Dockerfile.

The sandbox's real node (containerd, runc, a kubelet) runs the project's own
images, but these machines reach no image registry, only Debian's archive,
PyPI and the Go module proxy. So the bases are made here: a Python base from
bookworm's packages with ``mmdebstrap``, a busybox base from the host's
busybox-static, and the pod sandbox's pause image from
``deploy/sandbox/node/pause.c`` compiled with ``gcc -static``; like the
Python base, a git image for the init containers that clone task sources. The
Dockerfile's three targets are built on those bases (its ``PYTHON_BASE`` and
``BUSYBOX_BASE`` build arguments) with ``buildah bud --isolation chroot
--layers``. RUN steps reach PyPI through the host's CA bundle and a pip.conf,
both bind-mounted read-only for the build only: no image holds them.

Each image is exported as an OCI archive holding a reference such as
``lmeval-poller/lmeval-job:dev``, ready for ``skopeo copy oci-archive:FILE
docker://127.0.0.1:PORT/<ref>``, in ``<cache_root()>/images-<key>/`` (outside
the clone) with ``images.json``. As in build.py, the key hashes every input:
Dockerfile, .dockerignore, the context it selects, pause.c, the Debian suite,
mirrors and packages, the tools' versions; not PyPI (unpinned dependencies
may move on a rebuild). A warm run only hashes and reads the JSON. A new key
reuses the bases still in buildah's storage when their own key (a label)
matches: same image IDs, so buildah's layer cache still applies. Needs root.
"""

from __future__ import annotations

import configparser
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from lmeval_sandbox.build import _locked, cache_root
from poller import buildinfo

__all__ = [
    "IMAGE_NAMES",
    "RELEASE_TARGETS",
    "Image",
    "ImageBuildError",
    "ImageSet",
    "build_release_images",
    "cached",
    "dev_labels",
    "ensure_images",
    "stale_sets",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
PAUSE_SOURCE = REPO_ROOT / "deploy" / "sandbox" / "node" / "pause.c"
MODEL_SERVER_SOURCE = Path(__file__).resolve().with_name("model_server.py")
MODEL_SERVER_PATH = "/opt/lmeval-model-server/model_server.py"  # in its image

FORMAT = 4  # bump when this module changes what it builds
TAG = "dev"
IMAGE_NAMES = ("poller", "job", "driver", "pause", "plain", "model_server", "git")
REFS = {
    "poller": f"lmeval-poller/lmeval-poller:{TAG}",
    "job": f"lmeval-poller/lmeval-job:{TAG}",
    "driver": f"lmeval-poller/lmeval-driver:{TAG}",
    "pause": f"lmeval-poller/pause:{TAG}",
    # Not a Dockerfile target: the job image without our wheel (no driver),
    # "any image with Python and lm-eval" for the driver-image path's test.
    "plain": f"lmeval-poller/lm-eval-plain:{TAG}",
    # Not a Dockerfile target either: the sample model server
    # (deploy/sandbox/lmeval_sandbox/model_server.py, standard library only) on the Python
    # base, the job pods' sidecar in tests/node and `run --node real`.
    "model_server": f"lmeval-poller/model-server:{TAG}",
    # Not a Dockerfile target: git alone (Debian's package), the image of the
    # init containers that clone spec.customTasks[].git (setting git-image)
    # in tests/node; clusters use any git image (default alpine/git).
    "git": f"lmeval-poller/git:{TAG}",
}
PYTHON_BASE = "localhost/lmeval-base/python:3.11-bookworm"
BUSYBOX_BASE = "localhost/lmeval-base/busybox:bookworm"
BUILD_ARGS = {"PYTHON_BASE": PYTHON_BASE, "BUSYBOX_BASE": BUSYBOX_BASE}  # the Dockerfile's ARGs
# The Dockerfile's targets a release publishes (lmeval_sandbox.release).
RELEASE_TARGETS = ("poller", "job", "driver")
# The images' org.opencontainers.image.source, and the creation time of images
# that no commit dates (development builds): a constant keeps them cacheable.
SOURCE = "https://github.com/lmeval-poller/lmeval-poller"
EPOCH = "1970-01-01T00:00:00Z"

SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# Besides Python, what python:3.11-slim has too and wheels assume: manylinux
# wheels (numpy's) link the system's libstdc++; netbase; tzdata.
PYTHON_PACKAGES = "python3,python3-venv,python-is-python3,ca-certificates,libstdc++6,netbase,tzdata"
GIT_PACKAGES = "git,ca-certificates"
# The essential variant has no apt; the merged-usr hook avoids usrmerge, which pulls perl.
MMDEBSTRAP_OPTIONS = (
    "--variant=essential",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--skip=output/dev",
    *(f"--dpkgopt=path-exclude=/usr/share/{p}/*" for p in ("doc", "man", "locale", "info")),
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
)
TOOL_PACKAGES = ("buildah", "mmdebstrap", "gcc", "libc6-dev", "busybox-static")
BUSYBOX = Path("/bin/busybox")
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BASE_LABEL = "io.github.lmeval-poller.base-key"
KEEP_OTHER_SETS = 1  # image sets of other keys kept after a build (see _prune)


class ImageBuildError(RuntimeError):
    """A build step failed; the message ends with the log's last lines."""


@dataclass(frozen=True)
class Image:
    """One exported image: its OCI archive and the reference stored in it."""

    name: str  # one of IMAGE_NAMES
    ref: str  # e.g. lmeval-poller/lmeval-job:dev (no registry host)
    archive: Path
    size_bytes: int  # the layers, uncompressed
    archive_bytes: int


@dataclass(frozen=True)
class ImageSet:
    """The seven images of one key, and what building them cost (cold)."""

    directory: Path
    key: str
    poller: Image
    job: Image
    driver: Image
    pause: Image
    plain: Image
    model_server: Image
    git: Image
    build_seconds: dict[str, float]

    def all(self) -> tuple[Image, ...]:
        return (
            self.poller,
            self.job,
            self.driver,
            self.pause,
            self.plain,
            self.model_server,
            self.git,
        )


# -- the keys ------------------------------------------------------------------------------


def _ignore_rules() -> list[tuple[bool, re.Pattern[str], str]]:
    """.dockerignore as (negated, pattern, literal prefix), Docker's syntax."""
    rules = []
    wild = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            parts = re.split(r"(\*\*/|\*\*|\*|\?)", os.path.normpath(line.lstrip("!").strip("/")))
            regex = "".join(wild.get(p, re.escape(p)) for p in parts)
            rules.append((line.startswith("!"), re.compile(regex + r"\Z"), parts[0]))
    return rules


def context_files() -> list[Path]:
    """The build context's files as .dockerignore selects them (the last match wins;
    a pattern matching a directory matches what is in it)."""
    rules = _ignore_rules()

    def excluded(relative: str) -> bool:
        parts = relative.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        verdict = False
        for negated, pattern, _ in rules:
            if any(pattern.match(p) for p in prefixes):
                verdict = not negated
        return verdict

    def reachable(directory: str) -> bool:
        """Whether a negation may re-include something in an excluded directory."""
        return any(n and (p.startswith(directory) or directory.startswith(p)) for n, _, p in rules)

    kept = []
    for top, dirs, files in os.walk(REPO_ROOT):
        base = Path(top).relative_to(REPO_ROOT).as_posix()
        prefix = "" if base == "." else f"{base}/"
        # Skip what nothing can bring back (.git, .venv, tests, ...).
        dirs[:] = sorted(d for d in dirs if not excluded(prefix + d) or reachable(prefix + d))
        kept += [Path(top, f) for f in sorted(files) if not excluded(prefix + f)]
    return kept


def _hash(items: list[tuple[str, bytes]]) -> str:
    digest = hashlib.sha256()
    for label, data in items:
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def base_key() -> str:
    """A hash of what the two bases are made of: recipe and tools, not the project's code."""
    query = ["dpkg-query", "-W", "-f=${Package}=${Version}\\n", *TOOL_PACKAGES]
    try:
        tools = subprocess.run(query, capture_output=True, text=True).stdout
    except FileNotFoundError:
        tools = "no dpkg-query"
    recipe = [
        str(FORMAT),
        SUITE,
        *MIRRORS,
        PYTHON_PACKAGES,
        GIT_PACKAGES,
        *MMDEBSTRAP_OPTIONS,
        tools,
    ]
    return _hash([("recipe", "\n".join([*recipe, PYTHON_BASE, BUSYBOX_BASE]).encode())])


def images_key() -> str:
    """A hash of every input of the images (see the module's docstring)."""
    files = sorted({DOCKERFILE, DOCKERIGNORE, PAUSE_SOURCE, MODEL_SERVER_SOURCE, *context_files()})
    items = [(p.relative_to(REPO_ROOT).as_posix(), p.read_bytes()) for p in files]
    items += [("refs", " ".join(REFS.values()).encode()), ("base", base_key().encode())]
    items += [("labels", json.dumps(dev_labels(), sort_keys=True).encode())]
    return _hash(items)


# -- the cache -----------------------------------------------------------------------------


def _load(directory: Path) -> ImageSet | None:
    try:
        data = json.loads((directory / "images.json").read_text())
    except (OSError, ValueError):
        return None
    images = {
        name: Image(name=name, **{**entry, "archive": directory / entry["archive"]})
        for name, entry in data["images"].items()
    }
    if any(not image.archive.is_file() for image in images.values()):
        return None
    return ImageSet(directory, data["key"], build_seconds=data["build_seconds"], **images)


def cached() -> ImageSet | None:
    """The images of the current inputs if they were built already; never builds."""
    return _load(cache_root() / f"images-{images_key()}")


def ensure_images() -> ImageSet:
    """The current images, built at most once per key (cold: minutes; others wait)."""
    found = cached()
    if found is not None:
        return found
    with _locked(cache_root() / "images.lock"):
        key = images_key()
        target = cache_root() / f"images-{key}"
        found = _load(target)
        if found is not None:
            return found
        staging = target.with_name(f"{target.name}.tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)  # renamed when complete: a key's directory is complete
        log = target.with_name(f"{target.name}.build.log")
        log.write_text("")
        print(f"building images into {target} (log: {log})", file=sys.stderr)
        try:
            _build(key, staging, log)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        shutil.rmtree(target, ignore_errors=True)  # an incomplete leftover
        staging.rename(target)
        _prune(target)
    built = _load(target)
    assert built is not None, f"{target} lacks images.json"
    return built


def stale_sets(root: Path, current: Path, keep: int = KEEP_OTHER_SETS) -> list[Path]:
    """Image-set directories under `root` to remove once `current` is built: all
    but `current` and the `keep` newest others (by mtime; a build's staging
    leftovers count as sets), with nothing else touched."""
    others = [p for p in root.glob("images-*") if p.is_dir() and p != current]
    others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return others[keep:]


def _prune(current: Path) -> None:
    """Drop what earlier keys left: every code change makes a new set (0.65 GB of
    archives) and leaves its predecessors' images untagged in buildah's storage
    (about 1 GB), which nothing else removes; on a shared disk the real node's
    kubelet then reports DiskPressure and refuses pods. The newest other set
    stays, for switching back to one other checkout without a rebuild."""
    for stale in stale_sets(current.parent, current):
        shutil.rmtree(stale, ignore_errors=True)
        stale.with_name(f"{stale.name}.build.log").unlink(missing_ok=True)
    # Untagged images only: the bases and the current images keep their tags.
    subprocess.run(["buildah", "rmi", "--prune"], capture_output=True)


# -- building ------------------------------------------------------------------------------


def _run(argv: list[str], log: Path, capture: bool = False) -> str:
    """Run one step with its output in `log` (stdout returned instead when `capture`)."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        stdout = subprocess.PIPE if capture else out
        done = subprocess.run(argv, stdout=stdout, stderr=out, text=True)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        raise ImageBuildError(f"{argv[0]} {argv[1]} failed; end of {log}:\n" + "\n".join(tail))
    return done.stdout or ""


def _current(ref: str) -> bool:
    """Whether buildah holds base `ref` made from the current recipe (its label)."""
    label = '{{index .OCIv1.Config.Labels "' + BASE_LABEL + '"}}'
    query = ["buildah", "inspect", "--type", "image", "--format", label, ref]
    done = subprocess.run(query, capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == base_key()


def _import(rootfs: Path, ref: str, config: list[str], log: Path) -> None:
    """A FROM scratch image of one root filesystem tarball (buildah has no `import`)."""
    container = _run(["buildah", "from", "--quiet", "scratch"], log, capture=True).strip()
    try:
        _run(["buildah", "add", "--quiet", container, str(rootfs), "/"], log)
        label = f"{BASE_LABEL}={base_key()}"
        _run(["buildah", "config", "--label", label, *config, container], log)
        _run(["buildah", "commit", "--quiet", container, ref], log)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)


def _tar(out: Path, entries: list[tuple[str, bytes | str | None, int]]) -> None:
    """A root-owned tarball of (path, file bytes | symlink target | None for a dir, mode)."""
    with tarfile.open(out, "w") as tar:
        for name, content, mode in entries:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 0
            if content is None:
                info.type = tarfile.DIRTYPE
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
            else:
                info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if isinstance(content, bytes) else None)


def _debian_image(work: Path, log: Path, ref: str, packages: str, config: list[str]) -> None:
    """Image `ref` of bookworm's `packages` alone (mmdebstrap), unless buildah holds
    one made from the current recipe (its label)."""
    if _current(ref):
        return
    rootfs = work / f"{ref.rsplit('/', 1)[-1].replace(':', '-')}-rootfs.tar"
    options = [*MMDEBSTRAP_OPTIONS, f"--include={packages}"]
    _run(["mmdebstrap", *options, SUITE, str(rootfs), *MIRRORS], log)
    _import(rootfs, ref, config, log)


def _python_base(work: Path, log: Path) -> None:
    config = ["--env", PATH_ENV, "--env", "LANG=C.UTF-8"]
    _debian_image(work, log, PYTHON_BASE, PYTHON_PACKAGES, config)


def _busybox_base(work: Path, log: Path) -> None:
    """/bin/busybox and a symlink per applet at the path busybox lists for it."""
    if _current(BUSYBOX_BASE):
        return
    applets = _run([str(BUSYBOX), "--list-full"], log, capture=True).split()
    links = sorted(a for a in applets if "/" in a and a != "bin/busybox")
    dirs = sorted({str(Path(a).parent) for a in links} | {"bin", "etc", "root", "tmp"})
    entries: list[tuple[str, bytes | str | None, int]] = [
        (d, None, {"tmp": 0o1777, "root": 0o700}.get(d, 0o755)) for d in dirs
    ]
    entries += [(link, "/bin/busybox", 0o777) for link in links]
    entries += [("bin/busybox", BUSYBOX.read_bytes(), 0o755), ("etc/group", b"root:x:0:\n", 0o644)]
    entries += [("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644)]
    _tar(work / "busybox-rootfs.tar", entries)
    _import(work / "busybox-rootfs.tar", BUSYBOX_BASE, ["--env", PATH_ENV], log)


def _pause(work: Path, log: Path) -> None:
    binary = work / "pause"
    flags = ["-Os", "-static", "-Wall", "-Wextra", "-Werror"]
    _run(["gcc", *flags, "-o", str(binary), str(PAUSE_SOURCE)], log)
    _run(["strip", str(binary)], log)
    _tar(work / "pause-rootfs.tar", [("pause", binary.read_bytes(), 0o755)])
    config = ["--entrypoint", '["/pause"]', "--cmd", "[]", "--user", "65535:65535"]
    _import(work / "pause-rootfs.tar", f"localhost/{REFS['pause']}", config, log)


def _build_mounts(work: Path) -> list[str]:
    """`-v` options for the host's CA bundle and a pip.conf naming it (plus the host's
    index settings): RUN steps see them, the images never hold them."""
    host = configparser.ConfigParser()
    host.read(["/etc/xdg/pip/pip.conf", "/etc/pip.conf"])
    settings = dict(host["global"]) if host.has_section("global") else {}
    ca = os.environ.get("PIP_CERT") or settings.get("cert") or CA_BUNDLE
    conf = configparser.ConfigParser()
    keep = ("index-url", "extra-index-url", "trusted-host", "proxy")
    conf["global"] = {**{k: v for k, v in settings.items() if k in keep}, "cert": CA_BUNDLE}
    with (work / "pip.conf").open("w") as out:
        conf.write(out)
    return ["-v", f"{ca}:{CA_BUNDLE}:ro", "-v", f"{work / 'pip.conf'}:/etc/pip.conf:ro"]


def _bud(
    target: str,
    work: Path,
    log: Path,
    *,
    tree: Path = REPO_ROOT,
    tag: str = "",
    labels: Mapping[str, str] | None = None,
) -> None:
    """`buildah bud` of the Dockerfile's `target` in `tree` (a checkout), tagged
    `tag` (default: the dev reference), with `labels` as the Dockerfile's
    build arguments (VERSION, REVISION, CREATED, SOURCE: the OCI labels)."""
    argv = ["buildah", "bud", "--isolation", "chroot", "--layers", "--target", target]
    build_args = {**BUILD_ARGS, **(labels if labels is not None else dev_labels())}
    argv += [w for k, v in build_args.items() for w in ("--build-arg", f"{k}={v}")]
    argv += _build_mounts(work)
    dockerfile = tree / DOCKERFILE.name
    argv += ["--tag", tag or f"localhost/{REFS[target]}", "--file", str(dockerfile), str(tree)]
    _run(argv, log)


def dev_labels() -> dict[str, str]:
    """The build arguments of the development images: this checkout's version and
    no revision, so that a commit that changes no input reuses the cached set."""
    return {"VERSION": buildinfo.version(), "REVISION": "dev", "CREATED": EPOCH, "SOURCE": SOURCE}


def build_release_images(
    tree: Path, labels: Mapping[str, str], tags: Mapping[str, str], log: Path
) -> dict[str, float]:
    """Build the Dockerfile's three targets of checkout `tree` into buildah's
    storage as `tags` (target -> local reference), with `labels` as build
    arguments; returns seconds per step. The bases are the development
    images' (built here if missing), so buildah's layer cache serves every
    step a development build of the same tree already ran."""
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="lmeval-release-") as tmp:
        work = Path(tmp)
        for name, step in (("python-base", _python_base), ("busybox-base", _busybox_base)):
            started = time.monotonic()
            step(work, log)
            seconds[name] = round(time.monotonic() - started, 1)
        for target in RELEASE_TARGETS:
            started = time.monotonic()
            _bud(target, work, log, tree=tree, tag=tags[target], labels=labels)
            seconds[target] = round(time.monotonic() - started, 1)
    return seconds


def _plain(_: Path, log: Path) -> None:
    """lm-eval without the driver: the job image with the driver's distribution uninstalled."""
    container = _run(
        ["buildah", "from", "--quiet", "--pull-never", f"localhost/{REFS['job']}"],
        log,
        capture=True,
    ).strip()
    try:
        run = ["buildah", "run", "--isolation", "chroot", "--user", "0:0", container, "--"]
        _run([*run, "pip", "uninstall", "--yes", "--quiet", "lmeval-driver"], log)
        # Prove it: the driver is gone, lm_eval is there.
        _run(
            [
                *run,
                "python",
                "-c",
                "import lm_eval, importlib.util as u; "
                "assert u.find_spec('driver') is None, 'the driver is still installed'",
            ],
            log,
        )
        _run(
            ["buildah", "config", "--cmd", '["python", "-m", "lm_eval", "--help"]', container], log
        )
        _run(["buildah", "commit", "--quiet", container, f"localhost/{REFS['plain']}"], log)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)


def _model_server(_: Path, log: Path) -> None:
    """The sample model server alone on the Python base: one file, run as UID 1001."""
    container = _run(
        ["buildah", "from", "--quiet", "--pull-never", PYTHON_BASE], log, capture=True
    ).strip()
    try:
        copy = ["buildah", "copy", "--quiet", "--chmod", "0644", container]
        _run([*copy, str(MODEL_SERVER_SOURCE), MODEL_SERVER_PATH], log)
        config = ["buildah", "config", "--user", "1001:0", "--workingdir", "/"]
        config += ["--entrypoint", json.dumps(["python", MODEL_SERVER_PATH]), "--cmd", "[]"]
        _run([*config, container], log)
        _run(["buildah", "commit", "--quiet", container, f"localhost/{REFS['model_server']}"], log)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)


def _git(work: Path, log: Path) -> None:
    """Debian's git on its own root filesystem."""
    config = ["--env", PATH_ENV, "--user", "65532:65532", "--entrypoint", '["git"]', "--cmd", "[]"]
    _debian_image(work, log, f"localhost/{REFS['git']}", GIT_PACKAGES, config)


def _uncompressed_size(archive: Path) -> int:
    """The image's layers, uncompressed, read from its OCI archive."""
    with tarfile.open(archive) as tar:

        def blob(name: str) -> IO[bytes]:
            found = tar.extractfile(name if name == "index.json" else name.replace(":", "/"))
            if found is None:
                raise ImageBuildError(f"{archive} lacks {name}")
            return found

        (entry,) = json.load(blob("index.json"))["manifests"]
        total = 0
        for layer in json.load(blob(f"blobs/{entry['digest']}"))["layers"]:
            if not layer["mediaType"].endswith("gzip"):
                total += int(layer["size"])
                continue
            with gzip.open(blob(f"blobs/{layer['digest']}")) as stream:
                while chunk := stream.read(1 << 20):
                    total += len(chunk)
        return total


def _build(key: str, directory: Path, log: Path) -> None:
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="lmeval-images-") as tmp:
        work = Path(tmp)
        steps = {"python-base": _python_base, "busybox-base": _busybox_base, "pause": _pause}
        derived = {"plain": _plain, "model_server": _model_server, "git": _git}
        for step in [*steps, "job", "poller", "driver", *derived]:
            print(f"  {step} ...", file=sys.stderr)
            started = time.monotonic()
            if step in steps:
                steps[step](work, log)
            elif step in derived:
                derived[step](work, log)
            else:
                _bud(step, work, log)
            seconds[step] = round(time.monotonic() - started, 1)
    images = {}
    started = time.monotonic()
    for name in IMAGE_NAMES:
        archive = directory / f"{name}.oci.tar"
        destination = f"oci-archive:{archive}:{REFS[name]}"
        _run(["buildah", "push", "--quiet", f"localhost/{REFS[name]}", destination], log)
        size = _uncompressed_size(archive)
        images[name] = Image(name, REFS[name], archive, size, archive.stat().st_size)
    seconds["export"] = round(time.monotonic() - started, 1)
    described = {n: {k: v for k, v in asdict(i).items() if k != "name"} for n, i in images.items()}
    for entry in described.values():
        entry["archive"] = entry["archive"].name
    document = {"key": key, "images": described, "build_seconds": seconds}
    (directory / "images.json").write_text(json.dumps(document, indent=2) + "\n")
