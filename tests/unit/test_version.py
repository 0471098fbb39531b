"""One version, written once: in the distributions' metadata, and nowhere in the code.

Checks: the four pyproject.toml files carry one version and the two pins
between them (operator on driver, CLI on operator) name it; the code reads
it from the installed metadata (`poller.buildinfo.version`,
``driver.__version__``) and both say it in this checkout; ``lmeval-poller
--version`` prints it with the revision (``$LMEVAL_REVISION``, else the
checkout's HEAD); the driver reports the version of the copy of itself that
runs (a wheel's dist-info beside it, the METADATA the driver image puts
inside it), never that of another installed ``lmeval-driver``; and
``python -m lmeval_sandbox.version set X.Y.Z`` rewrites exactly the four
version lines and the two pins, refuses anything but MAJOR.MINOR.PATCH, and
writes nothing when it refuses.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from lmeval_sandbox import version as versiontool
from packaging.requirements import Requirement

import driver
from poller import buildinfo
from poller.__main__ import parse_args

REPO = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"


def _projects(root: Path) -> dict[str, dict[str, object]]:
    return {
        relative: tomllib.loads((root / relative).read_text())["project"]
        for relative in versiontool.PYPROJECTS
    }


def _our_pins(root: Path) -> dict[str, str]:
    """Every requirement of one of our distributions, by name: its specifier."""
    projects = _projects(root)
    ours = {str(p["name"]) for p in projects.values()}
    pins = {}
    for relative, project in projects.items():
        dependencies = project.get("dependencies")
        for text in dependencies if isinstance(dependencies, list) else []:
            requirement = Requirement(text)
            if requirement.name in ours:
                pins[f"{relative}: {requirement.name}"] = str(requirement.specifier)
    return pins


def the_version(root: Path = REPO) -> str:
    versions = {str(p["version"]) for p in _projects(root).values()}
    assert len(versions) == 1, versions
    (found,) = versions
    return found


def test_four_distributions_one_version_and_the_pins_name_it() -> None:
    version = the_version()
    assert versiontool.valid(version)
    assert _our_pins(REPO) == {
        "poller/pyproject.toml: lmeval-driver": f"=={version}",
        "poller/cli/pyproject.toml: lmeval-operator": f"=={version}",
    }
    assert versiontool.current() == version


def test_the_code_reads_it_from_the_metadata() -> None:
    assert buildinfo.version() == the_version()
    assert driver.__version__ == the_version()
    # No literal left behind: no module of the code assigns the version.
    assigned = re.compile(rf"""version\w*\s*[:=][^\n]*["']{re.escape(the_version())}["']""", re.I)
    for path in [*REPO.glob("poller/**/*.py"), *REPO.glob("driver/**/*.py")]:
        assert not assigned.search(path.read_text()), path


def test_revision_from_the_environment_else_the_checkout() -> None:
    assert buildinfo.revision({buildinfo.REVISION_ENV: SHA}) == SHA
    assert buildinfo.revision({buildinfo.REVISION_ENV: " v1-dirty \n"}) == "v1-dirty"
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert buildinfo.revision({}) == head
    assert buildinfo.revision({buildinfo.REVISION_ENV: ""}) == head
    assert buildinfo.describe("x", {}) == f"x {the_version()} (revision {head[:7]})"


def test_revision_of_a_directory_that_is_no_checkout_is_unknown(tmp_path: Path) -> None:
    assert buildinfo._checkout_revision(tmp_path / "plain") == "unknown"  # git is not run
    broken = tmp_path / "broken"
    (broken / ".git").mkdir(parents=True)  # there, but no repository: git refuses
    assert buildinfo._checkout_revision(broken) == "unknown"


def test_poller_version_flag() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "poller", "--version"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", buildinfo.REVISION_ENV: SHA},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"lmeval-poller {the_version()} (revision 0123456)\n"
    # Given no flag, parsing runs nothing of it (no metadata, no git).
    assert not hasattr(parse_args([]), "version")
    with pytest.raises(SystemExit) as exited:
        parse_args(["--once", "--version"])
    assert exited.value.code == 0


# -- the driver: the version of the copy that runs -------------------------------


def _driver_copy(home: Path) -> Path:
    """The driver's modules copied into `home`, as the driver image's init container does."""
    shutil.copytree(
        REPO / "driver", home / "driver", ignore=shutil.ignore_patterns("__pycache__", "*.toml")
    )
    return home


def _dist_info(directory: Path, project: str, version: str) -> None:
    info = directory / f"{project}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.4\nName: {project}\nVersion: {version}\n\nbody\n"
    )


def _driver_version(tmp_path: Path, *path: Path) -> str:
    # -S: no site-packages, so no development install of lmeval-poller either.
    done = subprocess.run(
        [sys.executable, "-S", "-m", "driver", "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(str(p) for p in path)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.removeprefix("lmeval-driver ").strip()


def test_driver_reports_the_version_of_its_own_copy(tmp_path: Path) -> None:
    copied = _driver_copy(tmp_path / "copied")
    # Another lmeval-driver installed elsewhere on the path is not this copy.
    elsewhere = tmp_path / "site"
    _dist_info(elsewhere, "lmeval_driver", "5.0.0")
    assert _driver_version(tmp_path, copied, elsewhere) == "0+unknown"
    # The driver image: its build puts the wheel's METADATA inside the package.
    (copied / "driver" / "METADATA").write_text("Metadata-Version: 2.4\nVersion: 7.7.7\n\n")
    assert _driver_version(tmp_path, copied, elsewhere) == "7.7.7"
    # A wheel install: the dist-info beside the package wins.
    installed = _driver_copy(tmp_path / "installed")
    _dist_info(installed, "lmeval_driver", "9.9.9")
    assert _driver_version(tmp_path, installed, elsewhere) == "9.9.9"
    # A development checkout: the lmeval-poller distribution holds the driver.
    checkout = _driver_copy(tmp_path / "checkout")
    dev = tmp_path / "dev-site"
    _dist_info(dev, "lmeval_poller", "3.2.1")
    assert _driver_version(tmp_path, checkout, dev) == "3.2.1"


# -- python -m lmeval_sandbox.version -------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The four pyproject.toml files, copied."""
    for relative in versiontool.PYPROJECTS:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / relative, tmp_path / relative)
    return tmp_path


def _texts(root: Path) -> dict[str, str]:
    return {r: (root / r).read_text() for r in versiontool.PYPROJECTS}


def test_set_rewrites_the_four_versions_and_the_two_pins(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = the_version(tree)
    before = _texts(tree)
    assert versiontool.main(["set", "12.0.3"], root=tree) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"{old} -> 12.0.3: pyproject.toml, poller/pyproject.toml, ")
    assert the_version(tree) == "12.0.3"
    assert _our_pins(tree) == {
        "poller/pyproject.toml: lmeval-driver": "==12.0.3",
        "poller/cli/pyproject.toml: lmeval-operator": "==12.0.3",
    }
    # Exactly six lines changed; every comment and the layout stay.
    changed = [
        (relative, a, b)
        for relative, text in _texts(tree).items()
        for a, b in zip(before[relative].splitlines(), text.splitlines(), strict=True)
        if a != b
    ]
    assert len(changed) == 6, changed
    assert all(old in a and "12.0.3" in b and a.replace(old, "12.0.3") == b for _, a, b in changed)
    assert versiontool.main([], root=tree) == 0
    assert capsys.readouterr().out == "12.0.3\n"
    assert versiontool.main(["set", "12.0.3"], root=tree) == 0
    assert capsys.readouterr().out == "already 12.0.3: nothing to change\n"


@pytest.mark.parametrize(
    "bad", ["1.2", "v1.2.3", "1.2.3-rc.1", "1.2.3rc1", "01.2.3", "1.2.3.4", "1.2.3\n", ""]
)
def test_set_refuses_what_is_not_semver(
    tree: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _texts(tree)
    assert versiontool.main(["set", bad], root=tree) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: not a version of the form MAJOR.MINOR.PATCH (e.g. 0.2.0)")
    assert repr(bad) in error
    assert _texts(tree) == before


def test_disagreeing_files_are_named_and_set_makes_them_agree(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = the_version(tree)
    cli = tree / "poller" / "cli" / "pyproject.toml"
    cli.write_text(cli.read_text().replace(f"lmeval-operator=={old}", "lmeval-operator==0.0.9"))
    assert versiontool.main([], root=tree) == 2
    error = capsys.readouterr().err
    assert "the versions disagree" in error
    assert "poller/cli/pyproject.toml: lmeval-operator 0.0.9" in error
    assert versiontool.main(["set", "0.3.0"], root=tree) == 0
    assert versiontool.current(tree) == "0.3.0"


def test_a_file_it_cannot_rewrite_leaves_all_as_they_were(tree: Path) -> None:
    operator = tree / "poller" / "pyproject.toml"
    operator.write_text(operator.read_text().replace('"lmeval-driver==', '"lmeval-driver>=', 1))
    before = _texts(tree)
    with pytest.raises(versiontool.VersionError, match=re.escape('one "lmeval-driver==..."')):
        versiontool.set_version("0.3.0", tree)
    assert _texts(tree) == before
