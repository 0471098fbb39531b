"""Local processes that play a pod's containers, for the sandbox runner.

Each container is a process in its own session whose stdout and stderr are
pumped, line by line, into a file in the container runtime's log format; a
pod is its containers plus the phase a kubelet would report. Liveness is
read from /proc (a zombie is dead), and a container's whole process family
is remembered so that a deletion can kill what it started, as a cgroup kill
would.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import datetime as dt
import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from lmeval_sandbox.podfs import TERMINATION_LINES, PathMapper
from poller import timefmt

__all__ = [
    "DRAIN_SECONDS",
    "Container",
    "LocalPod",
    "alive",
    "cri_line",
    "die_with_parent",
    "memory_kib",
    "process_table",
    "pump",
    "remember_family",
    "wait_for_exit",
]

# How long a finished container's output may keep arriving (a grandchild
# holding the pipe) before the termination is reported anyway.
DRAIN_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1


# -- processes ----------------------------------------------------------------------


def die_with_parent() -> None:
    # Between fork and exec: when the runner dies, its pods get SIGTERM.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) for every process."""
    table: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="utf-8") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(entry.name)] = (int(fields[1]), fields[19])
    return table


def alive(pid: int, start: str | None = None) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    if fields[0] in ("Z", "X"):
        return False
    return start is None or fields[19] == start


@dataclass
class Container:
    """One container of a pod: its spec, and its process once started."""

    name: str
    image: str
    spec: dict[str, Any]
    init: bool = False
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    message: str = ""
    waiting_reason: str = ""
    waiting_message: str = ""
    orphans_killed: bool = False
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=TERMINATION_LINES)
    )
    readers: list[threading.Thread] = field(default_factory=list)
    # Every process seen below the main one (pid -> start time), for the kill.
    family: dict[int, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def state(self) -> str:
        if self.exit_code is not None:
            return "terminated"
        if self.proc is not None:
            return "running"
        return "waiting"

    def drained(self) -> bool:
        """The process exited and its output is in the log (or took too long)."""
        if self.proc is None or self.proc.poll() is None:
            return False
        if not any(t.is_alive() for t in self.readers):
            return True
        finished = self.finished_at
        return finished is not None and (timefmt.now() - finished).total_seconds() > DRAIN_SECONDS

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.state == "running" and not self.init,
            "restartCount": 0,
        }
        if self.proc is not None:
            out["containerID"] = f"sandbox://{self.proc.pid}"
        if not self.init:
            out["started"] = self.state == "running"
        if self.exit_code is not None:
            terminated: dict[str, Any] = {
                "exitCode": self.exit_code,
                "reason": self.reason,
                "startedAt": timefmt.format_time(
                    self.started_at or self.finished_at or timefmt.now()
                ),
                "finishedAt": timefmt.format_time(self.finished_at or timefmt.now()),
            }
            if self.signal:
                terminated["signal"] = self.signal
            if self.message:
                terminated["message"] = self.message
            out["state"] = {"terminated": terminated}
        elif self.proc is not None:
            assert self.started_at is not None
            out["state"] = {"running": {"startedAt": timefmt.format_time(self.started_at)}}
        else:
            waiting: dict[str, Any] = {"reason": self.waiting_reason or "ContainerCreating"}
            if self.waiting_message:
                waiting["message"] = self.waiting_message
            out["state"] = {"waiting": waiting}
        return out


class LocalPod:
    """One pod on the node, as the runner tracks it."""

    def __init__(self, obj: dict[str, Any], pod_dir: Path) -> None:
        meta = obj["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.obj = obj
        self.dir = pod_dir
        self.root = pod_dir / "root"
        spec = obj.get("spec") or {}
        self.init = [
            Container(c["name"], c.get("image", ""), c, init=True)
            for c in spec.get("initContainers") or []
        ]
        self.main = [
            Container(c["name"], c.get("image", ""), c) for c in spec.get("containers") or []
        ]
        self.prepared = False
        self.retry_at = 0.0
        self.start_time: dt.datetime | None = None
        self.term_sent = False
        self.kill_at: float | None = None
        self.killed = False
        self.deleted = False
        self.lost = False
        self.reported: dict[str, Any] | None = None
        # Condition type -> (status, lastTransitionTime).
        self.transitions: dict[str, tuple[str, str]] = {}
        self.mapper = PathMapper(self.root, [])

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def containers(self) -> list[Container]:
        return [*self.init, *self.main]

    def running(self) -> list[Container]:
        return [c for c in self.containers() if c.state == "running"]

    def init_failed(self) -> bool:
        return any(c.exit_code not in (None, 0) for c in self.init)

    def finished(self) -> bool:
        if self.init_failed():
            return not self.running()
        return bool(self.main) and all(c.state == "terminated" for c in self.main)

    def phase(self) -> str:
        if self.lost:
            return "Failed"
        if self.finished():
            if self.init_failed() or any(c.exit_code != 0 for c in self.main):
                return "Failed"
            return "Succeeded"
        if any(c.state != "waiting" for c in self.main):
            return "Running"
        return "Pending"


# -- the runner ---------------------------------------------------------------------


def cri_line(stream: bytes, line: bytes) -> bytes:
    stamp = timefmt.format_micro_time(timefmt.now()).encode()
    return stamp + b" " + stream + b" F " + line + b"\n"


def pump(
    pipe: IO[bytes], stream: str, handle: IO[bytes], lock: threading.Lock, c: Container
) -> None:
    """Copy one pipe to the container log, a CRI line per output line."""
    name = stream.encode()
    try:
        for raw in iter(pipe.readline, b""):
            line = raw[:-1] if raw.endswith(b"\n") else raw
            with lock:
                if handle.closed:  # gave up waiting for this pipe (see DRAIN_SECONDS)
                    break
                handle.write(cri_line(name, line))
            with c._lock:
                c.tail.append(line.decode("utf-8", "replace"))
    finally:
        pipe.close()


def wait_for_exit(
    c: Container, readers: list[threading.Thread], handle: IO[bytes], lock: threading.Lock
) -> None:
    assert c.proc is not None
    c.proc.wait()
    c.finished_at = timefmt.now()
    for reader in readers:
        reader.join(DRAIN_SECONDS)
    with lock:
        handle.close()


def remember_family(c: Container, table: Mapping[int, tuple[int, str]]) -> None:
    """Add every live descendant of the container's main process to its family."""
    if c.proc is None or not table:
        return
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    stack = [c.proc.pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in c.family:
                c.family[child] = table[child][1]
            stack.append(child)


def memory_kib() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    return 8 * 1024 * 1024


# -- command line ----------------------------------------------------------------------
