"""KServe's InferenceService CRD, as KServe ships it, for the suites' model trigger.

An LMEvalSuite can start a run when an InferenceService's ready revision
changes (``spec.triggers.modelChange``). The tests install KServe's own CRD
(no KServe controller: they write the InferenceService's status as KServe
would), taken from the Go module proxy like every other part of the sandbox:
``go mod download github.com/kserve/kserve@<version>`` brings the module,
whose ``config/crd/full/`` holds the CRDs. The one file is copied under the
sandbox's cache, keyed by the version.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from lmeval_sandbox import build

__all__ = ["KSERVE_MODULE", "KSERVE_VERSION", "inference_service_crd"]

KSERVE_MODULE = "github.com/kserve/kserve"
KSERVE_VERSION = "v0.15.2"
_CRD = Path("config", "crd", "full", "serving.kserve.io_inferenceservices.yaml")


def inference_service_crd() -> Path:
    """The InferenceService CRD's file (downloaded once, then from the cache)."""
    target = build.cache_root() / f"kserve-{KSERVE_VERSION}" / "inferenceservices.yaml"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with build._locked(build.cache_root() / "kserve.lock"):
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory() as scratch:
            log = Path(scratch) / "go.log"
            module = build.go_module_dir(KSERVE_MODULE, KSERVE_VERSION, Path(scratch), log)
            partial = target.with_suffix(".tmp")
            shutil.copyfile(module / _CRD, partial)
            partial.chmod(0o644)
            partial.replace(target)
    return target
