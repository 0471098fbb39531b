"""The krew plugin's manifest, launcher and archive format (lmeval_sandbox.krewplugin), offline.

Checks: the manifest has krew's apiVersion and kind, the name ``lmeval``,
``v<version>``, a one-line short description, description, caveats naming
the Python range, and one platform per archive whose ``sha256`` is the
archive's and whose ``uri`` is the archive's name under the release's
download URL, which is the README's ``RELEASE=``; it reads back as written,
long texts as literal blocks. The Python range starts at the CLI's own
``requires-python``. The launcher runs the CLI from ``lib/cpXY`` and
``lib/common`` beside it (through a symlink too, as krew installs it), with
the release's revision, keeps the path of a Python started with -P, and
refuses a Python it has no directory for with one line and the CLI's exit
code 7. The archive is the same bytes whenever it is made, sorted, with the
given time, no owner and the executable bit kept; release.json names each
archive with its digest and size. The real archives and the real krew:
tests/deploy/test_krew.py.
"""

from __future__ import annotations

import ast
import hashlib
import io
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml
from lmeval_sandbox import krewplugin, release

REPO = Path(__file__).resolve().parents[2]
VERSION = "1.2.3"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _archives(tmp_path: Path) -> dict[krewplugin.Platform, Path]:
    archives = {}
    for platform in krewplugin.PLATFORMS:
        path = tmp_path / krewplugin.archive_name(VERSION, platform)
        path.write_bytes(f"not really an archive for {platform.name}".encode())
        archives[platform] = path
    return archives


def test_the_manifest_names_each_archive_by_url_and_digest(tmp_path: Path) -> None:
    archives = _archives(tmp_path)
    document = krewplugin.manifest(VERSION, archives)
    assert document["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert document["kind"] == "Plugin"
    assert document["metadata"] == {"name": "lmeval"}
    spec = document["spec"]
    assert spec["version"] == f"v{VERSION}"
    assert spec["homepage"] == "https://github.com/lmeval-poller/lmeval-poller"
    short = spec["shortDescription"]
    assert short and "\n" not in short and len(short) <= 50, short
    assert "LMEvalJob" in spec["description"]
    assert "CPython 3.11 to" in spec["caveats"] and "kubectl lmeval version" in spec["caveats"]
    base = f"https://github.com/lmeval-poller/lmeval-poller/releases/download/v{VERSION}/"
    platforms = spec["platforms"]
    assert len(platforms) == len(archives)
    selectors = set()
    for entry, (platform, archive) in zip(platforms, archives.items(), strict=True):
        assert entry["selector"] == {"matchLabels": {"os": platform.os, "arch": platform.arch}}
        selectors.add((platform.os, platform.arch))
        assert entry["uri"] == base + archive.name
        assert entry["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
        assert entry["bin"] == "kubectl-lmeval"
    assert len(selectors) == len(platforms), "two platforms select the same os/arch"
    assert {"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"} == {
        f"{os}/{arch}" for os, arch in selectors
    }


def test_the_manifest_reads_back_with_literal_blocks(tmp_path: Path) -> None:
    document = krewplugin.manifest(VERSION, _archives(tmp_path))
    text = krewplugin.dump_manifest(document)
    assert yaml.safe_load(text) == document
    assert "  description: |" in text and "  caveats: |" in text
    assert text.startswith("apiVersion: krew.googlecontainertools.github.com/v1alpha2\n")


def test_the_download_url_is_the_readmes() -> None:
    version = release.tree_version(REPO)
    lines = (REPO / "README.md").read_text().splitlines()
    given = {line for line in lines if line.startswith("RELEASE=")}
    assert given == {f"RELEASE={krewplugin.download_url(version)}"}
    # The description and caveats send readers to the README's install section.
    assert "## Install" in lines


def test_the_python_range_starts_at_the_clis_floor() -> None:
    project = tomllib.loads((REPO / "poller" / "cli" / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == f">={krewplugin.PYTHON_VERSIONS[0]}"
    minors = [int(v.split(".")[1]) for v in krewplugin.PYTHON_VERSIONS]
    assert minors == list(range(minors[0], minors[0] + len(minors))), "a version is skipped"
    assert krewplugin.has_cli(REPO)


def _plugin_dir(tmp_path: Path, python_tag: str) -> Path:
    """A launcher beside lib/<python_tag> and lib/common, whose `lmeval_cli.launch`
    (a stand-in) says where it was imported from and which revision it was given."""
    root = tmp_path / "store"
    (root / "lib" / python_tag).mkdir(parents=True)
    package = root / "lib" / "common" / "lmeval_cli"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch.py").write_text(
        "import os, sys\n"
        "def main():\n"
        "    print(__file__, os.environ['LMEVAL_REVISION'], sys.argv[1:])\n"
        "    return 0\n"
    )
    launcher = root / krewplugin.EXECUTABLE
    launcher.write_text(krewplugin.launcher(VERSION, REVISION))
    launcher.chmod(0o755)
    return root


def test_the_launcher_runs_the_cli_beside_it(tmp_path: Path) -> None:
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}{sys.abiflags}"
    root = _plugin_dir(tmp_path, tag)
    # krew links bin/kubectl-lmeval to the launcher in its store.
    link = tmp_path / "bin" / krewplugin.EXECUTABLE
    link.parent.mkdir()
    link.symlink_to(root / krewplugin.EXECUTABLE)
    env = {"PATH": str(Path(sys.executable).parent)}
    done = subprocess.run(
        [sys.executable, str(link), "version", "--client"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    where, revision, args = done.stdout.split(" ", 2)
    assert Path(where) == root / "lib" / "common" / "lmeval_cli" / "launch.py"
    assert revision == REVISION
    assert args.strip() == "['version', '--client']"


def test_the_launcher_refuses_a_python_it_has_no_packages_for(tmp_path: Path) -> None:
    root = _plugin_dir(tmp_path, "cp39")  # nothing for the Python running this test
    done = subprocess.run(
        [sys.executable, str(root / krewplugin.EXECUTABLE), "version"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 7, (done.stdout, done.stderr)
    first, last = krewplugin.PYTHON_VERSIONS[0], krewplugin.PYTHON_VERSIONS[-1]
    assert done.stderr.startswith(f"kubectl-lmeval: needs CPython {first} to {last}")
    assert sys.version.split()[0] in done.stderr and done.stderr.count("\n") == 1
    assert done.stdout == ""


def test_the_archive_is_reproducible(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    (stage / "lib" / "cp311").mkdir(parents=True)
    (stage / "lib" / "common" / "pkg").mkdir(parents=True)
    (stage / "lib" / "common" / "pkg" / "__init__.py").write_text("x = 1\n")
    (stage / krewplugin.EXECUTABLE).write_text("#!/usr/bin/env python3\n")
    (stage / krewplugin.EXECUTABLE).chmod(0o755)
    first, second = tmp_path / "1.tar.gz", tmp_path / "2.tar.gz"
    krewplugin._tar_gz(stage, first, 1796190682)
    (stage / "lib" / "common" / "pkg" / "__init__.py").touch()  # a new mtime changes nothing
    krewplugin._tar_gz(stage, second, 1796190682)
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(first.read_bytes())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members) == sorted(members)
    assert list(members) == [
        "kubectl-lmeval",
        "lib",
        "lib/common",
        "lib/common/pkg",
        "lib/common/pkg/__init__.py",
        "lib/cp311",
    ]
    assert members["lib/cp311"].isdir(), "an empty Python directory is kept"
    assert members["kubectl-lmeval"].mode == 0o755
    assert members["lib/common/pkg/__init__.py"].mode == 0o644
    assert {m.mtime for m in members.values()} == {1796190682}
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members.values()} == {(0, 0, "", "")}


@pytest.mark.parametrize("platform", krewplugin.PLATFORMS, ids=lambda p: p.name)
def test_archive_names_carry_version_and_platform(platform: krewplugin.Platform) -> None:
    name = krewplugin.archive_name(VERSION, platform)
    assert re.fullmatch(rf"kubectl-lmeval-{VERSION}-(linux|darwin)-(amd64|arm64)\.tar\.gz", name)
    assert name.endswith(f"-{platform.os}-{platform.arch}.tar.gz")


def test_the_launcher_keeps_a_safe_path_python_s_own_path(tmp_path: Path) -> None:
    # With -P (PYTHONSAFEPATH) Python puts no script directory first: the
    # launcher must not drop the entry that is there instead.
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}{sys.abiflags}"
    root = _plugin_dir(tmp_path, tag)
    (root / "lib" / "common" / "lmeval_cli" / "launch.py").write_text(
        "import sys\ndef main():\n    print(repr(sys.path))\n    return 0\n"
    )
    plain = subprocess.run(
        [sys.executable, "-P", "-c", "import sys; print(repr(sys.path))"],
        capture_output=True,
        text=True,
    )
    done = subprocess.run(
        [sys.executable, "-P", str(root / krewplugin.EXECUTABLE)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    seen = ast.literal_eval(done.stdout)
    assert seen[:2] == [str(root / "lib" / tag), str(root / "lib" / "common")]
    assert seen[2:] == ast.literal_eval(plain.stdout)


def test_release_json_describes_the_plugin(tmp_path: Path) -> None:
    archives = _archives(tmp_path)
    plugin = krewplugin.Plugin(tmp_path / krewplugin.MANIFEST_NAME, archives)
    described = release._krew_description(plugin)
    assert described is not None and described["manifest"] == "lmeval.yaml"
    linux = described["archives"]["linux/amd64"]
    path = archives[krewplugin.PLATFORMS[0]]
    assert linux == {
        "file": path.name,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "bytes": path.stat().st_size,
    }
    assert release._krew_description(None) is None
