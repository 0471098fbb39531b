"""Pod logs a hostile job author can make their pod print (issue 15).

Shared by the decoder's unit tests, the control-plane tests (served by kwok
as the job pod's log) and the memory benchmark, so that all three attack the
same bytes. Each log is plain text, one marker or line per ``\\n``, as the
apiserver returns a container log; each ends with a ``completed`` marker so
that the poller takes the pod for a finished, successful run.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import random
import zlib
from collections.abc import Callable

from driver.protocol import RESULTS_CHUNK_CHARS, RESULTS_ENCODING, encode_marker

RUN_ID = "hostile"
GIB = 1024 * 1024 * 1024


def _completed(**fields: object) -> str:
    return encode_marker("completed", run_id=RUN_ID, exit_code=0, message="ok", **fields)


def results_markers(
    data: str, *, digest: str, size: int, total: int | None = None, run_id: str = RUN_ID
) -> list[str]:
    """`data` (already encoded) cut into results markers that declare what they are told."""
    pieces = [data[i : i + RESULTS_CHUNK_CHARS] for i in range(0, len(data), RESULTS_CHUNK_CHARS)]
    count = total if total is not None else len(pieces)
    return [
        encode_marker(
            "results",
            run_id=run_id,
            seq=seq,
            total=count,
            sha256=digest,
            size=size,
            encoding=RESULTS_ENCODING,
            data=piece,
        )
        for seq, piece in enumerate(pieces, start=1)
    ]


@functools.cache
def _compressed_zeros(size: int) -> bytes:
    """zlib data of `size` zeros (a multiple of 1 MiB), made in milliseconds.

    After a full flush a deflate stream starts afresh, so every further MiB
    of zeros compresses to the same bytes: those are repeated, and the zlib
    header and Adler-32 trailer are put around them.
    """
    block = bytes(1024 * 1024)
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    checksum = 1
    for _ in range(size // len(block)):
        checksum = zlib.adler32(block, checksum)
    body = first + again * (size // len(block) - 1) + packer.flush()
    return b"\x78\xda" + body + checksum.to_bytes(4, "big")


def zip_bomb_log(inflated: int = GIB, declared: int = 64 * 1024 * 1024) -> str:
    """`inflated` bytes of zeros, compressed (about 1000:1), declaring `declared` bytes."""
    data = base64.b64encode(_compressed_zeros(inflated)).decode()
    lines = results_markers(data, digest="0" * 64, size=declared)
    return "\n".join([*lines, _completed()]) + "\n"


def small_zip_bomb_log(inflated: int = 64 * 1024 * 1024) -> str:
    """A bomb that fits the encoded cap (64 MiB of zeros: 64 KiB compressed), size declared true."""
    raw_digest = hashlib.sha256(bytes(inflated)).hexdigest()
    data = base64.b64encode(_compressed_zeros(inflated)).decode()
    lines = results_markers(data, digest=raw_digest, size=inflated)
    return "\n".join([*lines, _completed()]) + "\n"


def huge_chunk_count_log(total: int = 10**12) -> str:
    """A results set that declares `total` chunks and sends the first and the last."""
    marker = results_markers("QUFBQQ==", digest="0" * 64, size=4, total=total)[0]
    last = marker.replace('"seq":1,', f'"seq":{total},')
    return "\n".join([marker, last, _completed()]) + "\n"


def _checksummed_log(raw: bytes) -> str:
    data = base64.b64encode(zlib.compress(raw, 9)).decode()
    lines = results_markers(data, digest=hashlib.sha256(raw).hexdigest(), size=len(raw))
    return "\n".join([*lines, _completed()]) + "\n"


def _padding(raw_size: int) -> str:
    # Incompressible text enough to keep the whole within the 200:1 ratio
    # limit, so that the JSON itself is what the decoder meets.
    return base64.b64encode(random.Random(15).randbytes(raw_size // 100 + 64)).decode()


def deep_results_log(depth: int = 100_000) -> str:
    """A well-formed, correctly checksummed results set whose JSON nests `depth` deep."""
    body = "[" * depth + "]" * depth
    raw = f'{{"pad":"{_padding(len(body))}","results":{body}}}'.encode()
    return _checksummed_log(raw)


def wide_results_log(elements: int = 2_000_000) -> str:
    """A results JSON of `elements` empty objects: small on the wire, huge in memory."""
    body = "[" + ",".join(["{}"] * elements) + "]"
    raw = f'{{"pad":"{_padding(len(body))}","results":{body}}}'.encode()
    return _checksummed_log(raw)


def nan_progress_log(value: str = "NaN") -> str:
    """Progress markers whose numbers are not finite (``NaN``, ``Infinity``, ``1e999``)."""
    body = (
        '{"v":1,"event":"progress","phase":"Running loglikelihood requests",'
        f'"percent":{value},"n":{value},"total":{value}}}'
    )
    return "::lmeval::" + body + "\n"


def long_lines_log(line_bytes: int = 50 * 1024 * 1024, lines: int = 1) -> str:
    """`lines` lines of `line_bytes` characters each, then a completed marker without results."""
    return ("x" * line_bytes + "\n") * lines + _completed() + "\n"


def alternating_sets_log(markers: int = 20_000) -> str:
    """Results markers of two sets, interleaved, so the newest set changes on every line."""
    lines = []
    for index in range(markers):
        run_id = f"r{index % 2}"
        lines.extend(
            results_markers("QUFBQQ==", digest=str(index % 2) * 64, size=4, total=2, run_id=run_id)
        )
    return "\n".join([*lines, _completed()]) + "\n"


# Every hostile log by name, made on demand (the benchmark's and the tests' list).
HOSTILE_LOGS: dict[str, Callable[[], str]] = {
    "zip bomb (1 GiB of zeros)": zip_bomb_log,
    "small zip bomb (64 MiB, true size)": small_zip_bomb_log,
    "chunk total 10**12": huge_chunk_count_log,
    "results JSON 100k deep": deep_results_log,
    "results JSON of 2M objects": wide_results_log,
    "NaN progress": nan_progress_log,
    "50 MB line": long_lines_log,
    "20k alternating results sets": alternating_sets_log,
}


__all__ = [
    "HOSTILE_LOGS",
    "alternating_sets_log",
    "deep_results_log",
    "huge_chunk_count_log",
    "long_lines_log",
    "nan_progress_log",
    "results_markers",
    "small_zip_bomb_log",
    "wide_results_log",
    "zip_bomb_log",
]
