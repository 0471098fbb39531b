"""``python -m lmeval_sandbox.version [set X.Y.Z]``: the project's one version, shown or set.

Why this module exists: the version is written in four pyproject.toml files
(the development distribution and the three that ship: operator, driver,
CLI), and two of them pin another at it (``lmeval-operator`` requires
``lmeval-driver==X``, ``lmeval-cli`` requires ``lmeval-operator==X``). Edited
by hand, a forgotten one surfaces only when pip refuses to install the set.
Without arguments this prints the version (an error when the files
disagree); ``set`` rewrites all six places at once, line by line so that
every comment and the layout stay, and refuses anything but a plain
``MAJOR.MINOR.PATCH`` (a semantic version that is also a PEP 440 one, the
same string for pip, image tags and the ``app.kubernetes.io/version`` label).

Code never holds the version: `poller.buildinfo` and ``driver.__version__``
read the installed metadata, so a development checkout shows a new version
once its editable install is made again (``deploy/sandbox/setup.sh`` does
that whenever pyproject.toml changes).
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PINS",
    "PYPROJECTS",
    "Change",
    "VersionError",
    "current",
    "main",
    "set_version",
    "valid",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
# Every distribution's pyproject.toml, relative to the repository's root.
PYPROJECTS = (
    "pyproject.toml",
    "poller/pyproject.toml",
    "driver/pyproject.toml",
    "poller/cli/pyproject.toml",
)
# Which file pins which of our distributions at the one version.
PINS = {
    "poller/pyproject.toml": "lmeval-driver",
    "poller/cli/pyproject.toml": "lmeval-operator",
}
# semver 2.0.0's core, without pre-release or build parts: PEP 440 spells
# those differently (1.0.0-rc.1 is 1.0.0rc1 there), and the metadata would
# then disagree with the tag.
_SEMVER = re.compile(r"(?:0|[1-9][0-9]*)\.(?:0|[1-9][0-9]*)\.(?:0|[1-9][0-9]*)")
_VERSION_LINE = re.compile(r'^(version\s*=\s*)"[^"\n]*"', re.MULTILINE)
_TABLE_HEADER = re.compile(r"^\[", re.MULTILINE)


class VersionError(Exception):
    """The files disagree, or a version or a file is not what this tool rewrites."""


def valid(text: str) -> bool:
    """Whether `text` is a version `set_version` accepts: MAJOR.MINOR.PATCH."""
    return _SEMVER.fullmatch(text) is not None


def _project(text: str, where: str) -> dict[str, object]:
    try:
        project = tomllib.loads(text).get("project")
    except tomllib.TOMLDecodeError as error:
        raise VersionError(f"{where}: not TOML: {error}") from error
    if not isinstance(project, dict):
        raise VersionError(f"{where}: no [project] table")
    return project


def _pinned(project: dict[str, object], name: str) -> list[str]:
    """What `project`'s dependencies pin `name` at (``name==X``), one entry per mention."""
    found = []
    dependencies = project.get("dependencies")
    for requirement in dependencies if isinstance(dependencies, list) else []:
        spelled = str(requirement).replace(" ", "")
        if spelled.startswith(f"{name}=="):
            found.append(spelled.removeprefix(f"{name}=="))
        elif re.match(rf"{re.escape(name)}\b", spelled):
            found.append(spelled.removeprefix(name))  # pinned otherwise: reported as it is
    return found


def current(root: Path = REPO_ROOT) -> str:
    """The version the four files and the two pins agree on; VersionError when they don't."""
    seen: dict[str, str] = {}
    for relative in PYPROJECTS:
        project = _project((root / relative).read_text(), relative)
        seen[relative] = str(project.get("version"))
        if relative in PINS:
            name = PINS[relative]
            for pin in _pinned(project, name) or ["(not required)"]:
                seen[f"{relative}: {name}"] = pin
    if len(set(seen.values())) != 1:
        listed = "; ".join(f"{where} {value}" for where, value in seen.items())
        raise VersionError(f"the versions disagree: {listed}")
    return next(iter(seen.values()))


def _rewrite(text: str, relative: str, new: str) -> str:
    """`text` with its [project] version and its pin (if it has one) set to `new`."""
    start = re.search(r"^\[project\][ \t]*$", text, re.MULTILINE)
    if start is None:
        raise VersionError(f"{relative}: no [project] table")
    following = _TABLE_HEADER.search(text, start.end())
    end = following.start() if following else len(text)
    table, count = _VERSION_LINE.subn(rf'\g<1>"{new}"', text[start.end() : end])
    if count != 1:
        raise VersionError(f'{relative}: expected one `version = "..."` line in [project]')
    text = text[: start.end()] + table + text[end:]
    if relative in PINS:
        name = PINS[relative]
        text, count = re.subn(rf'"{re.escape(name)}==[^"\n]*"', f'"{name}=={new}"', text)
        if count != 1:
            raise VersionError(f'{relative}: expected one "{name}==..." requirement')
    # What was written must read back as meant (tomllib, as pip's build would).
    project = _project(text, relative)
    if project.get("version") != new or (
        relative in PINS and _pinned(project, PINS[relative]) != [new]
    ):
        raise VersionError(f"{relative}: the rewritten file does not say {new}")
    return text


@dataclass(frozen=True)
class Change:
    """What `set_version` did."""

    old: str
    new: str
    files: tuple[str, ...]


def set_version(new: str, root: Path = REPO_ROOT) -> Change:
    """Set every distribution's version, and the pins between them, to `new`.

    Every file is rewritten in memory and checked before any is written, so
    a file this cannot rewrite leaves all four as they were.
    """
    if not valid(new):
        raise VersionError(
            f"not a version of the form MAJOR.MINOR.PATCH (e.g. 0.2.0): {new!r}; pre-release "
            "and build suffixes are not accepted (semver and PEP 440 spell them differently)"
        )
    try:
        old = current(root)
    except VersionError as error:  # set makes them agree again
        old = f"({error})"
    texts = {relative: (root / relative).read_text() for relative in PYPROJECTS}
    rewritten = {relative: _rewrite(text, relative, new) for relative, text in texts.items()}
    changed = tuple(r for r in PYPROJECTS if rewritten[r] != texts[r])
    for relative in changed:
        (root / relative).write_text(rewritten[relative])
    return Change(old, new, changed)


def main(argv: Sequence[str] | None = None, root: Path = REPO_ROOT) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lmeval_sandbox.version",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    setter = sub.add_parser("set", help="set the version of every distribution, and their pins")
    setter.add_argument("version", help="MAJOR.MINOR.PATCH, e.g. 0.2.0")
    args = parser.parse_args(argv)
    try:
        if args.command is None:
            print(current(root))
            return 0
        change = set_version(args.version, root)
    except VersionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not change.files:
        print(f"already {change.new}: nothing to change")
        return 0
    print(f"{change.old} -> {change.new}: {', '.join(change.files)}")
    print(
        "the installed metadata (what the code reports) follows once the development "
        "install is made again: source deploy/sandbox/setup.sh, or pip install --no-deps -e ."
    )
    print(
        "the chart carries the version too: python -m lmeval_sandbox.chart; and the "
        "changelog and README need a section and a link for it (deploy/RELEASING.md)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
