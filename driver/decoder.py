"""Decoding a pod log into what its ``::lmeval::`` markers say (the poller's side).

Why a module of its own: `driver.protocol` is the contract (marker format,
limits, encoding); this is the reader, which meets the log as the poller
gets it: cut anywhere, possibly in the container runtime's format with lines
split at 16 KiB, and written by whoever controls the job's pod. So it skips
everything that is not a well-formed marker, refuses results that break the
protocol's limits before doing the work they ask for (declared chunk counts,
encoded size, inflated size and ratio, JSON depth and width), keeps a
bounded number of events, and never raises: whatever it is fed, the worst
outcome is ``results: None`` with a reason. Standard library only.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import io
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from driver.boundedjson import UntrustedJsonError, parse_untrusted_json
from driver.protocol import (
    CRI_LINE_RE,
    EVENT_COMPLETED,
    EVENT_ITEMS,
    EVENT_PROGRESS,
    EVENT_RESULTS,
    EVENT_STARTED,
    ITEMS_LIMITS,
    MARKER_JSON_LIMITS,
    MARKER_PREFIX,
    MAX_EVENT_CHARS,
    MAX_EVENTS,
    MAX_LINE_CHARS,
    MAX_MARKER_CHARS,
    MAX_SHARDS,
    RESULTS_ENCODING,
    RESULTS_LIMITS,
    ChunkLimits,
    FinalFields,
    ResultsChunkFields,
    ShardFields,
    log_problem,
    marker_event,
    parse_results_json,
    read_complete_fields,
    read_fields,
)

__all__ = [
    "DecodedLog",
    "LogDecoder",
    "Outcome",
    "decode_bytes",
    "decode_lines",
    "decode_stream",
    "decode_text",
    "iter_log_lines",
]


@dataclass(frozen=True)
class Outcome:
    """The final marker of a run: what happened and the driver's exit code."""

    event: str  # "completed" | "failed" | "cancelled"
    exit_code: int | None
    signal: int | None
    message: str
    results_path: str | None
    # Task sources cloned from Git: (name, commit), as the driver read them.
    task_sources: tuple[tuple[str, str], ...] = ()
    # spec.outputs.oci: the artifact pushed (<registry>/<repository>@sha256:...),
    # or why the push failed.
    results_artifact: str | None = None
    results_artifact_error: str | None = None
    # spec.outputs.mlflow: the run logged (its ID, page and experiment), or why not.
    mlflow_run_id: str | None = None
    mlflow_run_url: str | None = None
    mlflow_experiment_id: str | None = None
    mlflow_error: str | None = None
    # Per-item scores (driver.itemscores): why they are not in the log, and
    # the file that holds them in the pod (the outputs claim when mounted).
    items_note: str | None = None
    items_path: str | None = None
    # Provenance the final marker repeats (see payloads.FinalDetails).
    driver_version: str | None = None
    lm_eval_version: str | None = None
    argv: tuple[str, ...] = ()
    server_models: str | None = None
    # A merge pod's: what each shard contributed (typed; its strings are the pod's).
    shards: tuple[ShardFields, ...] = ()


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
    # The `items` markers' payload (driver.itemscores JSON bytes, checksum
    # verified, not yet decoded), or why there is none.
    items: bytes | None = None
    items_error: str | None = None

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
            "items": None if self.items is None else _items_summary(self.items),
            "items_error": self.items_error,
        }


def _items_summary(raw: bytes) -> dict[str, Any]:
    """What ``decode`` prints of the per-item scores: their size and shape, not their bytes."""
    from driver.itemscores import decode_item_scores

    summary: dict[str, Any] = {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    try:
        scores = decode_item_scores(raw)
    except ValueError as exc:
        summary["error"] = str(exc)
        return summary
    summary["tasks"] = {
        name: {"items": len(task.doc_ids), "metrics": sorted(task.metrics)}
        for name, task in scores.tasks.items()
    }
    summary["skipped"] = {name: list(reasons) for name, reasons in scores.skipped.items()}
    return summary


@dataclass
class _ChunkSet:
    """Chunks of one payload (results, items), identified by (run_id, sha256, total, size)."""

    limits: ChunkLimits
    key: tuple[str, str, int, int]
    chunks: dict[int, str] = field(default_factory=dict)
    encoded_chars: int = 0
    error: str | None = None

    @property
    def total(self) -> int:
        return self.key[2]


def _describe_missing(seen: Iterable[int], total: int, event: str) -> str:
    # total <= the set's max_chunks (the decoder refuses larger sets first).
    have = set(seen)
    count = f"({len(have)} of {total} chunks seen)"
    if 1 not in have:
        return f"log starts after the first {event} chunk {count}"
    if total not in have:
        return f"log ends before the last {event} chunk {count}"
    missing = [seq for seq in range(1, total + 1) if seq not in have]
    shown = ", ".join(str(m) for m in missing[:5]) + (", ..." if len(missing) > 5 else "")
    return f"{event} chunks missing: {shown} {count}"


class LogDecoder:
    """Streaming parser of a pod log (plain text or CRI format) into markers.

    Feed it lines in order with :meth:`feed_line`; call :meth:`result` at any
    time. Lines that are not well-formed markers are ignored, so garbage,
    forwarded child output and a log cut anywhere are all harmless. Neither
    method ever raises, whatever the log holds: an unexpected failure (out of
    memory, a bug) is reported as a corrupt log in ``results_error``. Memory
    is bounded by the module's limits, whatever the log's length.
    """

    def __init__(self) -> None:
        # Each kept event with the length of its marker (for MAX_EVENT_CHARS).
        self._events: list[tuple[dict[str, Any], int]] = []
        self._event_chars = 0
        self._dropped = 0
        self._started: dict[str, Any] | None = None
        self._last_progress: dict[str, Any] | None = None
        self._final: dict[str, Any] | None = None
        # The newest set of chunks of each chunked event (results, items).
        self._sets: dict[str, _ChunkSet] = {}
        self._corrupt: str | None = None
        # Partial (runtime-split) stdout line of a CRI log; None when there is
        # none, "" parts are legal. Over-long partials are dropped whole.
        self._partial: list[str] | None = None
        self._partial_len = 0
        self._partial_overflow = False

    # -- input -------------------------------------------------------------

    def feed_line(self, line: str) -> None:
        """Consume one log line (a trailing ``\\r``/``\\n`` is ignored). Never raises."""
        try:
            self._feed(line)
        except Exception as error:  # MemoryError, or a bug: the log is what is wrong
            self._reset_partial()
            self._corrupt = f"corrupt log: {type(error).__name__} while decoding a line"

    def _feed(self, line: str) -> None:
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
            body = parse_untrusted_json(text[len(MARKER_PREFIX) :], MARKER_JSON_LIMITS)
        except UntrustedJsonError:
            return
        if not isinstance(body, dict):
            return
        event = marker_event(body)
        if event is None:
            return
        if event == EVENT_RESULTS:
            self._add_chunk(body, RESULTS_LIMITS)
            return
        if event == EVENT_ITEMS:
            self._add_chunk(body, ITEMS_LIMITS)
            return
        if len(text) > MAX_MARKER_CHARS:
            return  # only results markers are long
        self._append_event(body, len(text))
        if event == EVENT_STARTED:
            self._started = body
        elif event == EVENT_PROGRESS:
            self._last_progress = body
        else:
            self._final = body

    def _append_event(self, body: dict[str, Any], chars: int) -> None:
        self._events.append((body, chars))
        self._event_chars += chars
        if len(self._events) > 2 * MAX_EVENTS or self._event_chars > 2 * MAX_EVENT_CHARS:
            self._compact_events()

    def _over_budget(self, count: int, chars: int) -> bool:
        return count > MAX_EVENTS or chars > MAX_EVENT_CHARS

    def _compact_events(self) -> None:
        # Back within MAX_EVENTS and MAX_EVENT_CHARS: the oldest progress
        # events go first, then the oldest others; amortised O(1) per event.
        count, chars = len(self._events), self._event_chars
        for progress_only in (True, False):
            kept: list[tuple[dict[str, Any], int]] = []
            for entry in self._events:
                body, size = entry
                if self._over_budget(count, chars) and (
                    not progress_only or marker_event(body) == EVENT_PROGRESS
                ):
                    count, chars = count - 1, chars - size
                    self._dropped += 1
                    continue
                kept.append(entry)
            self._events = kept
        self._event_chars = chars

    def _add_chunk(self, body: dict[str, Any], limits: ChunkLimits) -> None:
        # Items chunks have the results chunks' shape (payloads.ItemsChunkFields).
        chunk = read_complete_fields(body, ResultsChunkFields)
        if chunk is None or chunk["encoding"] != RESULTS_ENCODING:
            return
        seq, total, size, data = chunk["seq"], chunk["total"], chunk["size"], chunk["data"]
        if not 1 <= seq <= total:
            return
        key = (chunk["run_id"], chunk["sha256"], total, size)
        current = self._sets.get(limits.event)
        if current is None or current.key != key:
            # A new set replaces the previous one: the newest results (items)
            # in a log win, never an older complete set (that would be stale).
            current = self._sets[limits.event] = _ChunkSet(limits, key)
            if total > limits.max_chunks:
                current.error = (
                    f"a {limits.what} set of {total} chunks exceeds the {limits.max_chunks} "
                    f"chunk limit ({limits.max_encoded_chars} encoded characters)"
                )
            elif size > limits.max_bytes:
                current.error = log_problem(limits, size, 0)
        if current.error is not None:
            return
        previous = current.chunks.get(seq)
        current.encoded_chars += len(data) - (len(previous) if previous is not None else 0)
        if current.encoded_chars > limits.max_encoded_chars:
            current.error = (
                f"encoded {limits.what} exceed the {limits.max_encoded_chars} character limit"
            )
            current.chunks.clear()
            return
        current.chunks[seq] = data

    # -- output ------------------------------------------------------------

    def result(self) -> DecodedLog:
        """A snapshot of what the log said so far. Never raises."""
        try:
            results, error = self._results()
            if results is None and self._corrupt is not None:
                error = f"{self._corrupt}; {error}"
            items, items_error = self._items()
            return DecodedLog(
                events=[body for body, _ in self._events],
                results=results,
                results_error=error,
                outcome=self._outcome(),
                last_progress=self._last_progress,
                started=self._started,
                dropped_events=self._dropped,
                items=items,
                items_error=items_error,
            )
        except Exception as error:  # MemoryError, or a bug: say so, never raise
            return DecodedLog(
                events=[],
                results=None,
                results_error=f"corrupt log: {type(error).__name__} while decoding the results",
                outcome=None,
                last_progress=None,
                started=None,
                dropped_events=self._dropped,
            )

    def _outcome(self) -> Outcome | None:
        body = self._final
        if body is None:
            return None
        final = read_fields(body, FinalFields)
        return Outcome(
            event=str(marker_event(body)),
            exit_code=final.get("exit_code"),
            signal=final.get("signal"),
            message=final.get("message", ""),
            results_path=final.get("results_path"),
            task_sources=tuple(
                (source["name"], source["commit"]) for source in final.get("task_sources", [])
            ),
            results_artifact=final.get("results_artifact"),
            results_artifact_error=final.get("results_artifact_error"),
            mlflow_run_id=final.get("mlflow_run_id"),
            mlflow_run_url=final.get("mlflow_run_url"),
            mlflow_experiment_id=final.get("mlflow_experiment_id"),
            mlflow_error=final.get("mlflow_error"),
            items_note=final.get("items_note"),
            items_path=final.get("items_path"),
            driver_version=final.get("driver_version"),
            lm_eval_version=final.get("lm_eval_version"),
            argv=tuple(final.get("argv", [])),
            server_models=final.get("server_models"),
            shards=tuple(final.get("shards") or ())[:MAX_SHARDS],
        )

    def _results(self) -> tuple[dict[str, Any] | None, str | None]:
        current = self._sets.get(EVENT_RESULTS)
        if current is None:
            return None, self._no_chunks_reason(self._final)
        raw, error = self._payload(current, "results_sha256")
        if raw is None:
            return None, error
        try:
            return parse_results_json(raw), None
        except UntrustedJsonError as exc:
            return None, f"results are not usable: {exc}"

    def _items(self) -> tuple[bytes | None, str | None]:
        current = self._sets.get(EVENT_ITEMS)
        if current is None:
            return None, self._no_items_reason(self._final)
        return self._payload(current, "items_sha256")

    def _payload(self, current: _ChunkSet, checksum_key: str) -> tuple[bytes | None, str | None]:
        """The verified bytes of a complete set, or why there are none."""
        if current.error is not None:
            return None, current.error
        event = current.limits.event
        if len(current.chunks) < current.total:
            return None, _describe_missing(current.chunks, current.total, event)
        _run_id, digest, _total, size = current.key
        final = self._final
        if final is not None and marker_event(final) == EVENT_COMPLETED:
            expected = read_fields(final, FinalFields).get(checksum_key)
            if isinstance(expected, str) and expected != digest:
                return None, (
                    f"the {event} chunks in the log do not belong to the completed run "
                    f"(sha256 {digest[:12]}... != {expected[:12]}...)"
                )
        return _assemble(current, digest, size)

    @staticmethod
    def _no_items_reason(final: dict[str, Any] | None) -> str:
        if final is None:
            return "no items markers in the log (run not finished, or log starts after them)"
        event = marker_event(final)
        if event != EVENT_COMPLETED:
            return f"no per-item scores: the run ended with '{event}'"
        fields = read_fields(final, FinalFields)
        note = fields.get("items_note")
        if note:
            return note
        chunks = fields.get("items_chunks")
        if chunks:
            return (
                f"log starts after the items chunks ({chunks} expected): "
                "only the completed marker is present"
            )
        return "no per-item scores: lm_eval wrote no samples (run it with --log_samples)"

    @staticmethod
    def _no_chunks_reason(final: dict[str, Any] | None) -> str:
        if final is None:
            return "no results markers in the log (run not finished, or log starts after them)"
        event = marker_event(final)
        if event != EVENT_COMPLETED:
            return f"no results: the run ended with '{event}'"
        fields = read_fields(final, FinalFields)
        note = fields.get("results_note")
        if note:
            return note
        chunks = fields.get("results_chunks")
        extra = f" ({chunks} expected)" if chunks else ""
        return f"log starts after the results chunks{extra}: only the completed marker is present"


def _assemble(current: _ChunkSet, digest: str, size: int) -> tuple[bytes | None, str | None]:
    """Join, decode, decompress (bounded) and verify one complete set."""
    event = current.limits.event
    text = "".join(current.chunks[i] for i in range(1, current.total + 1))
    try:
        compressed = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None, f"{event} chunks are not valid base64 (corrupt log)"
    del text
    problem = log_problem(current.limits, size, len(compressed))
    if problem is not None:
        return None, problem
    inflater = zlib.decompressobj()
    try:
        # Never more than the declared size (+1 to notice more): that size
        # passed the absolute and the ratio limits above.
        raw = inflater.decompress(compressed, size + 1)
    except zlib.error as exc:
        return None, f"{event} chunks do not decompress ({exc}): corrupt log"
    if len(raw) > size or inflater.unconsumed_tail:
        return None, f"{event} inflate to more than the {size} bytes they declare"
    if len(raw) != size or hashlib.sha256(raw).hexdigest() != digest:
        return None, f"{event} checksum mismatch (corrupt or mixed-up chunks)"
    return raw, None


def decode_lines(lines: Iterable[str]) -> DecodedLog:
    """Decode an iterable of log lines."""
    decoder = LogDecoder()
    for line in lines:
        decoder.feed_line(line)
    return decoder.result()


def decode_text(text: str) -> DecodedLog:
    """Decode a whole log held in a string (lines are not copied all at once)."""
    return decode_lines(_split_lines(text))


def _split_lines(text: str) -> Iterator[str]:
    start = 0
    while (end := text.find("\n", start)) >= 0:
        yield text[start:end]
        start = end + 1
    yield text[start:]


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


def decode_bytes(data: bytes) -> DecodedLog:
    """Decode a log read into memory (as the poller reads one), line by line."""
    return decode_stream(io.BytesIO(data))
