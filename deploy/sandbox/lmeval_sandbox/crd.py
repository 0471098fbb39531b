"""Generate the LMEvalJob CustomResourceDefinition from the pydantic models.

The CRD is derived, never hand-edited: ``python -m lmeval_sandbox.crd`` rewrites
``crds/lmevaljobs.yaml`` and ``python -m lmeval_sandbox.crd --check`` fails when the
committed file and the models disagree (a test runs the check). pydantic's
JSON Schema is close to what the apiserver wants; the differences handled
here are the ones a *structural* schema requires: every ``$ref`` inlined, no
``anyOf`` for optional fields, no titles, and Kubernetes' own extensions
(``x-kubernetes-int-or-string``, list-map keys for conditions, exclusive
bounds in OpenAPI v3's form). Rules a
schema keyword cannot say arrive from the models as CEL
``x-kubernetes-validations`` (see ``poller.api.rules``) and pass through,
merged with the CEL rule that stands in for a map's key pattern.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from poller import api
from poller.api.rules import VALIDATIONS as _VALIDATIONS

__all__ = [
    "CRD_PATH",
    "CRD_PATHS",
    "SUITE_CRD_PATH",
    "crd_manifest",
    "render",
    "render_suite",
    "suite_crd_manifest",
]

CRD_PATH = Path(__file__).resolve().parents[3] / "crds" / "lmevaljobs.yaml"
SUITE_CRD_PATH = CRD_PATH.with_name("lmevalsuites.yaml")
# Both kinds, in the order they are applied (a suite's runs are LMEvalJobs).
CRD_PATHS = (CRD_PATH, SUITE_CRD_PATH)

_DROP = {"title", "default", "examples"}
# Bound on a map whose keys are checked in CEL, so that the rule's cost is too.
MAP_KEYS_MAX = 64


def _key_rule(pattern: str, names: dict[str, Any]) -> dict[str, str]:
    """The CEL rule standing in for patternProperties (and propertyNames' maxLength)."""
    if "'" in pattern or "\\" in pattern:
        raise ValueError(f"key pattern {pattern!r} cannot go into a CEL literal as it is")
    check = f"k.matches('{pattern}')"
    message = f"every key must match {pattern}"
    if "maxLength" in names:
        check = f"size(k) <= {names['maxLength']} && {check}"
        message += f" and have at most {names['maxLength']} characters"
    return {"rule": f"self.all(k, {check})", "message": message}


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in schema:
        # Optional[X] is "X or null": omitting the field is how Kubernetes
        # says null, so keep X and carry the outer description over.
        branches = [b for b in schema["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express anyOf with {len(branches)} branches structurally")
        outer = {k: v for k, v in schema.items() if k != "anyOf"}
        return _structural({**branches[0], **outer}, defs)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key == "additionalProperties" and value is False:
            continue  # structural schemas forbid it; the apiserver prunes unknown fields
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        elif key == "patternProperties":
            # Structural schemas have no patternProperties: check the keys with
            # a CEL rule instead, and bound the map so the rule's cost is too.
            ((pattern, sub),) = value.items()
            out["additionalProperties"] = _structural(sub, defs)
            out["maxProperties"] = MAP_KEYS_MAX
            rule = _key_rule(pattern, schema.get("propertyNames", {}))
            out[_VALIDATIONS] = [rule, *out.get(_VALIDATIONS, [])]
        elif key == "propertyNames":
            continue  # not allowed in a structural schema: folded into the key rule above
        elif key == _VALIDATIONS:
            out[key] = [*out.get(key, []), *value]
        elif key == "enum":
            out[key] = list(value)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema 2020's number form; OpenAPI v3 (Kubernetes) says the
            # bound in minimum/maximum and flags it exclusive.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = value
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        # a pattern on int-or-string applies to the string form only
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


def crd_manifest() -> dict[str, Any]:
    """The CRD as a Python object."""
    status = _status_schema()
    spec = _schema(api.LMEvalJobSpec)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.API_GROUP}"},
        "spec": {
            "group": api.API_GROUP,
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.KIND.lower(),
                "shortNames": [api.SHORT_NAME],
                "categories": ["all"],
            },
            "scope": "Namespaced",
            "versions": [_version(spec, status)],
        },
    }


def _status_schema() -> dict[str, Any]:
    status = _schema(api.LMEvalJobStatus)
    # Keyed by type, as Kubernetes conventions have it: the apiserver refuses two of one type.
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return status


def _version(spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The one served and stored version of the API."""
    return {
        "name": api.API_VERSION,
        "served": True,
        "storage": True,
        "subresources": {"status": {}},
        # The poller's hot cycle lists only unfinished jobs
        # (status.state!=Complete) and users may select by state
        # too: kubectl get lmej --field-selector status.state=Running.
        "selectableFields": [{"jsonPath": ".status.state"}],
        "additionalPrinterColumns": _printer_columns(),
        "schema": {"openAPIV3Schema": _root_schema(spec, status)},
    }


def _printer_columns() -> list[dict[str, Any]]:
    """kubectl get's columns; priority 1 ones only with -o wide."""
    return [
        {"name": "State", "type": "string", "jsonPath": ".status.state"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
        {"name": "Progress", "type": "string", "jsonPath": ".status.progress.line"},
        {"name": "Shards", "type": "string", "jsonPath": ".status.shardsDone", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Model", "type": "string", "jsonPath": ".spec.model", "priority": 1},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
        {
            "name": "Regressed",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Regressed")].status',
            "priority": 1,
        },
    ]


def _root_schema(spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The whole object's schema, with the rules that need more than spec to check."""
    return {
        "type": "object",
        "description": "An lm-evaluation-harness run, executed by the "
        "lmeval poller in a pod of its own.",
        "required": ["spec"],
        # Only the root may read metadata.name.
        _VALIDATIONS: [
            {
                "rule": "!has(self.spec.baseline) || self.spec.baseline != self.metadata.name",
                "message": "spec.baseline names this job itself",
                "fieldPath": ".spec.baseline",
            }
        ],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


_HEADER = "# Generated by `python -m lmeval_sandbox.crd` from poller/api/. Do not edit.\n"


def render() -> str:
    """The LMEvalJob CRD as the YAML text committed in ``crds/``."""
    return _HEADER + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)


def render_suite() -> str:
    """The LMEvalSuite CRD as the YAML text committed in ``crds/``."""
    return _HEADER + yaml.safe_dump(suite_crd_manifest(), sort_keys=False, width=100)


def suite_crd_manifest() -> dict[str, Any]:
    """The LMEvalSuite CRD: the spec embeds an LMEvalJob spec (its template)."""
    status = _schema(api.LMEvalSuiteStatus)
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    root = {
        "type": "object",
        "description": "Evaluations that run again on a schedule, when the model changes or "
        "by hand, each judged against a baseline by the lmeval poller.",
        "required": ["spec"],
        _VALIDATIONS: [
            {
                "rule": f"size(self.metadata.name) <= {api.SUITE_NAME_MAX}",
                "message": f"metadata.name: a suite's name has at most {api.SUITE_NAME_MAX} "
                "characters (its runs and their pods are named after it)",
            }
        ],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _schema(api.LMEvalSuiteSpec),
            "status": status,
        },
    }
    columns = [
        {"name": "Verdict", "type": "string", "jsonPath": ".status.lastVerdict"},
        {"name": "Schedule", "type": "string", "jsonPath": ".spec.triggers.schedule.cron"},
        {"name": "Last Run", "type": "date", "jsonPath": ".status.runs[-1:].started"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.SUITE_PLURAL}.{api.API_GROUP}"},
        "spec": {
            "group": api.API_GROUP,
            "names": {
                "kind": api.SUITE_KIND,
                "listKind": f"{api.SUITE_KIND}List",
                "plural": api.SUITE_PLURAL,
                "singular": api.SUITE_KIND.lower(),
                "shortNames": [api.SUITE_SHORT_NAME],
                "categories": ["all"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmeval_sandbox.crd", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = parser.parse_args(argv)
    stale = 0
    for path, text in ((CRD_PATH, render()), (SUITE_CRD_PATH, render_suite())):
        if args.check:
            if not path.exists() or path.read_text() != text:
                print(f"{path} is out of date: run `python -m lmeval_sandbox.crd`", file=sys.stderr)
                stale = 1
            continue
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
