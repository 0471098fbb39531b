"""``python -m lmeval_sandbox run``: one real evaluation on a local cluster, end to end.

The command a newcomer runs before they have a cluster. It starts the local
control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok),
installs what ``deploy/`` and ``crds/`` hold (the CRD, the poller's
namespace, ServiceAccount and ClusterRole, the rights-free job
ServiceAccount, the settings ConfigMap), then starts three local processes:

* the poller itself (``lmeval-poller``), authenticated as its ServiceAccount
  with nothing but the ClusterRole from ``deploy/base/rbac.yaml``;
* the local pod runner (`lmeval_sandbox.runner`), which plays the kubelet of
  node ``lmeval-sandbox`` and runs job pods as local processes, so the job
  pod really runs the driver and lm_eval;
* the toy OpenAI-compatible model server (`lmeval_sandbox.model_server`),
  the "served model" of the default sample.

It applies a sample from ``deploy/samples/`` (tasks ConfigMap + LMEvalJob),
follows the job through its states with a live progress bar, prints the
results as a table and, unless ``--keep`` is given, stops everything. Exit
code 0 when the job Succeeded, 1 otherwise (with the job's message), 130 on
Ctrl-C. With ``--keep`` every process keeps running (PIDs in ``state.json``,
so ``python -m lmeval_sandbox down`` stops them) and the kubectl lines to
explore the cluster are printed.

This module is the command as the newcomer sees it: the samples, following
the job in the terminal, the results table and the closing lines. Setting up
around the plane (a clean work directory, the installed manifests, the three
background processes) is in `lmeval_sandbox.bringup`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml
from lmeval_cli import facts
from lmeval_cli.client import Cluster
from lmeval_cli.errors import ApiError, CliError
from lmeval_cli.follow import follow_job
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

from driver.decoder import decode_text
from lmeval_sandbox import build
from lmeval_sandbox.bringup import (
    METRICS_PORT,
    REPO_ROOT,
    SETTINGS,
    DemoError,
    Processes,
    clean_workdir,
    install,
    start_processes,
)
from lmeval_sandbox.components import free_port
from lmeval_sandbox.controlplane import ControlPlane, ControlPlaneError
from lmeval_sandbox.identities import api_client
from poller import api
from poller.jobpod import podspec
from poller.results.lmeval import score_rows

__all__ = ["DEFAULT_SAMPLE", "SAMPLES", "DemoOptions", "results_rows", "run"]

SAMPLES_DIR = REPO_ROOT / "deploy" / "samples"
TASKS_FILE = SAMPLES_DIR / "tasks-configmap.yaml"
SAMPLES = {
    "served-model": SAMPLES_DIR / "served-model.yaml",
    "dummy-model": SAMPLES_DIR / "dummy-model.yaml",
    "chat-model": SAMPLES_DIR / "chat-model.yaml",
}
DEFAULT_SAMPLE = "served-model"
DEMO_NAMESPACE = "lmeval-demo"
# The toy model server's port; another free port is used when it is taken.
MODEL_SERVER_PORT = 8765
# The samples are written for a real cluster, so a model server's address and
# model name are placeholders there; the sandbox points them at its toy
# server (which answers to any model name, and calls itself "toy").
SAMPLE_SERVER = "http://my-model.models.svc:8000"
SAMPLE_SERVED_MODEL = "my-model"
TOY_MODEL = "toy"


@dataclass(frozen=True)
class DemoOptions:
    workdir: Path
    sample: str = DEFAULT_SAMPLE
    keep: bool = False
    model_port: int = MODEL_SERVER_PORT
    timeout: float = 600.0
    down_hint: str = "python -m lmeval_sandbox down"
    # "local": the local runner plays the kubelet; "real": a real node runs
    # our images (lmeval_sandbox.realdemo).
    node: str = "local"


# -- results -----------------------------------------------------------------------


def results_rows(results: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(task, metric, filter, value, stderr) for every score, as `poller.results.lmeval` reads."""
    return [
        (row.task, row.metric, row.filter, _number(row.value), _number(row.stderr))
        for row in score_rows(results)
    ]


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
    documents = [d for d in yaml.safe_load_all(TASKS_FILE.read_text()) if d]
    documents += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for document in documents:
        if document.get("kind") == api.KIND:
            _to_toy_server(document.get("spec") or {}, model_port)
    return documents


def _to_toy_server(spec: dict[str, Any], model_port: int) -> None:
    """Point a sample's placeholder model server at the toy server on `model_port`."""
    for pair in spec.get("modelArgs") or []:
        value = pair.get("value")
        if not isinstance(value, str):
            continue
        if pair.get("name") == "base_url" and value.startswith(SAMPLE_SERVER + "/"):
            pair["value"] = f"http://127.0.0.1:{model_port}" + value.removeprefix(SAMPLE_SERVER)
        elif pair.get("name") == "model" and value == SAMPLE_SERVED_MODEL:
            pair["value"] = TOY_MODEL


def _job_name(documents: list[dict[str, Any]]) -> str:
    jobs = [d for d in documents if d.get("kind") == api.KIND]
    if len(jobs) != 1:
        raise DemoError(f"a sample holds exactly one {api.KIND}; found {len(jobs)}")
    return str(jobs[0]["metadata"]["name"])


# -- following the job ---------------------------------------------------------------


@dataclass
class _Seen:
    state: str = ""
    reason: str = ""
    message: str = ""


class Watched(Protocol):
    """What runs beside the job: `check` raises DemoError when a part died."""

    def check(self) -> None: ...


class _StateLines:
    """The sandbox's view of the CLI's follower: a line per state change, a live bar.

    `lmeval_cli.follow.follow_job` does the polling; this only shows each
    read (every 0.25 s, so state changes print as they happen). Until the
    poller has written progress to status, the bar shows the driver's own
    progress markers from the pod log, read at most once a second.
    """

    def __init__(
        self, cluster: Cluster, console: Console, bar: Progress, processes: Watched
    ) -> None:
        self.cluster = cluster
        self.console = console
        self.bar = bar
        self.task = bar.add_task("job", total=None, state="New", phase="")
        self.processes = processes
        self.begin = time.monotonic()
        self.seen = _Seen()
        self._log_read = 0.0
        self._log_progress: dict[str, Any] | None = None

    def __call__(self, job: dict[str, Any]) -> None:
        self.processes.check()
        status = facts.status(job)
        state = status.get("state") or "New"
        reason = status.get("reason") or ""
        message = status.get("message") or ""
        if (state, reason, message) != (self.seen.state, self.seen.reason, self.seen.message):
            self.seen = _Seen(state, reason, message)
            shown = f"{reason}: {message}" if reason not in ("", "NoReason") else message
            if state == "New" and not shown:
                shown = "submitted; waiting for the poller"
            elapsed = time.monotonic() - self.begin
            style = {"Succeeded": "green", "Failed": "red", "Cancelled": "yellow"}.get(
                reason, "cyan"
            )
            self.console.print(
                f"  {elapsed:5.1f}s  [{style}]{state:<10}[/]  {shown}", soft_wrap=True
            )
        if state == "Complete":
            return
        progress = self._progress(status) or {}
        percent = progress.get("percent")
        phase = str(progress.get("phase") or "")[:48]
        if isinstance(percent, int | float):
            self.bar.update(
                self.task, total=100, completed=float(percent), state=state, phase=phase
            )
        else:
            self.bar.update(self.task, total=None, state=state, phase=phase)

    def _progress(self, status: dict[str, Any]) -> dict[str, Any] | None:
        """The latest progress: the poller's status.progress, else the driver's markers."""
        if status.get("progress"):
            progress: dict[str, Any] = status["progress"]
            return progress
        pod = status.get("podName")
        if status.get("state") != "Running" or not pod:
            return None
        if time.monotonic() - self._log_read > 1.0:
            self._log_read = time.monotonic()
            # Progress from the log is a nicety: nothing in reading it may stop the run.
            with contextlib.suppress(Exception):
                text = self.cluster.read_log(
                    pod, self.cluster.namespace, podspec.MAIN_CONTAINER, tail_lines=200
                )
                decoded = decode_text(text)
                if decoded.last_progress is not None:
                    self._log_progress = decoded.last_progress
                elif decoded.started is not None and self._log_progress is None:
                    self._log_progress = {"phase": "lm_eval starting"}
        return self._log_progress


def follow(
    cluster: Cluster, name: str, console: Console, timeout: float, processes: Watched
) -> dict[str, Any]:
    """Show the job's states and progress until it is Complete; its final status."""
    columns = (
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[state]:<10}"),
        BarColumn(bar_width=30),
        TaskProgressColumn(),
        TextColumn("{task.fields[phase]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        lines = _StateLines(cluster, console, bar, processes)
        try:
            job, finished = follow_job(
                cluster, name, cluster.namespace, timeout=timeout, interval=0.25, seen=lines
            )
        except CliError as error:  # the job was deleted, the apiserver refused, ...
            raise DemoError(error.message) from error
    if not finished:
        raise DemoError(f"the job did not finish within {timeout:.0f} s")
    return facts.status(job)


def log_tail(cluster: Cluster, pod: str, lines: int = 15) -> str:
    """The end of the job pod's log, or why it cannot be read."""
    try:
        return cluster.read_log(pod, cluster.namespace, podspec.MAIN_CONTAINER, tail_lines=lines)
    except (ApiError, CliError) as error:
        return f"(log unavailable: {error})"


# -- the command -----------------------------------------------------------------------


def _binaries_missing() -> bool:
    if os.environ.get("LMEVAL_SANDBOX_BIN") or os.environ.get("KUBEBUILDER_ASSETS"):
        return False
    try:
        return not build.binaries_dir().is_dir()
    except (OSError, subprocess.CalledProcessError):
        return True  # no Go toolchain: ensure_binaries says so


@contextlib.contextmanager
def step(console: Console, text: str) -> Iterator[None]:
    started = time.monotonic()
    with console.status(text):
        yield
    console.print(f"[green]✓[/] {text} [dim]({time.monotonic() - started:.1f} s)[/]")


def _interrupt(signum: int, _frame: object) -> None:
    # SIGTERM (a CI timeout, `kill`) stops everything like Ctrl-C does.
    raise KeyboardInterrupt


def run(options: DemoOptions, console: Console) -> int:
    """The whole command on the local runner (`realdemo` runs it on the real
    node; ``python -m lmeval_sandbox run`` picks one); returns the exit code."""
    return guarded(lambda: _run_local(options, console), console)


def guarded(body: Callable[[], int], console: Console) -> int:
    """Run `body`, turning the errors a newcomer can meet into a line and an exit code."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return body()
    except DemoError as error:
        console.print(f"[red]sandbox run failed:[/] {error}")
        return 1
    except ControlPlaneError as error:
        console.print(f"[red]the cluster did not start:[/] {error}")
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


def _run_local(options: DemoOptions, console: Console) -> int:
    """The command with the local pod runner as the kubelet."""
    begin = time.monotonic()
    plane: ControlPlane | None = None
    processes: Processes | None = None
    keep = False
    farewell = ""
    try:
        clean_workdir(options.workdir)
        documents = sample_documents(options.sample, options.model_port)
        job_name = _job_name(documents)
        if _binaries_missing():
            console.print(
                "[yellow]first run:[/] building etcd, kube-apiserver, kube-controller-manager, "
                "kube-scheduler, kubectl and kwok from their Go modules (about 7 minutes on 2 "
                "cores with an empty Go module cache; cached in ~/.cache/lmeval-poller after)"
            )
        plane = ControlPlane(
            options.workdir, kwok_nodes=1, die_with_parent=False, taint_kwok_nodes=True
        )
        with step(
            console, "local control plane (etcd, apiserver, controller-manager, scheduler, kwok)"
        ):
            plane.start()
        times = plane.times
        if times.binaries > 5:
            console.print(f"  binaries built in {times.binaries:.0f} s (cached from now on)")
        processes = Processes(plane)
        with step(console, "CRD, poller RBAC, job ServiceAccount and settings installed"):
            install(plane, DEMO_NAMESPACE)
        port = free_port(options.model_port)
        metrics_port = free_port(METRICS_PORT)
        documents = sample_documents(options.sample, port)
        with step(console, f"poller, local pod runner and model server on 127.0.0.1:{port}"):
            start_processes(plane, processes, port, metrics_port)
        sample_path = SAMPLES.get(options.sample) or Path(options.sample)
        plane.kubectl(
            "apply", "-n", DEMO_NAMESPACE, "-f", "-", input_text=yaml.safe_dump_all(documents)
        )
        console.print(f"[green]✓[/] applied {_shown(TASKS_FILE)} and {_shown(sample_path)}")
        console.print(f"following LMEvalJob [bold]{DEMO_NAMESPACE}/{job_name}[/]:")
        evaluation_begin = time.monotonic()
        with api_client(plane.kubeconfig) as admin:
            cluster = Cluster(admin, DEMO_NAMESPACE)
            status = follow(cluster, job_name, console, options.timeout, processes)
            succeeded = show_outcome(console, cluster, status)
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
    finally:
        if not keep:
            if processes is not None:
                processes.stop()
            if plane is not None:
                plane.stop()
                console.print("sandbox stopped" + (f"; {farewell}" if farewell else ""))


def show_outcome(console: Console, cluster: Cluster, status: dict[str, Any]) -> bool:
    """Print the results table, or the end of the pod log; True when it Succeeded."""
    succeeded = status.get("reason") == "Succeeded"
    if succeeded and status.get("results"):
        console.print(results_table(json.loads(status["results"])))
        if status.get("resultsReduced"):
            where = status.get("resultsConfigMap")
            console.print(f"  (reduced; the full JSON is in ConfigMap {where})")
    elif not succeeded and status.get("podName"):
        console.print(f"[dim]last lines of pod {status['podName']}:[/]")
        console.print(
            log_tail(cluster, status["podName"]), markup=False, highlight=False, soft_wrap=True
        )
    return succeeded


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
