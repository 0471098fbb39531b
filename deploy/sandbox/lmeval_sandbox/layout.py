"""The operator's layout as its imports draw it: a Markdown report anyone can run.

``python -m lmeval_sandbox.layout [--repo DIR] [--no-trips]`` prints the import
contracts' size, modules per folder, the operator's rooms (modules), floors
(the longest import path) and arrows (import edges), the longest and median
function, how many files one job's trip through ``Actuator.carry_out`` and
``Observer.gather`` enters and how often it climbs back up (measured at run
time on a unit test), and the ``duplicates`` pairs (when that tool is on
PATH). Why: the layering is a design claim; this is how it is measured
before and after a change to it (the figures of the layout step are in
poller/ARCHITECTURE.md's history, issue 31).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

EXCLUDED = ["poller.cli", "poller.sandbox"]
CARRY_OUT_TEST = (
    "tests/unit/test_made_objects.py::test_the_jobs_own_claim_is_adopted_and_the_pod_made"
)
GATHER_TEST = (
    "tests/unit/test_observe_then_decide.py::"
    "test_every_job_enters_decide_once_per_cycle[results in the first window]"
)
HEADER = re.compile(r"^\[\[?\s*[A-Za-z0-9_.\"' -]+\s*\]\]?\s*(#.*)?$")


def excluded(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in EXCLUDED)


def discover(repo: Path) -> dict[str, Path]:
    """Every operator module under poller/ (recursively) by dotted name."""
    mods: dict[str, Path] = {}
    for path in sorted((repo / "poller").rglob("*.py")):
        parts = list(path.relative_to(repo).with_suffix("").parts)
        if any(p.startswith(".") or p == "__pycache__" for p in parts):
            continue
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if not excluded(name):
            mods[name] = path
    return mods


def has_code(tree: ast.Module) -> bool:
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return bool(body)


def contracts_size(repo: Path) -> tuple[int, int, int, int]:
    """(code lines, comment lines, blank lines, contracts) of [tool.importlinter]."""
    code = comments = blank = contracts = 0
    inside = False
    for raw in (repo / "pyproject.toml").read_text().splitlines():
        line = raw.strip()
        if HEADER.match(line):
            inside = line.startswith(("[tool.importlinter", "[[tool.importlinter"))
            contracts += inside and line.startswith("[[")
        if not inside:
            continue
        if not line:
            blank += 1
        elif line.startswith("#"):
            comments += 1
        else:
            code += 1
    return code, comments, blank, contracts


def resolve(src: str, is_pkg: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    out: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            parts = alias.name.split(".")
            for i in range(len(parts), 0, -1):  # the deepest module the name names
                if ".".join(parts[:i]) in known:
                    out.add(".".join(parts[:i]))
                    break
        return out
    base = node.module or ""
    if node.level:
        pkg = src.split(".") if is_pkg else src.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join([*pkg, base] if base else pkg)
    for alias in node.names:
        if f"{base}.{alias.name}" in known:
            out.add(f"{base}.{alias.name}")
        elif base in known:
            out.add(base)
    return out


@dataclass
class Layout:
    mods: dict[str, Path]
    trees: dict[str, ast.Module]
    empty_inits: set[str]
    edges: set[tuple[str, str]] = field(default_factory=set)

    @property
    def rooms(self) -> list[str]:
        return sorted(m for m in self.mods if m not in self.empty_inits)


def build(repo: Path) -> Layout:
    mods = discover(repo)
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in mods.items()}
    empty = {m for m, p in mods.items() if p.name == "__init__.py" and not has_code(trees[m])}
    lay = Layout(mods, trees, empty)
    known = set(mods)
    for m, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for t in resolve(m, mods[m].name == "__init__.py", node, known):
                    if t != m and t not in empty:
                        lay.edges.add((m, t))
    return lay


def sccs(nodes: list[str], adj: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(adj[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def floors(lay: Layout) -> tuple[int, list[str], list[list[str]]]:
    nodes = lay.rooms
    adj: dict[str, set[str]] = {n: set() for n in nodes}
    for a, b in lay.edges:
        adj[a].add(b)
    comps = sccs(nodes, adj)
    comp_of = {n: i for i, c in enumerate(comps) for n in c}
    cadj: dict[int, set[int]] = {i: set() for i in range(len(comps))}
    for a, b in lay.edges:
        if comp_of[a] != comp_of[b]:
            cadj[comp_of[a]].add(comp_of[b])
    best: dict[int, list[int]] = {}
    for i in range(len(comps)):  # Tarjan emits components callees first
        tails = [best[j] for j in cadj[i]]
        best[i] = [i, *max(tails, key=len, default=[])]
    path = max(best.values(), key=len, default=[])
    return len(path), ["+".join(comps[i]) for i in path], [c for c in comps if len(c) > 1]


def folder_of(module: str) -> str:
    """The folder a module lives in: its layer's subpackage, or the module itself
    when it sits directly in poller/ (the process's modules are layers of their own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else module.removeprefix("poller.")


def folder_graph(lay: Layout) -> tuple[int, int, list[str], list[list[str]]]:
    """The same graph drawn between folders: their number, the arrows between
    them, the longest path and any cycles (a folder-level cycle breaks layering)."""
    edges = {(folder_of(a), folder_of(b)) for a, b in lay.edges}
    edges = {(a, b) for a, b in edges if a != b}
    nodes = sorted({folder_of(m) for m in lay.rooms} | {f for e in edges for f in e})
    grouped = Layout({n: Path(n) for n in nodes}, {}, set(), edges)
    length, path, cycles = floors(grouped)
    return len(nodes), len(edges), path[:length], cycles


def functions(lay: Layout) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                found.append(((child.end_lineno or child.lineno) - child.lineno + 1, name))
                walk(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    for m in lay.rooms:
        walk(lay.trees[m], m + ":")
    return found


@dataclass
class Trip:
    files: list[str] = field(default_factory=list)
    returns_up: int = 0
    # the returns whose caller is in another layer (folder) than the callee
    layer_returns: int = 0
    pairs: set[tuple[str, str]] = field(default_factory=set)
    max_depth: int = 0


def _folder(file: str) -> str:
    """The layer of an operator file: its folder under poller/, or itself at the root."""
    parts = Path(file).parts
    below = parts[len(parts) - 1 - parts[::-1].index("poller") + 1 :]
    return below[0] if len(below) > 1 else below[0].removesuffix(".py")


class Tracer:
    """A profile hook on while a frame of `qualname` (in an operator file) runs, per thread."""

    def __init__(self, qualname: str, files: set[str]) -> None:
        self.qualname, self.files = qualname, files
        self.trips: list[Trip] = []
        self.local = threading.local()
        self.lock = threading.Lock()

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        file = frame.f_code.co_filename
        if file not in self.files:
            return
        stack: list[tuple[str, int]] | None = getattr(self.local, "stack", None)
        trip: Trip | None = getattr(self.local, "trip", None)
        if event == "call":
            if stack is None or trip is None:
                if frame.f_code.co_qualname != self.qualname:
                    return
                trip, stack = Trip(), []
                self.local.trip, self.local.stack, self.local.top = trip, stack, frame
                with self.lock:
                    self.trips.append(trip)
            depth = stack[-1][1] + (stack[-1][0] != file) if stack else 1
            stack.append((file, depth))
            trip.max_depth = max(trip.max_depth, depth)
            if file not in trip.files:
                trip.files.append(file)
        elif stack is not None and trip is not None:
            stack.pop()
            if stack and stack[-1][0] != file:
                trip.returns_up += 1
                trip.pairs.add((file, stack[-1][0]))
                if _folder(file) != _folder(stack[-1][0]):
                    trip.layer_returns += 1
            if frame is self.local.top:
                self.local.stack = self.local.trip = self.local.top = None


def run_trip(repo: Path, nodeid: str, qualname: str, files: set[str]) -> tuple[int, list[Trip]]:
    pytest = importlib.import_module("pytest")
    tracer = Tracer(qualname, files)
    old_cwd = os.getcwd()
    os.chdir(repo)
    sys.path.insert(0, str(repo))
    threading.setprofile(tracer.hook)
    sys.setprofile(tracer.hook)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the report alone on stdout
            code = int(pytest.main([nodeid, "-q", "-p", "no:cacheprovider"]))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        os.chdir(old_cwd)
    return code, tracer.trips


def find_class(lay: Layout, cls: str, method: str) -> str | None:
    for m in lay.rooms:
        for node in ast.walk(lay.trees[m]):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                names = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                if method in names:
                    return m
    return None


def run(*argv: str) -> str:
    """A command's stdout ('' when it cannot run)."""
    exe = shutil.which(argv[0])
    if exe is None:
        return ""
    try:
        res = subprocess.run(
            [exe, *argv[1:]], capture_output=True, text=True, check=False, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout


def duplicates(folder: Path) -> str:
    text = run("duplicates", "--repo", str(folder), "--most", "200", "--seconds", "120")
    first = (text.splitlines() or ["(no output)"])[0]
    hit = re.match(r"(\d+) pairs?", first)
    count = hit.group(1) if hit else ("0" if first.startswith("no duplicates") else "?")
    files = re.search(r"(\d+) files? read", first)
    extra = [ln for ln in text.splitlines() if ln.startswith(("incomplete:", "left out:"))]
    note = "; " + "; ".join(extra) if extra else ""
    return f"**{count}** pairs ({files.group(1) if files else '?'} files read{note})"


def report(args: argparse.Namespace) -> str:
    repo: Path = args.repo.resolve()
    lay = build(repo)
    out: list[str] = []

    def add(*parts: str) -> None:
        out.append("".join(parts))

    head = run("git", "-C", str(repo), "rev-parse", "--short", "HEAD").strip() or "?"
    add(f"# Operator layout metrics: `{repo}` (HEAD `{head}`)\n")
    excl = " / ".join(f"`{e}`" for e in EXCLUDED)
    add(f"Operator = every module under `poller/` except {excl} and below (package boundary).\n")
    code, comments, blank, n = contracts_size(repo)
    add("## 1. Import contracts' size\n")
    add(
        f"- `[tool.importlinter]` + its {n} `[[tool.importlinter.contracts]]` tables: ",
        f"**{code}** non-blank, non-comment lines; **{code + comments}** lines with comments; ",
        f"{code + comments + blank} with blank lines too (from the `[tool.importlinter]` line ",
        "to the next other table header; the comment lines just above it are not counted).\n",
    )
    add("## 2. Modules per folder\n")
    add(
        "Counted: `.py` files other than `__init__.py` (`__main__.py` counts); the last column ",
        "says whether the folder's `__init__.py` has code beyond a docstring.\n",
    )
    add("| folder | modules | `__init__.py` |")
    add("| --- | ---: | --- |")
    folders: dict[str, list[str]] = {}
    for p in lay.mods.values():
        folders.setdefault(str(p.parent.relative_to(repo)) + "/", []).append(p.name)
    for folder, names in sorted(folders.items()):
        pkg = ".".join(Path(folder).parts)
        state = "empty/docstring" if pkg in lay.empty_inits else "has code"
        state = state if "__init__.py" in names else "none"
        add(f"| `{folder}` | {sum(n != '__init__.py' for n in names)} | {state} |")
    length, path, cycles = floors(lay)
    inits = [m for m in lay.rooms if lay.mods[m].name == "__init__.py"]
    add("\n## 3. Rooms, floors and arrows\n")
    add(
        f"- Rooms (operator modules; an `__init__` only if it has code): **{len(lay.rooms)}** ",
        f"(of {len(lay.mods)} files; `__init__` with code: {', '.join(inits) or 'none'}).",
    )
    add(
        "- Arrows (distinct import edges between rooms; no self-edges; every `import`/`from` ",
        "anywhere in a file, in functions and `if` blocks too; relative ones resolved; edges ",
        f"into a docstring-only `__init__` dropped): **{len(lay.edges)}**.",
    )
    add(
        f"- Floors (nodes on the longest import path after collapsing cycles): **{length}**: ",
        " → ".join(f"`{p.removeprefix('poller.')}`" for p in path),
        ".",
    )
    add(
        "- Cycles (SCCs of more than one module): ",
        "; ".join(", ".join(c) for c in cycles) if cycles else "**none**",
        ".\n",
    )
    count, arrows, chain, loops = folder_graph(lay)
    add(
        f"- By folder (a layer's subpackage, or a module directly in poller/): **{count}** ",
        f"rooms, **{arrows}** arrows, **{len(chain)}** floors: ",
        " → ".join(f"`{p}`" for p in chain),
        "; cycles: ",
        "; ".join(", ".join(c) for c in loops) if loops else "**none**",
        ".\n",
    )
    funcs = functions(lay)
    if funcs:
        top = max(funcs)
        add("## 4. Functions\n")
        add(
            f"- Longest: **{top[0]}** lines, `{top[1]}` (end_lineno - lineno + 1: from the ",
            "`def` line, decorators not counted).",
        )
        add(
            f"- Median of {len(funcs)} functions and methods (nested ones included): ",
            f"**{statistics.median(n for n, _ in funcs):g}** lines.\n",
        )
    add("## 5. One job's trip (measured at run time)\n")
    add(
        "Files = distinct operator files whose frames are entered while the method runs (its own ",
        "included). Returns up = `return` events of an operator frame whose nearest enclosing ",
        "operator frame is in another file (stdlib and third-party frames in between are skipped; ",
        "a generator's `yield` is a return event too); to another layer = those whose two files ",
        "are in different folders (a module directly in poller/ is a layer of its own, so in a ",
        "flat package every return up is one); distinct = distinct (from file, to file) ",
        "pairs of those. Depth = the most operator files stacked at once (consecutive frames ",
        "of one file count once). Other threads are followed from where they enter the method.\n",
    )
    add(
        "| method | class in | test | pytest exit | trips | files | returns up | to another "
        "layer | distinct | depth |"
    )
    add("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    files = {str(p.resolve()) for p in lay.mods.values()} | {str(p) for p in lay.mods.values()}
    entered: list[str] = []
    for spec, nodeid in ((args.carry_out, args.carry_out_test), (args.gather, args.gather_test)):
        cls, _, method = spec.partition(".")
        where = find_class(lay, cls, method)
        if args.no_trips or where is None:
            add(f"| `{spec}` | {where or 'not found'} | `{nodeid}` | not run | | | | | | |")
            continue
        exit_code, trips = run_trip(repo, nodeid, spec, files)
        t = trips[0] if trips else Trip()
        listed = ", ".join(f"`{os.path.relpath(f, repo)}`" for f in t.files)
        entered.append(f"- `{spec}` ({len(trips)} trip(s), the first shown): {listed}")
        add(
            f"| `{spec}` | `{lay.mods[where].relative_to(repo)}` | `{nodeid}` | {exit_code} | ",
            f"{len(trips)} | **{len(t.files)}** | **{t.returns_up}** | **{t.layer_returns}** | ",
            f"{len(t.pairs)} | ",
            f"{t.max_depth} |",
        )
    out += ["", *entered, "", "## 6. Duplicates (`duplicates --most 200`)\n"]
    with tempfile.TemporaryDirectory() as tmp:
        for p in lay.mods.values():
            dest = Path(tmp) / p.relative_to(repo / "poller")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest)
        operator_only = duplicates(Path(tmp))
    add(
        "- `poller/` whole (the tool cannot exclude folders, so the CLI and the sandbox are in): ",
        duplicates(repo / "poller"),
    )
    add(f"- operator only (its files copied alone to a temporary folder): {operator_only}")
    add(f"- `driver/`: {duplicates(repo / 'driver')}")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[3])
    ap.add_argument("--carry-out", default="Actuator.carry_out", help="Class.method")
    ap.add_argument("--gather", default="Observer.gather", help="Class.method")
    ap.add_argument("--carry-out-test", default=CARRY_OUT_TEST, help="pytest node id")
    ap.add_argument("--gather-test", default=GATHER_TEST, help="pytest node id")
    ap.add_argument("--no-trips", action="store_true", help="skip the run-time trips")
    ap.add_argument(
        "--exclude",
        action="append",
        metavar="DOTTED",
        help="not the operator (repeatable; default: poller.cli, poller.sandbox)",
    )
    args = ap.parse_args()
    if args.exclude:
        EXCLUDED[:] = args.exclude
    sys.stdout.write(report(args))


if __name__ == "__main__":
    main()
