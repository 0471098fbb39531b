"""Generate the reference documentation from the code, and check it for drift.

Why this module exists: a reference written by hand drifts the day someone
adds a field, a flag, a setting, a metric or a status message. These pages
are therefore *rendered* from the code that defines them, the way
`lmeval_sandbox.crd` renders the CRD: ``python -m lmeval_sandbox.docs``
rewrites them and ``python -m lmeval_sandbox.docs --check`` fails, naming
each stale file or block, when the committed text and the code disagree (a
test runs the check).

What it writes:

* ``crds/REFERENCE.md`` (whole file): every field of the LMEvalJob's spec
  and status, from the CRD schema `lmeval_sandbox.crd.crd_manifest` builds
  (so it says what the apiserver enforces), with the models' defaults.
* ``poller/cli/REFERENCE.md`` (whole file): every ``lmeval`` command, from
  the argparse parser, walked generically.
* Blocks inside hand-written pages, between
  ``<!-- BEGIN GENERATED NAME: python -m lmeval_sandbox.docs; do not edit -->``
  and ``<!-- END GENERATED NAME -->``: ``settings`` in deploy/CONFIGURE.md
  (the `Settings` model), ``metrics`` in deploy/METRICS.md (the metric
  families a fresh registry holds) and ``reasons`` in
  deploy/TROUBLESHOOTING.md (states, reasons, conditions, and every status
  message the poller can write, found in its source with `ast`).

Only the inside of a block is replaced; a page without its block is an error
in both modes. The root directory is a parameter (``--root``) so that tests
work on copies. Output is deterministic: sorted where the code has no order
of its own, no timestamps, argparse at a fixed width.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import enum
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BLOCKS",
    "CLI_REFERENCE",
    "COLUMNS",
    "CRD_REFERENCE",
    "DocsError",
    "StatusMessage",
    "check",
    "main",
    "render_cli_reference",
    "render_crd_reference",
    "render_metrics",
    "render_reasons",
    "render_settings",
    "replace_block",
    "status_messages",
    "write",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
PACKAGE_DIR = REPO_ROOT / "poller"
CRD_REFERENCE = Path("crds/REFERENCE.md")
CLI_REFERENCE = Path("poller/cli/REFERENCE.md")
# argparse wraps usage and help at the terminal's width: fixed, so that the
# page does not depend on who ran the generator.
COLUMNS = 100
_COMMAND = "python -m lmeval_sandbox.docs"


class DocsError(RuntimeError):
    """A page cannot be generated (a missing or broken block)."""


# -- Markdown ------------------------------------------------------------------------------

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


# Outside code spans, what Markdown would read as HTML, a link or emphasis: the
# texts are CEL messages and help lines, where `[a-z]([-a-z]*)` is a pattern.
_PROSE_ESCAPES = str.maketrans({"<": "&lt;", "[": "\\[", "]": "\\]", "*": "\\*"})


def _cell(text: str) -> str:
    """Prose for a table cell: one line, `|` escaped, `<`, `[`, `]` and `*` kept
    from reading as HTML, links or emphasis."""
    text = " ".join(str(text).split())
    out: list[str] = []
    last = 0
    for match in _CODE_SPAN.finditer(text):
        out.append(text[last : match.start()].translate(_PROSE_ESCAPES))
        out.append(match.group(0))
        last = match.end()
    out.append(text[last:].translate(_PROSE_ESCAPES))
    return "".join(out).replace("|", "\\|")


def _code(text: object) -> str:
    """`text` as a code span in a table cell (GFM unescapes ``\\|`` inside it too)."""
    value = " ".join(str(text).split())
    longest = max((len(run) for run in re.findall(r"`+", value)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if value.startswith("`") or value.endswith("`") or not value.strip() else ""
    return f"{fence}{pad}{value}{pad}{fence}".replace("|", "\\|")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _anchor(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# -- blocks and pages ----------------------------------------------------------------------


def _begin(name: str) -> str:
    return f"<!-- BEGIN GENERATED {name}: {_COMMAND}; do not edit -->"


def _end(name: str) -> str:
    return f"<!-- END GENERATED {name} -->"


def replace_block(text: str, name: str, body: str, where: str = "the page") -> str:
    """`text` with the inside of block `name` replaced by `body`; DocsError if the
    block is missing, repeated or unterminated."""
    begin, end = _begin(name), _end(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise DocsError(
            f"{where} needs exactly one block `{name}`: add the lines\n  {begin}\n  {end}"
        )
    head, rest = text.split(begin, 1)
    inner, tail = rest.split(end, 1)
    del inner
    if not body.endswith("\n"):
        body += "\n"
    return f"{head}{begin}\n{body}{end}{tail}"


@dataclass(frozen=True)
class _Page:
    path: Path  # relative to the root
    render: Callable[[], str]
    block: str | None = None  # None: the whole file


def _pages() -> tuple[_Page, ...]:
    return (
        _Page(CRD_REFERENCE, render_crd_reference),
        _Page(CLI_REFERENCE, render_cli_reference),
        _Page(Path(BLOCKS["settings"]), render_settings, "settings"),
        _Page(Path(BLOCKS["metrics"]), render_metrics, "metrics"),
        _Page(Path(BLOCKS["reasons"]), render_reasons, "reasons"),
    )


# The generated blocks of hand-written pages: name -> page.
BLOCKS = {
    "settings": "deploy/CONFIGURE.md",
    "metrics": "deploy/METRICS.md",
    "reasons": "deploy/TROUBLESHOOTING.md",
}


def _wanted(page: _Page, root: Path) -> tuple[str | None, str]:
    """(what the page should hold, or None when it cannot be made; the problem)."""
    target = root / page.path
    if page.block is None:
        return page.render(), ""
    if not target.exists():
        return None, (
            f"{page.path}: missing; it must hold the block `{page.block}` "
            f"({_begin(page.block)} ... {_end(page.block)})"
        )
    try:
        return replace_block(target.read_text(), page.block, page.render(), str(page.path)), ""
    except DocsError as error:
        return None, str(error)


def check(root: Path = REPO_ROOT) -> list[str]:
    """The stale or broken pages under `root`, one line each (empty: all current)."""
    problems = []
    for page in _pages():
        wanted, problem = _wanted(page, root)
        target = root / page.path
        if wanted is None:
            problems.append(problem)
        elif not target.exists() or target.read_text() != wanted:
            what = "" if page.block is None else f" block `{page.block}`"
            problems.append(f"{page.path}:{what} out of date: run `{_COMMAND}`")
    return problems


def write(root: Path = REPO_ROOT) -> tuple[list[Path], list[str]]:
    """Rewrite every page under `root`: (the files changed, the problems)."""
    written, problems = [], []
    for page in _pages():
        wanted, problem = _wanted(page, root)
        target = root / page.path
        if wanted is None:
            problems.append(problem)
            continue
        if not target.exists() or target.read_text() != wanted:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(wanted)
            written.append(page.path)
    return written, problems


# -- the CRD reference ---------------------------------------------------------------------

_VALIDATIONS = "x-kubernetes-validations"


@dataclass
class _Section:
    path: str
    schema: dict[str, Any]
    pydantic: dict[str, Any] | None
    rows: list[list[str]] = field(default_factory=list)
    rules: list[tuple[str, str]] = field(default_factory=list)


class _RawSchema:
    """The models' own JSON Schema, walked beside the CRD's for what the CRD drops
    (defaults: the apiserver applies none, the poller does)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.defs: dict[str, Any] = schema.get("$defs", {})
        self.root = self.plain(schema)

    def plain(self, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        """`schema` without its $ref and the null branch of an optional field."""
        seen = 0
        while schema is not None and seen < 50:
            seen += 1
            if "$ref" in schema:
                target = self.defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
                schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
            elif "anyOf" in schema:
                branches = [b for b in schema["anyOf"] if b.get("type") != "null"]
                if len(branches) != 1:
                    return schema
                schema = {**branches[0], **{k: v for k, v in schema.items() if k != "anyOf"}}
            else:
                return schema
        return schema

    def child(self, schema: dict[str, Any] | None, key: str, name: str = "") -> Any:
        if schema is None:
            return None
        if key == "properties":
            return self.plain((schema.get("properties") or {}).get(name))
        value = schema.get(key)
        if key == "additionalProperties" and value is None and schema.get("patternProperties"):
            value = next(iter(schema["patternProperties"].values()))
        return self.plain(value) if isinstance(value, dict) else None


def _schema_type(schema: dict[str, Any], link: Callable[[str], str], path: str) -> str:
    """A field's type in words, with a link to its section when it has one."""
    if schema.get("x-kubernetes-int-or-string"):
        return "integer or string"
    kind = schema.get("type", "")
    if kind == "array":
        items = schema.get("items") or {}
        inner = _schema_type(items, link, path + "[]")
        listed = schema.get("x-kubernetes-list-type")
        keyed = schema.get("x-kubernetes-list-map-keys")
        suffix = f" (keyed by {', '.join(keyed)})" if listed == "map" and keyed else ""
        return f"list of {inner}{suffix}"
    if kind == "object":
        if "properties" in schema:
            return link(path)
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            return f"map of string to {_schema_type(values, link, path + '.*')}"
        return "object (any fields)"
    return str(kind or "any")


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bounds(schema: dict[str, Any]) -> list[str]:
    """The schema's limits on one value, in words."""
    out: list[str] = []
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None:
        sign = ">" if schema.get("exclusiveMinimum") is True else "≥"
        out.append(f"{sign} {_number(low)}")
    if high is not None:
        sign = "<" if schema.get("exclusiveMaximum") is True else "≤"
        out.append(f"{sign} {_number(high)}")
    for key, words in (
        ("minLength", "at least {} characters"),
        ("maxLength", "at most {} characters"),
        ("minItems", "at least {} items"),
        ("maxItems", "at most {} items"),
        ("minProperties", "at least {} keys"),
        ("maxProperties", "at most {} keys"),
    ):
        if key in schema:
            out.append(words.format(schema[key]))
    if "format" in schema:
        out.append(f"format {_code(schema['format'])}")
    if "enum" in schema:
        out.append("one of " + ", ".join(_code(v) for v in schema["enum"]))
    if "pattern" in schema:
        out.append("pattern " + _code(schema["pattern"]))
    return out


def _default(raw: dict[str, Any] | None) -> str:
    if raw is None or "default" not in raw or raw["default"] is None:
        return ""
    value = raw["default"]
    if isinstance(value, bool):
        return _code(str(value).lower())
    if isinstance(value, (dict, list)) and not value:
        return _code("{}" if isinstance(value, dict) else "[]")
    return _code(value)


def _crd_sections() -> tuple[list[_Section], dict[str, Any]]:
    from lmeval_sandbox import crd
    from poller import api

    manifest = crd.crd_manifest()
    root = manifest["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    names = manifest["spec"]["names"]
    raws = {
        "spec": _RawSchema(api.LMEvalJobSpec.model_json_schema(by_alias=True, mode="validation")),
        "status": _RawSchema(
            api.LMEvalJobStatus.model_json_schema(by_alias=True, mode="validation")
        ),
    }
    sections: list[_Section] = []

    def link(path: str) -> str:
        return f"object ([{_code(path)}](#{_anchor(path)}))"

    def visit(path: str, schema: dict[str, Any], raw: dict[str, Any] | None, raw_of: Any) -> None:
        """One section per object with properties, then its children's, depth first."""
        section = _Section(path, schema, raw)
        sections.append(section)
        required = set(schema.get("required", []))
        for name, sub in schema.get("properties", {}).items():
            child_path = f"{path}.{name}" if path else name
            child_of = raws.get(name) if not path else raw_of
            if not path:  # spec and status: each has a model of its own
                sub_raw = child_of.root if child_of else None
            else:
                sub_raw = raw_of.child(raw, "properties", name) if raw_of else None
            visit_field(section, child_path, name in required, sub, sub_raw, child_of)
        for rule in schema.get(_VALIDATIONS, []):
            section.rules.append((path or names["kind"], rule.get("message") or rule["rule"]))

    def visit_field(
        section: _Section,
        path: str,
        required: bool,
        schema: dict[str, Any],
        raw: dict[str, Any] | None,
        raw_of: Any,
    ) -> None:
        bounds = _bounds(schema)
        inner, inner_path, inner_raw = schema, path, raw
        # Descend through lists and maps to what they hold: its bounds are the field's too.
        while True:
            if inner.get("type") == "array" and isinstance(inner.get("items"), dict):
                inner_path += "[]"
                inner_raw = raw_of.child(inner_raw, "items") if raw_of else None
                inner = inner["items"]
            elif (
                inner.get("type") == "object"
                and "properties" not in inner
                and isinstance(inner.get("additionalProperties"), dict)
            ):
                inner_path += ".*"
                inner_raw = raw_of.child(inner_raw, "additionalProperties") if raw_of else None
                inner = inner["additionalProperties"]
            else:
                break
            held = _bounds(inner)
            if held and "properties" not in inner:
                bounds.append("each: " + "; ".join(held))
            for rule in inner.get(_VALIDATIONS, []):
                if "properties" not in inner:
                    section.rules.append((inner_path, rule.get("message") or rule["rule"]))
        section.rows.append(
            [
                _code(path),
                _cell(_schema_type(schema, link, path)),
                "yes" if required else "",
                _default(raw),
                "; ".join(bounds),
                _cell(schema.get("description", "")),
            ]
        )
        for rule in schema.get(_VALIDATIONS, []):
            if "properties" not in schema:
                section.rules.append((path, rule.get("message") or rule["rule"]))
        if "properties" in inner:
            visit(inner_path, inner, inner_raw, raw_of)

    visit("", root, None, None)
    return sections, manifest


def render_crd_reference() -> str:
    """crds/REFERENCE.md: every field of the LMEvalJob API."""
    sections, manifest = _crd_sections()
    spec = manifest["spec"]
    version = spec["versions"][0]
    names = spec["names"]
    out = [
        "<!-- Generated by `python -m lmeval_sandbox.docs` from the CRD schema "
        "(poller/api/lmevaljob.py). Do not edit. -->\n",
        "# LMEvalJob API reference\n",
        f"`{spec['group']}/{version['name']}`, kind `{names['kind']}` "
        f"(plural `{names['plural']}`, short name `{', '.join(names['shortNames'])}`), "
        f"{spec['scope'].lower()}. The concepts (lifecycle, states, conditions, provenance) "
        "are in [README.md](README.md); this page lists every field of the schema the "
        "apiserver enforces, at every depth, as the CRD in "
        "[lmevaljobs.yaml](lmevaljobs.yaml) says it.\n",
        "Columns: **Required**, the apiserver refuses an object without it; **Default**, "
        "what the poller uses when the field is absent (the apiserver stores no default); "
        "**Bounds**, what the schema accepts (`≥`/`≤` numbers, lengths, item counts, "
        "patterns, values; `each:` applies to every item of a list or value of a map). "
        "**Rules** under a table are the CEL validations the apiserver checks there, by "
        "their messages. In paths, `[]` stands for every item of a list and `*` for every "
        "value of a map.\n",
        "## Contents\n",
    ]
    for section in sections:
        title = section.path or names["kind"]
        depth = section.path.count(".") + (1 if section.path else 0)
        indent = "  " * max(depth - 1, 0)
        out.append(f"{indent}- [{_code(title)}](#{_anchor(title)})")
    out.append("")
    for section in sections:
        title = section.path or names["kind"]
        out.append(f'<a id="{_anchor(title)}"></a>\n')
        out.append(f"## {_code(title)}\n")
        if section.schema.get("description"):
            out.append(" ".join(str(section.schema["description"]).split()) + "\n")
        out.append(
            _table(["Field", "Type", "Required", "Default", "Bounds", "Description"], section.rows)
        )
        if section.rules:
            out.append("Rules:\n")
            out += [f"- {_code(where)}: {_cell(message)}" for where, message in section.rules]
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


# -- the CLI reference ---------------------------------------------------------------------


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    """argparse formats for the terminal's width (COLUMNS): a fixed one here."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def _subcommands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> list[tuple[str, list[str], str, Any]]:
    """(name, aliases, help, parser) of each command, in the parser's own order; a
    command's own commands (``suite list``) follow it, named with its name."""
    out: list[tuple[str, list[str], str, Any]] = []
    for action in parser._actions:  # argparse has no public walk of its parsers
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        seen: dict[int, tuple[str, list[str], str, Any]] = {}
        for name, sub in action.choices.items():
            if id(sub) in seen:
                seen[id(sub)][1].append(prefix + name)
            else:
                seen[id(sub)] = (prefix + name, [], helps.get(name, ""), sub)
                out.append(seen[id(sub)])
                out += _subcommands(sub, f"{prefix}{name} ")
    return out


def _expanded_help(action: argparse.Action, prog: str) -> str:
    """An action's help with its %(...)s filled in, as argparse prints it."""
    text = action.help or ""
    if "%" not in text:
        return text
    params: dict[str, Any] = {
        k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS
    } | {"prog": prog}
    for name in list(params):
        if hasattr(params[name], "__name__"):
            params[name] = params[name].__name__
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    return text % params


def _flag_rows(actions: Sequence[argparse.Action], prog: str) -> list[list[str]]:
    rows = []
    for action in actions:
        if action.help == argparse.SUPPRESS or isinstance(
            action, argparse._SubParsersAction | argparse._HelpAction
        ):
            continue
        # argparse's own spelling of the values a flag takes (N, [NAME], X [X ...]).
        formatter = argparse.HelpFormatter(prog)
        if action.option_strings:
            values = ""
            if action.nargs != 0:
                values = " " + formatter._format_args(action, action.dest.upper())
            flag = ", ".join(f"{option}{values}" for option in action.option_strings)
        else:
            flag = formatter._format_args(action, action.dest)
        default = action.default
        shown_default = ""
        if (
            default is not None
            and default is not argparse.SUPPRESS
            and not (action.nargs == 0 and default is False)
            and default != []
        ):
            shown_default = _code(default)
        choices = ", ".join(_code(c) for c in action.choices) if action.choices else ""
        rows.append(
            [
                _code(flag),
                choices,
                shown_default,
                _cell(_expanded_help(action, prog)),
            ]
        )
    return rows


def _first_header(actions: Sequence[argparse.Action]) -> str:
    return "Flag" if any(action.option_strings for action in actions) else "Argument"


def _groups(parser: argparse.ArgumentParser) -> list[tuple[str, list[argparse.Action]]]:
    return [
        (group.title or "", list(group._group_actions))
        for group in parser._action_groups
        if group._group_actions
    ]


_EXIT_LINE = re.compile(r"^\s+(\d+)\s+(.*)$")


def _exit_codes(epilog: str | None) -> list[list[str]] | None:
    """The epilog's exit codes as rows, or None when it lists none."""
    lines = (epilog or "").splitlines()
    if not lines or "exit code" not in lines[0].lower():
        return None
    rows = []
    for line in lines[1:]:
        match = _EXIT_LINE.match(line)
        if match:
            rows.append([_code(match.group(1)), _cell(match.group(2))])
        elif line.strip() and rows:
            rows[-1][1] += " " + _cell(line.strip())
    return rows


def render_cli_reference() -> str:
    """poller/cli/REFERENCE.md: every ``lmeval`` command, from the parser."""
    from lmeval_cli.__main__ import build_parser

    with _columns(COLUMNS):
        parser = build_parser("lmeval")
        top_usage = parser.format_usage()
        commands = _subcommands(parser)
        usages = {name: sub.format_usage() for name, _, _, sub in commands}
    out = [
        "<!-- Generated by `python -m lmeval_sandbox.docs` from the parser in "
        "poller/cli/lmeval_cli/__main__.py. Do not edit. -->\n",
        "# `lmeval` command reference\n",
        "Every command and flag of `lmeval` (also `kubectl lmeval`), as `lmeval COMMAND "
        "--help` prints them. The guide, with a session and examples, is "
        "[README.md](README.md).\n",
        "```text\n" + top_usage.rstrip() + "\n```\n",
    ]
    if parser.description:
        out.append(" ".join(parser.description.split()) + "\n")
    top_groups = _groups(parser)
    shared = {
        (title, tuple(tuple(a.option_strings) for a in actions))
        for title, actions in top_groups
        if title not in ("options", "optional arguments", "positional arguments")
    }
    out.append("## Flags of every command\n")
    for title, actions in top_groups:
        rows = _flag_rows(actions, parser.prog)
        if rows:
            out.append(f"**{_cell(title)}**\n")
            out.append(_table(["Flag", "Choices", "Default", "Meaning"], rows))
    top_exits = _exit_codes(parser.epilog)
    if top_exits:
        out.append("## Exit codes\n")
        out.append(_table(["Code", "Meaning"], top_exits))
    out.append("## Commands\n")
    out += [
        f"- [{_code(name)}](#{_anchor('lmeval ' + name)}): {_cell(help_text)}"
        for name, _, help_text, _ in commands
    ]
    out.append("")
    for name, aliases, help_text, sub in commands:
        out.append(f'<a id="{_anchor("lmeval " + name)}"></a>\n')
        out.append(f"### `lmeval {name}`\n")
        if aliases:
            out.append("Also: " + ", ".join(_code(f"lmeval {a}") for a in aliases) + ".\n")
        out.append("```text\n" + usages[name].rstrip() + "\n```\n")
        description = sub.description or help_text
        if description:
            out.append(" ".join(description.split()) + "\n")
        for title, actions in _groups(sub):
            key = (title, tuple(tuple(a.option_strings) for a in actions))
            if key in shared:
                out.append(
                    f"{_cell(title).capitalize()}: see "
                    "[flags of every command](#flags-of-every-command).\n"
                )
                continue
            rows = _flag_rows(actions, sub.prog)
            if rows:
                out.append(f"**{_cell(title)}**\n")
                out.append(_table([_first_header(actions), "Choices", "Default", "Meaning"], rows))
        if sub.epilog and sub.epilog != parser.epilog:
            exits = _exit_codes(sub.epilog)
            if exits:
                out.append("Exit codes:\n")
                out.append(_table(["Code", "Meaning"], exits))
            else:
                out.append("```text\n" + sub.epilog.rstrip() + "\n```\n")
        elif sub.epilog:
            out.append("Exit codes: see [exit codes](#exit-codes).\n")
    return "\n".join(out).rstrip("\n") + "\n"


# -- the settings table --------------------------------------------------------------------


def _duration(seconds: float) -> str:
    """Seconds as a Go-style duration, the way the settings are written."""
    if seconds < 1:
        return f"{_number(seconds * 1000)}ms"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{_number(seconds)}s"


def _setting_kind(metadata: Sequence[object]) -> str | None:
    """How a setting's string is read, from the validator that parses it."""
    from poller.api import settings

    kinds = {
        settings.parse_duration: "duration",
        settings._boolean: "boolean",
        settings._yaml_mapping: "YAML mapping",
        settings._name_list: "comma-separated list",
    }
    for item in metadata:
        function = getattr(item, "func", None)
        if function in kinds:
            return kinds[function]
    return None


def render_settings() -> str:
    """The settings block of deploy/CONFIGURE.md: every key of the ConfigMap."""
    from pydantic_core import PydanticUndefined

    from poller.api import settings

    schema = settings.Settings.model_json_schema(by_alias=True, mode="validation")
    plain = _RawSchema(schema)
    rows = []
    fields = settings.Settings.model_fields
    for name in sorted(fields, key=lambda n: fields[n].alias or n):
        info = fields[name]
        key = info.alias or name
        prop = plain.child(plain.root, "properties", key) or {}
        kind = _setting_kind(info.metadata) or {
            "integer": "integer",
            "number": "number",
            "string": "string",
            "boolean": "boolean",
            "array": "list",
            "object": "mapping",
        }.get(str(prop.get("type")), str(prop.get("type", "")))
        if "enum" in prop:
            kind = "string"
        default = info.get_default(call_default_factory=True)
        if default is PydanticUndefined or default is None:
            shown = "unset"
        elif default == "" or default == {} or default == []:
            shown = "empty"
        elif isinstance(default, bool):
            shown = _code(str(default).lower())
        elif kind == "duration":
            shown = _code(_duration(float(default)))
        elif isinstance(default, list):
            shown = _code(",".join(str(v) for v in default))
        else:
            shown = _code(default)
        if key in settings.INSTALL_DEFAULT_ENV:
            shown += f" (or the poller's {_code(settings.INSTALL_DEFAULT_ENV[key])}, when set)"
        bounds = _bounds({k: v for k, v in prop.items() if k not in ("minimum", "maximum")})
        # pydantic names a bound ge/le when a validator runs before the type's check.
        low = prop.get("minimum", prop.get("ge"))
        high = prop.get("maximum", prop.get("le"))
        if low is not None or high is not None:
            show: Callable[[Any], str] = _duration if kind == "duration" else _number
            if low is not None and high is not None:
                bounds.insert(0, f"{show(low)} to {show(high)}")
            elif low is not None:
                bounds.insert(0, f"at least {show(low)}")
            else:
                bounds.insert(0, f"at most {show(high)}")
        names = prop.get("propertyNames") or {}
        if "pattern" in names:
            bounds.append("keys match " + _code(names["pattern"]))
        rows.append([_code(key), kind, shown, "; ".join(bounds), _cell(info.description or "")])
    return _table(["Key", "Type", "Default", "Bounds", "Meaning"], rows)


# -- the metrics table ---------------------------------------------------------------------


def render_metrics() -> str:
    """The metrics block of deploy/METRICS.md: every family on /metrics."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics import MetricWrapperBase

    from poller import jobmetrics, metrics, suitemetrics

    registry = CollectorRegistry()
    poller_metrics = metrics.PollerMetrics(registry, version="", revision="")
    labels = {**jobmetrics.family_labels(), **suitemetrics.suite_family_labels()}
    for value in vars(poller_metrics).values():
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                # prometheus_client keeps a metric's label names only here.
                labels[family.name] = tuple(value._labelnames)
    seen: dict[str, list[str]] = {}
    for family in registry.collect():
        if family.name in seen:
            continue  # a per-job family comes in parts of one name
        exposed = {
            "counter": f"{family.name}_total",
            "info": f"{family.name}_info",
        }.get(family.type, family.name)
        kind = family.type
        if kind == "histogram":
            kind = "histogram (`_bucket`, `_sum`, `_count`)"
        elif kind == "info":
            kind = "gauge (info: always 1)"
        seen[family.name] = [
            _code(exposed),
            kind,
            ", ".join(_code(label) for label in sorted(labels.get(family.name, ()))),
            _cell(family.documentation),
        ]
    rows = [seen[name] for name in sorted(seen)]
    return _table(["Metric", "Type", "Labels", "Meaning"], rows)


# -- status messages, from the source ------------------------------------------------------


@dataclass(frozen=True)
class _Text:
    """One possible value: text with ``<expression>`` placeholders, and where it is built."""

    text: str
    module: str


@dataclass(frozen=True)
class _Param:
    """A value the enclosing function takes from its caller."""

    name: str


_Alt = _Text | _Param
_Slots = dict[str, tuple[_Alt, ...]]
_MAX_ALTS = 40
_MAX_DEPTH = 6


@dataclass(frozen=True)
class StatusMessage:
    """A status message the poller can write: its template and what goes with it."""

    reason: str  # status.reason it is written with ("" when the write keeps the reason)
    state: str  # status.state, likewise
    template: str  # with <expression> for what is filled in at run time
    module: str  # where the text is written
    causes: tuple[str, ...]  # the Event's reason; a finished job's Finished/Succeeded reason


@dataclass(frozen=True)
class ConditionReason:
    """A reason the poller writes on a condition."""

    condition: str
    reason: str
    module: str


@dataclass
class _Function:
    module: _Module
    node: ast.FunctionDef | ast.AsyncFunctionDef
    owner: str | None  # the class, for a method
    parents: dict[int, tuple[list[ast.stmt], int, ast.AST]] | None = None  # see _parents

    @property
    def params(self) -> list[str]:
        args = [a.arg for a in (*self.node.args.posonlyargs, *self.node.args.args)]
        if self.owner is not None and args and args[0] in ("self", "cls"):
            args = args[1:]
        return args

    @property
    def all_params(self) -> set[str]:
        a = self.node.args
        names = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
        return names - {"self", "cls"}

    def default(self, name: str) -> ast.expr | None:
        a = self.node.args
        positional = [*a.posonlyargs, *a.args]
        for arg, value in zip(
            positional[len(positional) - len(a.defaults) :], a.defaults, strict=True
        ):
            if arg.arg == name:
                return value
        for arg, kw_value in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            if arg.arg == name:
                return kw_value
        return None

    @property
    def label(self) -> str:
        name = f"{self.owner}.{self.node.name}" if self.owner else self.node.name
        return f"{self.module.name}.{name}"


@dataclass
class _Module:
    name: str
    tree: ast.Module
    constants: dict[str, str] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted target
    enum_aliases: dict[str, str] = field(default_factory=dict)  # local name -> enum class
    functions: dict[str, _Function] = field(default_factory=dict)


def _enums() -> dict[str, dict[str, str]]:
    """The API's enums (JobState, JobReason, ConditionType): member name -> value."""
    from poller.api import status

    return {
        name: {member.name: member.value for member in value}
        for name, value in vars(status).items()
        if isinstance(value, type) and issubclass(value, enum.Enum)
    }


def _operator_modules(package: Path) -> list[tuple[str, Path]]:
    """The operator's modules under `package` (its layers' folders too): dotted name, path."""
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[0] in ("cli", "sandbox"):
            continue
        dotted = ".".join((package.name, *parts)).removesuffix(".__init__")
        if dotted in _OTHER_KINDS:
            continue
        found.append((dotted, path))
    return found


# Modules whose "state", "reason" and "message" are an LMEvalSuite's run records,
# not an LMEvalJob's status: the reasons page is the jobs' (the suite's reasons
# are in deploy/samples/suites.md).
_OTHER_KINDS = frozenset(
    {"poller.decisions.suites", "poller.decisions.attestation", "poller.cycle.suites"}
)


class _Source:
    """The operator's modules, parsed, and the flow of status messages through them."""

    def __init__(self, package: Path) -> None:
        self.enums = _enums()
        self.modules: dict[str, _Module] = {}
        for name, path in _operator_modules(package):
            module = _Module(name, ast.parse(path.read_text(), str(path)))
            self._index(module)
            self.modules[module.name] = module
        self.by_method: dict[str, list[_Function]] = {}
        for module in self.modules.values():
            for function in module.functions.values():
                self.by_method.setdefault(function.node.name, []).append(function)
        # What writes a status message or a condition: the draft's two methods,
        # then (found below) every function that passes its own parameter on.
        self.sinks: dict[int, tuple[_Function, list[tuple[str, _Slots]]]] = {}
        draft = self.modules.get("poller.decisions.draft")
        state = draft.functions.get("StatusDraft.state") if draft else None
        condition = draft.functions.get("StatusDraft.condition") if draft else None
        if state is None or condition is None:
            raise DocsError("poller.decisions.draft.StatusDraft.state/condition not found")
        self.seeds = {id(state.node), id(condition.node)}
        self.sinks[id(state.node)] = (
            state,
            [
                (
                    "status",
                    {
                        "state": (_Param("state"),),
                        "reason": (_Param("reason"),),
                        "message": (_Param("message"),),
                        "cause": (_Param("event"),),
                    },
                )
            ],
        )
        self.sinks[id(condition.node)] = (
            condition,
            [("condition", {"type": (_Param("kind"),), "reason": (_Param("reason"),)})],
        )

    @staticmethod
    def _index(module: _Module) -> None:
        for node in module.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                        module.constants[target.id] = node.value.value
                    elif isinstance(node.value, ast.Attribute | ast.Name):
                        module.enum_aliases[target.id] = ast.unparse(node.value).rsplit(".")[-1]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    module.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    module.imports[alias.asname or alias.name] = alias.name
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                module.functions[node.name] = _Function(module, node, None)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        key = f"{node.name}.{item.name}"
                        module.functions[key] = _Function(module, item, node.name)

    # -- resolving names -------------------------------------------------------------------

    def _target(self, dotted: str) -> tuple[_Module | None, str]:
        """A dotted import target as (module, attribute)."""
        if dotted in self.modules:
            return self.modules[dotted], ""
        head, _, attr = dotted.rpartition(".")
        return self.modules.get(head), attr

    def _constant(self, module: _Module, name: str) -> str | None:
        if name in module.constants:
            return module.constants[name]
        dotted = module.imports.get(name)
        if dotted:
            other, attr = self._target(dotted)
            if other is not None and attr in other.constants:
                return other.constants[attr]
        return None

    def _enum_value(self, expr: ast.expr, module: _Module) -> str | None:
        """The value of ``S.COMPLETE``, ``api.JobState.COMPLETE`` (or its ``.value``)."""
        if isinstance(expr, ast.Attribute) and expr.attr == "value":
            inner = self._enum_value(expr.value, module)
            if inner is not None:
                return inner
        if not isinstance(expr, ast.Attribute):
            return None
        owner = expr.value
        if isinstance(owner, ast.Name):
            enum_name = module.enum_aliases.get(owner.id, owner.id)
            dotted = module.imports.get(owner.id, "")
            enum_name = dotted.rsplit(".", 1)[-1] if dotted else enum_name
        elif isinstance(owner, ast.Attribute):
            enum_name = owner.attr
        else:
            return None
        return self.enums.get(enum_name, {}).get(expr.attr)

    def callees(self, call: ast.Call, caller: _Function) -> list[_Function]:
        """The functions of the operator a call may run (by name; methods by arity)."""
        func = call.func
        module = caller.module
        found: list[_Function] = []
        if isinstance(func, ast.Name):
            if func.id in module.functions:
                found = [module.functions[func.id]]
            elif func.id in module.imports:
                other, attr = self._target(module.imports[func.id])
                if other is not None and attr in other.functions:
                    found = [other.functions[attr]]
        elif isinstance(func, ast.Attribute):
            owner = func.value
            if isinstance(owner, ast.Name) and owner.id in module.imports:
                other, attr = self._target(module.imports[owner.id])
                if other is not None and not attr and func.attr in other.functions:
                    return [other.functions[func.attr]]
            if isinstance(owner, ast.Name) and owner.id == "self" and caller.owner:
                own = module.functions.get(f"{caller.owner}.{func.attr}")
                if own is not None:
                    return [own]
            # Another object's method: any method of that name whose signature fits.
            found = [
                f
                for f in self.by_method.get(func.attr, [])
                if f.owner is not None and self._fits(f, call)
            ]
        return found

    @staticmethod
    def _fits(function: _Function, call: ast.Call) -> bool:
        a = function.node.args
        positional = function.params
        required = len(positional) - len(a.defaults)
        given = len(call.args)
        if any(isinstance(arg, ast.Starred) for arg in call.args) or a.vararg:
            return True
        names = {kw.arg for kw in call.keywords if kw.arg}
        covered = given + len(names & set(positional[given:]))
        if given > len(positional) or covered < required:
            return False
        return names <= function.all_params or a.kwarg is not None

    # -- values ----------------------------------------------------------------------------

    def value(self, expr: ast.expr, where: _Where, depth: int = 0) -> tuple[_Alt, ...]:
        """What `expr` may be, as texts with placeholders or the caller's parameters."""
        module = where.function.module
        text = self._text(expr, where)
        if isinstance(expr, ast.Constant):
            # An empty text stays: "x" + ("" if a else "y") is "x" or "xy".
            return () if expr.value is None else (_Text(str(expr.value), module.name),)
        if isinstance(expr, ast.JoinedStr):
            return (_Text(text, module.name),)
        if isinstance(expr, ast.Name):
            return self._name(expr.id, where, depth)
        if isinstance(expr, ast.Attribute):
            member = self._enum_value(expr, module)
            if member is not None:
                return (_Text(member, module.name),)
            if expr.attr == "value" and isinstance(expr.value, ast.Name):
                inner = self._name(expr.value.id, where, depth)
                if all(isinstance(alt, _Param) for alt in inner):
                    return inner
            if isinstance(expr.value, ast.Name) and expr.value.id in module.imports:
                other, attr = self._target(module.imports[expr.value.id])
                if other is not None and not attr and expr.attr in other.constants:
                    return (_Text(other.constants[expr.attr], other.name),)
        if isinstance(expr, ast.BoolOp):
            values = expr.values if isinstance(expr.op, ast.Or) else expr.values[-1:]
            return _limited(alt for v in values for alt in self.value(v, where, depth))
        if isinstance(expr, ast.IfExp):
            return _limited(
                (*self.value(expr.body, where, depth), *self.value(expr.orelse, where, depth))
            )
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Slice):
            return self.value(expr.value, where, depth)  # a message cut to a length
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left = self.value(expr.left, where, depth)
            right = self.value(expr.right, where, depth)
            return _limited(_Text(_shown(a) + _shown(b), module.name) for a in left for b in right)
        if (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Attribute)
            and expr.func.attr in ("strip", "rstrip", "lstrip")
        ):
            return self.value(expr.func.value, where, depth)  # trimmed, still the text
        if isinstance(expr, ast.Call) and depth < _MAX_DEPTH:
            built = self._built(expr, where, depth)
            if built is not None:
                return built
        return (_Text(text, module.name),)

    def _built(self, call: ast.Call, where: _Where, depth: int) -> tuple[_Alt, ...] | None:
        """The values a helper of the operator returns (its own texts, its module's)."""
        callees = [f for f in self.callees(call, where.function) if id(f.node) not in self.sinks]
        if len(callees) != 1:
            return None
        callee = callees[0]
        out: list[_Alt] = []
        for statement, _ in _statements(callee):
            if isinstance(statement, ast.Return) and statement.value is not None:
                inner = _Where(callee, statement)
                for alt in self.value(statement.value, inner, depth + 1):
                    out.extend(self._bind(alt, callee, call, where, depth))
        return _limited(out) if out else None

    def _bind(
        self, alt: _Alt, callee: _Function, call: ast.Call, where: _Where, depth: int
    ) -> tuple[_Alt, ...]:
        """`alt` of `callee` as the caller sees it: a parameter becomes its argument."""
        if isinstance(alt, _Text):
            return (alt,)
        argument = _argument(callee, call, alt.name)
        if argument is None:
            default = callee.default(alt.name)
            if default is None:
                return ()
            return self.value(default, _Where(callee, None), depth + 1)
        return self.value(argument, where, depth + 1)

    def _name(self, name: str, where: _Where, depth: int) -> tuple[_Alt, ...]:
        """A local name: what the assignments that reach this statement give it."""
        function = where.function
        module = function.module
        found = _reaching(function, name, where.statement)
        out: list[_Alt] = []
        for statement, value, augmented in found.assignments:
            earlier = _Where(function, statement)
            alts = self.value(value, earlier, depth + 1)
            if augmented:
                before = self._name(name, earlier, depth + 1) or (_Text(f"<{name}>", module.name),)
                alts = tuple(
                    _Text(_shown(a) + _shown(b), module.name) for a in before for b in alts
                )
            out.extend(alts)
        if found.open_start:
            constant = self._constant(module, name)
            if name in function.all_params:
                out.append(_Param(name))
            elif constant is not None:
                out.append(_Text(constant, module.name))
            elif not out:  # assigned where this reader cannot see (a loop, a tuple)
                out.append(_Text(f"<{name}>", module.name))
        return _limited(out)

    def _text(self, expr: ast.expr, where: _Where) -> str:
        """An expression as message text: literal parts as they are, the rest as <source>."""
        if isinstance(expr, ast.Constant):
            return str(expr.value)
        if isinstance(expr, ast.JoinedStr):
            parts = []
            for part in expr.values:
                if isinstance(part, ast.Constant):
                    parts.append(str(part.value))
                elif isinstance(part, ast.FormattedValue):
                    if isinstance(part.value, ast.Constant):
                        parts.append(str(part.value.value))
                    else:
                        parts.append(f"<{ast.unparse(part.value)}>")
            return "".join(parts)
        return f"<{ast.unparse(expr)}>"

    # -- writes ----------------------------------------------------------------------------

    def writes(self, function: _Function) -> list[tuple[str, _Slots, str]]:
        """The writes in `function`: (kind, slots, label of the call), slots in its terms."""
        out: list[tuple[str, _Slots, str]] = []
        for statement, expressions in _statements(function):
            where = _Where(function, statement)
            targets: list[ast.expr] = []
            assigned: ast.expr | None = None
            if isinstance(statement, ast.Assign):
                targets, assigned = list(statement.targets), statement.value
            elif isinstance(statement, ast.AugAssign | ast.AnnAssign):
                targets, assigned = [statement.target], statement.value
            for target in targets:
                # status["message"] = ...: a message written without a state of its own.
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.slice, ast.Constant)
                    and target.slice.value == "message"
                    and assigned is not None
                    and _is_status(target.value, function)
                ):
                    value = self.value(assigned, where)
                    if isinstance(statement, ast.AugAssign):
                        value = tuple(
                            _Text(f"<{ast.unparse(target)}>" + _shown(v), function.module.name)
                            for v in value
                        )
                    out.append(("status", {"message": value}, ""))
            for expr in expressions:
                for node in ast.walk(expr):
                    if isinstance(node, ast.Dict):
                        out.extend(self._dict_write(node, where))
                    if isinstance(node, ast.Call):
                        out.extend(self._call_writes(node, where))
        return out

    def _dict_write(self, node: ast.Dict, where: _Where) -> list[tuple[str, _Slots, str]]:
        """A status literal ({"state": ..., "reason": ..., "message": ...}), as in a patch."""
        keys = {
            k.value: v
            for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
        if not {"state", "message"} <= keys.keys():
            return []
        slots: _Slots = {
            slot: self.value(keys[slot], where)
            for slot in ("state", "reason", "message")
            if slot in keys
        }
        return [("status", slots, "")]

    def _call_writes(self, call: ast.Call, where: _Where) -> list[tuple[str, _Slots, str]]:
        out: list[tuple[str, _Slots, str]] = []
        for callee in self.callees(call, where.function):
            sink = self.sinks.get(id(callee.node))
            if sink is None:
                continue
            for kind, slots in sink[1]:
                bound: _Slots = {}
                for slot, alts in slots.items():
                    values: list[_Alt] = []
                    for alt in alts:
                        values.extend(self._bind(alt, callee, call, where, 0))
                    bound[slot] = _limited(values)
                out.append((kind, bound, callee.label))
        return out

    def flow(self) -> list[tuple[str, _Slots, _Function]]:
        """Every write with no parameter left: (kind, slots, the function it is in).

        A function that passes one of its own parameters to a write is a writer
        too (with that parameter's position): repeated until nothing changes,
        so a new wrapper, at any depth, is found with its callers.
        """
        functions = [
            f
            for m in self.modules.values()
            for f in m.functions.values()
            if id(f.node) not in self.seeds
        ]
        for _ in range(20):
            changed = False
            for function in functions:
                derived = [
                    (kind, slots) for kind, slots, _ in self.writes(function) if _has_param(slots)
                ]
                current = self.sinks.get(id(function.node))
                if derived and (current is None or current[1] != derived):
                    self.sinks[id(function.node)] = (function, derived)
                    changed = True
            if not changed:
                break
        return [
            (kind, slots, function)
            for function in functions
            for kind, slots, _ in self.writes(function)
            if not _has_param(slots)
        ]


@dataclass(frozen=True)
class _Where:
    function: _Function
    statement: ast.stmt | None


@dataclass
class _Reaching:
    assignments: list[tuple[ast.stmt, ast.expr, bool]]
    open_start: bool  # some path reaches the function's start without an assignment


_BLOCK_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(function: _Function) -> Iterator[tuple[ast.stmt, list[ast.expr]]]:
    """Each statement of `function` (not of nested functions) with its own expressions."""

    def walk(block: Sequence[ast.AST]) -> Iterator[tuple[ast.stmt, list[ast.expr]]]:
        for node in block:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if isinstance(node, ast.stmt):
                expressions = [
                    value
                    for name, value in ast.iter_fields(node)
                    if name not in _BLOCK_FIELDS and isinstance(value, ast.expr)
                ]
                for name, value in ast.iter_fields(node):
                    if name not in _BLOCK_FIELDS and isinstance(value, list):
                        for item in value:
                            if isinstance(item, ast.expr):
                                expressions.append(item)
                            elif isinstance(item, ast.withitem):
                                expressions.append(item.context_expr)
                yield node, expressions
            for name in _BLOCK_FIELDS:
                inner = getattr(node, name, None)
                if isinstance(inner, list):
                    yield from walk(inner)
            if isinstance(node, ast.ExceptHandler | ast.match_case):
                yield from walk(node.body)

    yield from walk(function.node.body)


def _parents(function: _Function) -> dict[int, tuple[list[ast.stmt], int, ast.AST]]:
    """Each statement's block, its index there and the node that holds the block."""
    out: dict[int, tuple[list[ast.stmt], int, ast.AST]] = {}

    def walk(node: ast.AST) -> None:
        for name in _BLOCK_FIELDS:
            block = getattr(node, name, None)
            if not isinstance(block, list):
                continue
            for index, item in enumerate(block):
                if isinstance(item, ast.stmt):
                    out[id(item)] = (block, index, node)
                    if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        walk(item)
                elif isinstance(item, ast.ExceptHandler | ast.match_case):
                    walk(item)

    walk(function.node)
    return out


def _assigns(statement: ast.stmt, name: str) -> tuple[ast.expr, bool] | None:
    """(value, augmented) when `statement` itself assigns `name`."""
    if isinstance(statement, ast.Assign):
        if any(isinstance(t, ast.Name) and t.id == name for t in statement.targets):
            return statement.value, False
    elif isinstance(statement, ast.AnnAssign):
        target = statement.target
        if isinstance(target, ast.Name) and target.id == name and statement.value is not None:
            return statement.value, False
    elif isinstance(statement, ast.AugAssign):
        target = statement.target
        if isinstance(target, ast.Name) and target.id == name and isinstance(statement.op, ast.Add):
            return statement.value, True
    return None


def _reaching(function: _Function, name: str, statement: ast.stmt | None) -> _Reaching:
    """The assignments of `name` that may reach `statement`: the last one before it
    in its block and the blocks around it, and those inside compound statements on
    the way (which may or may not have run)."""
    if function.parents is None:
        function.parents = _parents(function)
    parents = function.parents
    found: list[tuple[ast.stmt, ast.expr, bool]] = []
    current: ast.AST | None = statement
    while current is not None and id(current) in parents:
        block, index, holder = parents[id(current)]
        for earlier in reversed(block[:index]):
            direct = _assigns(earlier, name)
            if direct is not None:
                found.append((earlier, *direct))
                return _Reaching(found, False)
            for inner in ast.walk(earlier):
                if isinstance(inner, ast.stmt) and inner is not earlier:
                    nested = _assigns(inner, name)
                    if nested is not None:
                        found.append((inner, *nested))
        current = holder if isinstance(holder, ast.stmt) else _holder_statement(holder, parents)
    return _Reaching(found, True)


def _holder_statement(
    node: ast.AST, parents: Mapping[int, tuple[list[ast.stmt], int, ast.AST]]
) -> ast.AST | None:
    """The statement an except handler or match case belongs to."""
    for block, index, holder in parents.values():
        if isinstance(holder, ast.Try | ast.Match) and (
            node in getattr(holder, "handlers", []) or node in getattr(holder, "cases", [])
        ):
            return holder
        del block, index
    return None


def _argument(callee: _Function, call: ast.Call, name: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    params = callee.params
    if name in params:
        index = params.index(name)
        if index < len(call.args) and not isinstance(call.args[index], ast.Starred):
            return call.args[index]
    return None


def _is_status(base: ast.expr, function: _Function) -> bool:
    """Whether `base` holds a job's status: a draft's fields, or a dict of changes
    that the function applies to a status (``status.model_copy(update=base)``)."""
    if isinstance(base, ast.Attribute) and base.attr == "fields":
        return True
    if not isinstance(base, ast.Name):
        return False
    for node in ast.walk(function.node):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "model_copy"
            and ast.unparse(node.func.value).endswith("status")
            and any(
                k.arg == "update" and isinstance(k.value, ast.Name) and k.value.id == base.id
                for k in node.keywords
            )
        ):
            return True
    return False


def _has_param(slots: _Slots) -> bool:
    return any(isinstance(alt, _Param) for alts in slots.values() for alt in alts)


def _shown(alt: _Alt) -> str:
    return alt.text if isinstance(alt, _Text) else f"<{alt.name}>"


def _limited(alts: Any) -> tuple[_Alt, ...]:
    """Distinct values, in order, at most _MAX_ALTS of them."""
    out: dict[_Alt, None] = {}
    for alt in alts:
        out.setdefault(alt, None)
        if len(out) >= _MAX_ALTS:
            break
    return tuple(out)


def _texts(alts: tuple[_Alt, ...]) -> list[_Text]:
    return [alt for alt in alts if isinstance(alt, _Text)]


_FLOWS: dict[tuple[object, ...], tuple[_Source, list[tuple[str, _Slots, _Function]]]] = {}


def _flow(package: Path) -> tuple[_Source, list[tuple[str, _Slots, _Function]]]:
    """`_Source(package).flow()`, kept while the package's files are unchanged."""
    key = (
        str(package.resolve()),
        *((n, p.stat().st_mtime_ns, p.stat().st_size) for n, p in _operator_modules(package)),
    )
    if key not in _FLOWS:
        source = _Source(package)
        _FLOWS[key] = (source, source.flow())
    return _FLOWS[key]


def status_messages(package: Path = PACKAGE_DIR) -> list[StatusMessage]:
    """Every status message the operator's modules in `package` can write, sorted."""
    _, final = _flow(package)
    merged: dict[tuple[str, str, str, str], set[str]] = {}
    for kind, slots, _function in final:
        if kind != "status":
            continue
        reasons = [t.text for t in _texts(slots.get("reason", ()))] or [""]
        states = [t.text for t in _texts(slots.get("state", ()))] or [""]
        causes = {t.text for t in _texts(slots.get("cause", ())) if t.text}
        for message in _texts(slots.get("message", ())):
            if not message.text:
                continue  # an optional argument left empty: the writer's own text is listed
            for reason in reasons:
                for state in states:
                    key = (reason, state, message.text, message.module)
                    merged.setdefault(key, set()).update(causes)
    return [
        StatusMessage(reason, state, template, module, tuple(sorted(causes)))
        for (reason, state, template, module), causes in sorted(merged.items())
    ]


def condition_reasons(package: Path = PACKAGE_DIR) -> list[ConditionReason]:
    """Every reason the operator writes on a condition, sorted.

    A reason held in an object's attribute (the gate's outcome) cannot be
    followed: the module's reason-like string constants (``"NotRegressed"``)
    stand for it.
    """
    source, final = _flow(package)
    found: set[ConditionReason] = set()
    for kind, slots, function in final:
        if kind != "condition":
            continue
        for kind_text in _texts(slots.get("type", ())):
            for reason in _texts(slots.get("reason", ())):
                module = source.modules[reason.module]
                words = [v for v in module.constants.values() if _REASON_WORD.match(v)]
                if _PLACEHOLDER.match(reason.text) and words:
                    for value in words:
                        found.add(ConditionReason(kind_text.text, value, module.name))
                else:
                    found.add(ConditionReason(kind_text.text, reason.text, reason.module))
        del function
    return sorted(found, key=lambda r: (r.condition, r.reason, r.module))


_REASON_WORD = re.compile(r"^[A-Z][a-z]+(?:[A-Z][a-z]*)*$")
_PLACEHOLDER = re.compile(r"^<[^<>]*>$")


def render_reasons(package: Path = PACKAGE_DIR) -> str:
    """The reasons block of deploy/TROUBLESHOOTING.md."""
    from poller import api
    from poller.api.status import REASON_DOCS, STATE_DOCS

    out = ["### States\n"]
    out.append(
        _table(
            ["State", "Meaning"],
            [[_code(state.value), _cell(text)] for state, text in STATE_DOCS.items()],
        )
    )
    out.append("### Reasons\n")
    out.append(
        _table(
            ["Reason", "Meaning"],
            [[_code(reason.value), _cell(text)] for reason, text in REASON_DOCS.items()],
        )
    )
    out.append("### Conditions\n")
    out.append(
        "The reasons the poller writes on each condition type (`kubectl wait "
        "--for=condition=TYPE`). A finished job's `Finished` and `Succeeded` conditions "
        "carry the cause of its end (the causes in the message tables below), else its "
        "reason.\n"
    )
    by_type: dict[str, dict[str, set[str]]] = {}
    for found in condition_reasons(package):
        by_type.setdefault(found.condition, {}).setdefault(found.reason, set()).add(found.module)
    messages = status_messages(package)
    causes = {c for m in messages if m.state == "Complete" for c in m.causes} | {
        m.reason for m in messages if m.state == "Complete"
    }
    rows = []
    for kind in api.ConditionType:
        reasons = by_type.get(kind.value, {})
        shown = sorted(r for r in reasons if not r.startswith("<"))
        placeholders = sorted(r for r in reasons if r.startswith("<"))
        if kind in (api.ConditionType.FINISHED, api.ConditionType.SUCCEEDED):
            shown = sorted({*shown, *(c for c in causes if not c.startswith("<"))})
        modules = sorted({m for r in reasons.values() for m in r})
        cells = [_code(r) for r in shown] + [_code(p) for p in placeholders]
        rows.append([_code(kind.value), ", ".join(cells), ", ".join(_code(m) for m in modules)])
    out.append(_table(["Condition", "Reasons", "Written in"], rows))
    out.append("### Status messages\n")
    out.append(
        "Every `status.message` the poller writes, by `status.reason`, as found in its "
        "source: `<...>` is filled in at run time (a pod's name, the kubelet's or lm_eval's "
        "own words). **Cause** is the reason of the Event posted with the message and, for a "
        "finished job, of its `Finished` and `Succeeded` conditions.\n"
    )
    order = {reason.value: index for index, reason in enumerate(api.JobReason)}
    groups: dict[str, list[StatusMessage]] = {}
    for message in messages:
        groups.setdefault(message.reason, []).append(message)
    for reason in sorted(groups, key=lambda r: (order.get(r, len(order)), r)):
        title = reason or "Rewritten in place (state and reason as another write sets them)"
        out.append(f"#### {_cell(title) if not reason else _code(reason)}\n")
        rows = [
            [
                _code(m.state) if m.state else "",
                _code(m.template),
                ", ".join(_code(c) for c in m.causes),
                _code(m.module),
            ]
            for m in sorted(groups[reason], key=lambda m: (m.state, m.template, m.module))
        ]
        out.append(_table(["State", "Message", "Cause", "From"], rows))
    return "\n".join(out).rstrip("\n") + "\n"


# -- command line --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=_COMMAND, description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="fail, naming each stale page, if any is out of date"
    )
    parser.add_argument(
        "--root", type=Path, default=REPO_ROOT, help="the checkout to work on (default: this one)"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.root)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    written, problems = write(args.root)
    for path in written:
        print(f"wrote {path}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
