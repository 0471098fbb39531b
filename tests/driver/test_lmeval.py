"""Real lm_eval runs through the driver, offline, on tasks made by the tests.

Each lm_eval run costs about ten seconds of CPU, so runs are module-scoped
fixtures shared by several assertions. Covered: the ``dummy`` model; the
``local-completions`` model against the loopback toy server (multiple-choice
and generation tasks) with forged marker lines in the dataset, in the
model's answers and in the server's error body; lm_eval's own failures
(unknown task, model server down, a results file it cannot write) and a
SIGTERM in the middle of a run. In every case ``decode`` of the driver's
stdout must agree with what lm_eval really did.
"""

from __future__ import annotations

import importlib.metadata
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox.components import free_port
from lmeval_sandbox.model_server import ModelServer

from driver.protocol import EXIT_CANCELLED, EXIT_NO_RESULTS, MARKER_PREFIX
from tests.driver.conftest import (
    DriverRun,
    LiveDriver,
    Tasks,
    forged_lines,
    lm_eval_cmd,
    pid_alive,
    run_driver,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.lmeval

FORGED_TEXT = "\n".join(forged_lines())


def results_files(run: DriverRun) -> list[Path]:
    started = run.decoded().started
    assert started is not None, run.describe()
    return sorted(Path(started["output_dir"]).rglob("results_*.json"))


def assert_decoded_matches_file(run: DriverRun) -> dict[str, Any]:
    assert run.returncode == 0, run.describe()
    decoded = run.decoded()
    files = results_files(run)
    assert len(files) == 1
    on_disk = json.loads(files[0].read_text(encoding="utf-8"))
    assert decoded.results == on_disk
    assert decoded.results_error is None
    assert decoded.outcome is not None and decoded.outcome.event == "completed"
    assert decoded.outcome.results_path is not None
    assert json.loads(Path(decoded.outcome.results_path).read_text(encoding="utf-8")) == on_disk
    return on_disk


@pytest.fixture(scope="module")
def dummy_run(
    tasks: Tasks, lmeval_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> DriverRun:
    root = tmp_path_factory.mktemp("dummy-out")
    return run_driver(
        ["--output-root", str(root), "--progress-interval", "0"],
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
        lmeval_env,
    )


def test_dummy_model_results_equal_the_results_file(dummy_run: DriverRun, tasks: Tasks) -> None:
    on_disk = assert_decoded_matches_file(dummy_run)
    assert "acc,none" in on_disk["results"][tasks.mc]


def test_dummy_run_markers(dummy_run: DriverRun) -> None:
    decoded = dummy_run.decoded()
    names = [e["event"] for e in decoded.events]
    assert names[0] == "started" and names[-1] == "completed"
    assert names.count("completed") == 1
    started = decoded.started
    assert started is not None
    assert started["lm_eval_version"] == importlib.metadata.version("lm_eval")
    assert started["argv"][-2:] == ["--output_path", started["output_dir"]]
    assert Path(started["output_dir"]).name == f"run-{started['run_id']}"
    phases = {e["phase"] for e in decoded.events if e["event"] == "progress"}
    assert "Running loglikelihood requests" in phases, phases
    assert decoded.last_progress is not None and decoded.last_progress["percent"] == 100.0
    # lm_eval's summary table was forwarded on stdout, its logs on stderr.
    assert "acc" in dummy_run.out and "Running loglikelihood requests" in dummy_run.err


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServer]:
    with ModelServer(
        generation_text=f"4\n{FORGED_TEXT}\n",
        fail_first=1,
        error_text=f"overloaded\n{FORGED_TEXT}\n",
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def api_run(
    server: ModelServer,
    forged_tasks: Tasks,
    lmeval_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> DriverRun:
    root = tmp_path_factory.mktemp("api-out")
    return run_driver(
        ["--output-root", str(root), "--progress-interval", "0"],
        lm_eval_cmd(
            "--model",
            "local-completions",
            "--model_args",
            server.model_args(),
            "--tasks",
            f"{forged_tasks.mc},{forged_tasks.gen}",
            "--include_path",
            str(forged_tasks.path),
            "--log_samples",
            "--write_out",
        ),
        lmeval_env,
    )


def test_local_completions_results_equal_the_results_file(
    api_run: DriverRun, forged_tasks: Tasks, server: ModelServer
) -> None:
    on_disk = assert_decoded_matches_file(api_run)
    assert set(on_disk["results"]) == {forged_tasks.mc, forged_tasks.gen}
    assert "acc,none" in on_disk["results"][forged_tasks.mc]
    assert "exact_match,none" in on_disk["results"][forged_tasks.gen]
    for endpoint in ("GET /tokenizer_info", "POST /tokenize", "POST /v1/completions"):
        assert server.count(endpoint) > 0, endpoint


def test_forged_markers_reached_the_output_but_decode_ignores_them(api_run: DriverRun) -> None:
    # The forgeries really went through lm_eval: dataset text (--write_out)
    # and the server's error body (logged by lm_eval), defused on the way.
    assert "FORGED" in api_run.err
    assert ":: lmeval ::" in api_run.err
    assert "overloaded" in api_run.err
    for line in (api_run.out + "\n" + api_run.err).split("\n"):
        if MARKER_PREFIX in line:
            assert line.startswith(MARKER_PREFIX) and "FORGED" not in line
    decoded = api_run.decoded()
    assert decoded.started is not None
    run_id = decoded.started["run_id"]
    assert all(e["run_id"] == run_id for e in decoded.events)
    assert "FORGED" not in json.dumps(decoded.events)
    assert decoded.results is not None and "forged" not in decoded.results["results"]
    finals = [e for e in decoded.events if e["event"] in ("completed", "failed", "cancelled")]
    assert [e["event"] for e in finals] == ["completed"]


def test_model_answers_with_markers_are_in_the_samples_not_the_markers(api_run: DriverRun) -> None:
    samples = [p for p in results_files(api_run)[0].parent.glob("samples_*gen*.jsonl")]
    assert samples, "lm_eval wrote no samples for the generation task"
    text = samples[0].read_text(encoding="utf-8")
    assert "FORGED" in text  # the model did answer with forged markers


def test_unknown_task_fails_with_lm_evals_message(
    tasks: Tasks, lmeval_env: dict[str, str], tmp_path: Path
) -> None:
    run = run_driver(
        ["--output-root", str(tmp_path)],
        lm_eval_cmd(
            "--model",
            "dummy",
            "--model_args",
            "pretrained=dummy",
            "--tasks",
            "nope_x",
            "--include_path",
            str(tasks.path),
        ),
        lmeval_env,
    )
    assert run.returncode == 1, run.describe()
    outcome = run.decoded().outcome
    assert outcome is not None and outcome.event == "failed" and outcome.exit_code == 1
    assert outcome.message == "ValueError: Tasks not found: nope_x"
    assert run.decoded().results is None


def test_model_server_down_fails(tasks: Tasks, lmeval_env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    run = run_driver(
        ["--output-root", str(tmp_path)],
        lm_eval_cmd(
            "--model",
            "local-completions",
            "--model_args",
            f"model=toy,base_url=http://127.0.0.1:{port}/v1/completions,tokenizer_backend=remote",
            "--tasks",
            tasks.mc,
            "--include_path",
            str(tasks.path),
        ),
        lmeval_env,
    )
    assert run.returncode == 1, run.describe()
    outcome = run.decoded().outcome
    assert outcome is not None and outcome.event == "failed" and outcome.exit_code == 1
    assert outcome.message.startswith("RuntimeError: RemoteTokenizer: GET")
    assert f"127.0.0.1:{port}" in outcome.message


def test_results_file_lm_eval_cannot_write_is_reported(
    tasks: Tasks, lmeval_env: dict[str, str], tmp_path: Path
) -> None:
    # lm_eval writes to <output_path>/<model name>/; a 300-character model
    # name makes that mkdir fail (even for root), and lm_eval still exits 0.
    run = run_driver(
        ["--output-root", str(tmp_path)],
        lm_eval_cmd(
            "--model",
            "dummy",
            "--model_args",
            "pretrained=" + "x" * 300,
            "--tasks",
            tasks.mc,
            "--include_path",
            str(tasks.path),
        ),
        lmeval_env,
    )
    assert run.returncode == EXIT_NO_RESULTS, run.describe()
    outcome = run.decoded().outcome
    assert outcome is not None and outcome.exit_code == EXIT_NO_RESULTS
    assert outcome.message.startswith("lm_eval exited 0 but wrote no results file in ")
    assert "Could not save results aggregated: OSError(36, 'File name too long')" in outcome.message


def test_sigterm_in_the_middle_of_a_real_run(
    tasks: Tasks, lmeval_env: dict[str, str], tmp_path: Path, live_drivers: list[LiveDriver]
) -> None:
    with ModelServer(delay=0.3) as slow:
        driver = LiveDriver(
            ["--output-root", str(tmp_path), "--grace-period", "10"],
            lm_eval_cmd(
                "--model",
                "local-completions",
                "--model_args",
                slow.model_args(),
                "--tasks",
                tasks.mc,
                "--include_path",
                str(tasks.path),
            ),
            lmeval_env,
        )
        live_drivers.append(driver)
        child_pid = int(driver.wait_event("started")["pid"])
        wait_for(
            lambda: slow.count("POST /v1/completions") >= 2, timeout=180, what="requests in flight"
        )
        sent = driver.send(signal.SIGTERM)
        run = driver.finish(timeout=60)
        took = time.monotonic() - sent
    assert run.returncode == EXIT_CANCELLED, run.describe()
    assert took < 10
    outcome = run.decoded().outcome
    assert outcome is not None and outcome.event == "cancelled" and outcome.signal == signal.SIGTERM
    assert not pid_alive(child_pid)
    assert run.decoded().results is None
