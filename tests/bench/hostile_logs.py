"""The hostile jobs of bench_hostile.py and the pod logs they serve (written to files).

A job's pod log is written by whoever wrote the job's code, so the poller
must treat it as hostile input. Each entry of :data:`HOSTILE` is one attack
that a hostile-tenant run found to cost the poller memory or time, or to
wedge the job: unbounded log reads, a tail window that widens 4x a round on
long lines, a results set that announces its own chunk count, a zip bomb, a
results JSON nested deeper than the parser's recursion limit, NaN/Infinity
in progress markers, results sets that keep replacing each other.

The sizes are fixed here, on purpose independent of the poller's own
constants (``MAX_TAIL_LINES`` and friends), so "before" and "after" figures
come from exactly the same input. Markers are made with
``driver.protocol.encode_marker`` / ``encode_results``; forged results chunks
start from a real chunk's fields, so they carry whatever fields the protocol
has. Files are in the container runtime's log format (what kwok serves) and
are written in batches, never held whole in memory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmeval_sandbox import kwok

from driver import protocol
from tests.hostile_logs import results_markers

# Today's widest tail window (poller.decisions.outcome.MAX_TAIL_LINES, 400 x 4 x 4 x 4):
# a log longer than this makes the poller widen its reads up to it.
WIDEST_TAIL = 25_600
# A line the decoder still reads (protocol.MAX_LINE_CHARS is 1 MiB).
LONG_LINE_CHARS = 1024 * 1024
FLOOD_LINES = 160  # 160 MiB returned by one tailLines=400 read
WIDEN_LINE_CHARS = 7 * 1024  # 25,700 lines of 7 KiB: 176 MiB at the widest read
CLAIMED_CHUNKS = 10**9  # `total` of a forged results set
BOMB_BYTES = 1024**3  # zeros behind the zip bomb (about 1 MB compressed)
NESTING = 100_000  # levels of the deeply nested JSON
ALTERNATING_DATA_CHARS = 4_000  # base64 per chunk of the alternating sets
# Everything written, with its CRI prefixes, stays under this (--help says so).
MAX_DISK_BYTES = 2 * 1024**3

RUN_ID = "hostile-run"
_BATCH = 256  # lines per write


@dataclass(frozen=True)
class Hostile:
    """One hostile job: its name, what its log does, and its pod's fate."""

    name: str
    attack: str
    log: str  # file name in the log directory (several jobs may share one)
    terminates: bool  # the pod exits 0 during the run; otherwise it keeps running


HOSTILE: tuple[Hostile, ...] = (
    Hostile("flood-exit", f"{FLOOD_LINES} lines of 1 MiB, no markers", "flood.log", True),
    Hostile(
        "flood-running",
        "the same 1 MiB lines, pod keeps running (progress reads)",
        "flood.log",
        False,
    ),
    Hostile(
        "widen-exit",
        f"{WIDEST_TAIL + 100} lines of 7 KiB, no markers: the tail widens to {WIDEST_TAIL}",
        "widen.log",
        True,
    ),
    Hostile("chunks-1e9", "a results set declaring total=10**9 chunks", "chunks.log", True),
    Hostile(
        "zip-bomb",
        f"{WIDEST_TAIL} filler lines, then a results set inflating to 1 GiB of zeros",
        "bomb.log",
        True,
    ),
    Hostile("deep-results", f"results JSON nested {NESTING:,} levels", "deep.log", True),
    Hostile(
        "alternating-sets",
        f"{WIDEST_TAIL + 100} chunks of two results sets in turn, never complete",
        "alternating.log",
        True,
    ),
    Hostile("nan-exit", "NaN/Infinity progress, then valid results", "nan-exit.log", True),
    Hostile("nan-running", "NaN/Infinity progress markers, pod keeps running", "nan.log", False),
    Hostile(
        "deep-progress-running",
        f"a progress marker nested {NESTING:,} levels, pod keeps running",
        "deep-progress.log",
        False,
    ),
)


# -- markers ------------------------------------------------------------------------


def started() -> str:
    return protocol.encode_marker(
        "started", run_id=RUN_ID, driver_version="0.1.0", lm_eval_version="0.4.13"
    )


def completed(results_sha256: str | None = None) -> str:
    fields: dict[str, Any] = {"exit_code": 0, "message": "lm_eval completed", "duration": 1.0}
    if results_sha256 is not None:
        fields["results_sha256"] = results_sha256
    return protocol.encode_marker("completed", run_id=RUN_ID, **fields)


def progress(percent: float, n: int = 1, total: int = 100) -> str:
    return protocol.encode_marker(
        "progress", run_id=RUN_ID, percent=percent, phase="loglikelihood", n=n, total=total
    )


def forged_chunk(**overrides: Any) -> str:
    """A results marker with a real chunk's fields, some replaced."""
    real = protocol.encode_results(b"{}", RUN_ID)[0]
    fields = json.loads(real[len(protocol.MARKER_PREFIX) :])
    del fields["v"], fields["event"]
    fields.update(overrides)
    return protocol.encode_marker(protocol.EVENT_RESULTS, **fields)


# -- the logs -------------------------------------------------------------------------


def flood() -> Iterator[str]:
    line = "x" * LONG_LINE_CHARS
    for _ in range(FLOOD_LINES):
        yield line


def widen() -> Iterator[str]:
    line = "w" * WIDEN_LINE_CHARS
    for _ in range(WIDEST_TAIL + 100):
        yield line


def chunks() -> Iterator[str]:
    # Both ends present, so the decoder goes on to list the chunks missing.
    yield started()
    for seq in (1, 2, 10**6, CLAIMED_CHUNKS // 2, CLAIMED_CHUNKS):
        yield forged_chunk(seq=seq, total=CLAIMED_CHUNKS, size=1000, data="AAAA")
    yield completed()


def zip_bomb() -> Iterator[str]:
    inflater = zlib.compressobj(9)
    digest = hashlib.sha256()
    block = bytes(1024 * 1024)
    parts = []
    for _ in range(BOMB_BYTES // len(block)):
        parts.append(inflater.compress(block))
        digest.update(block)
    parts.append(inflater.flush())
    text = base64.b64encode(b"".join(parts)).decode("ascii")
    pieces = [
        text[i : i + protocol.RESULTS_CHUNK_CHARS]
        for i in range(0, len(text), protocol.RESULTS_CHUNK_CHARS)
    ]
    yield started()
    # Short filler lines keep the window full, so every widening re-inflates.
    for k in range(WIDEST_TAIL):
        yield f"2025-01-01:00:00:00 INFO [evaluator:180] request {k}"
    # The declared size is a lie small enough to pass a size check.
    for seq, piece in enumerate(pieces, start=1):
        yield forged_chunk(
            seq=seq,
            total=len(pieces),
            size=protocol.MAX_RESULTS_BYTES,
            sha256=digest.hexdigest(),
            data=piece,
        )
    yield completed(digest.hexdigest())


def deep_json() -> bytes:
    return b"[" * NESTING + b"]" * NESTING


def raw_results(raw: bytes) -> list[str]:
    """Results markers for `raw` as a hostile pod writes them: the driver's own
    encoder refuses results the poller would refuse, a forger does not."""
    data = base64.b64encode(zlib.compress(raw, 6)).decode("ascii")
    digest = hashlib.sha256(raw).hexdigest()
    return results_markers(data, digest=digest, size=len(raw), run_id=RUN_ID)


def deep_results() -> Iterator[str]:
    raw = deep_json()
    yield started()
    yield from raw_results(raw)
    yield completed(hashlib.sha256(raw).hexdigest())


def alternating() -> Iterator[str]:
    data = "A" * ALTERNATING_DATA_CHARS
    yield started()
    for k in range(WIDEST_TAIL + 100):
        which = k % 2
        yield forged_chunk(
            run_id=f"{RUN_ID}-{which}",
            seq=1 + (k // 2) % 2,
            total=2,
            sha256=f"{which:064x}",
            size=3 * ALTERNATING_DATA_CHARS // 4,
            data=data,
        )
    yield completed()


def nan_progress() -> Iterator[str]:
    yield started()
    for k in range(50):
        yield progress((float("nan"), float("inf"), float("-inf"), 1e308)[k % 4], n=k)


def nan_then_results() -> Iterator[str]:
    yield from nan_progress()
    raw = json.dumps({"results": {"arc_easy": {"acc,none": 0.5}}}).encode()
    yield from protocol.encode_results(raw, RUN_ID)
    yield completed(hashlib.sha256(raw).hexdigest())


def deep_progress() -> Iterator[str]:
    yield started()
    yield progress(10.0)
    # A marker line whose JSON nests deeper than the parser's recursion limit.
    nested = "[" * NESTING + "]" * NESTING
    yield protocol.MARKER_PREFIX + f'{{"v":1,"event":"progress","run_id":"{RUN_ID}","n":{nested}}}'


WRITERS = {
    "flood.log": flood,
    "widen.log": widen,
    "chunks.log": chunks,
    "bomb.log": zip_bomb,
    "deep.log": deep_results,
    "alternating.log": alternating,
    "nan-exit.log": nan_then_results,
    "nan.log": nan_progress,
    "deep-progress.log": deep_progress,
}


def _write(path: Path, lines: Iterable[str], budget: int) -> int:
    """Write `lines` in the CRI format; stop with an error past `budget` bytes."""
    written = 0
    batch: list[str] = []
    with path.open("w", encoding="ascii") as out:

        def flush() -> None:
            nonlocal written
            text = kwok.cri_log_lines(batch)
            written += len(text)
            if written > budget:
                raise RuntimeError(f"{path.name}: hostile logs exceed {MAX_DISK_BYTES} bytes")
            out.write(text)
            batch.clear()

        for line in lines:
            batch.append(line)
            if len(batch) >= _BATCH:
                flush()
        flush()
    return written


def write_logs(directory: Path, jobs: Iterable[Hostile]) -> dict[str, int]:
    """Write each log the jobs need (once); returns bytes per file name."""
    directory.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {}
    for job in jobs:
        if job.log in sizes:
            continue
        budget = MAX_DISK_BYTES - sum(sizes.values())
        sizes[job.log] = _write(directory / job.log, WRITERS[job.log](), budget)
    return sizes


def last_line(path: Path) -> str:
    """The text of the file's last log line (to check kwok serves this file)."""
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - 2 * LONG_LINE_CHARS))
        tail = handle.read().decode("ascii").rstrip("\n").rsplit("\n", 1)[-1]
    match = protocol.CRI_LINE_RE.match(tail)
    return tail[match.end() :] if match else tail
