"""Find every place where a custom-task ConfigMap makes lm_eval run code.

A job's ``spec.customTasks`` ConfigMaps are mounted in its pod and handed to
lm_eval with ``--include_path``. Whoever can write such a ConfigMap then
decides what lm_eval does, and lm_eval 0.4.13 runs Python named by task
files whatever ``--confirm_run_unsafe_code`` says. Read from its source:

- ``lm_eval/tasks/_yaml_loader.py`` loads task YAML with ``yaml.load`` and a
  loader derived from ``CSafeLoader`` (``FullLoader`` when PyYAML lacks
  libyaml, which also honours ``!!python/name:`` tags) plus a ``!function``
  constructor. ``!function mod.fn`` executes ``mod.py`` next to the YAML (the
  dots become slashes, so ``!function .tmp.x.fn`` runs ``/tmp/x.py``), and
  when no such file exists imports ``mod`` from the image (``!function
  os.system`` is enough). Any position: ``process_docs``,
  ``doc_to_text``, ``metric``, ``aggregation``, ``custom_dataset``,
  ``class`` (a Python task class), filters...
- ``include:`` loads another file as task YAML: relative to the file, or any
  absolute path (another ConfigMap, a claim, whatever the pod mounts), and
  whatever its name (``include: data.txt`` parses data.txt as YAML).
- Templates (``doc_to_text``, ``doc_to_target``, ``doc_to_choice``,
  ``gen_prefix``...) are rendered by ``lm_eval.utils.apply_template`` with a
  plain ``jinja2.Environment``, not a sandboxed one: ``{{ x.__class__ }}``,
  ``cycler.__init__.__globals__.os`` and generator frames reach Python.
- A metric name lm_eval does not know, or any with ``hf_evaluate: true``, goes
  to ``evaluate.load``, which imports a local ``.py`` path or (online) a
  metric script from the Hugging Face Hub.
- ``trust_remote_code`` in ``dataset_kwargs``: lm_eval drops it with
  datasets >= 4 (the image has 5.2, which runs no loading scripts), but an
  image with an older datasets would run the dataset's script.

This module is pure: it reads a ConfigMap's ``data`` and ``binaryData`` and
returns `Finding`s (key, what, a short quote). It parses rather than greps:
a quoted string that mentions ``!function`` is not a tag, and a template is
read with Jinja's own parser. A YAML file that does not parse is a finding
too (what lm_eval would make of it cannot be checked).

Templates are judged statically, which cannot be exact for an unsandboxed
Jinja (a subscript whose key comes from the data is also an attribute
lookup). A template is flagged when it names an attribute or key that is
private (``_x``, ``__class__``) or on the list Jinja's own sandbox refuses
(frames, generators, ``mro``, ``format``); gives ``attr``, ``map`` and the
like a computed or private name; uses Jinja's Python globals (``lipsum``,
``cycler``, ``joiner``, ``namespace``, ``self``) or ``loop`` beyond its data
and calls; subscripts with a computed key twice in one expression; calls what
a computed subscript returned; or binds one with ``set``/``for``/``with``.
Checked against lm_eval 0.4.13's own 13,986 task files, no template there is
flagged, while ``{{ cycler.__init__.__globals__.os.popen(...) }}`` and its
disguises (see the unit tests) are.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import jinja2
import yaml
from jinja2 import nodes as jn

__all__ = [
    "MAX_CONFIGMAP_BYTES",
    "MAX_FINDINGS",
    "MAX_TEMPLATES",
    "MAX_TEMPLATE_CHARS",
    "MAX_YAML_EVENTS",
    "QUOTE_CHARS",
    "Finding",
    "scan_configmap",
]

# The apiserver refuses a ConfigMap whose data and binaryData exceed 1 MiB
# together; anything larger cannot come from a valid object and is not parsed.
MAX_CONFIGMAP_BYTES = 1024 * 1024
# Findings kept per ConfigMap: enough to say what to fix, bounded for messages.
MAX_FINDINGS = 20
# Characters of the offending text quoted in a finding.
QUOTE_CHARS = 80
# Work per ConfigMap, so that a hostile one costs the poller about a second
# (measured here: libyaml and the walk ~4 s per MiB of dense YAML, 100,000
# events ~0.5 s; Jinja ~70 KB of template text a second). A task file has a
# few dozen nodes and a handful of short templates; past a limit the
# ConfigMap is reported as not checkable instead of being parsed on.
MAX_YAML_EVENTS = 100_000  # parser events (about one per node) in all its YAML
MAX_TEMPLATES = 1000
MAX_TEMPLATE_CHARS = 64 * 1024

YAML_SUFFIXES = (".yaml", ".yml")
PYTHON_SUFFIXES = (".py", ".pyc", ".pyw", ".pth", ".so")
# Tags a task file may carry without naming code: YAML's own core schema.
_CORE = "tag:yaml.org,2002:"
SAFE_TAGS = frozenset(
    _CORE + name
    for name in (
        "str", "int", "float", "bool", "null", "map", "seq", "timestamp",
        "binary", "merge", "omap", "pairs", "set", "value",
    )
)  # fmt: skip
# Attribute names Jinja's SandboxedEnvironment refuses besides private ones
# (jinja2.sandbox.is_internal_attribute and its str.format handling).
UNSAFE_ATTRIBUTES = frozenset(
    {
        "mro", "format", "format_map",
        "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await",
        "ag_frame", "ag_code", "ag_await", "tb_frame", "tb_next",
        "f_back", "f_builtins", "f_code", "f_globals", "f_locals", "f_trace",
        "func_code", "func_globals", "im_class", "im_func", "im_self",
    }
)  # fmt: skip
# Jinja's default globals that are Python functions or classes (their methods
# lead to their module's globals): never needed by a task, refused outright.
# range and dict are builtins without such a path.
PYTHON_GLOBALS = frozenset({"lipsum", "cycler", "joiner", "namespace", "self", "caller"})
# What a task may read from `loop` in a for loop, and the methods it may call.
LOOP_ATTRIBUTES = frozenset(
    {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0",
     "previtem", "nextitem", "cycle", "changed"}
)  # fmt: skip
LOOP_METHODS = frozenset({"cycle", "changed"})
# Filters that look an attribute up by a name given as an argument (or, for
# map, select and reject, call a filter or test by name: map("attr", ...)):
# those names must be literals, and not private.
NAME_TAKING_FILTERS = frozenset(
    {"attr", "map", "select", "reject", "selectattr", "rejectattr", "groupby", "sort", "sum",
     "min", "max", "unique", "join"}
)  # fmt: skip


@dataclass(frozen=True)
class Finding:
    """One place in a ConfigMap that names code (or cannot be checked)."""

    key: str
    what: str
    quote: str = ""
    line: int = 0  # in the file, when known (for ordering and the message)

    def __str__(self) -> str:
        where = f" line {self.line}" if self.line else ""
        quoted = f": {self.quote}" if self.quote else ""
        return f"key {self.key}{where}: {self.what}{quoted}"


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= QUOTE_CHARS else flat[: QUOTE_CHARS - 3] + "..."


def scan_configmap(data: Mapping[str, str], binary_data: Mapping[str, str]) -> list[Finding]:
    """Every place in a ConfigMap's files that names code, in key order (bounded)."""
    size = sum(len(k) + len(v) for k, v in (*data.items(), *binary_data.items()))
    if size > MAX_CONFIGMAP_BYTES:
        return [Finding("*", f"too large to check ({size} bytes, limit {MAX_CONFIGMAP_BYTES})")]
    files: dict[str, bytes] = {key: value.encode("utf-8") for key, value in data.items()}
    findings: list[Finding] = []
    for key, value in binary_data.items():
        try:
            files[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            findings.append(Finding(key, "binaryData that is not base64"))
    findings += _scan_files(files)
    findings.sort(key=lambda f: (f.key, f.line))
    return findings[:MAX_FINDINGS]


def _scan_files(files: Mapping[str, bytes]) -> list[Finding]:
    findings = [
        Finding(key, "a Python file (task YAML can run it with !function)")
        for key in files
        if key.endswith(PYTHON_SUFFIXES)
    ]
    # lm_eval indexes *.yaml; include: loads any file of the folder as YAML.
    pending = [key for key in files if key.endswith(YAML_SUFFIXES)]
    parsed: set[str] = set()
    budget = _Budget(MAX_YAML_EVENTS, MAX_TEMPLATES, MAX_TEMPLATE_CHARS)
    while pending:
        key = pending.pop()
        if key in parsed:
            continue
        parsed.add(key)
        for item in _scan_yaml(key, files[key], budget):
            if isinstance(item, Finding):
                findings.append(item)
            elif item in files:
                pending.append(item)
    return findings


@dataclass
class _Budget:
    """What is left of the per-ConfigMap limits."""

    events: int
    templates: int
    template_chars: int


# libyaml is ~8x faster than PyYAML's Python parser and refuses nesting deeper
# than 1000 levels; PyYAML's parser stops at the recursion limit instead.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _scan_yaml(key: str, text: bytes, budget: _Budget) -> Iterator[Finding | str]:
    """Findings in one YAML file, and the names of sibling files it includes."""
    try:
        # Counted on the event stream first: nodes are built only when few.
        for _ in yaml.parse(text, Loader=_LOADER):
            budget.events -= 1
            if budget.events < 0:
                yield Finding(key, f"more than {MAX_YAML_EVENTS} YAML events (not all checked)")
                return
        documents = list(yaml.compose_all(text, Loader=_LOADER))
    except (yaml.YAMLError, RecursionError, UnicodeDecodeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        yield Finding(key, "YAML that does not parse (cannot be checked)", _quote(first))
        return
    seen: set[int] = set()
    stack: list[yaml.Node] = [doc for doc in documents if doc is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:  # aliases share nodes: each is walked once
            continue
        seen.add(id(node))
        if node.tag not in SAFE_TAGS:
            value = node.value if isinstance(node, yaml.ScalarNode) else "..."
            line = node.start_mark.line + 1
            yield Finding(key, f"YAML tag {node.tag}", _quote(f"{node.tag} {value}"), line)
        if isinstance(node, yaml.MappingNode):
            for name, value in node.value:
                stack += [name, value]
                if isinstance(name, yaml.ScalarNode):
                    yield from _scan_entry(key, str(name.value), value)
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
        elif isinstance(node, yaml.ScalarNode) and node.tag == _CORE + "str":
            template = str(node.value)
            if "{{" not in template and "{%" not in template:
                continue
            line = node.start_mark.line + 1
            budget.templates -= 1
            budget.template_chars -= len(template)
            if budget.templates < 0 or budget.template_chars < 0:
                limits = f"{MAX_TEMPLATES} templates or {MAX_TEMPLATE_CHARS} characters"
                yield Finding(key, f"templates beyond {limits} (not all checked)")
                return
            reason = _template_reason(template)
            if reason is not None:
                what = f"a template that reaches Python ({reason})"
                yield Finding(key, what, _quote(template), line)


def _scalars(node: yaml.Node) -> list[str]:
    if isinstance(node, yaml.ScalarNode):
        return [str(node.value)]
    if isinstance(node, yaml.SequenceNode):
        return [str(n.value) for n in node.value if isinstance(n, yaml.ScalarNode)]
    return []


def _scan_entry(key: str, name: str, value: yaml.Node) -> Iterator[Finding | str]:
    """What a task-file entry means beyond its tags (include, class, metric...)."""
    line = value.start_mark.line + 1
    if name == "include":
        for target in _scalars(value):
            # Keys hold no "/": a path with one (once "./" is gone) leaves the folder.
            inside = posixpath.normpath(target)
            if "/" in inside or inside in (".", ".."):
                yield Finding(key, "include of a file outside this ConfigMap", _quote(target), line)
            else:
                yield inside
    elif name == "class":
        yield Finding(key, "class: a Python task class", _quote(str(value.value)), line)
    elif name == "trust_remote_code" and _truthy(value):
        yield Finding(key, "trust_remote_code (a dataset loading script)", "", line)
    elif name == "hf_evaluate" and _truthy(value):
        yield Finding(key, "hf_evaluate: a metric script loaded by evaluate", "", line)
    elif name == "metric":
        for metric in _scalars(value):
            if "/" in metric or metric.endswith(".py"):
                yield Finding(key, "metric loaded by evaluate from a path", _quote(metric), line)


def _truthy(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and str(node.value).strip().lower() not in (
        "", "false", "no", "off", "0", "null", "~",
    )  # fmt: skip


# -- templates -------------------------------------------------------------------


def _unsafe_name(name: object) -> bool:
    if not isinstance(name, str):
        return False
    # A lone "_" is a fill-in blank in task text, not an attribute anyone has.
    private = name.startswith("_") and name.strip("_") != ""
    return private or name in UNSAFE_ATTRIBUTES


def _unsafe_path(path: object) -> bool:
    """An ``attribute=`` argument: dotted, each part looked up in turn."""
    return isinstance(path, str) and any(_unsafe_name(part) for part in path.split("."))


_ENV = jinja2.Environment(autoescape=False)  # noqa: S701 (parsing only, never rendering)


def _template_reason(text: str) -> str | None:
    """Why the template `text` may reach Python, or None."""
    try:
        tree = _ENV.parse(text)
    except (jinja2.TemplateSyntaxError, RecursionError):
        # The job image's Jinja may be another version, and its stack deeper:
        # what cannot be parsed here cannot be vouched for.
        return "it does not parse here, so it cannot be checked"
    # `loop` is a Python object whose methods (cycle, changed) reach their
    # module's globals in one lookup: a task may read its data attributes and
    # call those methods, nothing else (not index them, bind or pass them).
    called = {id(call.node) for call in tree.find_all(jn.Call)}
    allowed_loop = {
        id(node.node)
        for node in tree.find_all(jn.Getattr)
        if _is_loop(node.node)
        and node.attr in LOOP_ATTRIBUTES
        and (node.attr not in LOOP_METHODS or id(node) in called)
    }
    for node in tree.find_all(jn.Node):
        if _is_loop(node) and id(node) not in allowed_loop:
            return "a use of Jinja's loop other than its data or a call"
        reason = _node_reason(node)
        if reason is not None:
            return reason
    return None


def _is_loop(node: jn.Node) -> bool:
    return isinstance(node, jn.Name) and node.name == "loop"


def _is_computed(node: jn.Node) -> bool:
    """A subscript whose key is not a literal (so maybe a name from the data)."""
    if not isinstance(node, jn.Getitem):
        return False
    key = node.arg.node if isinstance(node.arg, jn.Neg | jn.Pos) else node.arg  # [-1]
    return not isinstance(key, jn.Const | jn.Slice)


def _contains_computed(node: jn.Node) -> bool:
    return _is_computed(node) or any(_is_computed(n) for n in node.find_all(jn.Getitem))


def _node_reason(node: jn.Node) -> str | None:
    """Why one node of a template may reach Python, or None."""
    if isinstance(node, jn.Name) and node.name in PYTHON_GLOBALS:
        return f"Jinja's {node.name}"
    if isinstance(node, jn.Getattr) and _unsafe_name(node.attr):
        return f"attribute {node.attr}"
    if isinstance(node, jn.Getitem):
        if isinstance(node.arg, jn.Const) and _unsafe_name(node.arg.value):
            return f"key {node.arg.value}"
        if _is_computed(node) and _contains_computed(node.node):
            return "two computed lookups in one chain"
    if isinstance(node, jn.Call) and _is_computed(node.node):
        return "a call of what a computed lookup returned"
    if isinstance(node, jn.Filter | jn.Test) and node.name in NAME_TAKING_FILTERS:
        names = [*node.args, *(kw.value for kw in node.kwargs if kw.key == "attribute")]
        if any(not isinstance(n, jn.Const) or _unsafe_path(n.value) for n in names):
            return f"a name given to {node.name} that is computed or private"
    if isinstance(node, jn.Assign | jn.For | jn.With):
        bound = [node.node] if isinstance(node, jn.Assign) else []
        if isinstance(node, jn.For):
            bound = [node.iter]
        if isinstance(node, jn.With):
            bound = list(node.values)
        if any(_contains_computed(value) for value in bound):
            return "a computed lookup bound to a name"
    return None
