"""The child process and the plumbing that forwards its output.

Why this module exists: lm_eval must never block on a full pipe, its output
must reach the pod log intact (in order, per stream) yet defused, and the
driver's own markers must never land in the middle of a forwarded line. This
module owns those mechanics:

* :class:`Child` starts the command in its own process group (so a signal or
  a kill reaches every process lm_eval spawned), observes its exit *without
  reaping it* (so the group id cannot be recycled before the group is killed)
  and never lets it outlive the driver.
* :class:`Pump` threads read each pipe in 64 KiB chunks and split on ``\\n``
  and ``\\r`` (tqdm redraws end in ``\\r``), byte-oriented so that
  multi-megabyte lines, invalid UTF-8 and a missing final newline all pass.
* :class:`Sink` serialises every write to stdout, stderr and the optional log
  copy behind one lock, and starts a marker on a fresh line when the previous
  forwarded segment ended in ``\\r``.

Only light standard-library modules are imported here: this runs before the
child starts.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import BinaryIO

from driver.contract import DRIVER_PROGRAM

READ_CHUNK = 1 << 16
# A line longer than this is forwarded in pieces (each piece becomes a line).
# Several MB is legal child output; unbounded buffering is not.
MAX_FORWARD_LINE = 8 * 1024 * 1024
# Only the end of each chunk is decoded for progress and error tracking: the
# newest redraw is what matters, and it bounds the per-chunk work.
OBSERVE_TAIL = 4 * 1024
OBSERVE_SEGMENTS = 64

_SEGMENT_RE = re.compile(r"([\r\n])")
_SEGMENT_SPLIT_RE = re.compile(r"[\r\n]+")

Neutralizer = Callable[[str], str]
# Observers get the segments of one block, oldest first.
Observer = Callable[[list[str]], None]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def sanitize_block(block: bytes, neutralize: Neutralizer) -> bytes:
    """Neutralise every segment of a block of complete segments; valid UTF-8 out.

    The fast path (plain ASCII without anything that could need defusing)
    returns the block untouched; that is nearly all of lm_eval's output.
    """
    if block.isascii() and b"lmeval" not in block and b" std" not in block:
        return block
    text = block.decode("utf-8", "replace")
    if "lmeval" not in text and " std" not in text:
        return text.encode("utf-8")
    parts = _SEGMENT_RE.split(text)
    parts[0::2] = [neutralize(segment) for segment in parts[0::2]]
    return "".join(parts).encode("utf-8")


def _utf8_safe_cut(data: bytes) -> int:
    """Index at which to split ``data`` without cutting a UTF-8 sequence."""
    cut = len(data)
    for back in range(1, 4):
        if cut - back < 0:
            break
        byte = data[cut - back]
        if byte & 0xC0 != 0x80:  # not a continuation byte
            return cut - back if byte >= 0xC0 else cut
    return cut


class Sink:
    """The driver's outputs: stdout, stderr and an optional log copy."""

    def __init__(
        self,
        stdout_fd: int = 1,
        stderr_fd: int = 2,
        log_copy: BinaryIO | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self._fds = {"stdout": stdout_fd, "stderr": stderr_fd}
        self._open_line = {"stdout": False, "stderr": False}
        self._dead: set[str] = set()
        self._copy = log_copy
        self._copy_open_line = False
        self._copy_source = ""

    def forward(self, stream: str, data: bytes) -> None:
        """Write complete, already neutralised child segments to ``stream``."""
        if not data:
            return
        with self.lock:
            self._write(stream, data, fresh_line=False)
            self._copy_write(stream, data)

    def marker(self, line: str) -> None:
        """Write one marker line on stdout, always starting at column 0."""
        data = line.encode("utf-8") + b"\n"
        with self.lock:
            self._write("stdout", data, fresh_line=True)
            self._copy_write("marker", data)

    def note(self, text: str) -> None:
        """A diagnostic of the driver itself, on stderr (never a marker)."""
        # Notes may quote child text: one line, and never a marker prefix in it.
        text = text.replace("\r", " ").replace("\n", " ").replace("lmeval::", "lmeval ::")
        data = (f"{DRIVER_PROGRAM}: {text}").encode("utf-8", "replace") + b"\n"
        with self.lock:
            self._write("stderr", data, fresh_line=True)
            self._copy_write("note", data)

    def _write(self, stream: str, data: bytes, fresh_line: bool) -> None:
        if stream in self._dead:
            return
        if fresh_line and self._open_line[stream]:
            # A marker after a "\r"-terminated redraw: put it on its own line.
            data = b"\n" + data
        try:
            _write_all(self._fds[stream], data)
        except OSError:
            # The reader went away (EPIPE); keep draining the child anyway.
            self._dead.add(stream)
            return
        self._open_line[stream] = not data.endswith(b"\n")

    def _copy_write(self, source: str, data: bytes) -> None:
        if self._copy is None:
            return
        if self._copy_open_line and source != self._copy_source:
            data = b"\n" + data
        try:
            self._copy.write(data)
            self._copy.flush()
        except (OSError, ValueError):
            self._copy = None
            return
        self._copy_open_line = not data.endswith(b"\n")
        self._copy_source = source


class Pump(threading.Thread):
    """Drains one pipe of the child into the sink, segment-aware."""

    def __init__(
        self,
        fd: int,
        stream: str,
        sink: Sink,
        neutralize: Neutralizer,
        observers: Sequence[Observer] = (),
    ) -> None:
        super().__init__(name=f"pump-{stream}", daemon=True)
        self._fd = fd
        self._stream = stream
        self._sink = sink
        self._neutralize = neutralize
        self._observers = tuple(observers)
        self.bytes_read = 0

    def run(self) -> None:
        try:
            self._pump()
        except Exception as exc:  # a bug here must never block the child on a full pipe
            self._sink.note(f"{self.name} failed ({exc!r}); draining the rest unforwarded")
            with contextlib.suppress(OSError):
                while os.read(self._fd, READ_CHUNK):
                    pass

    def _pump(self) -> None:
        pending: list[bytes] = []
        pending_len = 0
        while True:
            try:
                data = os.read(self._fd, READ_CHUNK)
            except OSError:
                break
            if not data:
                break
            self.bytes_read += len(data)
            cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
            if cut < 0:
                pending.append(data)
                pending_len += len(data)
                if pending_len >= MAX_FORWARD_LINE:
                    joined = b"".join(pending)
                    at = _utf8_safe_cut(joined)
                    self._emit(joined[:at] + b"\n")
                    rest = joined[at:]
                    pending, pending_len = ([rest], len(rest)) if rest else ([], 0)
                continue
            head = data[: cut + 1]
            block = b"".join([*pending, head]) if pending else head
            rest = data[cut + 1 :]
            pending, pending_len = ([rest], len(rest)) if rest else ([], 0)
            self._emit(block)
        if pending:
            # No final newline: forward what there is, terminated, so the
            # driver's next marker still starts at column 0.
            self._emit(b"".join(pending) + b"\n")

    def _emit(self, block: bytes) -> None:
        clean = sanitize_block(block, self._neutralize)
        self._sink.forward(self._stream, clean)
        if self._observers:
            try:
                self._observe(clean)
            except Exception as exc:  # progress parsing is best effort, forwarding is not
                self._observers = ()
                self._sink.note(f"{self.name}: output observers disabled after {exc!r}")

    def _observe(self, block: bytes) -> None:
        tail = block[-OBSERVE_TAIL:]
        segments = _SEGMENT_SPLIT_RE.split(tail.decode("utf-8", "replace"))
        if len(tail) < len(block):
            segments = segments[1:]  # the first may be cut
        kept = [s for s in segments if s and not s.isspace()][-OBSERVE_SEGMENTS:]
        if kept:
            for observer in self._observers:
                observer(kept)


def _parent_death_signal() -> Callable[[], None] | None:
    """A pre-exec hook that makes the kernel SIGKILL the child if we die.

    This covers the one exit path no ``finally`` can: the driver itself being
    SIGKILLed. Resolved before the fork, so the hook only calls into libc.
    """
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return hook


class Child:
    """The evaluated command, in its own process group."""

    def __init__(
        self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None
    ) -> None:
        self.argv = list(argv)
        self._env = env
        self._cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._pidfd = -1
        self._reaped = False
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        """Spawn the command; raises ``OSError`` when it cannot be executed."""
        self.proc = subprocess.Popen(  # argv list, never a shell
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_parent_death_signal(),  # no threads exist yet
            env=self._env,
            cwd=self._cwd,
        )
        try:
            self._pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self._pidfd = -1

    def stdout_fd(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def stderr_fd(self) -> int:
        assert self.proc is not None and self.proc.stderr is not None
        return self.proc.stderr.fileno()

    def kill_group(self, sig: int) -> None:
        """Signal the whole process group; a vanished group is not an error."""
        if self.proc is None or self._reaped:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the leader to exit, leaving it unreaped."""
        assert self.proc is not None
        if self._reaped or self._exited():
            return True
        if self._pidfd >= 0:
            ready, _, _ = select.select([self._pidfd], [], [], max(0.0, timeout))
            return bool(ready) and self._exited()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            if self._exited():
                return True
        return False

    def _exited(self) -> bool:
        assert self.proc is not None
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def reap(self) -> int:
        """Kill what is left of the group, then collect the exit status.

        The leader is a zombie until reaped, which keeps its pid (and so the
        group id) from being reused: the SIGKILL can only hit our processes.
        """
        assert self.proc is not None
        if not self._reaped:
            self.kill_group(signal.SIGKILL)
            self.returncode = self.proc.wait()
            self._reaped = True
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1
        assert self.returncode is not None
        return self.returncode

    def cleanup(self) -> None:
        """Last-resort path (driver exception): kill the group and reap."""
        if self.proc is None or self._reaped:
            return
        self.kill_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return
        self._reaped = True
