"""The release command's pure parts (lmeval_sandbox.release), without images.

Checks: a version's notes are its changelog section, with or without
brackets, up to the next version; the changelog's current section matches
the checkout's version, and every released section names a commit of this
repository's history; the job image lands in the Deployment's install
default, or, for a tree from before it existed (0.1.0), in the ConfigMap's
pod-image, and a tree with neither is refused; the chart archive is the same
bytes for the same input whenever it is made, lays the chart out under its
name, and carries the commit's time; a release refuses a registry with a
scheme and a version the checkout does not carry, before building anything.
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox import release

CHANGELOG = """# Changelog

## [1.2.0]

### Added
- a thing

## [1.1.0] - 2026-01-02

Commit: abc1234

- older
"""


def test_a_versions_notes_are_its_section() -> None:
    notes = release.changelog_section(CHANGELOG, "1.2.0")
    assert notes is not None
    assert notes.startswith("## [1.2.0]") and "a thing" in notes and "older" not in notes
    older = release.changelog_section(CHANGELOG, "1.1.0")
    assert older is not None and "Commit: abc1234" in older
    assert release.changelog_section(CHANGELOG, "1.0.0") is None
    assert release.changelog_section("## 2.0.0\nplain\n", "2.0.0") == "## 2.0.0\nplain\n"
    # 1.2.0 must not match 1.2.0-rc.1's heading, nor 1.2 a 1.2.0 heading.
    assert release.changelog_section("## [1.2.0-rc.1]\nx\n", "1.2.0") is None


def test_the_changelog_agrees_with_the_checkout() -> None:
    root = Path(release.__file__).resolve().parents[3]
    text = (root / release.CHANGELOG).read_text()
    version = release.tree_version(root)
    assert release.changelog_section(text, version), f"no section for {version}"
    for commit in re.findall(r"^Commit: ([0-9a-f]{7,40})$", text, re.M):
        assert release.resolve_commit(root, commit).startswith(commit)


def _deployment(env: list[dict[str, str]]) -> dict[str, Any]:
    container = {"name": "poller", "image": "x", "env": env}
    return {"kind": "Deployment", "spec": {"template": {"spec": {"containers": [container]}}}}


def test_the_job_image_goes_to_the_install_default_or_the_old_configmap() -> None:
    image = "127.0.0.1:5000/lmeval/lmeval-job@sha256:" + "1" * 64
    current = [_deployment([{"name": release.POD_IMAGE_ENV, "value": "old"}])]
    release._set_job_image(current, image)
    assert current[0]["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] == image
    configmap = {"kind": "ConfigMap", "data": {"pod-image": "quay.io/x:latest", "a": "b"}}
    old = [_deployment([]), configmap]
    release._set_job_image(old, image)
    assert configmap["data"] == {"pod-image": image, "a": "b"}
    with pytest.raises(release.ReleaseError, match=release.POD_IMAGE_ENV):
        release._set_job_image([_deployment([]), {"kind": "ConfigMap", "data": {}}], image)


def test_the_chart_archive_is_reproducible(tmp_path: Path) -> None:
    chart = tmp_path / "lmeval-poller"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("name: lmeval-poller\n")
    (chart / "templates" / "a.yaml").write_text("kind: A\n")
    first, second = tmp_path / "1.tgz", tmp_path / "2.tgz"
    release._chart_archive(chart, first, "2026-12-02T05:51:22Z")
    (chart / "templates" / "a.yaml").touch()  # a new mtime changes nothing
    release._chart_archive(chart, second, "2026-12-02T05:51:22Z")
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(first.read_bytes())) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [
        "lmeval-poller/Chart.yaml",
        "lmeval-poller/templates/a.yaml",
    ]
    assert {m.mtime for m in members} == {1796190682}
    assert {(m.uid, m.gid) for m in members} == {(0, 0)}


def test_bad_requests_are_refused_before_building(tmp_path: Path) -> None:
    with pytest.raises(release.ReleaseError, match="HOST"):
        release.build_release(registry="https://quay.io/x", out=tmp_path)
    with pytest.raises(release.ReleaseError, match="carries version"):
        release.build_release(registry="127.0.0.1:1/x", out=tmp_path, version="99.0.0")
