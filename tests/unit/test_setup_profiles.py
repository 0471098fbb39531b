"""deploy/sandbox/setup.sh prepares what its caller needs, and every clone runs its own code.

Runs the real script (with the caches that tests/run.sh has just warmed, so
each run takes seconds) and checks:

- ``bash deploy/sandbox/run.sh`` (the README's sandbox command; its
  ``sandbox`` profile) prepares the Python environment and the control-plane
  binaries and nothing else: no oldest-supported control plane, Kueue, Helm
  or Debian packages, which only the tests use;
- the ``tests`` profile (tests/run.sh; also the default) prepares all of
  them; an unknown profile, such as a script's own argument handed on to a
  bare ``source``, is refused;
- two clones share one dependency environment yet each imports its own
  code: in a second copy of this tree, ``python``, ``python -m`` and the
  console scripts resolve ``poller`` there, while this clone's environment
  still resolves it here;
- pruning old shared environments spares those used lately and the most
  recently used other one; a ``.venv`` that setup.sh did not make is left
  alone (setup.sh stops and says so);
- ``run --node real`` without root stops at once and says how to run it.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from lmeval_sandbox import build, realdemo
from lmeval_sandbox.bringup import DemoError
from rich.console import Console

REPO = Path(__file__).resolve().parents[2]
SETUP = "deploy/sandbox/setup.sh"
# A warm setup takes seconds; this only keeps a cold cache from hanging the suite.
TIMEOUT = 300
# `✓ TITLE (DETAIL) 0.3 s`, the line setup.sh prints for each step.
STEP = re.compile(r"^✓ (?P<title>.+?)(?: \((?P<detail>[^()]*)\))? [0-9.]+ s$")
SANDBOX_STEPS = ["python environment", "control-plane and node binaries"]
TESTS_ONLY = ("oldest supported Kubernetes", "Kueue", "Helm", "Debian packages")


def steps(output: str) -> list[str]:
    """The titles of the steps a setup printed, in order."""
    return [m["title"] for line in output.splitlines() if (m := STEP.match(line))]


def source(
    tree: Path, *args: str, then: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`source deploy/sandbox/setup.sh ARGS` in `tree` in a fresh bash, then run `then`."""
    script = f'source {SETUP} "$@"\nset +e\n{then}'
    return subprocess.run(
        ["bash", "-c", script, "bash", *args],
        cwd=tree,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def copy_of_this_tree(destination: Path) -> Path:
    """Another clone of this checkout as it is now: every file git lists, tracked or new."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        source_path = REPO / name
        if source_path.is_file() or source_path.is_symlink():  # not a deleted file
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source_path, target, follow_symlinks=False)
    return destination


def test_the_sandbox_command_prepares_only_what_run_needs() -> None:
    shown = subprocess.run(
        ["bash", "deploy/sandbox/run.sh", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert steps(shown.stdout) == SANDBOX_STEPS, shown.stdout
    assert not any(word in shown.stdout + shown.stderr for word in TESTS_ONLY), shown.stdout
    # Its arguments reached `python -m lmeval_sandbox run`, not setup.sh.
    assert "usage: python -m lmeval_sandbox run" in shown.stdout


def test_the_tests_profile_prepares_everything_and_is_the_default() -> None:
    for args in (("tests",), ()):
        done = source(REPO, *args)
        assert done.returncode == 0, done.stdout + done.stderr
        titles = steps(done.stdout)
        assert titles[:2] == SANDBOX_STEPS, done.stdout
        for part in TESTS_ONLY[:3]:
            assert any(part in title for title in titles), (part, done.stdout)
        packages = "real node's Debian packages"
        if os.geteuid() == 0:
            assert packages in titles, done.stdout
        else:
            assert f"- {packages}: skipped" in done.stdout


def test_an_unknown_profile_is_refused() -> None:
    # What a script that sources setup.sh bare hands on: its own arguments.
    done = source(REPO, "--node")
    assert done.returncode == 2
    assert "unknown profile '--node'" in done.stderr
    assert "source deploy/sandbox/setup.sh tests" in done.stderr
    assert steps(done.stdout) == []


def test_two_clones_share_the_dependencies_and_each_runs_its_own_code(tmp_path: Path) -> None:
    clone = copy_of_this_tree(tmp_path / "clone")
    commands = ("python", "lmeval", "lmeval-poller", "lmeval-driver", "kubectl-lmeval")
    tools = ("pytest", "mypy", "lint-imports", "lm_eval", "ruff")
    probe = "\n".join(
        [
            "cd /",  # not the clone: the current directory would be on sys.path
            'echo "poller=$(python -I -c "import poller; print(poller.__path__[0])")"',
            'echo "module=$(python -m poller --version)"',
            *(f'echo "which {name}=$(command -v {name})"' for name in commands + tools),
            # Which files the console script really loads (-v's import lines).
            "PYTHONVERBOSE=1 lmeval --version 2>&1 | grep '^# .*poller/cli/lmeval_cli/launch'",
            'echo "venv=$LMEVAL_VENV"',
        ]
    )
    done = source(clone, "sandbox", then=probe)
    assert done.returncode == 0, done.stdout + done.stderr
    assert steps(done.stdout) == SANDBOX_STEPS, done.stdout
    lines = done.stdout.splitlines()
    assert f"poller={clone / 'poller'}" in lines
    assert any(line.startswith("module=lmeval-poller ") for line in lines), done.stdout
    for name in commands + tools:
        assert f"which {name}={clone / '.venv' / 'bin' / name}" in lines, done.stdout
    loaded = [line for line in lines if line.startswith("# ")]
    assert loaded, done.stdout
    assert all(str(clone / "poller" / "cli") in line for line in loaded), loaded
    assert str(REPO / "poller") not in done.stdout
    assert f"venv={clone / '.venv'}" in lines

    # One shared dependency environment for both.
    shared = (REPO / ".venv" / "lmeval-shared").read_text()
    assert (clone / ".venv" / "lmeval-shared").read_text() == shared
    # This clone's environment still imports this clone's code.
    here = subprocess.run(
        [REPO / ".venv" / "bin" / "python", "-I", "-c", "import poller; print(poller.__file__)"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert here.stdout.strip() == str(REPO / "poller" / "__init__.py")


def _venv_dir(cache: Path, name: str, used_hours_ago: float, *, marked: bool = True) -> Path:
    """A stand-in shared environment last used `used_hours_ago`; unmarked ones
    (made by an older setup.sh) count from their directory's time."""
    path = cache / name
    path.mkdir()
    when = time.time() - used_hours_ago * 3600
    if marked:
        (path / ".last-used").touch()
        os.utime(path / ".last-used", (when, when))
    os.utime(path, (when, when))
    return path


def test_old_shared_environments_go_once_unused_for_a_day(tmp_path: Path) -> None:
    clone = copy_of_this_tree(tmp_path / "clone")
    cache = tmp_path / "cache"
    cache.mkdir()
    # The current environment is the real one (a cache of its own would mean
    # minutes of pip); the control-plane binaries come ready-made too.
    shared = Path((REPO / ".venv" / "lmeval-shared").read_text().strip())
    (cache / shared.name).symlink_to(shared)
    binaries = str(build.binaries_dir())
    env = {**os.environ, "LMEVAL_CACHE": str(cache), "LMEVAL_SANDBOX_BIN": binaries}
    env.pop("LMEVAL_SANDBOX_CACHE", None)
    unrelated = cache / "bin-0000000000000000"
    unrelated.mkdir()

    recent = _venv_dir(cache, "venv-recent", 1)
    stale = _venv_dir(cache, "venv-stale", 72)
    old_layout_stale = _venv_dir(cache, "venv-old-layout-stale", 72, marked=False)
    old_layout_fresh = _venv_dir(cache, "venv-old-layout-fresh", 0.2, marked=False)
    done = source(clone, "sandbox", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert recent.is_dir() and old_layout_fresh.is_dir()
    assert not stale.exists() and not old_layout_stale.exists()
    assert unrelated.is_dir() and (cache / shared.name).is_dir()

    # When all others are old, the most recently used of them stays.
    for path in (recent, old_layout_fresh):
        shutil.rmtree(path)
    newest_other = _venv_dir(cache, "venv-newest-other", 48)
    older = _venv_dir(cache, "venv-older", 96)
    done = source(clone, "sandbox", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert newest_other.is_dir() and not older.exists()


def test_the_real_node_without_root_says_how_to_run_it() -> None:
    shown = io.StringIO()
    with pytest.raises(
        DemoError,
        match=r"run it as root \(in a root shell: bash deploy/sandbox/run.sh --node real\)",
    ):
        realdemo.prepare_node(Console(file=shown), euid=1000)
    assert shown.getvalue() == ""  # nothing installed, nothing built


def test_a_virtual_environment_of_someone_else_is_left_alone(tmp_path: Path) -> None:
    clone = copy_of_this_tree(tmp_path / "clone")
    subprocess.run(["python3", "-m", "venv", "--without-pip", clone / ".venv"], check=True)
    before = sorted(path.name for path in (clone / ".venv").iterdir())
    done = source(clone, "sandbox")
    assert done.returncode == 1
    assert f"{clone / '.venv'} holds a virtual environment setup.sh did not make" in done.stderr
    assert sorted(path.name for path in (clone / ".venv").iterdir()) == before
