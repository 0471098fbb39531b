"""The ``::lmeval::`` marker protocol between the in-pod driver and the poller.

Why this module exists: the job pod has no API rights, so the pod log is the
only channel from a running evaluation to the poller. The log is shared with
untrusted text (dataset prompts, model answers, a model server's error
bodies), so the channel needs three properties that this module provides on
both ends:

* **Unforgeable.** Only the driver writes lines that start with
  :data:`MARKER_PREFIX`; every forwarded child line goes through
  :func:`neutralize`, which removes the prefix from anywhere in the line and
  defuses lines that could be mistaken for container-runtime (CRI) log lines.
* **Survives a cut log.** The poller reads a bounded ``tail_lines`` window, so
  results travel as self-describing chunks (sequence number, total, sha256 of
  the uncompressed bytes) and the decoder says precisely why results are
  missing instead of returning partial garbage.
* **Bounded.** The decoder keeps at most a fixed amount of memory whatever it
  is fed: over-long lines are skipped and the results are capped.

The module is standard-library only; the driver imports it lazily (after the
child has started, since ``dataclasses`` costs ~10 ms to import) and the
poller imports it to parse logs.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import re
import signal
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

MARKER_PREFIX = "::lmeval::"
PROTOCOL_VERSION = 1

# Exit codes of the driver. A child that exits with N != 0 makes the driver
# exit N; a child killed by signal S makes it exit 128 + S (the shell
# convention, so an OOM kill shows as 137 whichever process was killed).
EXIT_OK = 0
EXIT_NO_RESULTS = 70
EXIT_CANCELLED = 71
EXIT_DRIVER_ERROR = 72

EVENT_STARTED = "started"
EVENT_PROGRESS = "progress"
EVENT_RESULTS = "results"
EVENT_COMPLETED = "completed"
EVENT_FAILED = "failed"
EVENT_CANCELLED = "cancelled"
FINAL_EVENTS = frozenset({EVENT_COMPLETED, EVENT_FAILED, EVENT_CANCELLED})
KNOWN_EVENTS = frozenset({EVENT_STARTED, EVENT_PROGRESS, EVENT_RESULTS}) | FINAL_EVENTS

# Base64 characters per results marker. The marker line stays near 32 KiB,
# well under the 64 KiB that some log shippers cap lines at; the container
# runtime splits lines at 16 KiB anyway and the decoder re-joins them.
RESULTS_CHUNK_CHARS = 32_000
RESULTS_ENCODING = "zlib+base64"
# Upper bound of the results the decoder accepts (uncompressed, and also the
# encoded text it buffers). A real results file is a few KB to a few MB.
MAX_RESULTS_BYTES = 64 * 1024 * 1024
# Lines longer than this are never markers; the decoder skips them unread.
MAX_LINE_CHARS = 1024 * 1024
# Events kept by the decoder: progress events beyond this are dropped oldest
# first so that a week-long run's log cannot grow the decoder without bound.
MAX_EVENTS = 10_000

# One line of the container runtime's log format, as kubelet writes it to
# /var/log/pods and as kwok serves it:  <RFC3339Nano> <stream> <P|F>[:tags] <text>
CRI_LINE_RE = re.compile(
    r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})) "
    r"(stdout|stderr) ([PF])(?::\S*)? ?"
)
# Every "lmeval" that sits between two "::" is spaced out. Look-arounds do not
# consume, so overlapping forgeries such as "::lmeval::lmeval::" are all
# handled in one pass and no new prefix can appear (only spaces are added).
_PREFIX_CORE_RE = re.compile(r"(?<=::)lmeval(?=::)")
_NEUTRAL_CORE = " lmeval "


def encode_marker(event: str, **fields: Any) -> str:
    """Return one marker line (without newline) for ``event`` with ``fields``.

    ``ensure_ascii`` keeps the line free of every character that any reader
    might treat as a line break (U+2028, NEL, ...), so a marker is always one
    line whatever the field values contain.
    """
    if event not in KNOWN_EVENTS:
        raise ValueError(f"unknown marker event {event!r}")
    body = {"v": PROTOCOL_VERSION, "event": event, **fields}
    return MARKER_PREFIX + json.dumps(body, ensure_ascii=True, separators=(",", ":"))


def neutralize(line: str) -> str:
    """Make an untrusted line impossible to read as a marker, keeping it legible.

    ``::lmeval::`` anywhere becomes ``:: lmeval ::`` (anywhere, not only at
    column 0, because a reader may split lines on characters the driver does
    not, such as form feed or U+2028). A line that looks like a CRI log line
    gets a leading space, so a forged "partial line" cannot be glued onto the
    next one by a decoder reading a kubelet log file.
    """
    if "lmeval" in line:
        line = _PREFIX_CORE_RE.sub(_NEUTRAL_CORE, line)
    if CRI_LINE_RE.match(line):
        line = " " + line
    return line


def encode_results(results_json: bytes, run_id: str) -> list[str]:
    """Encode a results file as ``results`` marker lines (zlib, base64, chunked)."""
    digest = hashlib.sha256(results_json).hexdigest()
    text = base64.b64encode(zlib.compress(results_json, 6)).decode("ascii")
    pieces = [text[i : i + RESULTS_CHUNK_CHARS] for i in range(0, len(text), RESULTS_CHUNK_CHARS)]
    common = {"run_id": run_id, "total": len(pieces), "sha256": digest}
    common.update(size=len(results_json), encoding=RESULTS_ENCODING)
    return [
        encode_marker(EVENT_RESULTS, seq=seq, **common, data=piece)
        for seq, piece in enumerate(pieces, start=1)
    ]


def signal_name(signum: int) -> str:
    """``9`` -> ``"SIGKILL"``; unknown numbers get a generic name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit_code(code: int) -> str:
    """Explain a driver exit code, e.g. from the main container's terminated state."""
    fixed = {
        EXIT_OK: "completed",
        EXIT_NO_RESULTS: "lm_eval exited 0 but wrote no results file",
        EXIT_CANCELLED: "cancelled",
        EXIT_DRIVER_ERROR: "driver error",
    }
    if code in fixed:
        return fixed[code]
    if 128 < code < 128 + 65:
        return f"killed by signal {code - 128} ({signal_name(code - 128)})"
    return f"lm_eval exited with code {code}"


@dataclass(frozen=True)
class Outcome:
    """The final marker of a run: what happened and the driver's exit code."""

    event: str  # "completed" | "failed" | "cancelled"
    exit_code: int | None
    signal: int | None
    message: str
    results_path: str | None


@dataclass(frozen=True)
class DecodedLog:
    """Everything the markers in a log say, as the poller consumes it."""

    events: list[dict[str, Any]]
    results: dict[str, Any] | None
    results_error: str | None
    outcome: Outcome | None
    last_progress: dict[str, Any] | None
    started: dict[str, Any] | None
    dropped_events: int = 0

    def to_json(self) -> dict[str, Any]:
        """The shape printed by ``lmeval-driver decode``."""
        outcome = None if self.outcome is None else dataclasses.asdict(self.outcome)
        return {
            "events": self.events,
            "results": self.results,
            "results_error": self.results_error,
            "outcome": outcome,
            "last_progress": self.last_progress,
            "started": self.started,
            "dropped_events": self.dropped_events,
        }


@dataclass
class _ResultsSet:
    """Chunks of one results file, identified by (run_id, sha256, total, size)."""

    key: tuple[str, str, int, int]
    chunks: dict[int, str] = field(default_factory=dict)
    encoded_chars: int = 0
    error: str | None = None

    @property
    def total(self) -> int:
        return self.key[2]


def _int_or_none(value: Any) -> int | None:
    # bool is an int subclass in Python; a JSON true is not an exit code.
    return value if type(value) is int else None


def _describe_missing(seen: Iterable[int], total: int) -> str:
    have = set(seen)
    count = f"({len(have)} of {total} chunks seen)"
    if 1 not in have:
        return f"log starts after the first results chunk {count}"
    if total not in have:
        return f"log ends before the last results chunk {count}"
    missing = sorted(set(range(1, total + 1)) - have)
    shown = ", ".join(str(m) for m in missing[:5]) + (", ..." if len(missing) > 5 else "")
    return f"results chunks missing: {shown} {count}"


class LogDecoder:
    """Streaming parser of a pod log (plain text or CRI format) into markers.

    Feed it lines in order with :meth:`feed_line`; call :meth:`result` at any
    time. Lines that are not well-formed markers are ignored, so garbage,
    forwarded child output and a log cut anywhere are all harmless.
    """

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._dropped = 0
        self._progress_in_events = 0
        self._started: dict[str, Any] | None = None
        self._last_progress: dict[str, Any] | None = None
        self._final: dict[str, Any] | None = None
        self._results_set: _ResultsSet | None = None
        # Partial (runtime-split) stdout line of a CRI log; None when there is
        # none, "" parts are legal. Over-long partials are dropped whole.
        self._partial: list[str] | None = None
        self._partial_len = 0
        self._partial_overflow = False

    # -- input -------------------------------------------------------------

    def feed_line(self, line: str) -> None:
        """Consume one log line (a trailing ``\\r``/``\\n`` is ignored)."""
        if len(line) > MAX_LINE_CHARS + 2:
            # Too long to be a marker; it also ends any CRI partial sequence.
            self._reset_partial()
            return
        line = line.rstrip("\r\n")
        match = CRI_LINE_RE.match(line)
        if match is None:
            self._reset_partial()
            self._handle_text(line)
            return
        stream, tag = match.group(2), match.group(3)
        if stream != "stdout":
            # The driver writes markers to stdout only; stderr partials are
            # independent of stdout ones in the runtime's format.
            return
        text = line[match.end() :]
        if tag == "P":
            if self._partial is None:
                self._partial, self._partial_len, self._partial_overflow = [], 0, False
            self._partial_len += len(text)
            if self._partial_len > MAX_LINE_CHARS:
                self._partial_overflow = True
                self._partial.clear()
            elif not self._partial_overflow:
                self._partial.append(text)
            return
        if self._partial is not None:
            overflow = self._partial_overflow or self._partial_len + len(text) > MAX_LINE_CHARS
            joined = "".join(self._partial) + text if not overflow else ""
            self._reset_partial()
            if not overflow:
                self._handle_text(joined)
            return
        self._handle_text(text)

    def _reset_partial(self) -> None:
        self._partial, self._partial_len, self._partial_overflow = None, 0, False

    def _handle_text(self, text: str) -> None:
        if not text.startswith(MARKER_PREFIX):
            return
        try:
            body = json.loads(text[len(MARKER_PREFIX) :])
        except ValueError:
            return
        if not isinstance(body, dict):
            return
        version, event = body.get("v"), body.get("event")
        if type(version) is not int or version != PROTOCOL_VERSION or event not in KNOWN_EVENTS:
            return
        if event == EVENT_RESULTS:
            self._add_chunk(body)
            return
        self._append_event(body)
        if event == EVENT_STARTED:
            self._started = body
        elif event == EVENT_PROGRESS:
            self._last_progress = body
        else:
            self._final = body

    def _append_event(self, body: dict[str, Any]) -> None:
        self._events.append(body)
        if body["event"] == EVENT_PROGRESS:
            self._progress_in_events += 1
        if len(self._events) > 2 * MAX_EVENTS:
            self._compact_events()

    def _compact_events(self) -> None:
        # Keep every non-progress event and the newest progress events so the
        # list is back to MAX_EVENTS; amortised O(1) per event.
        excess = len(self._events) - MAX_EVENTS
        kept: list[dict[str, Any]] = []
        for ev in self._events:
            if excess > 0 and ev["event"] == EVENT_PROGRESS:
                excess -= 1
                self._dropped += 1
                self._progress_in_events -= 1
                continue
            kept.append(ev)
        self._events = kept

    def _add_chunk(self, body: dict[str, Any]) -> None:
        run_id, digest, data = body.get("run_id"), body.get("sha256"), body.get("data")
        seq, total, size = (_int_or_none(body.get(k)) for k in ("seq", "total", "size"))
        if not (isinstance(run_id, str) and isinstance(digest, str) and isinstance(data, str)):
            return
        if seq is None or total is None or size is None or not 1 <= seq <= total:
            return
        if body.get("encoding") != RESULTS_ENCODING:
            return
        key = (run_id, digest, total, size)
        current = self._results_set
        if current is None or current.key != key:
            # A new results set replaces the previous one: the newest results
            # in a log win, never an older complete set (that would be stale).
            current = self._results_set = _ResultsSet(key)
        if current.error is not None:
            return
        if size > MAX_RESULTS_BYTES:
            current.error = f"results of {size} bytes exceed the {MAX_RESULTS_BYTES} byte limit"
            current.chunks.clear()
            return
        previous = current.chunks.get(seq)
        current.encoded_chars += len(data) - (len(previous) if previous is not None else 0)
        if current.encoded_chars > MAX_RESULTS_BYTES:
            current.error = f"encoded results exceed the {MAX_RESULTS_BYTES} byte limit"
            current.chunks.clear()
            return
        current.chunks[seq] = data

    # -- output ------------------------------------------------------------

    def result(self) -> DecodedLog:
        """A snapshot of what the log said so far."""
        results, error = self._results()
        return DecodedLog(
            events=list(self._events),
            results=results,
            results_error=error,
            outcome=self._outcome(),
            last_progress=self._last_progress,
            started=self._started,
            dropped_events=self._dropped,
        )

    def _outcome(self) -> Outcome | None:
        body = self._final
        if body is None:
            return None
        message = body.get("message")
        path = body.get("results_path")
        return Outcome(
            event=str(body["event"]),
            exit_code=_int_or_none(body.get("exit_code")),
            signal=_int_or_none(body.get("signal")),
            message=message if isinstance(message, str) else "",
            results_path=path if isinstance(path, str) else None,
        )

    def _results(self) -> tuple[dict[str, Any] | None, str | None]:
        final = self._final
        current = self._results_set
        if current is None:
            return None, self._no_chunks_reason(final)
        if current.error is not None:
            return None, current.error
        if len(current.chunks) < current.total:
            return None, _describe_missing(current.chunks, current.total)
        _run_id, digest, _total, size = current.key
        if final is not None and final.get("event") == EVENT_COMPLETED:
            expected = final.get("results_sha256")
            if isinstance(expected, str) and expected != digest:
                return None, (
                    "the results chunks in the log do not belong to the completed run "
                    f"(sha256 {digest[:12]}... != {expected[:12]}...)"
                )
        return _assemble(current, digest, size)

    @staticmethod
    def _no_chunks_reason(final: dict[str, Any] | None) -> str:
        if final is None:
            return "no results markers in the log (run not finished, or log starts after them)"
        event = final.get("event")
        if event != EVENT_COMPLETED:
            return f"no results: the run ended with '{event}'"
        note = final.get("results_note")
        if isinstance(note, str) and note:
            return note
        chunks = _int_or_none(final.get("results_chunks"))
        extra = f" ({chunks} expected)" if chunks else ""
        return f"log starts after the results chunks{extra}: only the completed marker is present"


def _assemble(
    current: _ResultsSet, digest: str, size: int
) -> tuple[dict[str, Any] | None, str | None]:
    """Join, decode, decompress (bounded) and verify one complete results set."""
    text = "".join(current.chunks[i] for i in range(1, current.total + 1))
    try:
        compressed = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None, "results chunks are not valid base64 (corrupt log)"
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(compressed, MAX_RESULTS_BYTES + 1)
    except zlib.error as exc:
        return None, f"results chunks do not decompress ({exc}): corrupt log"
    if len(raw) > MAX_RESULTS_BYTES or inflater.unconsumed_tail:
        return None, f"results exceed the {MAX_RESULTS_BYTES} byte limit"
    if len(raw) != size or hashlib.sha256(raw).hexdigest() != digest:
        return None, "results checksum mismatch (corrupt or mixed-up chunks)"
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        return None, f"results are not valid JSON: {exc}"
    if not isinstance(parsed, dict):
        return None, "results JSON is not an object"
    return parsed, None


def decode_lines(lines: Iterable[str]) -> DecodedLog:
    """Decode an iterable of log lines."""
    decoder = LogDecoder()
    for line in lines:
        decoder.feed_line(line)
    return decoder.result()


def decode_text(text: str) -> DecodedLog:
    """Decode a whole log held in a string."""
    return decode_lines(text.split("\n"))


def iter_log_lines(stream: BinaryIO, max_chars: int = MAX_LINE_CHARS) -> Iterator[str]:
    """Yield ``\\n``-separated lines of a binary stream with bounded memory.

    A line longer than ``max_chars`` bytes is yielded truncated to
    ``max_chars + 3`` characters, which :meth:`LogDecoder.feed_line` rejects
    as over-long; its bytes are never held in memory at once.
    """
    overlong = "x" * (max_chars + 3)  # one shared object, not one per long line
    buf = bytearray()
    overflow = False
    while chunk := stream.read(1 << 16):
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not overflow:
                if len(buf) + len(piece) > max_chars:
                    overflow = True
                    buf.clear()
                else:
                    buf += piece
            if end < 0:
                break
            yield overlong if overflow else buf.decode("utf-8", "replace")
            buf.clear()
            overflow = False
            start = end + 1
    if overflow:
        yield overlong
    elif buf:
        yield buf.decode("utf-8", "replace")


def decode_stream(stream: BinaryIO) -> DecodedLog:
    """Decode a binary stream (file, pipe) of any size with bounded memory."""
    return decode_lines(iter_log_lines(stream))
