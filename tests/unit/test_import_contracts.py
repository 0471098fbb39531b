"""The import contracts hold: `lint-imports` passes, and its lists name every operator module.

The contracts live in pyproject.toml (``[tool.importlinter]``) and
tests/run.sh runs ``lint-imports`` after mypy; this runs them again so that
``pytest tests/unit`` alone catches a broken one. Among them: the poller
process never imports the ``kubernetes`` package (44 MiB of RSS for models it
never uses), the CLI or the sandbox; the driver never imports the poller; the
pure decision modules never import the I/O layer. The contracts are static,
so they also see imports inside functions, which run only on some paths.
They name folders: each of the operator's layers is a folder whose __init__
docstring states its rule, and "pure" is a property of a folder.

lint-imports runs in a child process: it reconfigures logging with
``dictConfig``, which would silence the loggers other tests capture.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

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


def _contract(contract_id: str) -> dict[str, Any]:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (found,) = (c for c in contracts if c["id"] == contract_id)
    return found


def _layer_folders() -> dict[str, str]:
    """The operator's layers' folders: name -> the rule its __init__ states."""
    folders = {}
    for init in sorted((REPO / "poller").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        folders[init.parent.name] = doc
    return folders


def test_every_layer_folder_is_a_layer_and_states_its_rule() -> None:
    layers = {
        name.strip()
        for layer in _contract("operator-layers")["layers"]
        for name in layer.split("|")
    }
    folders = _layer_folders()
    assert folders and set(folders) <= layers
    for name, doc in folders.items():
        assert "Rule:" in doc, f"poller/{name}/__init__.py does not state its rule"


def test_pure_is_a_property_of_folders() -> None:
    # The folders whose rule says they are pure are exactly the ones the
    # contract keeps from the I/O layer, urllib3, websocket and kubernetes.
    pure = {
        f"poller.{name}"
        for name, doc in _layer_folders().items()
        if doc.split("Rule:", 1)[1].lstrip().startswith("pure")
    }
    assert pure == set(_contract("operator-pure-layers")["source_modules"])
