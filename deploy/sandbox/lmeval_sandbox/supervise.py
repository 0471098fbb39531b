"""Child processes of the sandbox: started with their logs, waited on, stopped by PID.

The control plane (`lmeval_sandbox.controlplane`), the real node
(`lmeval_sandbox.realnode`) and Prometheus (`lmeval_sandbox.prometheus`) all
run long-lived binaries the same way: one log file per process in a logs
directory, a session of their own, killed with their parent unless asked to
outlive it, readiness polled with a deadline while watching that none of
them died, and stopped by PID (also from another process, via the PIDs a
state file kept). This module is that one way, so a fix to any of it (a
zombie that must count as dead, a probe that must not go through a proxy)
reaches every part.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

__all__ = ["Supervisor", "die_with_parent", "http_ok", "terminate"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Runs in the child between fork and exec: it dies with the process that started it.

    If the test process dies, so does the component, instead of lingering on
    its ports. SIGKILL, not SIGTERM: a kube-apiserver whose etcd died with
    it hangs in its graceful shutdown (seen orphaned after a killed
    benchmark), and nothing here needs flushing. `terminate` still asks
    nicely first.
    """
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def http_ok(
    url: str,
    context: ssl.SSLContext | None = None,
    accept: Callable[[bytes], bool] = lambda _: True,
) -> bool:
    """Whether `url` answers 2xx with a body `accept` likes; never through a proxy
    (every probe here is on loopback or the node's own bridge)."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=2) as response:
            return bool(accept(response.read()))
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the parenthesised command name, which may hold spaces.
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def terminate(pid: int, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; reaps it if it is our child."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if _is_zombie(pid):
            return  # dead, waiting for a parent (or init) to reap it
        try:
            # Reap it if it is our child; harmless otherwise.
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class Supervisor:
    """The named processes of one part, their logs in `logs_dir`.

    `error` builds the exception a failed wait raises (the part's own type,
    so callers catch `ControlPlaneError` or `RealNodeError` as before).
    """

    def __init__(
        self,
        workdir: Path,
        logs_dir: Path,
        *,
        die_with_parent: bool,
        error: Callable[[str], Exception],
    ) -> None:
        self.workdir = workdir
        self.logs_dir = logs_dir
        self.die_with_parent = die_with_parent
        self.error = error
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start `name` with its output appended to ``logs_dir/<name>.log``."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with (self.logs_dir / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                start_new_session=True,
                preexec_fn=die_with_parent if self.die_with_parent else None,
            )
        self.processes[name] = process
        return process

    def pids(self) -> dict[str, int]:
        return {name: process.pid for name, process in self.processes.items()}

    def running(self) -> dict[str, bool]:
        """Which processes are alive, by name."""
        return {name: process.poll() is None for name, process in self.processes.items()}

    def wait_until(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        """Poll `ready` (backing off to 0.5 s) until it holds; fail at once if any
        process died, and after `timeout`, with the log tail of the one to blame."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while time.monotonic() < deadline:
            for component, process in self.processes.items():
                if process.poll() is not None:
                    raise self.error(
                        f"{component} exited with code {process.returncode} while waiting for "
                        f"{name}\n{self.log_tail(component)}"
                    )
            if ready():
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        raise self.error(f"{name} not ready after {timeout:.0f} s\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The last lines of a process's log, for error messages."""
        path = self.logs_dir / f"{name}.log"
        if not path.exists():
            return f"(no log at {path})"
        text = path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last {len(text)} lines of {path} ---\n" + "\n".join(text)

    def reap(self) -> None:
        """Wait for (else kill) the processes this object started, once terminated."""
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        self.processes.clear()
