"""Build a release: the three images pushed, manifests that name them by digest,
the Helm chart, and checksums, in one folder.

``python -m lmeval_sandbox.release [VERSION] --registry HOST/PATH --out DIR``
builds, from a clean checkout (or, with ``--commit REV``, from any commit,
checked out with ``git worktree``), the Dockerfile's ``poller``, ``job`` and
``driver`` targets (`lmeval_sandbox.images`: Debian-made bases, buildah),
pushes them as ``HOST/PATH/lmeval-{poller,job,driver}:VERSION``, and writes:

- ``manifests.yaml``: everything one ``kubectl apply --server-side -f`` needs
  (CRD, namespace, RBAC, settings ConfigMap, Deployment, Service, admission
  policies), rendered from ``deploy/overlays/kubernetes`` with the poller's
  image and the default job image (``LMEVAL_DEFAULT_POD_IMAGE``) **by
  digest** and ``app.kubernetes.io/version`` on every object;
  ``manifests-openshift.yaml`` the same from ``deploy/overlays/openshift``;
- ``crd.yaml``, the CRD alone; ``job-namespace.yaml``, a namespace ready for
  jobs (``deploy/examples/job-namespace``);
- ``lmeval-poller-VERSION.tgz``, the Helm chart (`lmeval_sandbox.chart`)
  with the same images by digest as its defaults;
- ``lmeval.yaml``, the krew plugin manifest of ``kubectl lmeval``, and the
  archives it names (``kubectl-lmeval-VERSION-OS-ARCH.tar.gz``), by their
  URLs under the GitHub release and their SHA-256 (`lmeval_sandbox.krewplugin`);
- ``release.json`` (version, revision, images and digests), ``NOTES.md``
  (this version's section of ``deploy/CHANGELOG.md``) and ``checksums.txt``
  (``sha256sum -c`` format).

Every file is a function of the commit and the image digests, and buildah's
layer cache gives the same digests for a second build of the same commit, so
building twice gives byte-identical artifacts. The version is the checkout's
own (its pyproject.toml); a VERSION argument must agree with it, so a release
cannot be cut under a number its code does not carry. Publishing (a public
registry's credentials, a GitHub release) is the one step left out:
deploy/RELEASING.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lmeval_sandbox import build, chart, images, krewplugin

__all__ = [
    "IMAGE_REPOSITORIES",
    "POD_IMAGE_ENV",
    "Release",
    "ReleaseError",
    "ReleaseImage",
    "build_release",
    "changelog_section",
    "checkout",
    "main",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
# Each published image's repository under --registry, by Dockerfile target.
IMAGE_REPOSITORIES = {"poller": "lmeval-poller", "job": "lmeval-job", "driver": "lmeval-driver"}
# The names deploy/ uses for the images, which a release replaces.
UNRELEASED_POLLER_IMAGE = "quay.io/lmeval-poller/lmeval-poller"
POD_IMAGE_ENV = "LMEVAL_DEFAULT_POD_IMAGE"
CHANGELOG = Path("deploy") / "CHANGELOG.md"
VERSION_LABEL = "app.kubernetes.io/version"
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?$")


class ReleaseError(RuntimeError):
    """The release cannot be built; the message says what to fix."""


@dataclass(frozen=True)
class ReleaseImage:
    """One pushed image."""

    name: str  # the Dockerfile target
    tag_ref: str  # HOST/PATH/lmeval-job:VERSION
    digest: str  # sha256:...
    compressed_bytes: int  # what a pull transfers: config and layers as pushed

    @property
    def ref(self) -> str:
        """The reference by digest, as the manifests name it."""
        return f"{self.tag_ref.rpartition(':')[0]}@{self.digest}"


@dataclass(frozen=True)
class Release:
    """A built release: where its files are, and what building it cost."""

    version: str
    revision: str
    created: str
    registry: str
    directory: Path
    images: dict[str, ReleaseImage]
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def chart(self) -> Path:
        return self.directory / f"lmeval-poller-{self.version}.tgz"

    @property
    def manifests(self) -> Path:
        return self.directory / "manifests.yaml"

    @property
    def krew_manifest(self) -> Path:
        """The krew plugin manifest (absent for a commit without the CLI's distribution)."""
        return self.directory / krewplugin.MANIFEST_NAME


# -- the checkout --------------------------------------------------------------------------


def _git(tree: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)} failed in {tree}: {done.stderr.strip()}")
    return done.stdout.strip()


def resolve_commit(repo: Path, commit: str) -> str:
    """The full hash of `commit` in `repo`, fetched from its origin if a shallow
    clone (CI's) lacks it."""
    try:
        return _git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}")
    except ReleaseError:
        subprocess.run(
            ["git", "-C", str(repo), "fetch", "--quiet", "origin", commit],
            capture_output=True,
            timeout=300,
        )
        return _git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}")


@contextlib.contextmanager
def checkout(commit: str | None, repo: Path = REPO_ROOT) -> Iterator[Path]:
    """`repo` itself (no commit), or `commit` of it in a throwaway ``git worktree``."""
    if commit is None:
        yield repo
        return
    resolved = resolve_commit(repo, commit)
    with tempfile.TemporaryDirectory(prefix="lmeval-release-tree-") as tmp:
        tree = Path(tmp) / "tree"
        _git(repo, "worktree", "add", "--detach", str(tree), resolved)
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )


def tree_version(tree: Path) -> str:
    """The version the checkout's code carries (its pyproject.toml)."""
    with (tree / "pyproject.toml").open("rb") as handle:
        found = tomllib.load(handle)["project"]["version"]
    if not isinstance(found, str) or not _SEMVER.match(found):
        raise ReleaseError(f"{tree / 'pyproject.toml'}: version {found!r} is not X.Y.Z")
    return found


def _commit_time(tree: Path) -> str:
    """The commit's time in UTC: the images' creation time, so rebuilds agree."""
    when = dt.datetime.fromisoformat(_git(tree, "log", "-1", "--format=%cI", "HEAD"))
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def changelog_section(text: str, version: str) -> str | None:
    """The body of ``## [VERSION]`` (or ``## VERSION``) in a changelog, else None."""
    heading = re.compile(rf"^##\s+\[?v?{re.escape(version)}\]?(\s|$)")
    lines = text.splitlines()
    for at, line in enumerate(lines):
        if heading.match(line):
            body = []
            for rest in lines[at + 1 :]:
                if rest.startswith("## "):
                    break
                body.append(rest)
            return "\n".join([line, *body]).strip() + "\n"
    return None


# -- images --------------------------------------------------------------------------------


def _push(local: str, tag_ref: str, plain_http: bool, log: Path) -> str:
    """Push `local` to `tag_ref`; its manifest's digest."""
    with tempfile.TemporaryDirectory() as tmp:
        digest_file = Path(tmp) / "digest"
        argv = ["buildah", "push", "--quiet", "--digestfile", str(digest_file)]
        if plain_http:
            argv.append("--tls-verify=false")
        images._run([*argv, local, f"docker://{tag_ref}"], log)
        digest = digest_file.read_text().strip()
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ReleaseError(f"buildah push {tag_ref} wrote no digest ({digest!r})")
    return digest


def _compressed_bytes(ref: str, plain_http: bool) -> int:
    argv = ["skopeo", "inspect", "--raw"]
    if plain_http:
        argv.append("--tls-verify=false")
    done = subprocess.run([*argv, f"docker://{ref}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise ReleaseError(f"skopeo inspect {ref} failed: {done.stderr.strip()}")
    manifest = json.loads(done.stdout)
    return int(manifest["config"]["size"]) + sum(int(x["size"]) for x in manifest["layers"])


# -- manifests -----------------------------------------------------------------------------


def _overlay(
    work: Path, base: Path, version: str, poller: ReleaseImage | None
) -> list[dict[str, Any]]:
    """`base` with the version label on every object (and pod template) and, when
    given, the poller's image by digest."""
    work.mkdir(parents=True, exist_ok=True)
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, work)],
        "labels": [{"pairs": {VERSION_LABEL: version}, "includeTemplates": True}],
    }
    if poller is not None:
        name, _, digest = poller.ref.partition("@")
        kustomization["images"] = [
            {"name": UNRELEASED_POLLER_IMAGE, "newName": name, "digest": digest}
        ]
    (work / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return chart.kustomize(work)


def _set_job_image(documents: list[dict[str, Any]], job_image: str) -> None:
    """Name the release's job image: the Deployment's install default
    (LMEVAL_DEFAULT_POD_IMAGE); a tree from before that variable existed
    (0.1.0) had it as the ConfigMap's pod-image, which is set instead."""
    for document in documents:
        if document.get("kind") != "Deployment":
            continue
        for container in document["spec"]["template"]["spec"]["containers"]:
            for variable in container.get("env", []):
                if variable.get("name") == POD_IMAGE_ENV:
                    variable["value"] = job_image
                    return
    for document in documents:
        if document.get("kind") == "ConfigMap" and "pod-image" in document.get("data", {}):
            document["data"]["pod-image"] = job_image
            return
    raise ReleaseError(f"no {POD_IMAGE_ENV} in the Deployment nor pod-image in the ConfigMap")


def _dump(documents: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False, width=1000)


# -- the chart archive ---------------------------------------------------------------------


def _epoch(created: str) -> int:
    """``created`` (the commit's time) in seconds: every archive's file times."""
    return int(
        dt.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    )


def _chart_archive(chart_dir: Path, out: Path, created: str) -> None:
    """The chart as ``helm package`` lays it out (``NAME/...`` in a .tgz), but
    reproducible: sorted entries, the commit's time, no owner, gzip without a
    timestamp."""
    mtime = _epoch(created)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in chart_dir.rglob("*") if p.is_file()):
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{chart_dir.name}/{path.relative_to(chart_dir).as_posix()}")
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    # No name and no time in the gzip header either.
    zipped = gzip.compress(buffer.getvalue(), mtime=0)
    out.write_bytes(zipped)


# -- the release ---------------------------------------------------------------------------


def build_release(
    *,
    registry: str,
    out: Path,
    version: str | None = None,
    commit: str | None = None,
    plain_http: bool = False,
    allow_dirty: bool = False,
    repo: Path = REPO_ROOT,
    krew: bool = True,
) -> Release:
    """Build, push and write a release (see the module's docstring); without
    `krew`, no krew plugin (a test that only installs the operator)."""
    registry = registry.rstrip("/")
    if not registry or "://" in registry:
        raise ReleaseError(f"--registry {registry!r}: give HOST[:PORT]/PATH, without a scheme")
    seconds: dict[str, float] = {}
    with checkout(commit, repo) as tree:
        found = tree_version(tree)
        if version is not None and version.lstrip("v") != found:
            raise ReleaseError(
                f"the checkout carries version {found}, not {version}: bump it first "
                "(python -m lmeval_sandbox.version set X.Y.Z, and a changelog entry)"
            )
        revision = _git(tree, "rev-parse", "HEAD")
        dirty = _git(tree, "status", "--porcelain", "--untracked-files=normal")
        if dirty and not allow_dirty:
            changed = "\n  ".join(dirty.splitlines()[:10])
            raise ReleaseError(
                f"the checkout {tree} has uncommitted changes (commit them, or pass "
                f"--allow-dirty for a test build):\n  {changed}"
            )
        if dirty:
            revision += "-dirty"
        notes = _notes(tree, found, required=commit is None)
        created = _commit_time(tree)
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.iterdir():
            if stale.is_file():
                stale.unlink()
        log = out.parent / f"{out.name}.build.log"
        log.write_text("")
        labels = {"VERSION": found, "REVISION": revision, "CREATED": created}
        labels["SOURCE"] = images.SOURCE
        local = {
            target: f"localhost/lmeval-release/{IMAGE_REPOSITORIES[target]}:{found}-{revision[:12]}"
            for target in images.RELEASE_TARGETS
        }
        started = time.monotonic()
        seconds.update(images.build_release_images(tree, labels, local, log))
        seconds["build"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        pushed: dict[str, ReleaseImage] = {}
        for target, source in local.items():
            tag_ref = f"{registry}/{IMAGE_REPOSITORIES[target]}:{found}"
            digest = _push(source, tag_ref, plain_http, log)
            size = _compressed_bytes(f"{tag_ref.rpartition(':')[0]}@{digest}", plain_http)
            pushed[target] = ReleaseImage(target, tag_ref, digest, size)
        seconds["push"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        plugin = None
        if krew and krewplugin.has_cli(tree):
            plugin = krewplugin.build_plugin(
                tree, out, version=found, revision=revision, mtime=_epoch(created), log=log
            )
        seconds["krew"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        _write_artifacts(tree, out, found, revision, created, registry, pushed, notes, plugin)
        seconds["artifacts"] = round(time.monotonic() - started, 1)
    return Release(found, revision, created, registry, out, pushed, seconds)


def _notes(tree: Path, version: str, *, required: bool) -> str:
    path = tree / CHANGELOG
    if not path.is_file():
        if required:
            raise ReleaseError(f"{CHANGELOG} is missing: a release's notes come from it")
        return f"# lmeval-poller {version}\n\nThis commit has no {CHANGELOG}.\n"
    section = changelog_section(path.read_text(), version)
    if section is None:
        if required:
            raise ReleaseError(f"{CHANGELOG} has no section for {version}: write one first")
        return f"# lmeval-poller {version}\n\n{CHANGELOG} has no section for {version}.\n"
    return section


def _write_artifacts(
    tree: Path,
    out: Path,
    version: str,
    revision: str,
    created: str,
    registry: str,
    pushed: Mapping[str, ReleaseImage],
    notes: str,
    plugin: krewplugin.Plugin | None = None,
) -> None:
    deploy = tree / "deploy"
    with tempfile.TemporaryDirectory(prefix="lmeval-release-") as tmp:
        work = Path(tmp)
        for variant, file_name in (
            ("kubernetes", "manifests.yaml"),
            ("openshift", "manifests-openshift.yaml"),
        ):
            documents = _overlay(
                work / variant, deploy / "overlays" / variant, version, pushed["poller"]
            )
            _set_job_image(documents, pushed["job"].ref)
            (out / file_name).write_text(_dump(documents))
            if variant == "kubernetes":
                crds = [d for d in documents if d["kind"] == "CustomResourceDefinition"]
                (out / "crd.yaml").write_text(_dump(crds))
        namespace = _overlay(work / "jobs", deploy / "examples" / "job-namespace", version, None)
        (out / "job-namespace.yaml").write_text(_dump(namespace))
        chart_dir = work / "chart" / "lmeval-poller"
        chart.generate_chart(deploy, chart_dir, version=version, app_version=version)
        chart.set_image_defaults(
            chart_dir,
            poller=pushed["poller"].ref,
            job=pushed["job"].ref,
        )
        _chart_archive(chart_dir, out / f"lmeval-poller-{version}.tgz", created)
    (out / "NOTES.md").write_text(notes)
    described = {
        "version": version,
        "revision": revision,
        "created": created,
        "registry": registry,
        "images": {name: {**asdict(image), "ref": image.ref} for name, image in pushed.items()},
        "krew": _krew_description(plugin),
    }
    (out / "release.json").write_text(json.dumps(described, indent=2, sort_keys=True) + "\n")
    sums = []
    for path in sorted(p for p in out.iterdir() if p.is_file() and p.name != "checksums.txt"):
        sums.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}")
    (out / "checksums.txt").write_text("\n".join(sums) + "\n")


def _krew_description(plugin: krewplugin.Plugin | None) -> dict[str, Any] | None:
    """What release.json says of the krew plugin: its manifest and archives."""
    if plugin is None:
        return None
    archives = {
        f"{platform.os}/{platform.arch}": {
            "file": archive.name,
            "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
            "bytes": archive.stat().st_size,
        }
        for platform, archive in plugin.archives.items()
    }
    return {"manifest": plugin.manifest.name, "archives": archives}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lmeval_sandbox.release",
        description="Build the images, push them, and write a release's artifacts into one folder.",
    )
    parser.add_argument(
        "version", nargs="?", help="must equal the checkout's version (default: that version)"
    )
    parser.add_argument(
        "--registry", required=True, help="HOST[:PORT]/PATH the images are pushed under"
    )
    parser.add_argument(
        "--out", type=Path, help="the folder to write (default: <cache>/releases/VERSION)"
    )
    parser.add_argument("--commit", help="build this commit (git worktree) instead of the checkout")
    parser.add_argument(
        "--plain-http",
        action="store_true",
        help="the registry speaks HTTP (a loopback test registry)",
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="build uncommitted changes (never for a published release)",
    )
    parser.add_argument(
        "--no-krew",
        action="store_true",
        help="leave out the krew plugin (lmeval.yaml and its archives)",
    )
    args = parser.parse_args(argv)
    out = args.out
    if out is None:
        with checkout(args.commit) as tree:
            out = build.cache_root() / "releases" / tree_version(tree)
    try:
        release = build_release(
            registry=args.registry,
            out=out.resolve(),
            version=args.version,
            commit=args.commit,
            plain_http=args.plain_http,
            allow_dirty=args.allow_dirty,
            krew=not args.no_krew,
        )
    except (
        ReleaseError,
        chart.ChartError,
        images.ImageBuildError,
        krewplugin.PluginError,
    ) as error:
        print(f"release: {error}", file=sys.stderr)
        return 1
    print(f"lmeval-poller {release.version} (revision {release.revision}) in {release.directory}")
    for image in release.images.values():
        print(f"  {image.ref}  {image.compressed_bytes / 2**20:.0f} MiB compressed")
    if release.krew_manifest.is_file():
        print(f"  krew plugin: {release.krew_manifest.name} and the archives it names")
    print(f"  seconds: {json.dumps(release.seconds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
