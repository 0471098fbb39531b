"""Every property of the generated LMEvalJob CRD says what it is, as `kubectl explain` shows it.

Walks the schema that ``python -m lmeval_sandbox.crd`` writes (spec and
status, at every depth: object properties, the items of lists and the values
of maps that have properties) and checks that each property has a
description of reasonable length, in one paragraph (kubectl explain prints
line breaks as they are); that a property with a bound in the
schema (maxLength, maxItems, maxProperties, minimum, maximum, also on the
strings a list or map holds) names that bound; that a field with a default
in the models says so; that every value of an enum-like field (an enum, or
a pattern of bare alternatives such as ``^(TCP|UDP|SCTP)$``) is named in its
description; and that status.state, status.reason and the conditions explain
every state, reason, condition type and condition reason the poller writes,
with one text for the state and reason descriptions and the public
``STATE_DOCS`` / ``REASON_DOCS`` mappings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from lmeval_sandbox import crd
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from poller import api
from poller.api.status import REASON_DOCS, STATE_DOCS
from poller.decisions import outcome, regression

# Long enough to say something; short enough that kubectl explain stays readable
# (the status.state/reason/conditions texts explain several values each).
DESCRIPTION_MIN = 12
DESCRIPTION_MAX = 1800
# Schema keywords whose value is a bound the description must name.
BOUNDS = ("maxLength", "maxItems", "maxProperties", "minimum", "maximum")
# A pattern that is a plain choice among words, e.g. ^(Exists|Equal)$.
CHOICE = re.compile(r"^\^\(([A-Za-z]+(?:\|[A-Za-z]+)+)\)\$$")


def _schemas() -> dict[str, dict[str, Any]]:
    (version,) = crd.crd_manifest()["spec"]["versions"]
    root = version["schema"]["openAPIV3Schema"]["properties"]
    return {"spec": root["spec"], "status": root["status"]}


def _properties(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property below `schema`, with its path (lists as [], map values as {})."""
    for name, sub in schema.get("properties", {}).items():
        yield f"{path}.{name}", sub
        yield from _properties(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _properties(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _properties(schema["additionalProperties"], f"{path}{{}}")


PROPERTIES = [pair for name, schema in _schemas().items() for pair in _properties(schema, name)]


def _spellings(value: float) -> set[str]:
    """How a bound may be written: 253, 32,768, 1e9."""
    if float(value).is_integer():
        whole = int(value)
        short = f"{value:g}".replace("e+0", "e").replace("e+", "e")
        return {str(whole), f"{whole:,}", short}
    return {str(value), f"{value:g}"}


def _bounds(schema: dict[str, Any]) -> list[tuple[str, float]]:
    """The schema's own bounds, and those of the scalars a list or map holds."""
    found = [(key, schema[key]) for key in BOUNDS if key in schema]
    for key in ("items", "additionalProperties"):
        inner = schema.get(key)
        if isinstance(inner, dict) and "properties" not in inner:
            found += [(f"{key}.{bound}", inner[bound]) for bound in BOUNDS if bound in inner]
    return found


def _choices(schema: dict[str, Any]) -> list[str]:
    if "enum" in schema:
        return [str(value) for value in schema["enum"]]
    match = CHOICE.match(schema.get("pattern", ""))
    return match.group(1).split("|") if match else []


def test_the_walk_reaches_every_depth() -> None:
    """The walk itself: list items and nested objects are visited (else it checks little)."""
    paths = {path for path, _ in PROPERTIES}
    assert "spec.pod.sidecars[].ports[].containerPort" in paths
    assert (
        "spec.pod.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution"
        "[].podAffinityTerm.labelSelector.matchExpressions[].values" in paths
    )
    assert "status.conditions[].reason" in paths
    assert len(PROPERTIES) > 250


def test_every_property_has_a_description() -> None:
    missing = [path for path, schema in PROPERTIES if not schema.get("description", "").strip()]
    assert not missing, f"{len(missing)} of {len(PROPERTIES)} without a description: {missing}"


def test_descriptions_are_of_reasonable_length() -> None:
    wrong = [
        f"{path} ({len(text)})"
        for path, schema in PROPERTIES
        if (text := schema.get("description", ""))
        and not DESCRIPTION_MIN <= len(text) <= DESCRIPTION_MAX
    ]
    assert not wrong, f"descriptions outside {DESCRIPTION_MIN}..{DESCRIPTION_MAX}: {wrong}"


def test_descriptions_are_one_paragraph() -> None:
    """kubectl explain re-wraps a description but prints its line breaks as they are."""
    (version,) = crd.crd_manifest()["spec"]["versions"]
    root = version["schema"]["openAPIV3Schema"]["properties"]
    pairs = [("spec", root["spec"]), ("status", root["status"]), *PROPERTIES]
    broken = [path for path, schema in pairs if "\n" in schema.get("description", "")]
    assert not broken, f"descriptions with line breaks: {broken}"


def test_every_bound_is_named() -> None:
    unnamed = [
        f"{path}: {key}={value}"
        for path, schema in PROPERTIES
        for key, value in _bounds(schema)
        if not any(word in schema.get("description", "") for word in _spellings(value))
    ]
    assert not unnamed, f"bounds the description does not name: {unnamed}"


def test_every_choice_is_named() -> None:
    unnamed = [
        f"{path}: {choice}"
        for path, schema in PROPERTIES
        for choice in _choices(schema)
        if choice not in schema.get("description", "")
    ]
    assert not unnamed, f"values the description does not name: {unnamed}"


def _models() -> list[type[BaseModel]]:
    exported = (getattr(api, name) for name in api.__all__)
    return [m for m in exported if isinstance(m, type) and issubclass(m, BaseModel)]


def test_every_default_is_said() -> None:
    """A default the model applies (a value, not None) is in the field's description."""
    assert len(_models()) > 40
    silent = [
        f"{model.__name__}.{name}={field.default!r}"
        for model in _models()
        for name, field in model.model_fields.items()
        if field.default is not PydanticUndefined
        and field.default is not None
        and "default" not in (field.description or "").lower()
    ]
    assert not silent, f"defaults the description does not say: {silent}"


def _status(path: str) -> str:
    return str(dict(PROPERTIES)[path]["description"])


@pytest.mark.parametrize(("path", "enum", "docs"), [
    ("status.state", api.JobState, STATE_DOCS),
    ("status.reason", api.JobReason, REASON_DOCS),
])  # fmt: skip
def test_state_and_reason_explain_every_value_from_one_text(
    path: str, enum: type[api.JobState] | type[api.JobReason], docs: dict[Any, str]
) -> None:
    assert set(docs) == set(enum), f"{path}: the docs mapping covers {sorted(docs)}"
    text = _status(path)
    for value in enum:
        assert value.value in text, f"{path} does not name {value.value}"
        assert docs[value] in text, f"{path} does not use the docs text of {value.value}"
        assert len(docs[value]) > 30, f"{value.value}: too short to say what to do"


def test_conditions_explain_every_type_and_reason() -> None:
    types = _status("status.conditions[].type")
    assert [t.value for t in api.ConditionType if t.value not in types] == []
    reasons = _status("status.conditions[].reason")
    written = [
        regression.REGRESSED, regression.NOT_REGRESSED, regression.WAITING_FOR_BASELINE,
        regression.BASELINE_MISSING, regression.BASELINE_FAILED, regression.NO_ITEM_SCORES,
        regression.NOT_COMPARABLE, regression.JOB_NOT_SUCCEEDED, regression.INVALID_GATE,
        outcome.TASK_SOURCE_MISMATCH,
        # decisions.scheduling, .decide, .outcome, .kueueadmission, cycle.act, cycle.poison:
        # the reasons they pass to conditions and to a job's finish.
        "PodCreated", "Queued", "ContainerRunning", "Finished", "Suspended", "Resumed",
        "Admitted", "KueueQueued", "KueueInadmissible", "Pushed", "PushFailed",
        "Succeeded", "Failed", "Cancelled", "SpecChanged", "DeadlineExceeded", "AlteredPod",
        "ForeignPod", "ForeignObject", "Evicted", "PodFailed", "PodDeleted",
        "PodPendingTimeout", "Unschedulable", "ImagePullBackOff", "UnreadableJob",
        "PollerError", "OOMKilled",
    ]  # fmt: skip
    assert [r for r in written if r not in reasons] == []
