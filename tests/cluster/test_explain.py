"""`kubectl explain lmevaljob` shows every field's description, as a real apiserver publishes it.

The CRD's descriptions reach users through the apiserver's OpenAPI v3
document for the group, which is what ``kubectl explain`` reads. Checks,
after the repository's CRD is applied to the suite's control plane: the
published document (``/openapi/v3/apis/<group>/<version>``) carries, for every
property under LMEvalJob's spec and status (at every depth), the description
the CRD file holds; and the real ``kubectl explain lmevaljob.spec --recursive``
lists spec's fields at every depth, while ``kubectl explain lmevaljob.spec.pod``
prints spec.pod's description and those of its fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.crd import CRD_PATH

from poller import api
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

OPENAPI_PATH = f"/openapi/v3/apis/{api.API_GROUP}/{api.API_VERSION}"
# How the apiserver names the kind in the document's components.
SCHEMA_NAME = ".".join([*reversed(api.API_GROUP.split(".")), api.API_VERSION, api.KIND])


def _crd_schema() -> dict[str, Any]:
    (version,) = yaml.safe_load(CRD_PATH.read_text())["spec"]["versions"]
    return dict(version["schema"]["openAPIV3Schema"])


def _descriptions(schema: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """(path, description) of every property below `schema` (lists as [], map values as {})."""
    for name, sub in schema.get("properties", {}).items():
        yield f"{path}.{name}", sub.get("description", "")
        yield from _descriptions(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _descriptions(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _descriptions(schema["additionalProperties"], f"{path}{{}}")


def _published(plane: ControlPlane) -> dict[str, Any] | None:
    """LMEvalJob's schema in the apiserver's OpenAPI v3 document, once it is there."""
    done = plane.kubectl("get", "--raw", OPENAPI_PATH, check=False)
    if done.returncode != 0:
        return None
    schemas = json.loads(done.stdout).get("components", {}).get("schemas", {})
    found = schemas.get(SCHEMA_NAME)
    return dict(found) if found else None


def _flat(text: str) -> str:
    """Text with its line wrapping and indentation undone, as kubectl explain wraps it."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def published(poller_installed: ControlPlane) -> dict[str, Any]:
    """The schema the apiserver serves, once it serves this CRD's descriptions."""
    wanted = _crd_schema()["properties"]["spec"]["properties"]["pod"]["description"]

    def current() -> dict[str, Any] | None:
        schema = _published(poller_installed)
        pod = (schema or {}).get("properties", {}).get("spec", {}).get("properties", {})
        return schema if pod.get("pod", {}).get("description") == wanted else None

    # The apiserver publishes a CRD's OpenAPI asynchronously after it is established.
    return wait_for(current, timeout=60, interval=0.5, what=f"{SCHEMA_NAME} in {OPENAPI_PATH}")


@pytest.mark.parametrize("part", ["spec", "status"])
def test_the_openapi_document_describes_every_property(
    published: dict[str, Any], part: str
) -> None:
    expected = dict(_descriptions(_crd_schema()["properties"][part], part))
    served = dict(_descriptions(published["properties"][part], part))
    assert len(expected) > 40, f"the walk found only {len(expected)} properties under {part}"
    assert sorted(served) == sorted(expected), "the served schema has other properties"
    undescribed = [path for path, text in served.items() if not text.strip()]
    assert not undescribed, f"served without a description: {undescribed}"
    differing = [path for path, text in served.items() if text != expected[path]]
    assert not differing, f"served with another description than the CRD's: {differing}"


def _explain(plane: ControlPlane, cache: Path, *args: str) -> str:
    # A cache of this run's own: discovery and OpenAPI of an earlier plane never answer.
    done = plane.kubectl("explain", f"--cache-dir={cache}", *args)
    return done.stdout


def test_explain_recursive_lists_every_spec_field(
    published: dict[str, Any], poller_installed: ControlPlane, tmp_path: Path
) -> None:
    text = _explain(poller_installed, tmp_path, "lmevaljob.spec", "--recursive")
    print(text)
    assert f"KIND:       {api.KIND}" in text or f"KIND:     {api.KIND}" in text
    spec = _crd_schema()["properties"]["spec"]
    # Every field name at every depth, each on a line of its own (indented by depth).
    names = {path.rsplit(".", 1)[-1].rstrip("[]{}") for path, _ in _descriptions(spec, "spec")}
    listed = set(re.findall(r"^\s+([A-Za-z][A-Za-z0-9]*)\b", text, re.MULTILINE))
    assert not names - listed, f"fields kubectl explain --recursive does not list: {names - listed}"
    assert "requiredDuringSchedulingIgnoredDuringExecution" in listed
    # spec's own description heads the page.
    assert _flat(spec["description"]) in _flat(text)


def test_explain_pod_prints_the_descriptions(
    published: dict[str, Any], poller_installed: ControlPlane, tmp_path: Path
) -> None:
    text = _explain(poller_installed, tmp_path, "lmevaljob.spec.pod")
    print(text)
    pod = _crd_schema()["properties"]["spec"]["properties"]["pod"]
    flat = _flat(text)
    assert _flat(pod["description"]) in flat, "spec.pod's own description is not printed"
    assert "restricted Pod Security profile" in flat
    for name, field in pod["properties"].items():
        assert name in text
        assert _flat(field["description"]) in flat, f"spec.pod.{name}'s description is missing"
