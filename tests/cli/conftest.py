"""Fixtures for the ``lmeval`` command-line tests on the real control plane.

The CLI always runs as a separate process (``python -m lmeval_cli``), with
its output in a pipe, exactly as a script or CI would run it; its kubeconfig
is the admin's or a limited user's. Jobs are moved through their states by
the in-process poller (acting as its ServiceAccount) and kwok: a test
either steps the poller itself (``cycle_until``) or runs it in a background
thread (``background_poller``) while a CLI process that polls, such as
``wait`` or ``logs -f``, is running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.controlplane import ControlPlane

from poller.cycle.reconciler import Reconciler
from tests.poller_fixtures import CapturedRun, Jobs, cycle_until, serve_log, terminate

REPO = Path(__file__).resolve().parents[2]


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"KUBECONFIG", "COLUMNS"}}
    env["PYTHONPATH"] = str(REPO)
    return env


@dataclass
class Cli:
    """Runs `python -m lmeval_cli` against the test cluster and namespace."""

    kubeconfig: Path
    namespace: str

    def argv(self, *args: str, kubeconfig: Path | None = None) -> list[str]:
        return [
            sys.executable,
            "-m",
            "lmeval_cli",
            f"--kubeconfig={kubeconfig or self.kubeconfig}",
            "-n",
            self.namespace,
            *args,
        ]

    def __call__(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input_text: str | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args, kubeconfig=kubeconfig),
            capture_output=True,
            text=True,
            input=input_text,
            timeout=timeout,
            env=cli_env(),
            cwd=REPO,
            check=False,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            cwd=REPO,
        )


@pytest.fixture
def cli(poller_installed: ControlPlane, job_namespace: str) -> Cli:
    """The CLI as the sandbox admin, in this test's namespace."""
    return Cli(poller_installed.kubeconfig, job_namespace)


@dataclass
class BackgroundPoller:
    """The poller cycling in a thread, for CLI processes that poll on their own."""

    poller: Reconciler
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)

    def _loop(self) -> None:
        while not self.stop.is_set():
            report = self.poller.run_cycle()
            self.errors += report.error_messages if report.errors else []
            self.stop.wait(0.2)


@pytest.fixture
def background_poller(poller: Reconciler) -> Iterator[BackgroundPoller]:
    runner = BackgroundPoller(poller)
    thread = threading.Thread(target=runner._loop, name="poller", daemon=True)
    thread.start()
    yield runner
    runner.stop.set()
    thread.join(timeout=30)
    assert not runner.errors, runner.errors


def pod_when(poller: Reconciler | None, jobs: Jobs, name: str, state: str = "Running") -> str:
    """The job's pod once the job is in `state` (stepping `poller` if given)."""

    def probe() -> str | None:
        try:
            status = jobs.status(name)
        except client.exceptions.ApiException as error:
            if error.status == 404:  # not created yet (by a CLI process)
                return None
            raise
        return status.get("podName") if status.get("state") == state else None

    if poller is None:
        from tests.waiting import wait_for

        return wait_for(probe, timeout=30, what=f"{name} {state}")
    return cycle_until(poller, probe, what=f"{name} {state}")


def finish(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    name: str,
    run: CapturedRun,
    log_dir: Path,
    **spec: Any,
) -> dict[str, Any]:
    """Create job `name` and drive it to Complete with a captured run's log and exit code."""
    jobs.create(name, **spec)
    pod = pod_when(poller, jobs, name)
    serve_log(admin_api, jobs.namespace, pod, run.log, log_dir)
    terminate(admin_api, jobs.namespace, pod, run.exit_code)
    return cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == "Complete" and jobs.status(name),
        what=f"{name} Complete",
    )
