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
* **Bounded.** The log is written by whoever controls the job's pod, so every
  cost of reading it has a named limit here (line and marker sizes, chunk
  count, encoded, compressed and inflated results, compression ratio, JSON
  depth and width, kept events) and the results JSON, from the log, an
  exec'd file or a job's status, is parsed by one bounded parser
  (:func:`parse_results_json`). The driver never writes what the reader
  would refuse.

It is the whole contract: besides the framing and limits, it holds (by
re-export) the typed payload of every marker (`driver.payloads`) and the
driver's exit codes, command line and environment (`driver.contract`, which
the driver needs before its child starts). The poller imports the driver's
side of the contract from here only. The reader is `driver.decoder`. All are
standard-library only; the driver imports this module lazily (after the
child has started, since ``dataclasses`` costs ~10 ms to import) and the
poller imports both.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import signal
import zlib
from collections.abc import Mapping
from typing import Any, Literal

from driver.boundedjson import JsonLimits, UntrustedJsonError, parse_untrusted_json
from driver.contract import (
    CMD_DECODE,
    CMD_FETCH_S3,
    CMD_RELEASE,
    DRIVER_MODULE,
    DRIVER_PROGRAM,
    END_OF_OPTIONS,
    ENV_CA_BUNDLE,
    ENV_OUTPUT_ROOT,
    ENV_RUN_ID,
    EVENT_CANCELLED,
    EVENT_COMPLETED,
    EVENT_FAILED,
    EVENT_PROGRESS,
    EVENT_RESULTS,
    EVENT_STARTED,
    EXIT_CANCELLED,
    EXIT_DRIVER_ERROR,
    EXIT_NO_RESULTS,
    EXIT_OK,
    OPT_GRACE_PERIOD,
    OPT_HOLD_SECONDS,
    OPT_HUB_DATASETS,
    OPT_LOG_COPY,
    OPT_OCI_AUTH,
    OPT_OCI_PUSH,
    OPT_OCI_SCHEME,
    OPT_OCI_SUBJECT,
    OPT_OUTPUT_ROOT,
    OPT_PROGRESS_INTERVAL,
    OPT_RUN_ID,
    OPT_TASK_SOURCES,
    driver_command,
    fetch_s3_argv,
    release_argv,
    run_argv,
)
from driver.payloads import (
    FinalDetails,
    FinalFields,
    ProgressFields,
    ResultsChunkFields,
    StartedFields,
    TaskSourceFields,
    read_complete_fields,
    read_fields,
)

__all__ = [
    "CMD_DECODE",
    "CMD_FETCH_S3",
    "CMD_RELEASE",
    "CRI_LINE_RE",
    "DRIVER_MODULE",
    "DRIVER_PROGRAM",
    "END_OF_OPTIONS",
    "ENV_CA_BUNDLE",
    "ENV_OUTPUT_ROOT",
    "ENV_RUN_ID",
    "EVENT_CANCELLED",
    "EVENT_COMPLETED",
    "EVENT_FAILED",
    "EVENT_PROGRESS",
    "EVENT_RESULTS",
    "EVENT_STARTED",
    "EXIT_CANCELLED",
    "EXIT_DRIVER_ERROR",
    "EXIT_NO_RESULTS",
    "EXIT_OK",
    "FINAL_EVENTS",
    "KNOWN_EVENTS",
    "MARKER_JSON_LIMITS",
    "MARKER_PREFIX",
    "MAX_COMPRESSED_RESULTS_BYTES",
    "MAX_ENCODED_RESULTS_CHARS",
    "MAX_EVENTS",
    "MAX_EVENT_CHARS",
    "MAX_INFLATE_RATIO",
    "MAX_LINE_CHARS",
    "MAX_MARKER_CHARS",
    "MAX_MARKER_DEPTH",
    "MAX_MARKER_ELEMENTS",
    "MAX_RESULTS_BYTES",
    "MAX_RESULTS_CHUNKS",
    "MAX_RESULTS_JSON_DEPTH",
    "MAX_RESULTS_JSON_ELEMENTS",
    "MAX_RESULTS_MARKER_CHARS",
    "OPT_GRACE_PERIOD",
    "OPT_HOLD_SECONDS",
    "OPT_HUB_DATASETS",
    "OPT_LOG_COPY",
    "OPT_OCI_AUTH",
    "OPT_OCI_PUSH",
    "OPT_OCI_SCHEME",
    "OPT_OCI_SUBJECT",
    "OPT_OUTPUT_ROOT",
    "OPT_PROGRESS_INTERVAL",
    "OPT_RUN_ID",
    "OPT_TASK_SOURCES",
    "PROTOCOL_VERSION",
    "RESULTS_CHUNK_CHARS",
    "RESULTS_ENCODING",
    "RESULTS_JSON_LIMITS",
    "FinalDetails",
    "FinalEvent",
    "FinalFields",
    "ProgressFields",
    "ResultsChunkFields",
    "StartedFields",
    "TaskSourceFields",
    "driver_command",
    "encode_final",
    "encode_marker",
    "encode_progress",
    "encode_results",
    "encode_started",
    "fetch_s3_argv",
    "marker_event",
    "neutralize",
    "parse_results_json",
    "read_complete_fields",
    "read_fields",
    "release_argv",
    "results_log_problem",
    "run_argv",
    "signal_name",
    "signal_text",
]

MARKER_PREFIX = "::lmeval::"
PROTOCOL_VERSION = 1

FinalEvent = Literal["completed", "failed", "cancelled"]
FINAL_EVENTS = frozenset({EVENT_COMPLETED, EVENT_FAILED, EVENT_CANCELLED})
KNOWN_EVENTS = frozenset({EVENT_STARTED, EVENT_PROGRESS, EVENT_RESULTS}) | FINAL_EVENTS

# Base64 characters per results marker. The marker line stays near 32 KiB,
# well under the 64 KiB that some log shippers cap lines at; the container
# runtime splits lines at 16 KiB anyway and the decoder re-joins them.
RESULTS_CHUNK_CHARS = 32_000
RESULTS_ENCODING = "zlib+base64"

# Every limit below is what the poller spends at most on one job's log (see
# README, "Security"): the log is written by the job's author.
#
# Compressed results the log may carry. The poller keeps the full results in
# a ConfigMap, which holds 1 MiB of data at most: results whose compressed
# form is larger could not be stored anyway. 768 KiB is 1 MiB of base64.
MAX_COMPRESSED_RESULTS_BYTES = 768 * 1024
# The base64 text the decoder buffers for one results set.
MAX_ENCODED_RESULTS_CHARS = MAX_COMPRESSED_RESULTS_BYTES * 4 // 3
# Chunks a results set may declare (33): the encoded cap in whole chunks.
MAX_RESULTS_CHUNKS = -(-MAX_ENCODED_RESULTS_CHARS // RESULTS_CHUNK_CHARS)
# Uncompressed results, from the log or from an exec'd ``cat``. A real
# results file is KBs to a few MB (lm_eval writes the samples elsewhere).
MAX_RESULTS_BYTES = 8 * 1024 * 1024
# Inflated size over compressed size. lm_eval's JSON compresses about 5-20:1;
# zlib reaches 1000:1 on zeros, which is what a decompression bomb is.
MAX_INFLATE_RATIO = 200
# The results JSON's shape: lm_eval's nests about 8 deep and has thousands of
# elements for a large task group. Deeper or wider documents are refused
# before any Python object is made (see driver.boundedjson).
MAX_RESULTS_JSON_DEPTH = 64
MAX_RESULTS_JSON_ELEMENTS = 200_000
# A results marker: one chunk plus its fields (run_id, sha256, sizes).
MAX_RESULTS_MARKER_CHARS = RESULTS_CHUNK_CHARS + 1024
# Any other marker: the driver caps its messages at 1000 characters and its
# phases at 160; the started marker's argv is the longest (a few KB).
MAX_MARKER_CHARS = 16 * 1024
# And its JSON: flat objects, argv one list deep.
MAX_MARKER_DEPTH = 4
MAX_MARKER_ELEMENTS = 128
# Lines longer than this are never markers; the decoder skips them unread.
MAX_LINE_CHARS = MAX_RESULTS_MARKER_CHARS
# Events kept by the decoder (count, and marker characters): beyond them the
# oldest progress events go first, then the oldest others, so that a
# week-long run's log, or a hostile one, cannot grow the decoder without
# bound. The kept list may reach twice these before it is compacted.
MAX_EVENTS = 500
MAX_EVENT_CHARS = 1024 * 1024

RESULTS_JSON_LIMITS = JsonLimits(
    max_bytes=MAX_RESULTS_BYTES,
    max_depth=MAX_RESULTS_JSON_DEPTH,
    max_elements=MAX_RESULTS_JSON_ELEMENTS,
)
# Markers never carry NaN or Infinity on purpose; such a value becomes None,
# so that it can never reach a status patch.
MARKER_JSON_LIMITS = JsonLimits(
    max_bytes=MAX_RESULTS_MARKER_CHARS,
    max_depth=MAX_MARKER_DEPTH,
    max_elements=MAX_MARKER_ELEMENTS,
    finite_only=True,
)

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


def marker_event(body: Mapping[str, object]) -> str | None:
    """The event of a marker body of this protocol version; None for anything else."""
    version, event = body.get("v"), body.get("event")
    if type(version) is not int or version != PROTOCOL_VERSION or event not in KNOWN_EVENTS:
        return None
    return event


def encode_started(fields: StartedFields) -> str:
    """The ``started`` marker line."""
    return encode_marker(EVENT_STARTED, **fields)


def encode_progress(fields: ProgressFields) -> str:
    """A ``progress`` marker line."""
    return encode_marker(EVENT_PROGRESS, **fields)


def encode_final(event: FinalEvent, fields: FinalFields) -> str:
    """The final marker line: ``completed``, ``failed`` or ``cancelled``."""
    return encode_marker(event, **fields)


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


def results_log_problem(size: int, compressed_size: int) -> str | None:
    """Why results of `size` bytes, `compressed_size` compressed, cannot travel in the log.

    The driver asks before it writes results markers (and then says where the
    file is instead); the decoder asks again of what a log declares.
    """
    if size > MAX_RESULTS_BYTES:
        return f"results of {size} bytes exceed the {MAX_RESULTS_BYTES} byte limit"
    if compressed_size > MAX_COMPRESSED_RESULTS_BYTES:
        return (
            f"compressed results of {compressed_size} bytes exceed the "
            f"{MAX_COMPRESSED_RESULTS_BYTES} byte limit"
        )
    if size > MAX_INFLATE_RATIO * compressed_size:
        return (
            f"results of {size} bytes from {compressed_size} compressed bytes exceed the "
            f"{MAX_INFLATE_RATIO}:1 compression ratio limit"
        )
    return None


def encode_results(results_json: bytes, run_id: str) -> list[str]:
    """Encode a results file as ``results`` marker lines (zlib, base64, chunked).

    Raises ValueError (saying why) for results the decoder would refuse.
    """
    if len(results_json) > MAX_RESULTS_BYTES:  # not even worth compressing
        raise ValueError(results_log_problem(len(results_json), 0))
    compressed = zlib.compress(results_json, 6)
    problem = results_log_problem(len(results_json), len(compressed))
    if problem is not None:
        raise ValueError(problem)
    digest = hashlib.sha256(results_json).hexdigest()
    text = base64.b64encode(compressed).decode("ascii")
    pieces = [text[i : i + RESULTS_CHUNK_CHARS] for i in range(0, len(text), RESULTS_CHUNK_CHARS)]
    chunks: list[ResultsChunkFields] = [
        {
            "seq": seq,
            "run_id": run_id,
            "total": len(pieces),
            "sha256": digest,
            "size": len(results_json),
            "encoding": RESULTS_ENCODING,
            "data": piece,
        }
        for seq, piece in enumerate(pieces, start=1)
    ]
    return [encode_marker(EVENT_RESULTS, **chunk) for chunk in chunks]


def parse_results_json(raw: bytes | str) -> dict[str, Any]:
    """A results JSON object from untrusted bytes or text, within `RESULTS_JSON_LIMITS`.

    The one parser of results for the decoder, the poller's exec path and
    its score reader. NaN and Infinity are kept: lm_eval writes them (Python's
    ``json.dump``) and results only ever travel as text. Raises only
    `UntrustedJsonError` (a ValueError), with a message fit for a status.
    """
    parsed = parse_untrusted_json(raw, RESULTS_JSON_LIMITS)
    if not isinstance(parsed, dict):
        raise UntrustedJsonError("results JSON is not an object")
    return parsed


def signal_name(signum: int) -> str:
    """``9`` -> ``"SIGKILL"``; unknown numbers get a generic name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_text(signum: int) -> str:
    """``9`` -> ``"signal 9 (SIGKILL)"``; an unknown number is only ``"signal N"``."""
    name = signal_name(signum)
    return name if name == f"signal {signum}" else f"signal {signum} ({name})"
