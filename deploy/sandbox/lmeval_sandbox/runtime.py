"""The container runtime's part of the sandbox runner: processes in, exit codes out.

On a real node the kubelet decides and the container runtime acts: it starts
a container's process, writes its output to the log file, turns its exit
into a terminated state, and kills what is left when asked. The runner
(runner.py) is the kubelet here and this module its runtime, with local
processes for containers; kept apart, the runner's loop reads as decisions
and this module as process handling. It never touches the API. The process plumbing it builds on
(output pumps, /proc liveness, process families) is in localproc.py; the path
and argv rules are in podfs.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path

import driver
from driver import protocol
from lmeval_sandbox.localproc import (
    Container,
    LocalPod,
    alive,
    cri_line,
    die_with_parent,
    pump,
    remember_family,
    wait_for_exit,
)
from lmeval_sandbox.podfs import expand_vars, local_argv, termination_message
from poller import timefmt

__all__ = ["START_ERROR_CODE", "collect", "kill", "start", "start_failed", "terminate"]

log = logging.getLogger(__name__)

# A start error as containerd reports it.
START_ERROR_CODE = 128
# The image's driver is this checkout's: the interpreter's own install of the
# package (an editable one may point at another clone) must not win over it.
DRIVER_SOURCE = str(Path(driver.__file__).resolve().parents[1])


# The kubelet's bound on the termination message file it reads back.
TERMINATION_FILE_BYTES = 4096


def termination_log(pod: LocalPod, c: Container) -> Path:
    """Container `c`'s termination message file (its terminationMessagePath, locally)."""
    return pod.root / f"{c.name}.termination-log"


def start(pod: LocalPod, c: Container, env: Mapping[str, str], python: str) -> None:
    """Start container `c` as a process in its own session, its output to its log file.

    `env` is the container's own environment; `python` plays the image's interpreter.
    """
    words = [expand_vars(w, env) for w in [*c.spec.get("command", []), *c.spec.get("args", [])]]
    argv = local_argv(words, pod.mapper, python)
    base = {
        "PATH": os.pathsep.join([os.path.dirname(python), os.environ.get("PATH", "/usr/bin:/bin")]),
        "HOSTNAME": pod.name,
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TMPDIR": str(pod.root / "tmp"),
        # The "image" is this process's Python: this checkout's driver first,
        # then whatever the test process has on its path (e.g. an opt-in torch).
        "PYTHONPATH": os.pathsep.join(filter(None, [DRIVER_SOURCE, os.environ.get("PYTHONPATH")])),
        # The kubelet mounts a file at the container's terminationMessagePath
        # (/dev/termination-log); a local process gets its own file instead.
        protocol.ENV_TERMINATION_LOG: str(termination_log(pod, c)),
    }
    if os.environ.get("PYTHONPATH"):
        # The image's code is this process's code: a source tree on
        # PYTHONPATH (a work tree beside an installed checkout) wins in both.
        base["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env = {**base, **env}
    cwd = pod.mapper.local(c.spec.get("workingDir") or "/")
    if cwd == "/":
        cwd = str(pod.root)
    Path(cwd).mkdir(parents=True, exist_ok=True)
    assert c.log_path is not None
    c.started_at = timefmt.now()
    if not c.spec.get("command"):
        start_failed(
            c,
            "the sandbox runner cannot run an image's entrypoint: the container needs a command",
        )
        return
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    except OSError as error:
        start_failed(c, f"failed to start container process: {error}")
        return
    c.proc = proc
    log.info("pod %s: container %s runs as pid %d: %s", pod.key, c.name, proc.pid, argv)
    handle = c.log_path.open("ab", buffering=0)
    lock = threading.Lock()
    assert proc.stdout is not None and proc.stderr is not None
    readers = [
        threading.Thread(target=pump, args=(proc.stdout, "stdout", handle, lock, c), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, "stderr", handle, lock, c), daemon=True),
    ]
    c.readers = readers
    for reader in readers:
        reader.start()
    threading.Thread(target=wait_for_exit, args=(c, readers, handle, lock), daemon=True).start()


def start_failed(c: Container, message: str) -> None:
    """Terminate `c` as containerd reports a failed start (128, StartError), and log why."""
    c.exit_code, c.reason, c.message = START_ERROR_CODE, "StartError", message
    c.finished_at = timefmt.now()
    if c.log_path is not None:
        with c.log_path.open("ab") as handle:
            handle.write(cri_line(b"stderr", message.encode()))


def collect(pod: LocalPod, table: dict[int, tuple[int, str]]) -> None:
    """Turn exited processes into terminated container states."""
    for c in pod.containers():
        if c.exit_code is not None or c.proc is None or c.proc.poll() is None:
            continue
        if not c.orphans_killed:
            # As when a container's PID 1 exits: nothing it started survives
            # (and nothing keeps its output pipes open).
            c.orphans_killed = True
            remember_family(c, table)
            for pid, start in c.family.items():
                if alive(pid, start):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
        if not c.drained():
            continue
        code = c.proc.returncode
        assert code is not None
        if code < 0:
            c.signal = -code
            c.exit_code = 128 - code
        else:
            c.exit_code = code
        c.reason = "Completed" if c.exit_code == 0 else "Error"
        policy = c.spec.get("terminationMessagePolicy")
        written = termination_log(pod, c)
        said = written.read_bytes()[-TERMINATION_FILE_BYTES:] if written.is_file() else b""
        if said.strip():
            # As the kubelet: the file's words win over the log's.
            c.message = said.decode("utf-8", "replace")
        elif c.exit_code != 0 and policy == "FallbackToLogsOnError":
            with c._lock:
                c.message = termination_message(c.tail)
        log.info("pod %s: container %s exited with %d", pod.key, c.name, c.exit_code)


def kill(pod: LocalPod, table: dict[int, tuple[int, str]]) -> None:
    """SIGKILL every process of the pod, as removing its cgroup would."""
    pod.killed = True
    for c in pod.containers():
        if c.proc is None:
            continue
        remember_family(c, table)
        victims = {c.proc.pid: None, **c.family}
        for pid, start in victims.items():
            if pid == c.proc.pid and c.proc.poll() is not None:
                continue
            if pid != c.proc.pid and not alive(pid, start):
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def terminate(pod: LocalPod) -> None:
    """SIGTERM to the main process of each running container (it owns the orderly shutdown)."""
    for c in pod.running():
        assert c.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(c.proc.pid, signal.SIGTERM)
