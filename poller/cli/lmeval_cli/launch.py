"""The console scripts' entry point: say which extra is missing instead of a traceback.

The operator's distribution installs only what the operator runs (its image
has neither the kubernetes client nor rich); the CLI's dependencies come with
the ``cli`` extra. Someone who installed the plain package and types
``lmeval`` gets one line saying what to install, before anything that needs
those packages is imported.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["CLI_PACKAGES", "main", "missing_packages"]

# Top-level import names of the `cli` extra's distributions.
CLI_PACKAGES = ("kubernetes", "rich", "argcomplete", "jsonpath_ng")
EXIT_MISSING_PACKAGES = 7


def missing_packages() -> list[str]:
    """The CLI's packages that are not installed (empty: all there)."""
    return [name for name in CLI_PACKAGES if importlib.util.find_spec(name) is None]


def main() -> int:
    missing = missing_packages()
    if missing:
        print(
            f"lmeval: the command line needs {', '.join(missing)}: "
            "pip install 'lmeval-poller[cli]'",
            file=sys.stderr,
        )
        return EXIT_MISSING_PACKAGES
    from lmeval_cli.__main__ import main as run

    return run()
