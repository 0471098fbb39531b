"""``lmeval logs`` on the real control plane, with logs served by kwok.

Checks: the log of a running pod is printed line for line with the driver's
``::lmeval::`` markers hidden, and ``--raw`` keeps them; ``--tail N`` prints
the last N visible lines; ``-f`` prints lines as they are appended to the
log, each exactly once, and returns by itself when the job is Complete
(kwok's follow streams never end, so the CLI must not rely on them); after
``lmeval cancel`` the poller archives the log and deletes the pod, and
``logs`` then prints the archived tail from the results ConfigMap and says
so on stderr; a job without a pod is exit code 4 with the reason.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from kubernetes import client
from lmeval_sandbox import kwok

from driver.protocol import MARKER_PREFIX, encode_marker
from poller.cycle.reconciler import Reconciler
from tests.cli.conftest import BackgroundPoller, Cli, pod_when
from tests.poller_fixtures import CapturedRun, Jobs, cycle_until, serve_log, terminate
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster


def _visible(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith(MARKER_PREFIX)]


def test_logs_hide_markers_unless_raw(
    cli: Cli,
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    assert MARKER_PREFIX in succeeded_run.log  # the captured run has markers to hide
    jobs.create("talky")
    pod = pod_when(poller, jobs, "talky")
    serve_log(admin_api, jobs.namespace, pod, succeeded_run.log, tmp_path)

    shown = cli("logs", "talky")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == _visible(succeeded_run.log)
    assert MARKER_PREFIX not in shown.stdout

    raw = cli("logs", "talky", "--raw")
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout.splitlines() == succeeded_run.log.splitlines()

    tail = cli("logs", "talky", "--tail", "3")
    assert tail.stdout.splitlines() == _visible(succeeded_run.log)[-3:]


def test_logs_follow_prints_new_lines_once_and_ends_with_the_job(
    cli: Cli,
    background_poller: BackgroundPoller,
    jobs: Jobs,
    admin_api: client.ApiClient,
    tmp_path: Path,
) -> None:
    jobs.create("followed")
    pod = pod_when(None, jobs, "followed")
    first = ["loading the model", encode_marker("started", run_id="r1"), "step 1 of 2"]
    serve_log(admin_api, jobs.namespace, pod, "\n".join(first), tmp_path)

    process = cli.popen("logs", "followed", "-f", "--interval", "0.2")
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(process.stdout.readline, "")))
    reader.start()
    wait_for(lambda: "step 1 of 2" in "".join(seen), timeout=30, what="first part printed")

    second = ["step 2 of 2", encode_marker("progress", percent=100.0), "all done"]
    with (tmp_path / f"{pod}.log").open("a") as log:
        log.write(kwok.cri_log_lines(second))
    wait_for(lambda: "all done" in "".join(seen), timeout=30, what="appended part printed")
    assert process.poll() is None  # still following: the job is not Complete

    terminate(admin_api, jobs.namespace, pod, 0)
    assert process.wait(timeout=60) == 0, process.stderr.read()
    reader.join(timeout=10)
    assert [line.rstrip("\n") for line in seen] == [
        "loading the model",
        "step 1 of 2",
        "step 2 of 2",
        "all done",
    ]


def test_logs_after_cancel_come_from_the_archive(
    cli: Cli,
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    jobs.create("stopped")
    pod = pod_when(poller, jobs, "stopped")
    serve_log(admin_api, jobs.namespace, pod, succeeded_run.log, tmp_path)

    cancelled = cli("cancel", "stopped")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == "lmevaljob/stopped cancel requested: the poller stops it\n"
    assert jobs.get("stopped")["spec"]["cancel"] is True
    cycle_until(
        poller,
        lambda: jobs.status("stopped").get("reason") == "Cancelled" and not jobs.pods(),
        what="Cancelled, pod deleted",
    )

    archived = cli("logs", "stopped")
    assert archived.returncode == 0, archived.stderr
    assert f"pod {pod} no longer exists" in archived.stderr
    assert "archived by the poller in ConfigMap stopped-results" in archived.stderr
    visible = _visible(succeeded_run.log)
    printed = archived.stdout.splitlines()
    assert printed and printed == visible[-len(printed) :]
    assert MARKER_PREFIX not in archived.stdout
    assert MARKER_PREFIX in cli("logs", "stopped", "--raw").stdout
    assert cli("logs", "stopped", "--tail", "2").stdout.splitlines() == visible[-2:]

    again = cli("cancel", "stopped")
    assert again.returncode == 0
    assert "already finished (Cancelled): nothing to cancel" in again.stderr


def test_logs_without_a_pod(cli: Cli, jobs: Jobs) -> None:
    jobs.create("unscheduled")  # no poller: it never gets a pod
    result = cli("logs", "unscheduled")
    assert result.returncode == 4
    assert "LMEvalJob unscheduled has no log to show: it has no pod (state New)" in result.stderr
