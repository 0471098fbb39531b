"""The image cache stays bounded: which image sets a new build removes.

Every code change makes a new image set (its key hashes the build context),
about 0.65 GB of archives; without pruning, a developer's or CI machine's
disk filled until the real node's kubelet reported DiskPressure and refused
the poller's pods. Checks `images.stale_sets`: a build keeps its own set and
the newest other one, removes the older ones (staging leftovers of a failed
build included), and touches nothing that is not an image set.
"""

from __future__ import annotations

import os
from pathlib import Path

from lmeval_sandbox import images


def _set(root: Path, name: str, mtime: float) -> Path:
    path = root / name
    path.mkdir()
    os.utime(path, (mtime, mtime))
    return path


def test_a_build_keeps_its_set_and_the_newest_other(tmp_path: Path) -> None:
    oldest = _set(tmp_path, "images-0000000000000001", 1_000)
    leftover = _set(tmp_path, "images-0000000000000002.tmp4242", 2_000)
    previous = _set(tmp_path, "images-0000000000000003", 3_000)
    current = _set(tmp_path, "images-0000000000000004", 500)  # its mtime does not matter
    (tmp_path / "images-0000000000000001.build.log").write_text("log")
    (tmp_path / "images.lock").write_text("")
    _set(tmp_path, "venv-0000000000000001", 100)

    stale = images.stale_sets(tmp_path, current)

    assert sorted(stale) == sorted([oldest, leftover])
    assert previous not in stale and current not in stale
    assert all(path.name.startswith("images-") and path.is_dir() for path in stale)


def test_nothing_is_stale_with_one_other_set(tmp_path: Path) -> None:
    previous = _set(tmp_path, "images-aaaaaaaaaaaaaaaa", 1_000)
    current = _set(tmp_path, "images-bbbbbbbbbbbbbbbb", 2_000)
    assert images.stale_sets(tmp_path, current) == []
    assert images.stale_sets(tmp_path, current, keep=0) == [previous]
