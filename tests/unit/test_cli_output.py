"""The ``-o`` vocabulary of ``lmeval``: parsing the values and rendering objects with them.

Checks: each command's offered formats are accepted and anything else is
refused naming what is offered (kubectl-only formats say so); ``jsonpath=``
templates render as kubectl's do on kubectl's own examples (a field, every
item, ``range``/``end`` with quoted strings, filters, escaped dots in label
keys, nested objects as JSON, a missing field as nothing) and unsupported
or malformed templates are usage errors (exit 3); ``custom-columns=`` makes
one column per ``HEADER:EXPR`` with ``<none>`` for a missing value and
refuses a malformed spec; ``-o name`` is kubectl's qualified name; several
objects print as one ``kind: List`` in json and yaml, one object as itself.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml
from lmeval_cli import output
from lmeval_cli.errors import CliError, ExitCode
from lmeval_cli.render import Output

JOBS: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {
            "metadata": {
                "name": "base",
                "namespace": "team-a",
                "labels": {"app.kubernetes.io/name": "eval", "team": "nlp"},
            },
            "spec": {"tasks": ["arc_easy", "hellaswag"], "limit": "10"},
            "status": {
                "state": "Complete",
                "reason": "Succeeded",
                "conditions": [
                    {"type": "Finished", "status": "True"},
                    {"type": "Succeeded", "status": "True"},
                ],
            },
        },
        {
            "metadata": {"name": "cand", "namespace": "team-a"},
            "spec": {"tasks": ["arc_easy"]},
            "status": {"state": "Running"},
        },
    ],
}


def render(template: str, obj: Any = JOBS) -> str:
    return output.parse_template(template).render(obj)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{.kind}", "List"),
        ("{.items[*].metadata.name}", "base cand"),
        ("{.items[0].metadata.name}", "base"),
        ("{.items[-1].metadata.name}", "cand"),
        ("{$.items[1].status.state}", "Running"),
        (
            '{range .items[*]}{.metadata.name}{"\\t"}{.status.state}{"\\n"}{end}',
            "base\tComplete\ncand\tRunning\n",
        ),
        ("{range .items[*]}[{@.metadata.name}]{end}", "[base][cand]"),
        ('{.items[?(@.status.state=="Running")].metadata.name}', "cand"),
        (
            '{.items[0].status.conditions[?(@.type=="Succeeded")].status}',
            "True",
        ),
        ("{.items[0].metadata.labels.app\\.kubernetes\\.io/name}", "eval"),
        ("{.items[0].metadata.labels['app.kubernetes.io/name']}", "eval"),
        ("{.items[0].spec.tasks}", '["arc_easy","hellaswag"]'),
        ("{.items[0].spec.tasks[*]}", "arc_easy hellaswag"),
        ("{..state}", "Complete Running"),
        ("name: {.items[0].metadata.name}!", "name: base!"),
        ("{.items[1].status.reason}", ""),  # missing: nothing, as kubectl by default
        ("{.items[0:1].metadata.name}", "base"),
    ],
)
def test_jsonpath_templates_render_as_kubectl(template: str, expected: str) -> None:
    assert render(template) == expected


def test_range_nests_and_is_relative_to_the_current_item() -> None:
    template = '{range .items[*]}{.metadata.name}:{range .spec.tasks[*]} {@}{end}{"\\n"}{end}'
    assert render(template) == "base: arc_easy hellaswag\ncand: arc_easy\n"


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("", "empty template"),
        ("{.items", "unclosed action"),
        ("{end}", "{end} without {range"),
        ("{range .items[*]}{.x}", "without {end}"),
        ("{if .x}", "{if} is not supported"),
        ("{template}", "{template} is not supported"),
        ("{}", "empty action"),
        ("{.items[}", "cannot parse"),
        ('{"\\q"}', "bad quoted string"),
        ("{range}{end}", "needs an expression"),
    ],
)
def test_unsupported_or_malformed_templates_are_usage_errors(template: str, words: str) -> None:
    with pytest.raises(CliError) as refused:
        output.parse_template(template)
    assert refused.value.code == ExitCode.USAGE == 3
    assert words in refused.value.message


def test_custom_columns() -> None:
    columns = output.custom_columns(
        "NAME:.metadata.name,STATE:{.status.state},TEAM:metadata.labels.team,TASKS:.spec.tasks[*]"
    )
    assert output.columns_grid(columns, JOBS["items"]) == (
        ["NAME", "STATE", "TEAM", "TASKS"],
        [
            ["base", "Complete", "nlp", "arc_easy,hellaswag"],
            ["cand", "Running", "<none>", "arc_easy"],
        ],
    )
    for spec in ("", "NAME", "NAME:", ":.metadata.name", "NAME:.metadata.name,STATE"):
        with pytest.raises(CliError) as refused:
            output.custom_columns(spec)
        assert refused.value.code == ExitCode.USAGE


def test_formats_are_offered_per_command() -> None:
    assert output.parse_format("json", output.OBJECT_FORMATS) == output.Format("json")
    jsonpath = output.parse_format("jsonpath={.metadata.name}", output.OBJECT_FORMATS)
    assert jsonpath.name == "jsonpath" and jsonpath.template is not None
    assert (
        output.parse_format("custom-columns=N:.a", output.OBJECT_FORMATS).columns[0].header == "N"
    )
    assert output.parse_format("markdown", output.TABLE_FORMATS).name == "markdown"
    cases = [
        ("wide", output.OBJECT_FORMATS, "use one of json, yaml, name, jsonpath=..."),
        ("yaml", output.TABLE_FORMATS, "use one of table, csv, markdown, json"),
        ("go-template={{.x}}", output.OBJECT_FORMATS, "go-template is kubectl's"),
        ("json=x", output.OBJECT_FORMATS, "takes no value"),
        ("jsonpath=", output.OBJECT_FORMATS, "empty template"),
    ]
    for text, offered, words in cases:
        with pytest.raises(CliError) as refused:
            output.parse_format(text, offered)
        assert refused.value.code == ExitCode.USAGE
        assert words in refused.value.message, refused.value.message


def _printed(fmt: str, objects: list[dict[str, Any]], *, single: bool) -> str:
    stdout = io.StringIO()
    out = Output(stdout, io.StringIO())
    output.print_objects(
        out, output.parse_format(fmt, output.OBJECT_FORMATS), objects, single=single
    )
    return stdout.getvalue()


def test_printing_one_object_or_a_list() -> None:
    one, two = JOBS["items"]
    assert json.loads(_printed("json", [one], single=True)) == one
    listed = yaml.safe_load(_printed("yaml", [one, two], single=False))
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == [
        "base",
        "cand",
    ]
    # Selected by a label, even one job is a List (as kubectl).
    assert json.loads(_printed("json", [one], single=False))["kind"] == "List"
    assert _printed("name", [one, two], single=False) == (
        "lmevaljob.foundation-model-stack.github.com/base\n"
        "lmevaljob.foundation-model-stack.github.com/cand\n"
    )
    # jsonpath: exactly the template's text, no newline added (as kubectl).
    assert _printed("jsonpath={.metadata.name}", [one], single=True) == "base"
    assert _printed("jsonpath={.items[*].metadata.name}", [one, two], single=False) == "base cand"
    table = _printed(
        "custom-columns=NAME:.metadata.name,STATE:.status.state", [one, two], single=False
    )
    assert [line.split() for line in table.splitlines()] == [
        ["NAME", "STATE"],
        ["base", "Complete"],
        ["cand", "Running"],
    ]
