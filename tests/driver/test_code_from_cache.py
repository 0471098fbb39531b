"""Code planted in a shared hub cache, or in lm_eval's working directory, never runs.

Whoever may write an offline cache (a claim any pod creator can mount, an S3
prefix) can put a one-part ``datasets--NAME`` repository there whose snapshot
is a Python package: ``datasets--lm_eval`` holding ``__init__.py`` and
``__main__.py``. The driver's hub view (``--hub-datasets``) is lm_eval's
working directory, and ``python -m lm_eval`` puts its working directory first
on ``sys.path``: that package would *be* lm_eval. Checks, with the real
lm_eval:

- the snapshots planted here do run when nothing protects against them (the
  control: ``python -m lm_eval`` started in such a directory writes the
  canary), so the checks below would fail if the protections went;
- ``build_view`` does not expose a snapshot that is a Python package
  (``__init__``/``__main__`` with any suffix Python imports) or that holds
  the loading script ``NAME.py`` (the installed ``datasets`` refuses such a
  directory without running it, so no loadable dataset is lost, but
  ``evaluate.load(NAME)`` would import it), and says which it refused; a
  dataset with other ``.py`` files beside its data is still exposed;
- a standard task (``arc_easy``) runs for real from a hub cache that also
  holds ``datasets--lm_eval``, ``datasets--datasets`` and
  ``datasets--transformers`` packages, with ``python -m lm_eval`` (no
  ``-P``): the results are lm_eval's and no canary exists;
- the driver's own layer alone: lm_eval started by the driver (without
  ``-P``, without a view) in a working directory holding ``lm_eval``,
  ``datasets`` and ``transformers`` packages runs the real lm_eval, because
  the driver sets ``PYTHONSAFEPATH`` for the child whatever its argv says.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lmeval_sandbox.model_server import ModelServer

from driver.hubview import build_view, code_in
from tests.driver.conftest import Tasks, child_env, fake_child, lm_eval_cmd, run_driver
from tests.hubcache import ARC_ROWS, write_arc_easy

pytestmark = pytest.mark.lmeval

COMMIT = "c0de" * 10
# Names lm_eval imports at start-up: the package itself and two of its own imports.
HIJACKED = ("lm_eval", "datasets", "transformers")


def canary_code(canary: str) -> str:
    """Python that records that it ran, in file `canary` (and on stderr, for a pod log)."""
    return (
        "import sys\n"
        f"open({canary!r}, 'a').write(__name__ + '\\n')\n"
        "sys.stderr.write('HOSTILE CODE RAN: ' + __name__ + '\\n')\n"
    )


def write_package(directory: Path, canary: str) -> None:
    """A Python package in `directory` whose import, or ``-m`` run, writes `canary`."""
    directory.mkdir(parents=True, exist_ok=True)
    for module in ("__init__.py", "__main__.py"):
        (directory / module).write_text(canary_code(canary), encoding="utf-8")


def write_code_snapshot(hub: Path, name: str, canary: str) -> Path:
    """A ``datasets--NAME`` repository of hub cache `hub` whose snapshot (the one
    ``refs/main`` names) is a Python package, with a data file beside it."""
    repo = hub / f"datasets--{name}"
    snapshot = repo / "snapshots" / COMMIT
    write_package(snapshot, canary)
    (snapshot / "train.jsonl").write_text('{"text": "looks like data"}\n', encoding="utf-8")
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT, encoding="ascii")
    return snapshot


def test_the_planted_package_runs_when_nothing_protects(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    hub = tmp_path / "hub"
    snapshot = write_code_snapshot(hub, "lm_eval", str(canary))
    exposed = tmp_path / "unprotected-view"
    exposed.mkdir()
    (exposed / "lm_eval").symlink_to(snapshot, target_is_directory=True)
    subprocess.run([sys.executable, "-m", "lm_eval"], cwd=exposed, capture_output=True, timeout=120)
    assert canary.read_text().split() == ["lm_eval", "__main__"]


def _snapshot(hub: Path, name: str, files: dict[str, str]) -> Path:
    repo = hub / f"datasets--{name}"
    snapshot = repo / "snapshots" / COMMIT
    for path, text in files.items():
        (snapshot / path).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / path).write_text(text, encoding="utf-8")
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT, encoding="ascii")
    return snapshot


def test_the_view_exposes_data_never_a_package_or_a_loading_script(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    write_arc_easy(hub)
    data = {"train.jsonl": "{}\n"}
    _snapshot(hub, "lm_eval", {**data, "__init__.py": "", "__main__.py": ""})
    _snapshot(hub, "datasets", {**data, "__init__.pyc": ""})
    _snapshot(hub, "transformers", {**data, "__main__.py": ""})
    _snapshot(hub, "numpy", {**data, "__init__.cpython-311-x86_64-linux-gnu.so": ""})
    _snapshot(hub, "org--metric", {**data, "metric.py": ""})
    _snapshot(hub, "scripted", {"scripted.py": "", "README.md": ""})
    # Other Python beside the data is no package and no loading script: exposed.
    _snapshot(hub, "org--with_tools", {**data, "convert.py": "", "tools/__init__.py": ""})
    _snapshot(hub, "plain", data)

    view = build_view(str(hub), str(tmp_path / "view"))
    assert view.names == ["allenai/ai2_arc", "org/with_tools", "plain"]
    assert view.refused == [
        "datasets (__init__.pyc)",
        "lm_eval (__init__.py)",
        "numpy (__init__.cpython-311-x86_64-linux-gnu.so)",
        "org/metric (metric.py)",
        "scripted (scripted.py)",
        "transformers (__main__.py)",
    ]
    assert sorted(p.name for p in (tmp_path / "view").iterdir()) == ["allenai", "org", "plain"]
    assert sorted(p.name for p in (tmp_path / "view" / "org").iterdir()) == ["with_tools"]
    assert code_in(str(tmp_path / "absent"), "x") is None


def test_datasets_refuses_a_directory_with_its_loading_script(tmp_path: Path) -> None:
    """Why refusing ``NAME/NAME.py`` loses no dataset: the installed ``datasets``
    does not load such a directory at all, and does not run the script."""
    canary = tmp_path / "canary"
    directory = tmp_path / "scripted"
    directory.mkdir()
    (directory / "scripted.py").write_text(canary_code(str(canary)), encoding="utf-8")
    (directory / "train.jsonl").write_text('{"text": "x"}\n', encoding="utf-8")
    probe = "import datasets; datasets.load_dataset('scripted')"
    env = child_env(tmp_path / "hf")
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, timeout=120
    )
    assert done.returncode != 0
    assert b"Dataset scripts are no longer supported" in done.stderr, done.stderr[-2000:]
    assert not canary.exists()


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer() as srv:
        yield srv


def test_a_standard_task_runs_for_real_beside_planted_packages(
    server: ModelServer, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    hub = tmp_path / "storage" / "hub"
    write_arc_easy(hub)
    for name in HIJACKED:
        write_code_snapshot(hub, name, str(canary))
    env = child_env(tmp_path / "hf-home")
    env["HF_HUB_CACHE"] = str(hub)
    env["TMPDIR"] = str(tmp_path / "tmp")
    env.pop("PYTHONSAFEPATH", None)
    (tmp_path / "tmp").mkdir()
    run = run_driver(
        ["--output-root", str(tmp_path / "out"), "--hub-datasets", str(hub)],
        # No -P here: the driver's view and environment must hold on their own.
        lm_eval_cmd(
            "--model",
            "local-completions",
            "--model_args",
            server.model_args(),
            "--tasks",
            "arc_easy",
        ),
        env,
    )
    assert run.returncode == 0, run.describe()
    assert not canary.exists(), canary.read_text()
    assert "HOSTILE CODE RAN" not in run.err
    assert "1 dataset(s) of" in run.err and "allenai/ai2_arc" in run.err
    assert "3 repository(ies) of" in run.err and "hold Python code" in run.err
    for name in HIJACKED:
        assert f"{name} (__init__.py)" in run.err
    [results_path] = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(results_path.read_text())
    assert set(results["results"]) == {"arc_easy"}
    assert results["n-samples"]["arc_easy"]["effective"] == len(ARC_ROWS["test"])
    assert server.count("POST /v1/completions") > 0


def test_the_driver_keeps_the_working_directory_off_the_childs_path(
    tasks: Tasks, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    workdir = tmp_path / "workdir"
    for name in HIJACKED:
        write_package(workdir / name, str(canary))
    env = child_env(tmp_path / "hf-home")
    env.pop("PYTHONSAFEPATH", None)
    # The control: lm_eval started there without the driver runs the planted one.
    subprocess.run(
        [sys.executable, "-m", "lm_eval", "--help"],
        cwd=workdir,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert canary.exists()
    canary.unlink()

    probe = run_driver(
        ["--output-root", str(tmp_path / "probe")],
        fake_child(
            "import json, os, sys; print('PROBE', json.dumps([os.environ.get('PYTHONSAFEPATH'), "
            "'' in sys.path or os.getcwd() in sys.path]))"
        ),
        env,
        cwd=workdir,
    )
    # The probe writes no results (exit 70): only what it printed counts.
    [line] = [line for line in probe.out.splitlines() if line.startswith("PROBE ")]
    assert json.loads(line[len("PROBE ") :]) == ["1", False], probe.describe()

    run = run_driver(
        ["--output-root", str(tmp_path / "out")],
        lm_eval_cmd(
            "--model",
            "dummy",
            "--model_args",
            "pretrained=dummy",
            "--tasks",
            tasks.mc,
            "--include_path",
            str(tasks.path),
        ),
        env,
        cwd=workdir,
    )
    assert run.returncode == 0, run.describe()
    assert not canary.exists(), canary.read_text()
    [results_path] = (tmp_path / "out").rglob("results_*.json")
    assert set(json.loads(results_path.read_text())["results"]) == {tasks.mc}
