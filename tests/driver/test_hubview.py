"""Hub datasets offline: the driver's ``--hub-datasets`` and a standard lm_eval task.

The hub cache is one the tests write (tests/hubcache.py), laid out exactly as
huggingface_hub lays out a downloaded dataset repository. Checks:

- ``build_view`` links ``ORG/NAME`` to the snapshot ``refs/main`` names (or
  to the only snapshot), and skips what is not a dataset repository of the
  cache;
- lm_eval's standard ``arc_easy`` task (``dataset_path: allenai/ai2_arc``,
  ``dataset_name: ARC-Easy``), unchanged, runs OFFLINE against the loopback
  model server with ``--hub-datasets`` and scores the rows written here;
- without ``--hub-datasets`` the same offline run fails: ``datasets`` 5.x does
  not read the hub cache offline (which is why the option exists), and the
  run never writes into the cache.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lmeval_sandbox.model_server import ModelServer

from driver.hubview import build_view, snapshot_of
from tests.driver.conftest import DriverRun, child_env, lm_eval_cmd, run_driver
from tests.hubcache import ARC_COMMIT, ARC_REPO, ARC_ROWS, tree_state, write_arc_easy

pytestmark = pytest.mark.lmeval


def test_view_links_each_cached_dataset_to_its_main_snapshot(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    repo = write_arc_easy(hub)
    # A dataset without a namespace, with one snapshot and no refs/main.
    (hub / "datasets--plain" / "snapshots" / ("a" * 40)).mkdir(parents=True)
    # Not datasets, or not usable: skipped.
    (hub / "models--org--model" / "snapshots" / ("b" * 40)).mkdir(parents=True)
    (hub / "datasets--two--snap" / "snapshots" / ("c" * 40)).mkdir(parents=True)
    (hub / "datasets--two--snap" / "snapshots" / ("d" * 40)).mkdir(parents=True)
    (hub / "datasets--bad--ref" / "refs").mkdir(parents=True)
    (hub / "datasets--bad--ref" / "refs" / "main").write_text("../../etc")
    (hub / "datasets--a--b--c" / "snapshots" / ("e" * 40)).mkdir(parents=True)
    (hub / ".locks").mkdir()

    view = tmp_path / "view"
    assert build_view(str(hub), str(view)) == (["allenai/ai2_arc", "plain"], [])
    assert (view / "allenai" / "ai2_arc").resolve() == (repo / "snapshots" / ARC_COMMIT)
    assert (view / "plain").resolve() == hub / "datasets--plain" / "snapshots" / ("a" * 40)
    assert sorted(p.name for p in view.iterdir()) == ["allenai", "plain"]
    assert snapshot_of(str(hub / "datasets--two--snap")) is None
    assert snapshot_of(str(hub / "datasets--bad--ref")) is None
    # A missing cache exposes nothing (lm_eval then says what is missing).
    assert build_view(str(tmp_path / "absent"), str(tmp_path / "view2")) == ([], [])


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    hub = tmp_path_factory.mktemp("storage") / "hub"
    write_arc_easy(hub)
    return hub


def _arc_easy(server: ModelServer, hub: Path, tmp_path: Path, options: list[str]) -> DriverRun:
    env = child_env(tmp_path / "hf-home")
    env["HF_HUB_CACHE"] = str(hub)
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    return run_driver(
        ["--output-root", str(tmp_path / "out"), *options],
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


def test_standard_task_reads_its_hub_dataset_offline(
    server: ModelServer, hub: Path, tmp_path: Path
) -> None:
    before = tree_state(hub)
    run = _arc_easy(server, hub, tmp_path, ["--hub-datasets", str(hub)])
    assert run.returncode == 0, run.describe()
    assert "1 dataset(s) of" in run.err and "allenai/ai2_arc" in run.err
    [results_path] = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(results_path.read_text())
    assert set(results["results"]) == {"arc_easy"}
    assert results["n-samples"]["arc_easy"]["effective"] == len(ARC_ROWS["test"])
    assert "acc,none" in results["results"]["arc_easy"]
    assert results["configs"]["arc_easy"]["dataset_path"] == "allenai/ai2_arc"
    assert server.count("POST /v1/completions") > 0
    # The cache is read, never written (datasets' Arrow cache went to HF_HOME).
    assert tree_state(hub) == before
    assert any((tmp_path / "hf-home" / "datasets").iterdir())
    # The view of the cache is gone with the run.
    assert not [n for n in os.listdir(tmp_path / "tmp") if n.startswith("lmeval-hub-datasets-")]


def test_without_the_view_datasets_does_not_read_the_hub_cache_offline(
    server: ModelServer, hub: Path, tmp_path: Path
) -> None:
    run = _arc_easy(server, hub, tmp_path, [])
    assert run.returncode != 0, run.describe()
    assert "allenai/ai2_arc" in run.err
    assert ARC_REPO in {p.name for p in hub.iterdir()}
