"""The poller service as a guarded process, and what its log says (for bench_hostile.py).

A hostile log can take the poller to gigabytes, so the benchmark cannot just
start it and wait: `Guarded` polls the process's VmRSS and kills it above a
guard (first SIGABRT, so faulthandler writes what every thread was doing),
and restarts it the way kubelet restarts a crashed container, so the other
tenants' latency is measured through a crash loop too. The functions below
read the service's log: cycle durations and gaps, errors per job, and the
busy stacks at each guard kill.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import resource
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_cycle import log, summary

# The service is killed when its VmRSS passes this (--guard-mib): the
# machine's safety, well above the Deployment's limit so that today's peak shows.
GUARD_MIB = 1200
# Backstop if RSS grows faster than the guard polls. Address space, not RSS:
# the service's threads reserve malloc arenas and stacks they never touch
# (VmSize 1154 MiB at 649 MiB RSS, measured), so this sits far above the guard.
ADDRESS_SPACE_LIMIT = 6 * 1024**3
# Seconds the guard's SIGABRT gets (faulthandler's stack dump) before SIGKILL.
ABORT_GRACE = 3.0
GUARD_POLL = 0.1  # seconds between the guard's reads of /proc/PID/status
SAMPLE_EVERY = 0.5  # seconds between kept samples
# kubelet's CrashLoopBackOff: 10 s, doubled each restart, at most 5 min.
RESTART_BACKOFF = (10.0, 20.0, 40.0, 80.0, 160.0, 300.0)
CYCLE_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*cycle: .* in ([0-9.]+) s$", re.MULTILINE
)
# Threads whose innermost frame is here are waiting, not working.
IDLE_FILES = {"threading.py", "selectors.py", "socketserver.py", "queue.py", "thread.py"}
JOB_ERROR = re.compile(r"error handling LMEvalJob (\S+?): (.*)$", re.MULTILINE)
EXCEPTION_LINE = re.compile(r"^(\w+(?:Error|Exception)): ", re.MULTILINE)


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM, VmSize of `pid` in MiB (empty once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    found = re.findall(r"^(VmRSS|VmHWM|VmSize):\s+(\d+) kB", text, re.MULTILINE)
    return {key: int(value) / 1024 for key, value in found}


@dataclass
class Guarded:
    """The poller service as a process: guarded, sampled, restarted like a pod."""

    argv: list[str]
    log_path: Path
    cwd: Path
    guard_mib: float
    max_restarts: int
    proc: subprocess.Popen[bytes] | None = None
    samples: list[tuple[float, int, float, float]] = field(default_factory=list)
    ends: list[dict[str, Any]] = field(default_factory=list)  # one per process that ended
    starts: list[float] = field(default_factory=list)
    peak_size_mib: float = 0.0
    stopping: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def _spawn(self) -> None:
        with self.log_path.open("ab") as out:
            out.write(f"=== bench: start {len(self.starts) + 1} at {time.time():.3f}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                # The guard kills with SIGABRT first, so that faulthandler
                # writes every thread's stack to the log: what was growing.
                env={**os.environ, "PYTHONFAULTHANDLER": "1"},
            )
        # Set from here rather than in a preexec_fn (unsafe with threads); the
        # interpreter's start-up before this call is small.
        limit = (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT)
        with contextlib.suppress(ProcessLookupError):
            resource.prlimit(self.proc.pid, resource.RLIMIT_AS, limit)
            resource.prlimit(self.proc.pid, resource.RLIMIT_CORE, (0, 0))  # abort: no core
        self.starts.append(time.time())

    def start(self) -> None:
        self._spawn()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        last_sample = 0.0
        hwm = 0.0
        while not self.stopping.is_set():
            proc = self.proc
            assert proc is not None
            status = proc_status(proc.pid)
            now = time.time()
            rss = status.get("VmRSS", 0.0)
            hwm = max(hwm, status.get("VmHWM", 0.0))
            self.peak_size_mib = max(self.peak_size_mib, status.get("VmSize", 0.0))
            if now - last_sample >= SAMPLE_EVERY and status:
                self.samples.append((now, proc.pid, rss, hwm))
                last_sample = now
            killed = rss > self.guard_mib
            if killed:
                proc.send_signal(signal.SIGABRT)
                try:
                    proc.wait(timeout=ABORT_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if killed or proc.poll() is not None:
                code = proc.wait()
                self.ends.append(
                    {"at": now, "pid": proc.pid, "exit_code": code, "guard": killed, "vm_hwm": hwm}
                )
                log(f"  poller pid {proc.pid} ended ({'guard kill' if killed else code})")
                hwm = 0.0
                restarts = len(self.starts) - 1
                if restarts >= self.max_restarts:
                    return
                delay = RESTART_BACKOFF[min(restarts, len(RESTART_BACKOFF) - 1)]
                if self.stopping.wait(delay):
                    return
                self._spawn()
                continue
            self.stopping.wait(GUARD_POLL)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        hwm = proc_status(proc.pid).get("VmHWM", 0.0)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        self.ends.append(
            {"at": time.time(), "pid": proc.pid, "exit_code": proc.returncode, "guard": False,
             "vm_hwm": hwm, "stopped": True}
        )  # fmt: skip


def cycle_figures(text: str, begin: float, end: float) -> dict[str, Any]:
    """Cycle durations and the longest time without a completed cycle in [begin, end]."""
    durations, ends = [], [begin]
    for match in CYCLE_LINE.finditer(text):
        moment = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))
        at = moment + int(match.group(2)) / 1000
        if begin <= at <= end:
            durations.append(float(match.group(3)))
            ends.append(at)
    ends.append(end)
    return {
        "cycles": len(durations),
        "cycle": summary(durations),
        "longest_without_cycle": max(b - a for a, b in itertools.pairwise(ends)),
    }


def guard_stacks(text: str) -> list[list[str]]:
    """Per guard kill: each busy thread's innermost poller/driver frame (faulthandler)."""
    kills = []
    for dump in text.split("Fatal Python error: Aborted")[1:]:
        busy = []
        for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump):
            frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
            if not frames or Path(frames[0][0]).name in IDLE_FILES:
                continue
            ours = [f for f in frames if re.search(r"/(poller|driver)/", f[0])]
            where = ours[0] if ours else frames[0]
            inner = frames[0]
            text_ = f"{Path(where[0]).name}:{where[1]} {where[2]}"
            if inner is not where:
                text_ += f" (in {Path(inner[0]).name} {inner[2]})"
            busy.append(text_)
        kills.append(busy)
    return kills


def logged_errors(text: str) -> dict[str, Any]:
    """Per job: how many 'error handling' lines, and the first message; exception kinds."""
    per_job: dict[str, dict[str, Any]] = {}
    for match in JOB_ERROR.finditer(text):
        entry = per_job.setdefault(match.group(1), {"count": 0, "first": match.group(2)[:160]})
        entry["count"] += 1
    return {
        "per_job": per_job,
        "exceptions": dict(Counter(m.group(1) for m in EXCEPTION_LINE.finditer(text))),
        "cycle_failures": text.count("poll cycle failed"),
        "at_guard_kill": guard_stacks(text),
    }
