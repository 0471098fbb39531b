"""What ``python -m lmeval_sandbox run`` sets up once the control plane is up.

`lmeval_sandbox.demo` is the command: it reads the sample, starts the plane,
follows the job and prints what happened. This module is its set-up, kept
apart so the command reads as a sequence of steps: a clean work directory,
the objects ``deploy/`` and ``crds/`` define (installed as a cluster admin
would install them), and the command's three background processes (the
toy model server, the local pod runner, the poller) with their PIDs added to
the plane's ``state.json`` so ``python -m lmeval_sandbox down`` stops them
too. `DemoError` lives here because set-up is where most of them arise.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.crd import CRD_PATHS
from lmeval_sandbox.identities import service_account_kubeconfig
from lmeval_sandbox.runner import NODE_NAME
from lmeval_sandbox.supervise import http_ok
from poller import api
from poller.api.settings import CONFIGMAP_NAME

__all__ = [
    "METRICS_PORT",
    "POLLER_NAMESPACE",
    "REPO_ROOT",
    "SETTINGS",
    "DemoError",
    "Processes",
    "clean_workdir",
    "install",
    "start_processes",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
POLLER_NAMESPACE = "lmeval-system"
# Sub-directories of a previous run that must not leak into this one.
STALE = ("etcd", "runner", "users", "logs", "pki")
SETTINGS = {"poll-interval": "1s"}
METRICS_PORT = 8080
TOKEN_SECONDS = 7 * 24 * 3600


class DemoError(RuntimeError):
    """Something the newcomer must read: what failed and where its log is."""


# -- processes -----------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # Everything here is on loopback: never through a proxy.
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Processes:
    """The command's own background processes, recorded in the plane's state.json."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log_path = self.plane.logs_dir / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.plane.workdir,
                env=_child_env(),
                start_new_session=True,
            )
        self.procs[name] = proc
        state = json.loads(self.plane.state_file.read_text())
        state["pids"][name] = proc.pid
        self.plane.state_file.write_text(json.dumps(state, indent=2))
        return proc

    def check(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise DemoError(
                    f"{name} exited with code {proc.returncode}\n{self.plane.log_tail(name)}"
                )

    def stop(self) -> None:
        # The poller first (no new pods), then the runner (stops its pods).
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        self.procs.clear()


def _wait(what: str, ready: Any, timeout: float, processes: Processes) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        processes.check()
        if time.monotonic() > deadline:
            raise DemoError(f"{what} not ready after {timeout:.0f} s")
        time.sleep(0.1)


# -- steps -----------------------------------------------------------------------------


def clean_workdir(workdir: Path) -> None:
    """Refuse a work directory a sandbox still runs in; drop a stopped one's state."""
    state = ControlPlane.read_state(workdir)
    if state and any(_alive(int(pid)) for pid in state["pids"].values()):
        raise DemoError(
            f"a sandbox already runs in {workdir}; stop it with "
            f"`python -m lmeval_sandbox --workdir {workdir} down` first"
        )
    # A fresh cluster every time: an old etcd would still hold the last run's job.
    for name in STALE:
        shutil.rmtree(workdir / name, ignore_errors=True)
    (workdir / "state.json").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def install(plane: ControlPlane, namespace: str) -> None:
    """The CRD, the poller's namespace and RBAC, the admission policies, a job
    namespace, the settings."""
    for crd_path in CRD_PATHS:
        plane.kubectl("apply", "--server-side", "-f", str(crd_path))
    plane.kubectl("apply", "-f", str(REPO_ROOT / "deploy" / "base" / "namespace.yaml"))
    plane.kubectl("apply", "-f", str(REPO_ROOT / "deploy" / "base" / "rbac.yaml"))
    # As installed: the sample's job passes them (its creator is the admin), and
    # the poller, acting as its ServiceAccount, may make the claimed job pod.
    plane.kubectl("apply", "--server-side", "-k", str(REPO_ROOT / "deploy" / "admission"))
    plane.kubectl("create", "namespace", namespace)
    job_sa = REPO_ROOT / "deploy" / "components" / "job-namespace" / "job-serviceaccount.yaml"
    plane.kubectl("apply", "-n", namespace, "-f", str(job_sa))
    settings = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP_NAME, "namespace": POLLER_NAMESPACE},
        "data": dict(SETTINGS),
    }
    plane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(settings))
    plane.kubectl("wait", "--for=condition=Established", f"crd/{api.PLURAL}.{api.API_GROUP}")


def _node_ready(plane: ControlPlane) -> bool:
    out = plane.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
    if out.returncode != 0:
        return False
    conditions = json.loads(out.stdout).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def start_processes(
    plane: ControlPlane, processes: Processes, model_port: int, metrics_port: int
) -> None:
    """The model server, the local pod runner and the poller; wait until each serves."""
    python = sys.executable
    processes.spawn(
        "model-server",
        [python, "-m", "lmeval_sandbox.model_server", "--port", str(model_port)],
    )
    processes.spawn(
        "lmeval-sandbox-runner",
        [
            python,
            "-m",
            "lmeval_sandbox.runner",
            f"--kubeconfig={plane.kubeconfig}",
            f"--workdir={plane.workdir / 'runner'}",
            f"--kwok-port={plane.ports.kwok_server}",
            # Any job lands here, never on the (tainted) kwok node.
            "--untainted",
        ],
    )
    # The poller acts as its ServiceAccount: exactly the rights deploy/ gives it.
    poller_config = service_account_kubeconfig(
        plane, POLLER_NAMESPACE, "lmeval-poller", expiration_seconds=TOKEN_SECONDS
    )
    processes.spawn(
        "lmeval-poller",
        [
            python,
            "-m",
            "poller",
            f"--kubeconfig={poller_config}",
            f"--settings-namespace={POLLER_NAMESPACE}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={metrics_port}",
        ],
    )
    _wait("model server", lambda: http_ok(f"http://127.0.0.1:{model_port}/health"), 30, processes)
    _wait("node lmeval-sandbox", lambda: _node_ready(plane), 30, processes)
    _wait("poller", lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 30, processes)
