"""Shared helpers of the deployment tests: kustomize renderings of ``deploy/``.

Rendering uses the kubectl built for the sandbox (kustomize is built into
it), the same binary a CI run has; it needs no running control plane, so
the static checks of the manifests stay cheap.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from lmeval_sandbox import build

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = {
    "kubernetes": DEPLOY / "overlays" / "kubernetes",
    "openshift": DEPLOY / "overlays" / "openshift",
}
POLLER_NS = "lmeval-system"

Manifest = dict[str, Any]


def kustomize(kubectl: Path, path: Path) -> str:
    """`kubectl kustomize path`, failing with kustomize's own message."""
    done = subprocess.run(
        [str(kubectl), "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"kustomize {path} failed: {done.stderr}"
    return done.stdout


def documents(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(docs: list[Manifest], kind: str, name: str) -> Manifest:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def yaml_file(path: Path) -> list[Manifest]:
    return documents(path.read_text())


@pytest.fixture(scope="session")
def kubectl_bin() -> Path:
    """The sandbox's kubectl (built from Go modules, cached; never rebuilt here)."""
    return build.ensure_binaries() / "kubectl"


@pytest.fixture(scope="session")
def rendered(kubectl_bin: Path) -> dict[str, list[Manifest]]:
    """Each overlay's rendering, parsed."""
    return {name: documents(kustomize(kubectl_bin, path)) for name, path in OVERLAYS.items()}
