"""The poller deployed as users deploy it: its image, ``kubectl apply -k``, in-cluster.

On the real node (`lmeval_sandbox.realnode`) the poller is not a local
process: this module writes a kustomize overlay that takes
``deploy/overlays/kubernetes`` unchanged, swaps in the images from the node's
registry (``images:``, as the overlay's own comment tells users to) and
patches the settings ConfigMap, then applies it with the sandbox's kubectl
(server-side, as INSTALL.md says) and waits for the Deployment. From there
the poller reads its ServiceAccount token and the ``kubernetes`` Service like
on any cluster. A namespace for jobs is made the same way, from
``deploy/components/job-namespace``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from lmeval_sandbox.controlplane import ControlPlane

__all__ = [
    "DEPLOY_DIR",
    "POLLER_IMAGE",
    "apply_job_namespace",
    "apply_poller",
    "poller_overlay",
]

DEPLOY_DIR = Path(__file__).resolve().parents[3] / "deploy"
# The image names deploy/ uses, which an overlay replaces.
POLLER_IMAGE = "quay.io/lmeval-poller/lmeval-poller"


def _relative(target: Path, start: Path) -> str:
    # kustomize wants bases as paths relative to the kustomization.
    return os.path.relpath(target, start)


def poller_overlay(directory: Path, *, poller_image: str, settings: Mapping[str, str]) -> Path:
    """Write an overlay of deploy/overlays/kubernetes with our image and settings."""
    directory.mkdir(parents=True, exist_ok=True)
    name, _, tag = poller_image.rpartition(":")
    settings_patch = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "lmeval-poller-config", "namespace": "lmeval-system"},
        "data": dict(settings),
    }
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [_relative(DEPLOY_DIR / "overlays" / "kubernetes", directory)],
        "images": [{"name": POLLER_IMAGE, "newName": name, "newTag": tag}],
        "patches": [{"path": "settings.yaml"}],
    }
    (directory / "settings.yaml").write_text(yaml.safe_dump(settings_patch, sort_keys=False))
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return directory


def apply_poller(
    plane: ControlPlane,
    directory: Path,
    *,
    poller_image: str,
    settings: Mapping[str, str],
    timeout: float = 180.0,
) -> None:
    """Apply the overlay and wait until the poller's Deployment is Available."""
    overlay = poller_overlay(directory, poller_image=poller_image, settings=settings)
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(overlay), timeout=120)
    plane.kubectl(
        "-n",
        "lmeval-system",
        "rollout",
        "status",
        "deployment/lmeval-poller",
        f"--timeout={int(timeout)}s",
        timeout=timeout + 10,
    )


def apply_job_namespace(
    plane: ControlPlane, directory: Path, namespace: str, *, annotations: Mapping[str, str] = {}
) -> None:
    """Create `namespace` ready for jobs (deploy/components/job-namespace)."""
    directory.mkdir(parents=True, exist_ok=True)
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "annotations": dict(annotations)},
    }
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": namespace,
        "resources": ["namespace.yaml"],
        "components": [_relative(DEPLOY_DIR / "components" / "job-namespace", directory)],
    }
    (directory / "namespace.yaml").write_text(json.dumps(body))
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    plane.kubectl("apply", "--server-side", "-k", str(directory))
