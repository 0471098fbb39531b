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
the driver needs before its child starts), the per-item scores' format
(`driver.itemscores`) and the redaction of what a log may echo
(`driver.argv`). The poller imports the driver from here and from the reader,
`driver.decoder`, only: an import contract in pyproject.toml holds it to that. All are
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
from typing import Any, Literal, NamedTuple

from driver.argv import redact_argv, redact_json, redact_text
from driver.boundedjson import JsonLimits, UntrustedJsonError, parse_untrusted_json
from driver.contract import (
    ATTEST_MODULE,
    ATTESTATION_PREDICATE_TYPE,
    CMD_CA_BUNDLE,
    CMD_DECODE,
    CMD_FETCH_S3,
    CMD_RELEASE,
    DRIVER_MODULE,
    DRIVER_PROGRAM,
    END_OF_OPTIONS,
    ENV_CA_BUNDLE,
    ENV_CLUSTER_CA_BUNDLES,
    ENV_OUTPUT_ROOT,
    ENV_RUN_ID,
    ENV_SAFE_PATH,
    ENV_TERMINATION_LOG,
    EVENT_CANCELLED,
    EVENT_COMPLETED,
    EVENT_FAILED,
    EVENT_ITEMS,
    EVENT_PROGRESS,
    EVENT_RESULTS,
    EVENT_STARTED,
    EXIT_CANCELLED,
    EXIT_DRIVER_ERROR,
    EXIT_NO_RESULTS,
    EXIT_OK,
    EXIT_SHARD_REFUSED,
    MAX_SHARDS,
    OPT_OUTPUT_ROOT,
    SHARD_MODULE,
    SHARDS_RECORD,
    RunArgs,
    attest_argv,
    ca_bundle_argv,
    driver_command,
    fetch_s3_argv,
    option_flag,
    release_argv,
    run_argv,
    shard_merge_argv,
    shard_run_argv,
)
from driver.itemscores import (
    BINARY,
    FIXED_SCALE,
    ITEM_SCORES_LIMITS,
    MAX_TASKS,
    ItemScores,
    TaskItems,
    decode_item_scores,
)
from driver.payloads import (
    FinalDetails,
    FinalFields,
    ItemsChunkFields,
    ProgressFields,
    ResultsChunkFields,
    ShardFields,
    StartedFields,
    TaskSourceFields,
    read_complete_fields,
    read_fields,
)

__all__ = [
    "ATTESTATION_OUTPUT_LIMITS",
    "ATTESTATION_PREDICATE_TYPE",
    "ATTEST_MODULE",
    "BINARY",
    "CMD_CA_BUNDLE",
    "CMD_DECODE",
    "CMD_FETCH_S3",
    "CMD_RELEASE",
    "CRI_LINE_RE",
    "DRIVER_MODULE",
    "DRIVER_PROGRAM",
    "END_OF_OPTIONS",
    "ENV_CA_BUNDLE",
    "ENV_CLUSTER_CA_BUNDLES",
    "ENV_OUTPUT_ROOT",
    "ENV_RUN_ID",
    "ENV_SAFE_PATH",
    "ENV_TERMINATION_LOG",
    "EVENT_CANCELLED",
    "EVENT_COMPLETED",
    "EVENT_FAILED",
    "EVENT_ITEMS",
    "EVENT_PROGRESS",
    "EVENT_RESULTS",
    "EVENT_STARTED",
    "EXIT_CANCELLED",
    "EXIT_DRIVER_ERROR",
    "EXIT_NO_RESULTS",
    "EXIT_OK",
    "EXIT_SHARD_REFUSED",
    "FINAL_EVENTS",
    "FIXED_SCALE",
    "ITEMS_LIMITS",
    "ITEMS_RATIO_FLOOR",
    "ITEM_SCORES_LIMITS",
    "KNOWN_EVENTS",
    "MARKER_JSON_LIMITS",
    "MARKER_PREFIX",
    "MAX_ARGUMENT_CHARS",
    "MAX_ARGV_CHARS",
    "MAX_ARGV_ITEMS",
    "MAX_COMPRESSED_ITEMS_BYTES",
    "MAX_COMPRESSED_RESULTS_BYTES",
    "MAX_ENCODED_ITEMS_CHARS",
    "MAX_ENCODED_RESULTS_CHARS",
    "MAX_EVENTS",
    "MAX_EVENT_CHARS",
    "MAX_INFLATE_RATIO",
    "MAX_ITEMS_BYTES",
    "MAX_ITEMS_CHUNKS",
    "MAX_LINE_CHARS",
    "MAX_MARKER_CHARS",
    "MAX_MARKER_DEPTH",
    "MAX_MARKER_ELEMENTS",
    "MAX_RESULTS_BYTES",
    "MAX_RESULTS_CHUNKS",
    "MAX_RESULTS_JSON_DEPTH",
    "MAX_RESULTS_JSON_ELEMENTS",
    "MAX_RESULTS_MARKER_CHARS",
    "MAX_SHARDS",
    "MAX_TASKS",
    "OPT_OUTPUT_ROOT",
    "PROTOCOL_VERSION",
    "RESULTS_CHUNK_CHARS",
    "RESULTS_ENCODING",
    "RESULTS_JSON_LIMITS",
    "RESULTS_LIMITS",
    "SHARDS_RECORD",
    "SHARD_MODULE",
    "ChunkLimits",
    "FinalDetails",
    "FinalEvent",
    "FinalFields",
    "ItemScores",
    "ItemsChunkFields",
    "ProgressFields",
    "ResultsChunkFields",
    "RunArgs",
    "ShardFields",
    "StartedFields",
    "TaskItems",
    "TaskSourceFields",
    "attest_argv",
    "bounded_argv",
    "ca_bundle_argv",
    "decode_item_scores",
    "driver_command",
    "encode_chunks",
    "encode_final",
    "encode_items",
    "encode_marker",
    "encode_progress",
    "encode_results",
    "encode_started",
    "fetch_s3_argv",
    "log_problem",
    "marker_event",
    "neutralize",
    "option_flag",
    "parse_attestation_output",
    "parse_results_json",
    "read_complete_fields",
    "read_fields",
    "redact_argv",
    "redact_json",
    "redact_text",
    "release_argv",
    "run_argv",
    "shard_merge_argv",
    "shard_run_argv",
    "signal_name",
    "signal_text",
]

MARKER_PREFIX = "::lmeval::"
PROTOCOL_VERSION = 1

FinalEvent = Literal["completed", "failed", "cancelled"]
FINAL_EVENTS = frozenset({EVENT_COMPLETED, EVENT_FAILED, EVENT_CANCELLED})
KNOWN_EVENTS = frozenset({EVENT_STARTED, EVENT_PROGRESS, EVENT_RESULTS, EVENT_ITEMS}) | FINAL_EVENTS

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
# Per-item scores (``items`` markers, driver.itemscores JSON), sent after the
# results. Their chunks must fit the poller's narrow results window with the
# results' own (see poller.decisions.outcome.RESULTS_TAIL_LINES): that window, 16 KiB
# per runtime line, must fit a results read's 2 MiB, which leaves room for 4
# chunks, 96,000 compressed bytes. In items: a 0/1 metric is one bit per
# document before compression (base64 and zlib roughly cancel out), so about
# 750,000 binary values; any other metric is 8 bytes per document before
# compression, about 3-4 after (the high bytes of small numbers are zeros),
# so some 25,000 fixed-point values (tests/bench/bench_items.py measures it).
# Larger item sets stay in the run directory's lmeval-items.json.
MAX_ITEMS_CHUNKS = 4
MAX_ENCODED_ITEMS_CHARS = MAX_ITEMS_CHUNKS * RESULTS_CHUNK_CHARS
MAX_COMPRESSED_ITEMS_BYTES = MAX_ENCODED_ITEMS_CHARS * 3 // 4
# Uncompressed, what driver.itemscores decodes at most.
MAX_ITEMS_BYTES = 8 * 1024 * 1024
# Below this size any compression ratio is accepted for items: a metric that
# is 0 (or 1) for every document is a run of one base64 letter, which zlib
# shrinks far beyond MAX_INFLATE_RATIO, and inflating 1 MiB is cheap.
ITEMS_RATIO_FLOOR = 1024 * 1024
# Any other marker: the driver caps its messages at 1000 characters and its
# phases at 160. The final marker is the longest: with task sources, a long
# argv (bounded by `bounded_argv`), lm_eval's last line and the notes, it can
# pass 16 KiB; the driver shrinks it to fit this limit (`encode_final`).
MAX_MARKER_CHARS = 32 * 1024
# And its JSON: flat objects, argv and task sources one list deep. 64 task
# sources are 320 elements, an argv at most MAX_ARGV_ITEMS, the fields ~80.
MAX_MARKER_DEPTH = 4
MAX_MARKER_ELEMENTS = 1024
# The argv that started and final markers carry: lm_eval's command line, with
# at most this many arguments and this much JSON text (longer ones end with
# a note of what was left out). A poller-built command is ~20 arguments, 1 KB.
MAX_ARGV_ITEMS = 256
MAX_ARGV_CHARS = 8 * 1024
MAX_ARGUMENT_CHARS = 2048
# Lines longer than this are never markers; the decoder skips them unread.
MAX_LINE_CHARS = MAX_RESULTS_MARKER_CHARS
# Events kept by the decoder (count, and marker characters): beyond them the
# oldest progress events go first, then the oldest others, so that a
# week-long run's log, or a hostile one, cannot grow the decoder without
# bound. The kept list may reach twice these before it is compacted.
MAX_EVENTS = 500
MAX_EVENT_CHARS = 1024 * 1024


class ChunkLimits(NamedTuple):
    """What one chunked payload (results, per-item scores) may be in the log."""

    what: str  # how messages name it
    event: str
    max_bytes: int  # uncompressed
    max_compressed: int
    max_chunks: int
    ratio_floor: int  # uncompressed sizes up to this pass any compression ratio

    @property
    def max_encoded_chars(self) -> int:
        """The base64 text the decoder buffers for one set."""
        return self.max_compressed * 4 // 3


RESULTS_LIMITS = ChunkLimits(
    "results",
    EVENT_RESULTS,
    MAX_RESULTS_BYTES,
    MAX_COMPRESSED_RESULTS_BYTES,
    MAX_RESULTS_CHUNKS,
    0,
)
ITEMS_LIMITS = ChunkLimits(
    "per-item scores",
    EVENT_ITEMS,
    MAX_ITEMS_BYTES,
    MAX_COMPRESSED_ITEMS_BYTES,
    MAX_ITEMS_CHUNKS,
    ITEMS_RATIO_FLOOR,
)

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
    """The final marker line: ``completed``, ``failed`` or ``cancelled``.

    Never longer than MAX_MARKER_CHARS (the decoder would skip it): a marker
    over the limit loses its argv first, then has its free texts shortened.
    """
    line = encode_marker(event, **fields)
    if len(line) <= MAX_MARKER_CHARS:
        return line
    shrunk: dict[str, Any] = dict(fields)
    if "argv" in shrunk:
        shrunk["argv"] = ["(argv left out: the final marker was too long; see the started marker)"]
        line = encode_marker(event, **shrunk)
    for cap in (500, 100):
        if len(line) <= MAX_MARKER_CHARS:
            break
        for key in _FREE_TEXTS:
            value = shrunk.get(key)
            if isinstance(value, str) and len(value) > cap:
                shrunk[key] = value[:cap] + "..."
        line = encode_marker(event, **shrunk)
    if len(line) > MAX_MARKER_CHARS:  # only task sources left: drop them
        shrunk.pop("task_sources", None)
        line = encode_marker(event, **shrunk)
    return line


# The final marker's texts that may be shortened, in no particular order.
_FREE_TEXTS = (
    "message",
    "last_line",
    "results_note",
    "items_note",
    "results_artifact_error",
    "mlflow_error",
    "results_path",
    "results_file",
    "items_path",
    "server_models",
)


def bounded_argv(argv: list[str]) -> list[str]:
    """`argv` within MAX_ARGV_ITEMS and MAX_ARGV_CHARS (of ASCII JSON), saying what was cut."""
    kept: list[str] = []
    chars = 2
    for index, argument in enumerate(argv):
        if len(argument) > MAX_ARGUMENT_CHARS:
            argument = argument[: MAX_ARGUMENT_CHARS // 2] + f"... ({len(argument)} characters)"
        size = len(json.dumps(argument)) + 1
        if index >= MAX_ARGV_ITEMS - 1 or chars + size > MAX_ARGV_CHARS - 64:
            kept.append(f"... ({len(argv) - index} more arguments)")
            break
        kept.append(argument)
        chars += size
    return kept


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


def log_problem(limits: ChunkLimits, size: int, compressed_size: int) -> str | None:
    """Why a payload of `size` bytes, `compressed_size` compressed, cannot travel in the log.

    The driver asks before it writes the markers (and then says where the
    file is instead); the decoder asks again of what a log declares.
    """
    what = limits.what
    if size > limits.max_bytes:
        return f"{what} of {size} bytes exceed the {limits.max_bytes} byte limit"
    if compressed_size > limits.max_compressed:
        return (
            f"compressed {what} of {compressed_size} bytes exceed the "
            f"{limits.max_compressed} byte limit"
        )
    if size > limits.ratio_floor and size > MAX_INFLATE_RATIO * compressed_size:
        return (
            f"{what} of {size} bytes from {compressed_size} compressed bytes exceed the "
            f"{MAX_INFLATE_RATIO}:1 compression ratio limit"
        )
    return None


def encode_chunks(payload: bytes, run_id: str, limits: ChunkLimits) -> list[str]:
    """Encode `payload` as `limits.event` marker lines (zlib, base64, chunked).

    Raises ValueError (saying why) for a payload the decoder would refuse.
    """
    if len(payload) > limits.max_bytes:  # not even worth compressing
        raise ValueError(log_problem(limits, len(payload), 0))
    compressed = zlib.compress(payload, 6)
    problem = log_problem(limits, len(payload), len(compressed))
    if problem is not None:
        raise ValueError(problem)
    digest = hashlib.sha256(payload).hexdigest()
    text = base64.b64encode(compressed).decode("ascii")
    pieces = [text[i : i + RESULTS_CHUNK_CHARS] for i in range(0, len(text), RESULTS_CHUNK_CHARS)]
    chunks: list[ResultsChunkFields] = [
        {
            "seq": seq,
            "run_id": run_id,
            "total": len(pieces),
            "sha256": digest,
            "size": len(payload),
            "encoding": RESULTS_ENCODING,
            "data": piece,
        }
        for seq, piece in enumerate(pieces, start=1)
    ]
    return [encode_marker(limits.event, **chunk) for chunk in chunks]


def encode_results(results_json: bytes, run_id: str) -> list[str]:
    """Encode a results file as ``results`` marker lines (see `encode_chunks`)."""
    return encode_chunks(results_json, run_id, RESULTS_LIMITS)


def encode_items(items_json: bytes, run_id: str) -> list[str]:
    """Encode `driver.itemscores` JSON as ``items`` marker lines (see `encode_chunks`)."""
    return encode_chunks(items_json, run_id, ITEMS_LIMITS)


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


# The signing pod's one line (`attest_argv`): a DSSE envelope of a few KB.
ATTESTATION_OUTPUT_LIMITS = JsonLimits(max_bytes=1 << 20, max_depth=8, max_elements=1000)


def parse_attestation_output(raw: bytes) -> tuple[dict[str, Any], str | None]:
    """The envelope and the pushed manifest's digest from the signing pod's last
    log line, checked in shape; ValueError saying what is wrong."""
    lines = [line for line in raw.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the signing pod printed nothing")
    try:
        found = parse_untrusted_json(lines[-1], ATTESTATION_OUTPUT_LIMITS)
    except UntrustedJsonError as error:
        raise ValueError(f"the signing pod's output is not its JSON line: {error}") from None
    if not isinstance(found, dict):
        raise ValueError("the signing pod's output is not a JSON object")
    envelope, pushed = found.get("envelope"), found.get("pushed")
    if (
        not isinstance(envelope, dict)
        or not isinstance(envelope.get("payload"), str)
        or not isinstance(envelope.get("payloadType"), str)
        or not isinstance(envelope.get("signatures"), list)
    ):
        raise ValueError("the signing pod's output has no DSSE envelope")
    if pushed is not None and not (
        isinstance(pushed, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", pushed)
    ):
        raise ValueError("the signing pod's pushed digest is not sha256:<hex>")
    return envelope, pushed
