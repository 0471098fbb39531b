"""``lmeval results``, ``compare``, ``wait``, ``submit --wait``, ``suspend`` and
``resume`` on the real control plane.

Checks: the scores of a real lm_eval run come out identical as a table, as
JSON (the complete results document), as CSV and as Markdown; ``compare``
puts two jobs' scores side by side, one row per task/metric/filter, ``-``
where a job lacks one; ``wait`` exits 0 on a job that succeeds, 1 with the
poller's message on one that fails, 2 on a timeout, and 0 with ``--for
finished`` on a failed job; ``submit --wait`` follows the new job to its
end; on a terminal ``wait`` draws a rich progress bar; ``suspend`` and
``resume`` merge-patch ``spec.suspend`` and the poller acts on it. While a
polling command runs as a subprocess, the poller cycles in a background
thread.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import subprocess
from pathlib import Path

import pytest
from kubernetes import client

from poller import api
from poller.cycle.reconciler import Reconciler
from tests.cli.conftest import BackgroundPoller, Cli, cli_env, finish, pod_when
from tests.poller_fixtures import CapturedRun, Jobs, cycle_until, serve_log, terminate

pytestmark = pytest.mark.cluster


def _expected_rows(run: CapturedRun) -> list[list[str]]:
    assert run.results is not None
    rows = []
    for task, metrics in run.results["results"].items():
        for key, value in metrics.items():
            metric, _, filt = key.partition(",")
            if not filt or "_stderr" in metric:
                continue
            stderr = metrics.get(f"{metric}_stderr,{filt}")
            rows.append(
                [task, metric, filt, f"{value:.4f}", "-" if stderr is None else f"{stderr:.4f}"]
            )
    return rows


def _complete_with(jobs: Jobs, name: str, results: dict) -> None:
    """A finished job whose status holds `results` (written as an admin, no poller)."""
    jobs.create(name)
    jobs.custom.patch_namespaced_custom_object_status(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        name,
        {
            "status": {
                "state": "Complete",
                "reason": "Succeeded",
                "message": "evaluation finished",
                "results": json.dumps(results),
            }
        },
    )


def test_results_in_every_format_and_compare(
    cli: Cli,
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    finish(poller, jobs, admin_api, "base", succeeded_run, tmp_path)
    expected = _expected_rows(succeeded_run)
    assert expected

    table = cli("results", "base")
    assert table.returncode == 0, table.stderr
    lines = [line.split() for line in table.stdout.splitlines()]
    assert lines[0] == ["TASK", "METRIC", "FILTER", "VALUE", "STDERR"]
    assert lines[1:] == expected

    as_json = cli("results", "base", "-o", "json")
    assert json.loads(as_json.stdout) == succeeded_run.results

    as_csv = list(csv.reader(io.StringIO(cli("results", "base", "-o", "csv").stdout)))
    assert as_csv == [["task", "metric", "filter", "value", "stderr"], *expected]

    markdown = cli("results", "base", "-o", "markdown").stdout.splitlines()
    assert markdown[0] == "| task | metric | filter | value | stderr |"
    assert markdown[1] == "|---|---|---|---|---|"
    assert markdown[2:] == ["| " + " | ".join(row) + " |" for row in expected]

    acc = succeeded_run.results["results"]["toy_mc"]["acc,none"]  # type: ignore[index]
    _complete_with(
        jobs,
        "tuned",
        {"results": {"toy_mc": {"acc,none": 0.875, "acc_stderr,none": 0.01, "f1,none": 0.5}}},
    )
    compared = cli("compare", "base", "tuned")
    assert compared.returncode == 0, compared.stderr
    rows = [line.split() for line in compared.stdout.splitlines()]
    assert rows[0] == ["TASK", "METRIC", "FILTER", "base", "tuned"]
    assert ["toy_mc", "acc", "none", f"{acc:.4f}", "0.8750"] in rows
    assert ["toy_mc", "f1", "none", "-", "0.5000"] in rows
    assert (
        "| toy_mc | acc | none | "
        f"{acc:.4f} | 0.8750 |" in cli("compare", "base", "tuned", "-o", "markdown").stdout
    )
    as_json = json.loads(cli("compare", "base", "tuned", "-o", "json").stdout)
    assert as_json["jobs"] == ["base", "tuned"] and as_json["paired"] is None
    as_json_rows = as_json["scores"]
    f1 = next(r for r in as_json_rows if r["metric"] == "f1")
    assert f1["values"]["base"] is None and f1["values"]["tuned"]["value"] == 0.5

    jobs.create("pending")
    none_yet = cli("results", "pending")
    assert none_yet.returncode == 4
    assert "LMEvalJob pending has no results (state New)" in none_yet.stderr


def test_wait_succeeding_and_failing_jobs(
    cli: Cli,
    background_poller: BackgroundPoller,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    failed_run: CapturedRun,
    tmp_path: Path,
) -> None:
    jobs.create("good")
    jobs.create("bad")
    waiting = {
        name: cli.popen("wait", name, "--timeout", "2m", "--interval", "0.2")
        for name in ("good", "bad")
    }
    for name, run in (("good", succeeded_run), ("bad", failed_run)):
        pod = pod_when(None, jobs, name)
        serve_log(admin_api, jobs.namespace, pod, run.log, tmp_path)
        terminate(admin_api, jobs.namespace, pod, run.exit_code)

    out, err = waiting["good"].communicate(timeout=90)
    assert waiting["good"].returncode == 0, err
    acc = succeeded_run.results["results"]["toy_mc"]["acc,none"]  # type: ignore[index]
    assert out.splitlines()[-1] == f"lmevaljob/good succeeded: acc={acc:.4f}"
    assert "good: Complete 100%" in out

    out, err = waiting["bad"].communicate(timeout=90)
    assert waiting["bad"].returncode == 1, (out, err)
    message = jobs.status("bad")["message"]
    assert jobs.status("bad")["reason"] == "Failed" and message
    assert err.strip() == f"lmevaljob/bad failed: {message}"

    finished = cli("wait", "bad", "--for", "finished")
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.splitlines()[-1] == f"lmevaljob/bad failed: {message}"


def test_wait_times_out(cli: Cli, jobs: Jobs) -> None:
    jobs.create("stuck")  # no poller: it stays New
    result = cli("wait", "stuck", "--timeout", "1s", "--interval", "0.2")
    assert result.returncode == 2
    assert (
        "timed out after 1s waiting for lmevaljob/stuck to be succeeded (state New, progress -)"
        in result.stderr
    )


def test_submit_wait_follows_the_new_job(
    cli: Cli,
    background_poller: BackgroundPoller,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    process = cli.popen(
        "submit", "--name=direct", "--model=dummy", "--task=toy_mc", "--wait", "--interval=0.2"
    )
    pod = pod_when(None, jobs, "direct")
    serve_log(admin_api, jobs.namespace, pod, succeeded_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, pod, 0)
    out, err = process.communicate(timeout=90)
    assert process.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == f"lmevaljob/direct created in namespace {jobs.namespace}"
    assert lines[-1].startswith("lmevaljob/direct succeeded: acc=")


def test_wait_draws_a_progress_bar_on_a_terminal(cli: Cli, jobs: Jobs, tmp_path: Path) -> None:
    _complete_with(jobs, "drawn", {"results": {"toy_mc": {"acc,none": 0.5}}})
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        cli.argv("wait", "drawn"), stdout=follower, stderr=follower, env=cli_env()
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=30) == 0
    screen = b"".join(chunks).decode()
    assert "\u2501" in screen  # rich's bar
    assert "100%" in screen
    assert "lmevaljob/drawn succeeded: acc=0.5000" in screen


def test_suspend_and_resume_patch_the_spec(cli: Cli, poller: Reconciler, jobs: Jobs) -> None:
    jobs.create("pausable")
    pod_when(poller, jobs, "pausable")

    suspended = cli("suspend", "pausable")
    assert suspended.returncode == 0, suspended.stderr
    assert suspended.stdout == "lmevaljob/pausable suspend requested: the poller deletes its pod\n"
    assert jobs.get("pausable")["spec"]["suspend"] is True
    cycle_until(
        poller,
        lambda: jobs.status("pausable").get("state") == "Suspended" and not jobs.pods(),
        what="Suspended",
    )
    assert cli("list").stdout.splitlines()[1].split()[:2] == ["pausable", "Suspended"]

    resumed = cli("resume", "pausable")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "lmevaljob/pausable resumed: the poller starts a fresh pod\n"
    assert jobs.get("pausable")["spec"]["suspend"] is False
    pod_when(poller, jobs, "pausable")
