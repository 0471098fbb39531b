"""The import contracts hold: `lint-imports` passes, and its lists name every operator module.

The contracts live in pyproject.toml (``[tool.importlinter]``) and
tests/run.sh runs ``lint-imports`` after mypy; this runs them again so that
``pytest tests/unit`` alone catches a broken one. Among them: the poller
process never imports the ``kubernetes`` package (44 MiB of RSS for models it
never uses), the CLI or the sandbox; the driver never imports the poller; the
pure decision modules never import the I/O layer. The contracts are static,
so they also see imports inside functions, which run only on some paths.

lint-imports runs in a child process: it reconfigures logging with
``dictConfig``, which would silence the loggers other tests capture.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"


def test_the_import_contracts_hold() -> None:
    lint = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    done = subprocess.run(
        [sys.executable, "-c", lint, "--config", str(PYPROJECT), "--no-cache", "--no-logo"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_operator_contract_names_every_operator_module() -> None:
    # A forbidden contract checks only the modules it lists, so a new module
    # of poller/ must be added to it (poller.cli and poller.sandbox are the
    # packages it forbids, not part of the operator).
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (operator,) = (c for c in contracts if c["id"] == "operator-boundaries")
    modules = {
        ".".join(path.relative_to(REPO).with_suffix("").parts)
        for path in (REPO / "poller").rglob("*.py")
        if path.relative_to(REPO / "poller").parts[0] not in ("cli", "sandbox")
        and path.name != "__init__.py"
    } | {"poller.api"}  # the API's public names, re-exported by its __init__
    assert set(operator["source_modules"]) == modules
