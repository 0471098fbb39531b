"""The in-pod driver of lmeval-poller.

Why this package exists: the job pod has no Kubernetes API rights, so the
driver is what turns a raw ``lm_eval`` process into a record the poller can
trust: it runs lm_eval as a child, forwards its output with forgeries
defused, writes ``::lmeval::`` markers (see :mod:`driver.protocol`) and exits
with a meaningful code. It uses only the standard library and imports neither
``kubernetes`` nor ``poller``, so it can be copied into any image that has
Python and lm_eval.

``__version__`` is read from the metadata of the distribution this copy of
the package was installed from (see `_version`); no version is written here.
"""

import os
import sys

UNKNOWN_VERSION = "0+unknown"


def _metadata_version(path: str) -> str | None:
    """The ``Version:`` header of a core metadata file (METADATA, PKG-INFO)."""
    try:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if not line.strip():
                    return None  # the headers end at the first empty line
                if line.startswith("Version:"):
                    return line.partition(":")[2].strip() or None
    except OSError:
        return None
    return None


def _dist_info_version(directory: str, project: str) -> str | None:
    """The version of `project` (normalised, e.g. lmeval_driver) installed in `directory`."""
    try:
        names = sorted(os.listdir(directory or "."))
    except OSError:
        return None
    for name in names:
        if name.lower().startswith(f"{project}-") and name.endswith(".dist-info"):
            found = _metadata_version(os.path.join(directory or ".", name, "METADATA"))
            if found:
                return found
    return None


def _version() -> str:
    """The version of the distribution these very modules came from.

    Read from the metadata files on disk, not with ``importlib.metadata``
    (~40 ms, and the driver starts before anything heavy is imported), and
    only where it describes this copy of the package: a job pod may run the
    driver copied from the driver image (PYTHONPATH) in an image that has
    another ``lmeval-driver`` installed, whose version is not this one's.

    1. A wheel install: ``lmeval_driver-X.dist-info`` beside the package.
    2. The driver image: its build puts the wheel's METADATA inside the
       package (Dockerfile), since the init container copies the package
       directory alone.
    3. A development checkout: the ``lmeval-poller`` distribution, which
       holds every package of the repository, on the import path.
    """
    package = os.path.dirname(os.path.abspath(__file__))
    found = _dist_info_version(os.path.dirname(package), "lmeval_driver") or _metadata_version(
        os.path.join(package, "METADATA")
    )
    if found:
        return found
    for entry in sys.path:
        found = _dist_info_version(entry, "lmeval_poller")
        if found:
            return found
    return UNKNOWN_VERSION


# The version is the distributions' (driver/pyproject.toml), set for all of
# them by `python -m lmeval_sandbox.version set X.Y.Z`.
__version__ = _version()
