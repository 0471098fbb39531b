"""The shipped distributions and the development one agree, and each holds what it should.

The repository's pyproject.toml is the development distribution of every
package; what ships is built from three of their own (poller/pyproject.toml:
the operator, driver/pyproject.toml: the driver, poller/cli/pyproject.toml:
the user CLI). Their requirements are written twice, so this checks that the
development distribution's are exactly theirs, that each ships one import
package (poller, driver, lmeval_cli) whole from a folder of its own, and
that each installs the console scripts of its part; the sandbox
(lmeval_sandbox) ships in none. The wheels themselves are built and
inspected by tests/deploy/test_dockerfile.py (operator and driver) and run
in the images by tests/node/test_images.py.
"""

from __future__ import annotations

import fnmatch
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
    assert _theirs(extras["mlflow"]) == _theirs(DRIVER["optional-dependencies"]["mlflow"])
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


def _chain(top: Path, folder: Path) -> bool:
    """Whether every folder from `top` down to `folder` holds an __init__.py."""
    while folder != top:
        if not (folder / "__init__.py").exists():
            return False
        folder = folder.parent
    return True


def test_one_distribution_one_import_package() -> None:
    """Each shipped distribution holds one import package, in its own folder, whole."""
    shipped = {}
    for path in ("poller/pyproject.toml", "driver/pyproject.toml", "poller/cli/pyproject.toml"):
        tool = tomllib.loads((REPO / path).read_text())["tool"]["setuptools"]
        folder = (REPO / path).parent
        top = {name.split(".")[0] for name in tool["packages"]}
        assert len(top) == 1, f"{path} ships more than one import package: {top}"
        (name,) = top
        where = folder / tool.get("package-dir", {}).get(name, name)
        shipped[name] = (where.resolve(), set(tool["packages"]))
    assert set(shipped) == {"poller", "driver", "lmeval_cli"}
    for name, (where, packages) in shipped.items():
        # setuptools' packages are not recursive: every subpackage is named.
        # (a folder is a subpackage if it and every folder above it up to
        # the package hold an __init__.py: poller/cli/lmeval_cli is not one)
        inside = {
            ".".join((name, *p.parent.relative_to(where).parts))
            for p in where.rglob("__init__.py")
            if _chain(where, p.parent)
        }
        assert packages == inside, name
    # No import package inside another's folder: the CLI's folder holds no
    # __init__.py (it is not poller.cli), and the sandbox left poller/.
    assert not (REPO / "poller" / "cli" / "__init__.py").exists()
    assert shipped["lmeval_cli"][0] == (REPO / "poller" / "cli" / "lmeval_cli").resolve()
    assert not (REPO / "poller" / "sandbox").exists()


def test_the_development_distribution_finds_every_package_and_the_sandbox() -> None:
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    find = tool["setuptools"]["packages"]["find"]
    where, include = find["where"], find["include"]
    tops = {
        init.parent.name
        for root in where
        for init in (REPO / root).glob("*/__init__.py")
        if any(fnmatch.fnmatch(init.parent.name, pattern) for pattern in include)
    }
    assert tops == {"poller", "driver", "lmeval_cli", "lmeval_sandbox"}
    # mypy and the import contracts see the same four.
    assert set(tool["mypy"]["packages"]) == tops
    assert set(tool["importlinter"]["root_packages"]) == tops
