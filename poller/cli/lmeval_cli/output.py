"""The one ``-o/--output`` vocabulary of ``lmeval``, parsed and printed in one place.

Why this module exists: people who use kubectl expect ``-o`` to take the same
values on every command (``json``, ``yaml``, ``wide``, ``name``,
``jsonpath=TEMPLATE``, ``custom-columns=SPEC``), and scripts break when one
command spells a format differently from the next. Every command declares
which of these it offers (:func:`add_output`) and prints its objects through
:func:`print_objects`, so a format behaves the same wherever it is accepted.
A value a command does not offer, or a template that cannot be parsed, is a
usage error (exit 3) before any request is made.

``jsonpath=`` follows kubectl's template syntax: text outside braces is
printed as is; ``{.a.b}`` (or ``{$.a.b}``, ``{@.a.b}``) prints what the
expression finds, several matches separated by spaces; ``{"\\n"}`` is a
quoted string (JSON escapes); ``{range EXPR}...{end}`` repeats its body for
every match, with ``.`` (and ``@``) meaning the current match inside it.
The expressions inside braces are evaluated by jsonpath-ng (its extended
parser, for kubectl's filters such as ``[?(@.type=="Succeeded")]``) after a
small translation of kubectl's spelling: a leading ``.`` is rooted at the
current object, and a field name with escaped dots (``app\\.kubernetes\\.io``)
or other characters is quoted. A missing field prints nothing, as kubectl's
default ``--allow-missing-template-keys=true`` does. ``custom-columns=`` takes
``HEADER:EXPR`` pairs separated by commas; a column without a value shows
``<none>``, several values are joined by commas.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonpath_ng import JSONPath
from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.ext.parser import parse as jsonpath_parse

from lmeval_cli import render
from lmeval_cli.errors import CliError, ExitCode
from poller.cliapi import api

__all__ = [
    "OBJECT_FORMATS",
    "RESOURCE",
    "SUITE_RESOURCE",
    "TABLE_FORMATS",
    "Format",
    "Template",
    "add_output",
    "custom_columns",
    "list_object",
    "parse_format",
    "parse_template",
    "print_objects",
    "qualified_name",
]

# How kubectl names an LMEvalJob in `-o name` and in `delete`'s lines, and an LMEvalSuite.
RESOURCE = f"{api.KIND.lower()}.{api.API_GROUP}"
SUITE_RESOURCE = f"{api.SUITE_KIND.lower()}.{api.API_GROUP}"
# The formats that print the objects themselves, whatever the command.
OBJECT_FORMATS = ("json", "yaml", "name", "jsonpath", "custom-columns")
# The formats of tables of scores (results, compare).
TABLE_FORMATS = ("table", "csv", "markdown", "json")
_WITH_VALUE = ("jsonpath", "custom-columns")
# What kubectl offers and lmeval does not, so the error can say so.
_NOT_OFFERED = ("go-template", "go-template-file", "jsonpath-file", "jsonpath-as-json")
NONE_CELL = "<none>"


# -- jsonpath templates ---------------------------------------------------------------


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Lookup:
    source: str
    path: JSONPath


@dataclass(frozen=True)
class _Range:
    source: str
    path: JSONPath
    body: tuple[_Node, ...]


_Node = _Text | _Lookup | _Range


@dataclass(frozen=True)
class Template:
    """A parsed kubectl jsonpath template; :meth:`render` applies it to one object."""

    source: str
    nodes: tuple[_Node, ...]

    def render(self, obj: Any) -> str:
        return "".join(_run(self.nodes, obj))


def _run(nodes: Sequence[_Node], current: Any) -> Iterable[str]:
    for node in nodes:
        if isinstance(node, _Text):
            yield node.text
        elif isinstance(node, _Lookup):
            yield " ".join(_text(value) for value in _find(node.path, current))
        else:
            for value in _find(node.path, current):
                yield from _run(node.body, value)


def _find(path: JSONPath, obj: Any) -> list[Any]:
    return [match.value for match in path.find(obj)]


def _text(value: Any) -> str:
    """A value as kubectl prints it: strings bare, everything else as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":"))


def _template_error(source: str, why: str) -> CliError:
    return CliError(f"jsonpath template {source!r}: {why}", ExitCode.USAGE)


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _quote_name(name: str) -> str:
    """A field name as jsonpath-ng reads it: bare when plain, else quoted."""
    name = name.replace("\\.", ".")
    if _PLAIN_NAME.fullmatch(name) or name == "*":
        return name
    return "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _translate(expression: str) -> str:
    """kubectl's expression spelling (``.a.b``, ``@.a``, ``a\\.b``) as jsonpath-ng's ``$...``."""
    text = expression.strip()
    if text.startswith(("$", "@")):
        text = text[1:]
    out, i = ["$"], 0
    while i < len(text):
        char = text[i]
        if char == "[":
            # Brackets (indexes, slices, filters, quoted keys) pass through whole.
            depth, j, quote = 0, i, ""
            while j < len(text):
                c = text[j]
                if quote:
                    if c == "\\":
                        j += 1
                    elif c == quote:
                        quote = ""
                elif c in "'\"":
                    quote = c
                elif c == "[":
                    depth += 1
                elif c == "]":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            if j >= len(text):
                raise ValueError("unclosed [")
            out.append(text[i : j + 1])
            i = j + 1
        elif char == ".":
            dots = 2 if text.startswith("..", i) else 1
            i += dots
            j = i
            while j < len(text) and text[j] not in ".[":
                j += 2 if text[j] == "\\" else 1
            name = text[i:j]
            out.append("." * dots + (_quote_name(name) if name else ""))
            i = j
        else:
            # A bare first name (custom-columns' relaxed `metadata.name`).
            j = i
            while j < len(text) and text[j] not in ".[":
                j += 2 if text[j] == "\\" else 1
            out.append("." + _quote_name(text[i:j]))
            i = j
    translated = "".join(out)
    return translated.rstrip(".") if translated not in ("$.", "$..") else "$"


def _compile(expression: str, source: str) -> JSONPath:
    try:
        path: JSONPath = jsonpath_parse(_translate(expression))
    except (ValueError, JsonPathLexerError, JsonPathParserError) as error:
        raise _template_error(source, f"cannot parse {{{expression}}}: {error}") from None
    return path


def _split_actions(source: str) -> list[tuple[bool, str]]:
    """(is_action, text) pieces of a template: text outside braces, actions inside."""
    pieces: list[tuple[bool, str]] = []
    i = 0
    while i < len(source):
        start = source.find("{", i)
        if start < 0:
            pieces.append((False, source[i:]))
            break
        if start > i:
            pieces.append((False, source[i:start]))
        j, quote = start + 1, ""
        while j < len(source):
            c = source[j]
            if quote:
                if c == "\\":
                    j += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c == "}":
                break
            j += 1
        if j >= len(source):
            raise _template_error(source, "unclosed action: a { without its }")
        pieces.append((True, source[start + 1 : j]))
        i = j + 1
    return pieces


def parse_template(source: str) -> Template:
    """A kubectl jsonpath template; CliError (exit 3) naming what is not supported."""
    if not source:
        raise _template_error(source, "empty template (e.g. jsonpath='{.metadata.name}')")
    stack: list[tuple[str, JSONPath, list[_Node]]] = []
    nodes: list[_Node] = []
    for is_action, text in _split_actions(source):
        if not is_action:
            nodes.append(_Text(text))
            continue
        action = text.strip()
        if action.startswith('"'):
            try:
                literal = json.loads(action)
            except ValueError:
                raise _template_error(source, f"bad quoted string {action}") from None
            nodes.append(_Text(str(literal)))
        elif action == "end":
            if not stack:
                raise _template_error(source, "{end} without {range ...}")
            expression, path, outer = stack.pop()
            outer.append(_Range(expression, path, tuple(nodes)))
            nodes = outer
        elif action.startswith("range ") or action == "range":
            expression = action[len("range") :].strip()
            if not expression:
                raise _template_error(source, "{range} needs an expression")
            stack.append((expression, _compile(expression, source), nodes))
            nodes = []
        elif action == "":
            raise _template_error(source, "empty action {}")
        elif action.startswith(("$", "@", ".", "[")):
            nodes.append(_Lookup(action, _compile(action, source)))
        else:
            word = action.split()[0]
            raise _template_error(
                source,
                f"{{{word}}} is not supported: actions are expressions such as .metadata.name, "
                'quoted strings such as "\\n", and {range EXPR}...{end}',
            )
    if stack:
        raise _template_error(source, f"{{range {stack[-1][0]}}} without {{end}}")
    return Template(source, tuple(nodes))


# -- custom columns ---------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    header: str
    source: str
    path: JSONPath


def custom_columns(spec: str) -> tuple[Column, ...]:
    """``NAME:.metadata.name,STATE:.status.state`` as columns; CliError (exit 3) if malformed."""
    if not spec:
        raise CliError(
            "custom-columns needs a spec, e.g. custom-columns=NAME:.metadata.name", ExitCode.USAGE
        )
    columns = []
    for part in spec.split(","):
        header, colon, expression = part.partition(":")
        expression = expression.strip()
        if not colon or not header or not expression:
            raise CliError(
                f"custom-columns: {part!r} is not HEADER:EXPRESSION "
                "(e.g. NAME:.metadata.name,STATE:.status.state)",
                ExitCode.USAGE,
            )
        if expression.startswith("{") and expression.endswith("}"):
            expression = expression[1:-1]
        columns.append(Column(header, expression, _compile(expression, spec)))
    return tuple(columns)


def _cell(column: Column, obj: Any) -> str:
    values = _find(column.path, obj)
    if not values:
        return NONE_CELL
    return ",".join(_text(v) for v in values) or NONE_CELL


def columns_grid(columns: Sequence[Column], objects: Sequence[Any]) -> render.Grid:
    return [c.header for c in columns], [[_cell(c, obj) for c in columns] for obj in objects]


# -- the -o flag ------------------------------------------------------------------------


@dataclass(frozen=True)
class Format:
    """One parsed ``-o`` value: its name, and the template or columns it carries."""

    name: str
    template: Template | None = None
    columns: tuple[Column, ...] = field(default=())


def parse_format(text: str, offered: Sequence[str]) -> Format:
    """``-o`` `text` among the `offered` format names; CliError (exit 3) otherwise."""
    name, equals, value = text.partition("=")
    name = name.strip()
    if name not in offered:
        also = f" ({name} is kubectl's, not offered by lmeval)" if name in _NOT_OFFERED else ""
        shown = ", ".join(f"{o}=..." if o in _WITH_VALUE else o for o in offered)
        raise CliError(
            f"unsupported output format {text!r}{also}: use one of {shown}", ExitCode.USAGE
        )
    if name == "jsonpath":
        return Format(name, template=parse_template(value))
    if name == "custom-columns":
        return Format(name, columns=custom_columns(value))
    if equals:
        raise CliError(f"output format {name} takes no value (got {text!r})", ExitCode.USAGE)
    return Format(name)


def _format_type(offered: Sequence[str]) -> Callable[[str], Format]:
    def parse(text: str) -> Format:
        try:
            return parse_format(text, offered)
        except CliError as error:
            raise argparse.ArgumentTypeError(error.message) from None

    return parse


def add_output(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    offered: Sequence[str],
    help_text: str = "",
) -> argparse.Action:
    """``-o/--output`` taking one of `offered` (default: the command's own printing)."""
    shown = "|".join(f"{o}=..." if o in _WITH_VALUE else o for o in offered)
    action = parser.add_argument(
        "-o",
        "--output",
        type=_format_type(offered),
        metavar="FORMAT",
        help=f"output format: {shown}" + (f"; {help_text}" if help_text else ""),
    )
    # Shell completion offers the names (argcomplete reads `completer`).
    action.completer = lambda **_: [  # type: ignore[attr-defined]
        f"{o}=" if o in _WITH_VALUE else o for o in offered
    ]
    return action


# -- printing objects ---------------------------------------------------------------------


def qualified_name(obj: dict[str, Any], resource: str = RESOURCE) -> str:
    """``lmevaljob.<group>/NAME`` (or `resource`/NAME), as kubectl's ``-o name`` prints it."""
    meta = obj.get("metadata") or {}
    return f"{resource}/{meta.get('name') or meta.get('generateName') or ''}"


def list_object(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several objects as kubectl prints them: one ``kind: List``."""
    return {"apiVersion": "v1", "kind": "List", "items": list(items), "metadata": {}}


def print_objects(
    out: render.Output,
    fmt: Format,
    objects: Sequence[dict[str, Any]],
    *,
    single: bool,
    no_headers: bool = False,
    resource: str = RESOURCE,
) -> None:
    """Print `objects` in an object format (json, yaml, name, jsonpath, custom-columns).

    `single`: one object was asked for by name, so json, yaml and jsonpath
    get the object itself; otherwise they get a List of them (as kubectl).
    `resource`: what ``-o name`` calls them (LMEvalJobs unless told).
    """
    whole: Any = objects[0] if single and len(objects) == 1 else list_object(objects)
    if fmt.name in ("json", "yaml"):
        out.write(render.dump(whole, fmt.name))
    elif fmt.name == "name":
        for obj in objects:
            out.write(qualified_name(obj, resource))
    elif fmt.name == "jsonpath":
        assert fmt.template is not None
        # Like kubectl: exactly the template's text, no newline added.
        out.stdout.write(fmt.template.render(whole))
        out.stdout.flush()
    elif fmt.name == "custom-columns":
        headers, rows = columns_grid(fmt.columns, objects)
        out.show(render.grid_table((headers, rows), show_header=not no_headers))
    else:
        raise CliError(f"output format {fmt.name} cannot print these objects", ExitCode.USAGE)
