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
"""

from __future__ import annotations

import os
import re

__all__ = ["build_view", "snapshot_of"]

PREFIX = "datasets--"
# Hub names: ORG/NAME or NAME (no "..", no other separator).
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


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


def build_view(hub_cache: str, view: str) -> list[str]:
    """Make `view`'s ``ORG/NAME`` symlinks to the cached datasets of `hub_cache`.

    Returns the dataset names exposed, sorted. A missing or unreadable hub
    cache exposes nothing (the run then fails as any offline run without its
    data would, with lm_eval's own message).
    """
    os.makedirs(view, exist_ok=True)
    try:
        entries = sorted(os.listdir(hub_cache))
    except OSError:
        return []
    exposed: list[str] = []
    for entry in entries:
        if not entry.startswith(PREFIX):
            continue
        parts = entry[len(PREFIX) :].split("--")
        if not 1 <= len(parts) <= 2 or not all(_PART.match(p) and p != ".." for p in parts):
            continue
        snapshot = snapshot_of(os.path.join(hub_cache, entry))
        if snapshot is None:
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
    return exposed
