"""Which build of the operator is running: its version and source revision.

Why this module exists: the version is written once, in the distributions'
metadata (the four pyproject.toml files, kept equal by
``python -m lmeval_sandbox.version``), and every place that shows it
(``lmeval-poller --version``, the metric ``lmeval_build_info``, ``lmeval
version``) reads it from there instead of repeating a literal that drifts.

`version` is the installed metadata of ``lmeval-operator`` (the operator's
image), else of ``lmeval-poller`` (a development checkout's editable
install), else ``0+unknown``. `revision` is ``$LMEVAL_REVISION``, which the
images set from their ``REVISION`` build argument (Dockerfile); in a git
checkout without it, ``git rev-parse HEAD`` run once, on first use; else
``unknown``.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "DISTRIBUTIONS",
    "REVISION_ENV",
    "UNKNOWN_REVISION",
    "UNKNOWN_VERSION",
    "VersionAction",
    "describe",
    "revision",
    "short_revision",
    "version",
]

# The operator's own distribution first: in its image it is the only one. The
# development distribution holds the same modules (pyproject.toml, `.[dev]`).
DISTRIBUTIONS = ("lmeval-operator", "lmeval-poller")
# A PEP 440 local version: sorts below every release, and says what it is.
UNKNOWN_VERSION = "0+unknown"
UNKNOWN_REVISION = "unknown"
REVISION_ENV = "LMEVAL_REVISION"
# A git object name: SHA-1 (40 hex digits) or SHA-256 (64).
_OBJECT_NAME = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
# git answers in milliseconds; a hung filesystem must not hang the poller's start.
_GIT_TIMEOUT_SECONDS = 5.0
# What `describe` shows of a commit (git's own default abbreviation).
SHORT_REVISION = 7


@functools.cache
def version() -> str:
    """The installed version of the operator's distribution (cached: it cannot change)."""
    for name in DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return UNKNOWN_VERSION


def revision(environ: Mapping[str, str] | None = None) -> str:
    """The source revision: ``$LMEVAL_REVISION``, else the checkout's HEAD, else ``unknown``."""
    given = (os.environ if environ is None else environ).get(REVISION_ENV, "").strip()
    if given:
        return given
    return _checkout_revision(Path(__file__).resolve().parent.parent)


@functools.cache
def _checkout_revision(root: Path) -> str:
    """HEAD of the git checkout at `root`, asked once per process.

    Only where `root` is a checkout (``.git`` is a directory, or a file in a
    worktree): an installed package sits in site-packages, which has none, so
    an image never starts git. Any failure (no git, not a repository, an
    owner git distrusts, a timeout) is ``unknown``, never an error.
    """
    if not (root / ".git").exists():
        return UNKNOWN_REVISION
    # The caller's GIT_DIR or GIT_WORK_TREE would point git at another repository.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--verify", "HEAD"],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_SECONDS,
            env=env,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN_REVISION
    answer = done.stdout.strip()
    if done.returncode != 0 or not _OBJECT_NAME.fullmatch(answer):
        return UNKNOWN_REVISION
    return answer


def short_revision(full: str) -> str:
    """A commit's name abbreviated as git does; anything else as it is."""
    return full[:SHORT_REVISION] if _OBJECT_NAME.fullmatch(full) else full


def describe(program: str, environ: Mapping[str, str] | None = None) -> str:
    """One line for ``--version``, e.g. ``lmeval-poller 0.1.0 (revision abc1234)``."""
    return f"{program} {version()} (revision {short_revision(revision(environ))})"


class VersionAction(argparse.Action):
    """``--version``: print `describe` for the parser's program, and exit 0.

    argparse's own ``version`` action takes the text when the parser is
    built; this one asks for it only when the flag is given, so a command
    that is not asked for its version never reads metadata or runs git.
    """

    def __init__(
        self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any
    ) -> None:
        kwargs.setdefault("help", "print the version and source revision, and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(describe(parser.prog))
        parser.exit()
