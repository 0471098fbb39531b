"""The release's krew plugin, installed by the real krew and run as ``kubectl lmeval``.

The plugin (``lmeval.yaml`` and one archive per platform) is built from this
checkout as the release builds it (`lmeval_sandbox.krewplugin`; the CLI's
dependencies come from PyPI), and krew and the krew index's validator are
built from their Go module (`lmeval_sandbox.krew`). No cluster. Checks:

- the index's own validator (``validate-krew-manifest``) accepts the
  manifest: structure, supported platforms, no overlapping selectors;
- ``krew install --manifest --archive`` with ``KREW_ROOT`` in a temporary
  directory installs this machine's archive; the installed
  ``kubectl-lmeval version --client``, run by a Python that has none of the
  CLI's packages, prints the release's version and revision, and so does
  ``kubectl lmeval version --client`` through the sandbox's kubectl (when
  its binaries are built); ``krew uninstall`` removes it;
- every other platform's archive installs as krew would on that platform
  (``KREW_OS``/``KREW_ARCH``) and holds compiled modules for that platform
  and for each Python of `PYTHON_VERSIONS`;
- the installed plugin runs on every supported CPython found on this
  machine and refuses an older one with the CLI's exit code 7.
"""

from __future__ import annotations

import os
import platform as host
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from lmeval_sandbox import build, krew, krewplugin, release

REPO = Path(__file__).resolve().parents[2]
VERSION = release.tree_version(REPO)
REVISION = "0123456789abcdef0123456789abcdef01234567"
CLIENT_LINE = f"Client Version: {VERSION} (revision {REVISION[:7]})"
# The platform krew runs on here, by Python's name of the machine.
HOST = {"x86_64": ("linux", "amd64"), "aarch64": ("linux", "arm64")}.get(host.machine())
# What each platform's compiled modules say in their file names.
SO_MARKERS = {
    ("linux", "amd64"): "x86_64-linux-gnu",
    ("linux", "arm64"): "aarch64-linux-gnu",
    ("darwin", "amd64"): "darwin",
    ("darwin", "arm64"): "darwin",
}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> krewplugin.Plugin:
    krew.ensure()
    out = tmp_path_factory.mktemp("plugin")
    return krewplugin.build_plugin(
        REPO, out, version=VERSION, revision=REVISION, mtime=0, log=out.parent / "plugin.log"
    )


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose python3 has none of the CLI's packages (a venv without pip)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    probe = subprocess.run([venv / "bin" / "python3", "-c", "import yaml"], capture_output=True)
    assert probe.returncode != 0, "the bare Python finds the checkout's packages"
    return venv / "bin"


def _host(plugin: krewplugin.Plugin) -> tuple[krewplugin.Platform, Path]:
    if HOST is None:
        pytest.skip(f"no archive for this machine ({host.machine()})")
    return next((p, a) for p, a in plugin.archives.items() if (p.os, p.arch) == HOST)


def _install(root: Path, plugin: krewplugin.Plugin, archive: Path, **env: str) -> None:
    done = krew.run_krew(
        "install",
        f"--manifest={plugin.manifest}",
        f"--archive={archive}",
        root=root,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Installed plugin: lmeval" in done.stderr, done.stderr


def _plugin_env(root: Path, python_dir: Path) -> dict[str, str]:
    """krew's bin directory, then a bare python3, then nothing of the checkout's."""
    env = krew.krew_env(root)
    env["PATH"] = os.pathsep.join([str(root / "bin"), str(python_dir), "/usr/bin", "/bin"])
    env.pop("PYTHONPATH", None)
    env.pop("LMEVAL_REVISION", None)
    return env


@pytest.fixture
def installed(
    plugin: krewplugin.Plugin, tmp_path: Path, bare_python: Path
) -> Iterator[dict[str, str]]:
    """The host's archive installed under a KREW_ROOT of its own; the plugin's environment."""
    root = tmp_path / "krew"
    _install(root, plugin, _host(plugin)[1])
    yield _plugin_env(root, bare_python)


def test_the_index_validator_accepts_the_manifest(plugin: krewplugin.Plugin) -> None:
    validator = krew.ensure() / "validate-krew-manifest"
    # -skip-install: its install step downloads each archive from the release's URL.
    done = subprocess.run(
        [str(validator), "-manifest", str(plugin.manifest), "-skip-install"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "structural validation OK" in done.stderr
    assert "no overlapping spec.platform[].selector" in done.stderr


def test_krew_installs_it_and_kubectl_lmeval_runs(
    plugin: krewplugin.Plugin, installed: dict[str, str], tmp_path: Path
) -> None:
    root = Path(installed["KREW_ROOT"])
    receipt = yaml.safe_load((root / "receipts" / "lmeval.yaml").read_text())
    assert receipt["spec"]["version"] == f"v{VERSION}"
    assert receipt["status"]["source"]["name"] == "detached"  # from --manifest, not an index
    # `krew list` and `uninstall` want an index (a git clone); the real one
    # cannot be fetched here, an empty local one will do.
    subprocess.run(["git", "init", "-q", str(root / "index" / "default")], check=True)
    listed = krew.run_krew("list", root=root).stdout.split()
    assert "detached/lmeval" in listed, listed  # installed from a manifest, not an index
    link = root / "bin" / "kubectl-lmeval"
    assert link.is_symlink()
    assert link.resolve() == root / "store" / "lmeval" / f"v{VERSION}" / "kubectl-lmeval"
    done = subprocess.run(
        ["kubectl-lmeval", "version", "--client"], capture_output=True, text=True, env=installed
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == CLIENT_LINE, done.stdout
    usage = subprocess.run(
        ["kubectl-lmeval", "--help"], capture_output=True, text=True, env=installed
    )
    assert usage.returncode == 0, usage.stderr
    assert usage.stdout.startswith("usage: kubectl lmeval"), usage.stdout[:200]
    if build.needs_build():
        print("the sandbox's kubectl is not built: `kubectl lmeval` not run")
    else:
        kubectl = build.ensure_binaries() / "kubectl"
        through = subprocess.run(
            [str(kubectl), "lmeval", "version", "--client"],
            capture_output=True,
            text=True,
            env={**installed, "KUBECONFIG": str(tmp_path / "none")},
        )
        assert through.returncode == 0, through.stderr
        assert through.stdout.strip() == CLIENT_LINE, through.stdout
        plugins = subprocess.run(
            [str(kubectl), "plugin", "list", "--name-only"],
            capture_output=True,
            text=True,
            env=installed,
        )
        assert "kubectl-lmeval" in plugins.stdout.split(), plugins.stdout
    krew.run_krew("uninstall", "lmeval", root=root)
    assert not link.exists() and not link.is_symlink()
    assert not (root / "store" / "lmeval").exists()
    assert not (root / "receipts" / "lmeval.yaml").exists()


@pytest.mark.parametrize("platform", krewplugin.PLATFORMS, ids=lambda p: p.name)
def test_each_archive_installs_for_its_platform(
    plugin: krewplugin.Plugin, platform: krewplugin.Platform, tmp_path: Path
) -> None:
    root = tmp_path / "krew"
    _install(root, plugin, plugin.archives[platform], KREW_OS=platform.os, KREW_ARCH=platform.arch)
    store = root / "store" / "lmeval" / f"v{VERSION}"
    assert os.access(store / "kubectl-lmeval", os.X_OK)
    marker = SO_MARKERS[(platform.os, platform.arch)]
    for python in krewplugin.PYTHON_VERSIONS:
        tag = "cp" + python.replace(".", "")
        compiled = list((store / "lib" / tag / "pydantic_core").glob("_pydantic_core.*.so"))
        assert len(compiled) == 1, (tag, compiled)
        assert f"cpython-{tag[2:]}" in compiled[0].name and marker in compiled[0].name, compiled
    # The pure packages are shared, the CLI among them.
    assert (store / "lib" / "common" / "lmeval_cli" / "__main__.py").is_file()
    assert not list(store.rglob("__pycache__")), "bytecode is written on first use, not shipped"
    for directory in (store / "lib").iterdir():
        assert not (directory / "bin").exists(), "pip's console scripts name the builder's Python"


def _interpreter(version: str) -> str | None:
    """A CPython `version` on this machine (pyenv's, or on PATH), if one runs."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [str(p) for p in sorted(pyenv.glob(f"{version}.*/bin/python{version}"))]
    candidates += [c for c in [shutil.which(f"python{version}")] if c]
    for candidate in candidates:
        done = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0 and done.stdout.strip() == version:
            return candidate
    return None


@pytest.mark.parametrize("version", [*krewplugin.PYTHON_VERSIONS, "3.10"])
def test_it_runs_on_every_supported_python_and_refuses_older(
    installed: dict[str, str], version: str
) -> None:
    python = _interpreter(version)
    if python is None:
        pytest.skip(f"no CPython {version} on this machine")
    script = Path(installed["KREW_ROOT"]) / "bin" / "kubectl-lmeval"
    done = subprocess.run(
        [python, str(script), "version", "--client"], capture_output=True, text=True, env=installed
    )
    if version in krewplugin.PYTHON_VERSIONS:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == CLIENT_LINE
    else:
        assert done.returncode == 7, (done.stdout, done.stderr)
        assert re.match(r"kubectl-lmeval: needs CPython 3\.11 to 3\.\d+", done.stderr)
