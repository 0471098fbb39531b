"""``lmeval logs`` and ``lmeval wait``: following jobs by polling, never watching.

Why this module exists: following needs care that a one-shot read does not.
Log streams with ``follow=true`` are not used: some servers (kwok, proxies
with idle timeouts) keep them open forever or cut them silently, and the
command must end when the job does. Instead the log is re-read every
interval with ``timestamps=true`` and ``sinceTime`` (which the apiserver
rounds down to the second), and a cursor (the last timestamp printed and how
many lines carried it) drops what was already shown, so no line is printed
twice or lost. The driver's ``::lmeval::`` marker lines are hidden unless
``--raw``. When the pod is gone (cancelled, suspended, deleted), the tail of
its log that the poller archived in the results ConfigMap is shown instead,
saying so on stderr. The pod and the ConfigMap are read only when the job is
their controller (``client.owned_object``): a pod someone else made under
the job's pod name is refused before a line of its log is printed (exit 8),
and so is a ConfigMap under the results' name. ``wait`` polls the jobs'
status until each meets what ``--for`` asks (``waitfor``), and draws a rich
progress bar per job on a terminal, or prints one line per change in a pipe.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from driver.protocol import MARKER_PREFIX
from lmeval_cli import facts, render
from lmeval_cli.client import (
    Cluster,
    fetch_job,
    owned_object,
    results_configmap,
    results_configmap_of,
)
from lmeval_cli.errors import ApiError, CliError, ExitCode, explain
from lmeval_cli.waitfor import WaitFor
from poller.cliapi import LOG_ARCHIVE_KEY, MAIN_CONTAINER, api, pod_name, timefmt

__all__ = ["LogCursor", "follow_job", "show_logs", "visible", "wait_job", "wait_jobs"]

_STAMP_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")
# Markers are a minority of lines; read this many more so --tail N shows N visible lines.
_TAIL_SLACK = 4


def visible(line: str, raw: bool) -> bool:
    """Whether a log line is shown: markers only with --raw."""
    return raw or not line.startswith(MARKER_PREFIX)


def _stamp_key(stamp: str) -> tuple[str, int] | None:
    match = _STAMP_RE.match(stamp)
    if not match:
        return None
    whole, fraction, zone = match.groups()
    if zone != "Z":
        moment = timefmt.parse_time(whole + zone)
        if moment is None:
            return None
        whole = timefmt.format_time(moment).removesuffix("Z")
    return whole, int((fraction or "0").ljust(9, "0"))


class LogCursor:
    """How far a polled, timestamped log was printed."""

    def __init__(self) -> None:
        self.last: tuple[str, int] | None = None
        self.seen = 0  # lines printed that carry exactly `last`

    def since_time(self) -> str | None:
        return f"{self.last[0]}Z" if self.last else None

    def new_lines(self, text: str) -> list[str]:
        """The lines of `text` (timestamps=true) not printed before, without stamps."""
        start_last, start_seen, same = self.last, self.seen, 0
        fresh: list[str] = []
        for entry in text.splitlines():
            stamp, _, line = entry.partition(" ")
            key = _stamp_key(stamp)
            if key is None:  # not stamped (should not happen): show as is
                fresh.append(entry)
                continue
            if start_last is not None:
                if key < start_last:
                    continue
                if key == start_last:
                    same += 1
                    if same <= start_seen:
                        continue
            if key == self.last:
                self.seen += 1
            else:
                self.last, self.seen = key, 1
            fresh.append(line)
        return fresh


def _pod_of(job: dict[str, Any]) -> str:
    meta = job["metadata"]
    named = facts.status(job).get("podName")
    return str(named or pod_name(str(meta["name"]), str(meta["uid"])))


def _archived_tail(cluster: Cluster, job: dict[str, Any]) -> tuple[str, str] | None:
    try:
        found = results_configmap(cluster, job)
    except ApiError as error:
        raise explain(error) from error
    text = ((found or {}).get("data") or {}).get(LOG_ARCHIVE_KEY)
    return (results_configmap_of(job), text) if isinstance(text, str) else None


def _own_pod_log(
    cluster: Cluster,
    job: dict[str, Any],
    pod: str,
    *,
    tail_lines: int | None,
    since_time: str | None,
) -> str | None:
    """The log of the job's pod, None when there is no such pod.

    The pod is checked first (`owned_object`: CliError when the job is not its
    controller), then its log read by name. A pod replaced between the two
    requests would have to be deleted first, which ends the job's evaluation
    (and fails the job: the poller finds it gone); the check is repeated on
    every poll.
    """
    try:
        if owned_object(cluster, job, "pods", pod) is None:
            return None
        return cluster.read_log(
            pod,
            str(job["metadata"]["namespace"]),
            MAIN_CONTAINER,
            tail_lines=tail_lines,
            since_time=since_time,
            timestamps=True,
        )
    except ApiError as error:
        if error.status == 404 and error.details.get("kind") == "pods":
            return None
        raise


def _print(out: render.Output, lines: list[str], raw: bool, tail: int | None = None) -> int:
    shown = [line for line in lines if visible(line, raw)]
    if tail is not None:
        shown = shown[-tail:] if tail > 0 else []
    for line in shown:
        out.stdout.write(line + "\n")
    out.stdout.flush()
    return len(shown)


def _show_archive(
    cluster: Cluster, out: render.Output, job: dict[str, Any], raw: bool, tail: int | None
) -> bool:
    archived = _archived_tail(cluster, job)
    if archived is None:
        return False
    configmap, text = archived
    out.note(
        f"pod {_pod_of(job)} no longer exists: showing the last {len(text.encode()) / 1024:.1f} "
        f"KiB of its log, archived by the poller in ConfigMap {configmap}"
    )
    _print(out, text.splitlines(), raw, tail)
    return True


def _no_log(job: dict[str, Any], why: str) -> CliError:
    name = job["metadata"]["name"]
    return CliError(f"LMEvalJob {name} has no log to show: {why}", ExitCode.NOT_FOUND)


def show_logs(
    cluster: Cluster,
    out: render.Output,
    job: dict[str, Any],
    *,
    raw: bool,
    tail: int | None,
    follow: bool,
    interval: float,
) -> int:
    """Print the job's log; with `follow`, keep printing until the job is Complete."""
    meta = job["metadata"]
    name, namespace = str(meta["name"]), str(meta["namespace"])
    cursor, printed, first, waiting_said = LogCursor(), 0, True, ""
    while True:
        finished = facts.state(job) == api.JobState.COMPLETE.value
        pod = _pod_of(job)
        why = ""
        try:
            read_tail = (tail * _TAIL_SLACK + 100) if first and tail is not None else None
            text = _own_pod_log(
                cluster, job, pod, tail_lines=read_tail, since_time=cursor.since_time()
            )
        except ApiError as error:
            if error.status != 400:  # 400: e.g. the container is waiting to start
                raise explain(error) from error
            if not follow or finished:
                raise _no_log(job, error.message) from error
            text, why = "", f"waiting: {error.message}"
        if text is None:
            gone = printed == 0 and _show_archive(cluster, out, job, raw, tail)
            if gone or (printed and finished):
                return ExitCode.OK
            if printed:
                out.note(
                    f"pod {pod} was deleted; the rest of its log was archived in "
                    f"ConfigMap {results_configmap_of(job)} (if the poller saw it)"
                )
                return ExitCode.OK
            if not follow or finished:
                raise _no_log(job, f"it has no pod (state {facts.state(job)})")
            why = f"waiting for the pod of {name} (state {facts.state(job)})"
        elif not why:
            printed += _print(out, cursor.new_lines(text), raw, tail if first else None)
            first = False
        if why and why != waiting_said:
            out.note(why)
            waiting_said = why
        if not follow or finished:
            return ExitCode.OK
        time.sleep(interval)
        try:
            job = cluster.get_job(name, namespace)
        except ApiError as error:
            if error.status == 404:
                out.note(f"LMEvalJob {name} was deleted")
                return ExitCode.OK
            raise explain(error) from error


class _Display:
    """Live progress bars on a terminal (one per job); one line per change in a pipe."""

    def __init__(self, out: render.Output, names: list[str]) -> None:
        self.out = out
        self.names = names
        self.last_line: dict[str, str] = {}
        self.progress: Progress | None = None
        self.tasks: dict[str, Any] = {}
        if out.stdout.isatty():
            self.progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                console=out.out,
            )

    def __enter__(self) -> _Display:
        if self.progress is not None:
            self.progress.start()
            for name in self.names:
                self.tasks[name] = self.progress.add_task(name, total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def _line(self, name: str, line: str) -> None:
        if line != self.last_line.get(name):
            self.out.write(line)
            self.last_line[name] = line

    def update(self, name: str, job: dict[str, Any]) -> None:
        state = facts.state(job)
        percent = facts.percent(job)
        progress = facts.status(job).get("progress") or {}
        phase = ""
        if state == api.JobState.RUNNING.value and isinstance(progress, dict):
            phase = str(progress.get("phase") or "")
        words = " ".join(w for w in (name, state, phase) if w)
        if self.progress is not None:
            self.progress.update(
                self.tasks[name],
                description=words,
                total=100 if percent is not None else None,
                completed=percent or 0,
            )
            return
        line = f"{name}: {state}"
        if percent is not None:
            line += f" {percent:.0f}%"
        if phase:
            line += f" {phase}"
        self._line(name, line)

    def gone(self, name: str) -> None:
        if self.progress is not None:
            self.progress.update(self.tasks[name], description=f"{name} deleted", total=1)
            self.progress.update(self.tasks[name], completed=1)
            return
        self._line(name, f"{name}: deleted")


def _describe(seconds: float) -> str:
    return f"{seconds:g}s" if seconds < 120 else f"{seconds / 60:g}m"


def follow_job(
    cluster: Cluster,
    name: str,
    namespace: str,
    *,
    timeout: float | None,
    interval: float,
    seen: Callable[[dict[str, Any]], None],
) -> tuple[dict[str, Any], bool]:
    """Poll the job until it is Complete or `timeout` passes; `seen` gets every read.

    The last job read, and whether it is Complete. The sandbox's follower
    (its state lines); a job that vanishes, or an API error, is a CliError
    that says why.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        job = fetch_job(cluster, name, namespace)
        seen(job)
        if facts.state(job) == api.JobState.COMPLETE.value:
            return job, True
        if deadline is not None and time.monotonic() >= deadline:
            return job, False
        pause = interval
        if deadline is not None:
            pause = max(0.0, min(interval, deadline - time.monotonic()))
        time.sleep(pause)


def _ended_text(name: str, job: dict[str, Any]) -> str:
    """'lmevaljob/x succeeded: acc=...', '... failed: message', '... was cancelled'."""
    reason = facts.reason(job)
    if reason == api.JobReason.SUCCEEDED.value:
        score = facts.headline(job)
        return f"lmevaljob/{name} succeeded" + (f": {score}" if score != "-" else "")
    message = str(facts.status(job).get("message") or "")
    outcome = "was cancelled" if reason == api.JobReason.CANCELLED.value else "failed"
    return f"lmevaljob/{name} {outcome}" + (f": {message}" if message else "")


def _read(cluster: Cluster, name: str, namespace: str, want: WaitFor) -> dict[str, Any] | None:
    """The job; None when it is gone and deletion is awaited."""
    if not want.delete:
        return fetch_job(cluster, name, namespace)
    try:
        return cluster.get_job(name, namespace)
    except ApiError as error:
        if error.status == 404:
            return None
        raise explain(error) from error


def wait_jobs(
    cluster: Cluster,
    out: render.Output,
    targets: list[tuple[str, str]],
    *,
    want: WaitFor,
    timeout: float | None,
    interval: float,
) -> int:
    """Poll (namespace, name) `targets` until each meets `want`, ends, or `timeout` passes.

    Exit code: 0 when every job met it; 1 when one ended without meeting it
    (a failed job, for the default condition=Succeeded); else 2 when the
    time ran out. Each job's outcome is printed once the display is closed.
    """
    labels = {t: t[1] if t[0] == cluster.namespace else f"{t[0]}/{t[1]}" for t in targets}
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(targets)
    last: dict[tuple[str, str], dict[str, Any] | None] = {}
    ended: dict[tuple[str, str], int] = {}
    with _Display(out, [labels[t] for t in targets]) as display:
        while True:
            for target in list(pending):
                job = _read(cluster, target[1], target[0], want)
                last[target] = job
                if job is None:
                    display.gone(labels[target])
                    ended[target] = ExitCode.OK
                else:
                    display.update(labels[target], job)
                    if not want.delete and want.met(job):
                        ended[target] = ExitCode.OK
                    elif not want.delete and want.never(job):
                        ended[target] = ExitCode.JOB_FAILED
                if target in ended:
                    pending.remove(target)
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                break
            pause = interval
            if deadline is not None:
                pause = max(0.0, min(interval, deadline - time.monotonic()))
            time.sleep(pause)
    for target in targets:
        _report(out, labels[target], last.get(target), ended.get(target), want, timeout)
    codes = set(ended.values())
    if ExitCode.JOB_FAILED in codes:
        return ExitCode.JOB_FAILED
    return ExitCode.TIMEOUT if pending else ExitCode.OK


def _report(
    out: render.Output,
    label: str,
    job: dict[str, Any] | None,
    code: int | None,
    want: WaitFor,
    timeout: float | None,
) -> None:
    if job is None:
        out.write(f"lmevaljob/{label} deleted")
        return
    if code is None:
        out.note(
            f"timed out after {_describe(timeout or 0)} waiting for lmevaljob/{label} "
            f"{want.describe()} (state {facts.state(job)}, progress {facts.progress_text(job)})"
        )
        return
    finished = facts.state(job) == api.JobState.COMPLETE.value
    if code == ExitCode.OK:
        if finished and want.condition in ("Finished", "Succeeded") and want.status:
            out.write(_ended_text(label, job))
        else:
            out.write(f"lmevaljob/{label} condition met: {want.condition}={want.status}")
        return
    text = _ended_text(label, job)
    if want.condition != "Succeeded" or not want.status:
        text += f" (condition {want.condition}={want.status} can no longer be met)"
    out.note(text)


def wait_job(
    cluster: Cluster,
    out: render.Output,
    name: str,
    namespace: str,
    *,
    want: WaitFor,
    timeout: float | None,
    interval: float,
) -> int:
    """`wait_jobs` for one job (``submit --wait``, ``rerun --wait``)."""
    return wait_jobs(
        cluster, out, [(namespace, name)], want=want, timeout=timeout, interval=interval
    )
