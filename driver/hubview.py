"""Datasets of a Hugging Face hub cache as local directories, for offline runs.

Why this module exists: the ``datasets`` library (5.x) does not read the hub
cache when ``HF_DATASETS_OFFLINE``/``HF_HUB_OFFLINE`` is set; a Hub name such
as ``allenai/ai2_arc`` then only loads from the Arrow cache of an earlier
online run. It does load a *local directory* named by the same relative path,
reading the repository's dataset card (``configs:``) and data files as the
Hub would serve them. lm_eval hands a task's ``dataset_path`` to
``datasets.load_dataset`` unchanged, so a directory holding
``ORG/NAME -> <hub>/datasets--ORG--NAME/snapshots/<commit>`` symlinks, used as
lm_eval's working directory, makes a standard task load its data from the
cache, offline, without editing the task.

The commit is the one ``refs/main`` names (the one huggingface_hub itself
resolves for the default revision); a repository without ``refs/main`` but
with exactly one snapshot uses that snapshot. Anything else is skipped.

The cache may be shared (a claim any pod creator can mount, an S3 prefix
others write), so what the view exposes is chosen as data, never as code.
lm_eval's interpreter does not look in its working directory for modules
(the pod runs it with ``-P`` and the driver sets ``PYTHONSAFEPATH``), and on
top of that a snapshot holding Python at its top is not exposed:

* ``__init__``/``__main__`` with any suffix Python imports (``.py``,
  ``.pyc``, ``.so``...) make the directory a Python package, not a dataset:
  ``datasets--lm_eval`` would otherwise be a package named ``lm_eval`` in
  lm_eval's working directory;
* ``NAME.py`` (NAME the dataset's last part) is a loading script: the
  installed ``datasets`` (4.0 on, 5.x here) refuses to load such a
  directory ("Dataset scripts are no longer supported") and never runs the
  script, so nothing loadable is lost; but ``evaluate.load(NAME)``, which
  lm_eval calls for a metric its registry does not know, imports
  ``NAME/NAME.py`` from the working directory.

Other files of a snapshot stay: they are read as data files, and nothing
imports or runs them from there.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
from typing import NamedTuple

__all__ = ["View", "build_view", "code_in", "snapshot_of"]

PREFIX = "datasets--"
# Hub names: ORG/NAME or NAME (no "..", no other separator).
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# Every suffix the import system loads a module from (.py, .pyc, extension
# modules), longest first so that ".cpython-311-x86_64-linux-gnu.so" wins over ".so".
_CODE_SUFFIXES = tuple(sorted(importlib.machinery.all_suffixes(), key=len, reverse=True))
_PACKAGE_STEMS = ("__init__", "__main__")


class View(NamedTuple):
    """What `build_view` exposed (``ORG/NAME``, sorted), and what it refused
    because it holds code (``ORG/NAME (FILE)``)."""

    names: list[str]
    refused: list[str]


def snapshot_of(repo_dir: str) -> str | None:
    """The snapshot directory of a cached dataset repository, or None."""
    snapshots = os.path.join(repo_dir, "snapshots")
    try:
        with open(os.path.join(repo_dir, "refs", "main"), encoding="ascii") as fh:
            commit = fh.read().strip()
    except (OSError, UnicodeDecodeError):
        try:
            found = [n for n in os.listdir(snapshots) if _COMMIT.match(n)]
        except OSError:
            return None
        commit = found[0] if len(found) == 1 else ""
    if not _COMMIT.match(commit):
        return None
    path = os.path.join(snapshots, commit)
    return path if os.path.isdir(path) else None


def code_in(snapshot: str, name: str) -> str | None:
    """The first file at the top of `snapshot` that makes it Python rather than a
    dataset named `name` (a package's ``__init__``/``__main__``, or the loading
    script ``name.py``), or None. An unreadable snapshot holds none."""
    try:
        entries = sorted(os.listdir(snapshot))
    except OSError:
        return None
    for entry in entries:
        for suffix in _CODE_SUFFIXES:
            if entry.endswith(suffix):
                if entry[: -len(suffix)] in (*_PACKAGE_STEMS, name):
                    return entry
                break
    return None


def build_view(hub_cache: str, view: str) -> View:
    """Make `view`'s ``ORG/NAME`` symlinks to the cached datasets of `hub_cache`.

    Returns the dataset names exposed, sorted, and those refused because their
    snapshot holds code (`code_in`). A missing or unreadable hub cache exposes
    nothing (the run then fails as any offline run without its data would,
    with lm_eval's own message).
    """
    os.makedirs(view, exist_ok=True)
    try:
        entries = sorted(os.listdir(hub_cache))
    except OSError:
        return View([], [])
    exposed: list[str] = []
    refused: list[str] = []
    for entry in entries:
        if not entry.startswith(PREFIX):
            continue
        parts = entry[len(PREFIX) :].split("--")
        if not 1 <= len(parts) <= 2 or not all(_PART.match(p) and p != ".." for p in parts):
            continue
        snapshot = snapshot_of(os.path.join(hub_cache, entry))
        if snapshot is None:
            continue
        code = code_in(snapshot, parts[-1])
        if code is not None:
            refused.append(f"{'/'.join(parts)} ({code})")
            continue
        link = os.path.join(view, *parts)
        try:
            parent = os.path.dirname(link)
            if os.path.islink(parent):
                continue  # NAME is also a dataset of its own: ORG/NAME cannot be added
            os.makedirs(parent, exist_ok=True)
            if os.path.lexists(link):
                continue
            os.symlink(snapshot, link, target_is_directory=True)
        except OSError:
            continue
        exposed.append("/".join(parts))
    return View(exposed, refused)
