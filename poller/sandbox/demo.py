"""``python -m poller.sandbox run``: one real evaluation on a local cluster, end to end.

The command a newcomer runs before they have a cluster. It starts the local
control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok),
installs what ``deploy/`` and ``crds/`` hold (the CRD, the poller's
namespace, ServiceAccount and ClusterRole, the rights-free job
ServiceAccount, the settings ConfigMap), then starts three local processes:

* the poller itself (``lmeval-poller``), authenticated as its ServiceAccount
  with nothing but the ClusterRole from ``deploy/base/rbac.yaml``;
* the local pod runner (`poller.sandbox.runner`), which plays the kubelet of
  node ``lmeval-sandbox`` and runs job pods as local processes, so the job
  pod really runs the driver and lm_eval;
* the toy OpenAI-compatible model server (`poller.sandbox.model_server`),
  the "served model" of the default sample.

It applies a sample from ``deploy/samples/`` (tasks ConfigMap + LMEvalJob),
follows the job through its states with a live progress bar, prints the
results as a table and, unless ``--keep`` is given, stops everything. Exit
code 0 when the job Succeeded, 1 otherwise (with the job's message), 130 on
Ctrl-C. With ``--keep`` every process keeps running (PIDs in ``state.json``,
so ``python -m poller.sandbox down`` stops them) and the kubectl lines to
explore the cluster are printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from driver.protocol import decode_text
from poller import api
from poller.crd import CRD_PATH
from poller.sandbox import build
from poller.sandbox.controlplane import ControlPlane, ControlPlaneError
from poller.sandbox.identities import api_client, service_account_kubeconfig
from poller.sandbox.runner import NODE_NAME
from poller.settings import CONFIGMAP_NAME

__all__ = ["DEFAULT_SAMPLE", "SAMPLES", "DemoOptions", "results_rows", "run"]

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLES_DIR = REPO_ROOT / "deploy" / "samples"
TASKS_FILE = SAMPLES_DIR / "tasks-configmap.yaml"
SAMPLES = {
    "served-model": SAMPLES_DIR / "served-model.yaml",
    "dummy-model": SAMPLES_DIR / "dummy-model.yaml",
}
DEFAULT_SAMPLE = "served-model"
DEMO_NAMESPACE = "lmeval-demo"
POLLER_NAMESPACE = "lmeval-system"
# The port the samples name; another free port is substituted when it is taken.
MODEL_SERVER_PORT = 8765
SAMPLE_MODEL_URL = f"127.0.0.1:{MODEL_SERVER_PORT}"
# Processes this command adds to the plane's state.json (stopped first by `down`).
PROCESS_NAMES = ("model-server", "lmeval-sandbox-runner", "lmeval-poller")
# Sub-directories of a previous run that must not leak into this one.
STALE = ("etcd", "runner", "users", "logs", "pki")
SETTINGS = {"poll-interval": "1s"}
METRICS_PORT = 8080
TOKEN_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class DemoOptions:
    workdir: Path
    sample: str = DEFAULT_SAMPLE
    keep: bool = False
    model_port: int = MODEL_SERVER_PORT
    timeout: float = 600.0
    down_hint: str = "python -m poller.sandbox down"


class DemoError(RuntimeError):
    """Something the newcomer must read: what failed and where its log is."""


# -- results -----------------------------------------------------------------------


def results_rows(results: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(task, metric, filter, value, stderr) for every score in lm_eval's results JSON."""
    rows: list[tuple[str, str, str, str, str]] = []
    for section in ("groups", "results"):
        for task, scores in sorted((results.get(section) or {}).items()):
            if section == "results" and task in (results.get("groups") or {}):
                continue
            for key, value in sorted(scores.items()):
                if "," not in key:
                    continue
                metric, filter_name = key.split(",", 1)
                if metric.endswith("_stderr"):
                    continue
                stderr = scores.get(f"{metric}_stderr,{filter_name}")
                rows.append((task, metric, filter_name, _number(value), _number(stderr)))
    return rows


def _number(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def results_table(results: dict[str, Any]) -> Table:
    table = Table(title="lm_eval results", title_justify="left")
    for name, justify in (
        ("task", "left"),
        ("metric", "left"),
        ("filter", "left"),
        ("value", "right"),
        ("stderr", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in results_rows(results):
        table.add_row(*row)
    return table


# -- samples -----------------------------------------------------------------------


def sample_documents(sample: str, model_port: int) -> list[dict[str, Any]]:
    """The tasks ConfigMap and the sample's documents, with the model server's port."""
    path = SAMPLES.get(sample) or Path(sample)
    if not path.is_file():
        names = ", ".join(SAMPLES)
        raise DemoError(f"no sample {sample!r}: use one of {names}, or a path to a YAML file")
    text = path.read_text().replace(SAMPLE_MODEL_URL, f"127.0.0.1:{model_port}")
    documents = [d for d in yaml.safe_load_all(TASKS_FILE.read_text()) if d]
    documents += [d for d in yaml.safe_load_all(text) if d]
    return documents


def _job_name(documents: list[dict[str, Any]]) -> str:
    jobs = [d for d in documents if d.get("kind") == api.KIND]
    if len(jobs) != 1:
        raise DemoError(f"a sample holds exactly one {api.KIND}; found {len(jobs)}")
    return str(jobs[0]["metadata"]["name"])


# -- processes -----------------------------------------------------------------------


def _free_port(preferred: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the server will: a recent run's TIME_WAIT connections do not block it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


def _http_ok(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# -- steps -----------------------------------------------------------------------------


def _clean_workdir(workdir: Path) -> None:
    state = ControlPlane.read_state(workdir)
    if state and any(_alive(int(pid)) for pid in state["pids"].values()):
        raise DemoError(
            f"a sandbox already runs in {workdir}; stop it with "
            f"`python -m poller.sandbox --workdir {workdir} down` first"
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
    """The CRD, the poller's namespace and RBAC, a job namespace, the settings."""
    plane.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    plane.kubectl("apply", "-f", str(REPO_ROOT / "deploy" / "base" / "namespace.yaml"))
    plane.kubectl("apply", "-f", str(REPO_ROOT / "deploy" / "base" / "rbac.yaml"))
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
        [python, "-m", "poller.sandbox.model_server", "--port", str(model_port)],
    )
    processes.spawn(
        "lmeval-sandbox-runner",
        [
            python,
            "-m",
            "poller.sandbox.runner",
            f"--kubeconfig={plane.kubeconfig}",
            f"--workdir={plane.workdir / 'runner'}",
            f"--kwok-port={plane.ports.kwok_server}",
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
    _wait("model server", lambda: _http_ok(f"http://127.0.0.1:{model_port}/health"), 30, processes)
    _wait("node lmeval-sandbox", lambda: _node_ready(plane), 30, processes)
    _wait("poller", lambda: _http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 30, processes)


# -- following the job ---------------------------------------------------------------


@dataclass
class _Seen:
    state: str = ""
    reason: str = ""
    message: str = ""


class JobFollower:
    """Reads the job (and, for progress, the pod log) as the admin."""

    def __init__(self, admin: client.ApiClient, namespace: str, name: str) -> None:
        self.custom = client.CustomObjectsApi(admin)
        self.core = client.CoreV1Api(admin)
        self.namespace = namespace
        self.name = name
        self._log_read = 0.0
        self._log_progress: dict[str, Any] | None = None

    def status(self) -> dict[str, Any]:
        job = self.custom.get_namespaced_custom_object(
            api.API_GROUP, api.API_VERSION, self.namespace, api.PLURAL, self.name
        )
        assert isinstance(job, dict)
        status: dict[str, Any] = job.get("status") or {}
        return status

    def progress(self, status: dict[str, Any]) -> dict[str, Any] | None:
        """The latest progress: the poller's status.progress, else the driver's markers."""
        if status.get("progress"):
            progress: dict[str, Any] = status["progress"]
            return progress
        pod = status.get("podName")
        if status.get("state") != "Running" or not pod:
            return None
        if time.monotonic() - self._log_read > 1.0:
            self._log_read = time.monotonic()
            with contextlib.suppress(Exception):
                text = self.core.read_namespaced_pod_log(
                    pod, self.namespace, container="lmeval", tail_lines=200
                )
                decoded = decode_text(text)
                if decoded.last_progress is not None:
                    self._log_progress = decoded.last_progress
                elif decoded.started is not None and self._log_progress is None:
                    self._log_progress = {"phase": "lm_eval starting"}
        return self._log_progress

    def log_tail(self, pod: str, lines: int = 15) -> str:
        try:
            text: str = self.core.read_namespaced_pod_log(
                pod, self.namespace, container="lmeval", tail_lines=lines
            )
        except Exception as error:
            return f"(log unavailable: {error})"
        return text


def follow(
    follower: JobFollower, console: Console, timeout: float, processes: Processes
) -> dict[str, Any]:
    """Show the job's states and progress until it is Complete; its final status."""
    begin = time.monotonic()
    seen = _Seen()
    columns = (
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[state]:<10}"),
        BarColumn(bar_width=30),
        TaskProgressColumn(),
        TextColumn("{task.fields[phase]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("job", total=None, state="New", phase="")
        while True:
            processes.check()
            status = follower.status()
            state = status.get("state") or "New"
            reason = status.get("reason") or ""
            message = status.get("message") or ""
            if (state, reason, message) != (seen.state, seen.reason, seen.message):
                seen = _Seen(state, reason, message)
                shown = f"{reason}: {message}" if reason not in ("", "NoReason") else message
                if state == "New" and not shown:
                    shown = "submitted; waiting for the poller"
                elapsed = time.monotonic() - begin
                style = {"Succeeded": "green", "Failed": "red", "Cancelled": "yellow"}.get(
                    reason, "cyan"
                )
                console.print(
                    f"  {elapsed:5.1f}s  [{style}]{state:<10}[/]  {shown}", soft_wrap=True
                )
            if state == "Complete":
                return status
            progress = follower.progress(status) or {}
            percent = progress.get("percent")
            phase = str(progress.get("phase") or "")[:48]
            if isinstance(percent, int | float):
                bar.update(task, total=100, completed=float(percent), state=state, phase=phase)
            else:
                bar.update(task, total=None, state=state, phase=phase)
            if time.monotonic() - begin > timeout:
                raise DemoError(f"the job did not finish within {timeout:.0f} s")
            time.sleep(0.25)


# -- the command -----------------------------------------------------------------------


def _binaries_missing() -> bool:
    if os.environ.get("LMEVAL_SANDBOX_BIN") or os.environ.get("KUBEBUILDER_ASSETS"):
        return False
    try:
        return not build.binaries_dir().is_dir()
    except (OSError, subprocess.CalledProcessError):
        return True  # no Go toolchain: ensure_binaries says so


@contextlib.contextmanager
def _step(console: Console, text: str) -> Iterator[None]:
    started = time.monotonic()
    with console.status(text):
        yield
    console.print(f"[green]✓[/] {text} [dim]({time.monotonic() - started:.1f} s)[/]")


def _interrupt(signum: int, _frame: object) -> None:
    # SIGTERM (a CI timeout, `kill`) stops everything like Ctrl-C does.
    raise KeyboardInterrupt


def run(options: DemoOptions, console: Console | None = None) -> int:
    """The whole command; returns the exit code."""
    console = console or Console(soft_wrap=True)
    begin = time.monotonic()
    plane: ControlPlane | None = None
    processes: Processes | None = None
    keep = False
    farewell = ""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        _clean_workdir(options.workdir)
        documents = sample_documents(options.sample, options.model_port)
        job_name = _job_name(documents)
        if _binaries_missing():
            console.print(
                "[yellow]first run:[/] building etcd, kube-apiserver, kube-controller-manager, "
                "kube-scheduler, kubectl and kwok from their Go modules (about 7 minutes on 2 "
                "cores with an empty Go module cache; cached in ~/.cache/lmeval-poller after)"
            )
        plane = ControlPlane(options.workdir, kwok_nodes=1, die_with_parent=False)
        with _step(
            console, "local control plane (etcd, apiserver, controller-manager, scheduler, kwok)"
        ):
            plane.start()
        times = plane.times
        if times.binaries > 5:
            console.print(f"  binaries built in {times.binaries:.0f} s (cached from now on)")
        processes = Processes(plane)
        with _step(console, "CRD, poller RBAC, job ServiceAccount and settings installed"):
            install(plane, DEMO_NAMESPACE)
        port = _free_port(options.model_port)
        metrics_port = _free_port(METRICS_PORT)
        documents = sample_documents(options.sample, port)
        with _step(console, f"poller, local pod runner and model server on 127.0.0.1:{port}"):
            start_processes(plane, processes, port, metrics_port)
        sample_path = SAMPLES.get(options.sample) or Path(options.sample)
        plane.kubectl(
            "apply", "-n", DEMO_NAMESPACE, "-f", "-", input_text=yaml.safe_dump_all(documents)
        )
        console.print(f"[green]✓[/] applied {_shown(TASKS_FILE)} and {_shown(sample_path)}")
        console.print(f"following LMEvalJob [bold]{DEMO_NAMESPACE}/{job_name}[/]:")
        evaluation_begin = time.monotonic()
        with api_client(plane.kubeconfig) as admin:
            follower = JobFollower(admin, DEMO_NAMESPACE, job_name)
            status = follow(follower, console, options.timeout, processes)
            succeeded = status.get("reason") == "Succeeded"
            if succeeded and status.get("results"):
                console.print(results_table(json.loads(status["results"])))
                if status.get("resultsReduced"):
                    where = status.get("resultsConfigMap")
                    console.print(f"  (reduced; the full JSON is in ConfigMap {where})")
            elif not succeeded and status.get("podName"):
                console.print(f"[dim]last lines of pod {status['podName']}:[/]")
                console.print(
                    follower.log_tail(status["podName"]),
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )
        evaluation = time.monotonic() - evaluation_begin
        total = time.monotonic() - begin
        console.print(
            f"finished in {total:.0f} s: control plane {times.total:.0f} s, "
            f"evaluation {evaluation:.0f} s (poll interval {SETTINGS['poll-interval']})"
        )
        keep = options.keep
        if keep:
            _explain(console, plane, job_name, status, options, metrics_port)
        else:
            farewell = "run again with --keep to explore the cluster with kubectl afterwards"
        return 0 if succeeded else 1
    except DemoError as error:
        console.print(f"[red]sandbox run failed:[/] {error}")
        return 1
    except ControlPlaneError as error:
        console.print(f"[red]the control plane did not start:[/] {error}")
        return 1
    except RuntimeError as error:  # building the binaries failed (no Go, no network, ...)
        console.print(f"[red]sandbox run failed:[/] {error}")
        return 1
    except subprocess.CalledProcessError as error:
        console.print(f"[red]{' '.join(map(str, error.cmd[1:]))} failed:[/] {error.stderr}")
        return 1
    except KeyboardInterrupt:
        console.print("interrupted: stopping everything")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not keep:
            if processes is not None:
                processes.stop()
            if plane is not None:
                plane.stop()
                console.print("sandbox stopped" + (f"; {farewell}" if farewell else ""))


def _shown(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd()))
    return str(path)


def _explain(
    console: Console,
    plane: ControlPlane,
    job: str,
    status: dict[str, Any],
    options: DemoOptions,
    metrics_port: int,
) -> None:
    """The kubectl lines that explore what `--keep` left running."""
    kubectl = plane.binaries / "kubectl" if plane.binaries else Path("kubectl")
    pod = status.get("podName") or "<pod>"
    ns = DEMO_NAMESPACE
    lines = [
        f"export KUBECONFIG={plane.kubeconfig}",
        f"alias kubectl={kubectl}",
        f"kubectl get lmevaljobs -n {ns}",
        f"kubectl describe lmevaljob {job} -n {ns}",
        f"kubectl wait lmevaljob/{job} -n {ns} --for=condition=Succeeded",
        f"kubectl logs -n {ns} {pod}",
        f"kubectl get configmap -n {ns} {status.get('resultsConfigMap') or job}"
        " -o jsonpath='{.data.results\\.json}'",
        f"kubectl apply -n {ns} -f {_shown(SAMPLES['dummy-model'])}",
        f"curl -s http://127.0.0.1:{metrics_port}/metrics | grep ^lmeval_job",
    ]
    console.print("\nthe sandbox keeps running; explore it:")
    for line in lines:
        console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"stop it:\n  {options.down_hint}", highlight=False)
