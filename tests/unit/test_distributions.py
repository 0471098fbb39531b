"""The shipped distributions and the development one agree, and each holds what it should.

The repository's pyproject.toml is the development distribution of every
package; what ships is built from three of their own (poller/pyproject.toml:
the operator, driver/pyproject.toml: the driver, poller/cli/pyproject.toml:
the user CLI). Their requirements are written twice, so this checks that the
development distribution's are exactly theirs, that together they cover
every module of the repository except the sandbox, and that each installs
the console scripts of its part. The wheels themselves are built and
inspected by tests/deploy/test_dockerfile.py (operator and driver) and run
in the images by tests/node/test_images.py.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


def _project(path: Path) -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads(path.read_text())["project"]
    return project


DEVELOPMENT = _project(REPO / "pyproject.toml")
OPERATOR = _project(REPO / "poller" / "pyproject.toml")
DRIVER = _project(REPO / "driver" / "pyproject.toml")
CLI = _project(REPO / "poller" / "cli" / "pyproject.toml")
SHIPPED = (OPERATOR, DRIVER, CLI)
OUR_NAMES = {p["name"] for p in SHIPPED}


def _theirs(requirements: list[str]) -> set[str]:
    """Third-party requirements, normalised (ours are the development tree itself)."""
    return {str(Requirement(r)) for r in requirements if Requirement(r).name not in OUR_NAMES}


def test_the_development_distribution_requires_what_the_operator_does() -> None:
    assert _theirs(DEVELOPMENT["dependencies"]) == _theirs(OPERATOR["dependencies"])
    assert DRIVER["dependencies"] == [], "the driver runs on the standard library alone"


def test_its_extras_are_the_drivers_and_the_clis_requirements() -> None:
    extras = DEVELOPMENT["optional-dependencies"]
    assert _theirs(extras["eval"]) == _theirs(DRIVER["optional-dependencies"]["eval"])
    assert _theirs(extras["cli"]) == _theirs(CLI["dependencies"])


def test_shipped_distributions_require_each_other_at_one_version() -> None:
    versions = {p["version"] for p in (DEVELOPMENT, *SHIPPED)}
    assert len(versions) == 1, versions
    (version,) = versions
    pins = {
        Requirement(r).name: str(Requirement(r).specifier)
        for p in SHIPPED
        for r in p["dependencies"]
        if Requirement(r).name in OUR_NAMES
    }
    assert pins == {"lmeval-driver": f"=={version}", "lmeval-operator": f"=={version}"}


def test_console_scripts_are_the_shipped_ones() -> None:
    shipped: dict[str, str] = {}
    for project in SHIPPED:
        assert not set(shipped) & set(project["scripts"]), "a script in two distributions"
        shipped |= project["scripts"]
    assert DEVELOPMENT["scripts"] == shipped


def test_every_module_but_the_sandbox_ships_in_one_distribution() -> None:
    def package_dir(project_file: Path) -> dict[str, str]:
        tool = tomllib.loads(project_file.read_text())["tool"]["setuptools"]
        assert tool["packages"] == list(tool["package-dir"]), project_file
        return {name: str(project_file.parent) for name in tool["packages"]}

    owners = {}
    for path in ("poller/pyproject.toml", "driver/pyproject.toml", "poller/cli/pyproject.toml"):
        owners |= package_dir(REPO / path)
    # A package-dir ships the .py files directly in it (packages are not recursive).
    operator = {name for name, where in owners.items() if where == str(REPO / "poller")}
    assert "poller" in operator
    assert owners["driver"] == str(REPO / "driver")
    assert owners["poller.cli"] == str(REPO / "poller" / "cli")
    packages = {
        ".".join(p.parent.relative_to(REPO).parts)
        for top in ("poller", "driver")
        for p in (REPO / top).rglob("__init__.py")
    }
    assert packages - set(owners) == {"poller.sandbox"}
    # Every layer's folder ships with the operator.
    assert {p for p in packages if p.count(".") == 1 and p not in owners} == {"poller.sandbox"}
    assert operator == {"poller"} | {
        p for p in packages if p.startswith("poller.") and p.split(".")[1] not in ("cli", "sandbox")
    }
