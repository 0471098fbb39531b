"""Progress and error-line extraction from lm_eval's stderr.

Why this module exists: lm_eval reports progress only through tqdm bars that
redraw in place with ``\\r`` and through its logging lines; it has no
machine-readable progress. The poller shows a percentage and the current phase
in the job's status, so the driver turns the newest bar into a ``progress``
marker, at most one per interval so that a fast-redrawing bar cannot flood the
log. When lm_eval fails, the most useful message for a human is the last
meaningful stderr line (usually the exception line at the end of a
traceback); :class:`ErrorLineTracker` keeps just enough of stderr to find it.

Standard library only, and cheap per line: the pump threads call into this
module for every chunk of child output.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from driver.protocol import ProgressFields

# Longer lines are never tqdm bars (a bar is ~100-200 characters); skipping
# them also keeps the regular expressions away from multi-megabyte input.
MAX_BAR_CHARS = 2000
MAX_MESSAGE_CHARS = 1000
MAX_PHASE_CHARS = 160

_SUFFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_NUM = r"[0-9]+(?:\.[0-9]+)?[kMGTP]?"
# "desc: 45%|####5     | 45/100 [00:01<00:02, 30.00it/s]" (desc optional)
_BAR_RE = re.compile(
    r"^(?:(?P<desc>.*?):\s*)?(?P<pct>\d{1,3})%\|[^|]*\|\s*"
    rf"(?P<n>{_NUM})/(?P<total>{_NUM}|\?)\s*"
    r"\[(?P<elapsed>[^<\]]*)<(?P<remaining>[^,\]]*)(?:,\s*(?P<rate>[^\]]*))?\]"
)
# A bar without a total: "Generating test split: 8 examples [00:00, 2920.32 examples/s]"
_COUNTER_RE = re.compile(
    rf"^(?:(?P<desc>.*?):\s*)?(?P<n>{_NUM})(?P<unit>[^\[\]\d]*?)\s*"
    r"\[(?P<elapsed>[0-9:d, ]+?),\s*(?P<rate>[^\]]*)\]$"
)
# lm_eval's logging format: "2026-11-29:22:45:41 INFO     [evaluator:589] Running ..."
_LOG_RE = re.compile(
    r"^\d{4}-\d{2}-\d{2}:\d{2}:\d{2}:\d{2}\s+(?P<level>[A-Z]+)\s+\[[^\]]*\]\s*(?P<msg>.*)$"
)
# The last line of a Python traceback: "ValueError: Tasks not found: x".
_EXCEPTION_RE = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure|Fault)\b(?::.*)?$"
)

# How lm_eval logs a caught exception after a warning: "OSError(36, '...')".
_EXCEPTION_REPR_RE = re.compile(r"^[A-Za-z_]\w*(?:Error|Exception)\(")


def parse_duration(text: str) -> float | None:
    """tqdm's ``[H:]MM:SS`` (optionally ``Nd, ``-prefixed) to seconds; ``?`` -> None."""
    text = text.strip()
    days = 0
    if "d" in text:
        head, _, text = text.partition("d")
        if not head.strip().isdigit():
            return None
        days = int(head)
        text = text.lstrip(", ")
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    seconds = 0
    for p in parts:
        seconds = seconds * 60 + int(p)
    return float(days * 86400 + seconds)


def _number(text: str) -> float:
    suffix = text[-1] if text[-1] in _SUFFIX else ""
    return float(text[: len(text) - len(suffix)]) * _SUFFIX[suffix]


def _compact(value: float) -> int | float:
    return int(value) if value.is_integer() else value


@dataclass(frozen=True)
class Progress:
    """One parsed tqdm redraw."""

    phase: str
    percent: float | None
    n: int | float
    total: int | float | None
    elapsed: float | None
    remaining: float | None
    rate: str | None

    def marker_fields(self, run_id: str, ts: float) -> ProgressFields:
        """The ``progress`` marker's payload for run `run_id` at time `ts`."""
        return {
            "run_id": run_id,
            "ts": ts,
            "phase": self.phase,
            "percent": self.percent,
            "n": self.n,
            "total": self.total,
            "elapsed": self.elapsed,
            "remaining": self.remaining,
            "rate": self.rate,
        }


def looks_like_bar(line: str) -> bool:
    """Cheap pre-check: every tqdm redraw ends with its rate and ``]``."""
    line = line.rstrip()
    return line.endswith("]") and ("/s]" in line or "s/it]" in line) and len(line) <= MAX_BAR_CHARS


def parse_tqdm(line: str, default_phase: str = "") -> Progress | None:
    """Parse one tqdm redraw; ``None`` for anything else.

    A bar without a description (lm_eval's own bars have none) takes
    ``default_phase``, the message of the latest lm_eval log line, such as
    "Running loglikelihood requests".
    """
    line = line.strip()
    if len(line) > MAX_BAR_CHARS or not line.endswith("]") or "[" not in line:
        return None
    match = _BAR_RE.match(line)
    if match is not None:
        n = _number(match["n"])
        total = None if match["total"] == "?" else _number(match["total"])
        if total:
            percent: float | None = round(min(100.0, 100.0 * n / total), 2)
        else:
            percent = float(match["pct"])
        return Progress(
            phase=_phase(match["desc"], default_phase),
            percent=percent,
            n=_compact(n),
            total=None if total is None else _compact(total),
            elapsed=parse_duration(match["elapsed"]),
            remaining=parse_duration(match["remaining"]),
            rate=(match["rate"] or "").strip() or None,
        )
    match = _COUNTER_RE.match(line)
    if match is not None:
        return Progress(
            phase=_phase(match["desc"], default_phase),
            percent=None,
            n=_compact(_number(match["n"])),
            total=None,
            elapsed=parse_duration(match["elapsed"]),
            remaining=None,
            rate=match["rate"].strip() or None,
        )
    return None


def _phase(desc: str | None, default: str) -> str:
    desc = (desc or "").strip()
    return (desc or default)[:MAX_PHASE_CHARS]


def log_message(line: str) -> tuple[str, str] | None:
    """``(level, message)`` of an lm_eval logging line, else ``None``."""
    if len(line) > MAX_BAR_CHARS:
        return None
    match = _LOG_RE.match(line)
    if match is None:
        return None
    return match["level"], match["msg"].strip()


class ProgressTracker:
    """Turns tqdm redraws into rate-limited ``progress`` events.

    The first bar is reported at once; after that at most one event per
    ``interval`` seconds, always the newest state. When the phase changes, the
    last unreported state of the previous phase (typically its 100%) is
    reported too, if at least ``min(1 s, interval)`` passed since the last
    event, so a child alternating phases cannot flood the log either.
    """

    def __init__(
        self,
        interval: float,
        emit: Callable[[Progress], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval = max(0.0, interval)
        self._emit = emit
        self._clock = clock
        self._phase_hint = ""
        self._pending: Progress | None = None
        self._pending_reported = True
        self._last_emit: float | None = None

    def feed_block(self, lines: list[str]) -> None:
        """Observe the segments of one chunk of output, oldest first.

        Only the newest bar of the chunk is parsed: within one chunk older
        redraws are superseded anyway, and a child flooding its output with
        redraws must not cost a regular-expression match per redraw. (lm_eval
        redraws a few times per second, so its chunks hold one bar each.)
        """
        newest = -1
        for i in range(len(lines) - 1, -1, -1):
            if looks_like_bar(lines[i]):
                newest = i
                break
        for i, line in enumerate(lines):
            if i == newest or (not looks_like_bar(line) and line[:1].isdigit()):
                self.feed(line)

    def feed(self, line: str) -> None:
        """Observe one stderr segment (a line, or a ``\\r``-terminated redraw)."""
        logged = log_message(line)
        if logged is not None:
            level, message = logged
            if level == "INFO" and message:
                self._phase_hint = message[:MAX_PHASE_CHARS]
            return
        progress = parse_tqdm(line, self._phase_hint)
        if progress is None:
            return
        now = self._clock()
        pending = self._pending
        if (
            pending is not None
            and not self._pending_reported
            and pending.phase != progress.phase
            and self._since_last(now) >= min(1.0, self._interval)
        ):
            self._report(pending, now)
        self._pending, self._pending_reported = progress, False
        if self._since_last(now) >= self._interval:
            self._report(progress, now)

    def flush(self) -> None:
        """Report the newest state if it was not reported yet (child exited)."""
        if self._pending is not None and not self._pending_reported:
            self._report(self._pending, self._clock())

    def _since_last(self, now: float) -> float:
        return float("inf") if self._last_emit is None else now - self._last_emit

    def _report(self, progress: Progress, now: float) -> None:
        self._last_emit = now
        if progress is self._pending:
            self._pending_reported = True
        self._emit(progress)


# What OpenSSL's verification failure says in every Python client's error.
TLS_VERIFY_FAILED = "CERTIFICATE_VERIFY_FAILED"


class ErrorLineTracker:
    """Remembers the tail of a stream to name the last meaningful error line."""

    def __init__(self, keep: int = 200) -> None:
        self._lines: deque[str] = deque(maxlen=keep)
        self._keep_per_block = min(keep, 32)

    def feed_block(self, lines: list[str]) -> None:
        """Observe the segments of one chunk, oldest first (keeps its last lines)."""
        kept: list[str] = []
        for line in reversed(lines):
            if len(kept) == self._keep_per_block:
                break
            stripped = line.strip()
            if stripped and not looks_like_bar(stripped):
                kept.append(stripped[:MAX_MESSAGE_CHARS])
        self._lines.extend(reversed(kept))

    def feed(self, line: str) -> None:
        """Observe one segment; blank lines and progress bars are not kept."""
        self.feed_block([line])

    def best(self) -> str | None:
        """The line a human most wants to see about why the child failed.

        In order of preference: the last exception line of a traceback, the
        last ERROR/CRITICAL log line, the last WARNING log line, the last line.
        """
        lines = list(self._lines)
        for index in range(len(lines) - 1, -1, -1):
            line = lines[index]
            if _EXCEPTION_RE.match(line):
                if line.endswith(":") and index + 1 < len(lines):
                    # An exception whose message is on later lines (numpy's
                    # ImportError ends its advice with "Original error was:
                    # libstdc++.so.6: cannot open ..."): name the last of them.
                    return f"{line} {lines[-1]}"[:MAX_MESSAGE_CHARS]
                return line
        for wanted in (("ERROR", "CRITICAL"), ("WARNING",)):
            for line in reversed(lines):
                logged = log_message(line)
                if logged is not None and logged[0] in wanted:
                    return line
        return lines[-1] if lines else None

    def tls_failure(self) -> str | None:
        """The last line that reports a failed certificate verification (OpenSSL's
        CERTIFICATE_VERIFY_FAILED, through requests or aiohttp), or None."""
        for line in reversed(self._lines):
            if TLS_VERIFY_FAILED in line:
                return line
        return None

    def last_warning(self) -> str | None:
        """The last WARNING/ERROR log message (for "exited 0 but wrote nothing").

        lm_eval logs the cause of a failed save on the next line, as the repr
        of the exception ("OSError(36, 'File name too long')"): it is appended.
        """
        lines = list(self._lines)
        for i in range(len(lines) - 1, -1, -1):
            logged = log_message(lines[i])
            if logged is None or logged[0] not in ("WARNING", "ERROR", "CRITICAL"):
                continue
            message = logged[1]
            following = log_message(lines[i + 1]) if i + 1 < len(lines) else None
            if following is not None and _EXCEPTION_REPR_RE.match(following[1]):
                message = f"{message}: {following[1]}"
            return message[:MAX_MESSAGE_CHARS]
        return None
