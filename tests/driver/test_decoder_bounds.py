"""The decoder's limits against hostile logs (issue 15), and that it never raises.

Checks each limit of `driver.protocol` where the decoder applies it: the
declared chunk count (10**12 chunks costs nothing), the encoded characters
buffered, the inflated size and the compression ratio (zip bombs), the
results JSON's depth and width (100k deep, 2M objects), marker sizes and
shapes, the events kept (count and characters), NaN and Infinity in
markers, 50 MB lines; that the bounded JSON parser is exact on escapes and
raises only its own error; that the driver never writes results the decoder
would refuse; and, with hypothesis, that `LogDecoder.feed_line` and
`result` never raise on arbitrary text and arbitrary marker bodies. Each
hostile case also bounds the traced memory of decoding it.
"""

from __future__ import annotations

import base64
import json
import math
import os
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver import protocol
from driver.boundedjson import JsonLimits, UntrustedJsonError, parse_untrusted_json
from driver.decoder import DecodedLog, LogDecoder, decode_bytes, decode_lines, decode_text
from driver.protocol import (
    MARKER_PREFIX,
    MAX_ENCODED_RESULTS_CHARS,
    MAX_EVENT_CHARS,
    MAX_EVENTS,
    MAX_RESULTS_CHUNKS,
    RESULTS_CHUNK_CHARS,
    encode_marker,
    encode_results,
    parse_results_json,
)
from tests import hostile_logs
from tests.driver.test_protocol import big_results, completed_log

MIB = 1024 * 1024


def decoded_within(limit_mib: float, make: Callable[[], DecodedLog]) -> DecodedLog:
    """`make()`, asserting its traced allocations peaked under `limit_mib`."""
    tracemalloc.start()
    try:
        decoded = make()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit_mib * MIB, f"peak {peak / MIB:.1f} MiB"
    return decoded


def test_limits_derive_from_each_other() -> None:
    assert MAX_ENCODED_RESULTS_CHARS == 4 * protocol.MAX_COMPRESSED_RESULTS_BYTES // 3 == MIB
    assert MAX_RESULTS_CHUNKS == 33
    assert MAX_RESULTS_CHUNKS * RESULTS_CHUNK_CHARS >= MAX_ENCODED_RESULTS_CHARS
    assert (MAX_RESULTS_CHUNKS - 1) * RESULTS_CHUNK_CHARS < MAX_ENCODED_RESULTS_CHARS
    assert protocol.MAX_LINE_CHARS == protocol.MAX_RESULTS_MARKER_CHARS
    assert protocol.MAX_MARKER_CHARS < protocol.MAX_RESULTS_MARKER_CHARS


# -- results sets ------------------------------------------------------------------


def test_a_chunk_total_of_10_to_the_12_is_refused_at_once() -> None:
    text = hostile_logs.huge_chunk_count_log(10**12)
    decoded = decoded_within(1, lambda: decode_text(text))
    assert decoded.results is None
    assert decoded.results_error == (
        "a results set of 1000000000000 chunks exceeds the 33 chunk limit "
        "(1048576 encoded characters)"
    )
    assert decoded.outcome is not None and decoded.outcome.event == "completed"


def test_a_zip_bomb_of_one_gib_is_refused_before_inflating() -> None:
    text = hostile_logs.zip_bomb_log()
    decoded = decoded_within(2, lambda: decode_text(text))
    assert decoded.results is None
    assert decoded.results_error is not None and "33 chunk limit" in decoded.results_error


def test_a_zip_bomb_within_the_chunk_limit_is_refused_by_size_and_ratio() -> None:
    # 64 MiB of zeros, declared truthfully: over the absolute limit.
    text = hostile_logs.small_zip_bomb_log()
    decoded = decoded_within(1, lambda: decode_text(text))
    assert decoded.results_error == "results of 67108864 bytes exceed the 8388608 byte limit"
    # 8 MiB of zeros (8 KiB compressed, about 1000:1): over the ratio limit.
    eight = 8 * MIB
    text = hostile_logs.small_zip_bomb_log(eight)
    decoded = decoded_within(1, lambda: decode_text(text))
    assert decoded.results is None
    assert decoded.results_error is not None
    assert decoded.results_error.endswith("exceed the 200:1 compression ratio limit")


def test_inflating_stops_at_the_declared_size() -> None:
    # 5100 bytes claiming to be 5000: never inflated past 5001.
    raw = bytes(5000) + b"x" * 100
    data = base64.b64encode(zlib.compress(raw)).decode()
    lines = hostile_logs.results_markers(data, digest="0" * 64, size=5000)
    decoded = decode_lines(lines)
    assert decoded.results_error == "results inflate to more than the 5000 bytes they declare"


def test_encoded_characters_are_capped_within_the_chunk_count() -> None:
    # 33 over-long chunks (lines up to the results marker size): more than 1 MiB encoded.
    decoder = LogDecoder()
    chunk = "A" * (RESULTS_CHUNK_CHARS + 700)
    for seq in range(1, MAX_RESULTS_CHUNKS + 1):
        line = encode_marker(
            "results", run_id="r", seq=seq, total=MAX_RESULTS_CHUNKS, sha256="0" * 64,
            size=100, encoding="zlib+base64", data=chunk,
        )  # fmt: skip
        assert len(line) <= protocol.MAX_LINE_CHARS
        decoder.feed_line(line)
    result = decoder.result()
    assert result.results_error == "encoded results exceed the 1048576 character limit"
    assert decoder._sets["results"].chunks == {}


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (hostile_logs.deep_results_log, "JSON nested deeper than 64 levels"),
        (hostile_logs.wide_results_log, "more than 200000 JSON elements"),
    ],
)
def test_deep_or_wide_results_json_is_refused_without_building_it(
    make: Callable[[], str], words: str
) -> None:
    text = make()
    decoded = decoded_within(24, lambda: decode_text(text))
    assert decoded.results is None
    assert decoded.results_error == f"results are not usable: {words}"


def test_many_alternating_results_sets_keep_one_set() -> None:
    text = hostile_logs.alternating_sets_log(5000)
    decoder = LogDecoder()
    for line in text.split("\n"):
        decoder.feed_line(line)
    assert len(decoder._sets["results"].chunks) == 1
    assert decoder.result().results_error == (
        "log ends before the last results chunk (1 of 2 chunks seen)"
    )


def test_results_at_the_limits_still_round_trip() -> None:
    raw = big_results(7 * MIB, like_lm_eval=True)
    assert len(raw) <= protocol.MAX_RESULTS_BYTES
    decoded = decode_lines(completed_log(raw))
    assert decoded.results == json.loads(raw)


# -- the driver's side --------------------------------------------------------------


def test_the_driver_never_encodes_what_the_decoder_refuses() -> None:
    noise = big_results(2 * MIB)  # random hex: compresses about 2:1, over 768 KiB
    with pytest.raises(ValueError, match=r"compressed results of \d+ bytes exceed the 786432 byte"):
        encode_results(noise, "r")
    with pytest.raises(ValueError, match="exceed the 200:1 compression ratio limit"):
        encode_results(b'{"a":"' + b" " * (4 * MIB) + b'"}', "r")
    with pytest.raises(ValueError, match="exceed the 8388608 byte limit"):
        encode_results(b"{}" + b" " * (9 * MIB), "r")


# -- markers -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_in_markers_become_none(value: str) -> None:
    decoded = decode_text(hostile_logs.nan_progress_log(value))
    assert decoded.last_progress is not None
    assert decoded.last_progress["percent"] is None
    assert decoded.last_progress["n"] is None and decoded.last_progress["total"] is None
    assert decoded.last_progress["phase"] == "Running loglikelihood requests"


def test_results_json_keeps_nan_as_lm_eval_writes_it() -> None:
    raw = b'{"results": {"t": {"acc,none": NaN, "acc_stderr,none": Infinity}}}'
    decoded = decode_lines(completed_log(raw))
    assert decoded.results is not None
    assert math.isnan(decoded.results["results"]["t"]["acc,none"])


def test_oversized_or_misshapen_markers_are_ignored() -> None:
    long_failed = encode_marker("failed", exit_code=1, message="x" * protocol.MAX_MARKER_CHARS)
    wide = encode_marker("progress", **{f"k{i}": i for i in range(protocol.MAX_MARKER_ELEMENTS)})
    deep = MARKER_PREFIX + '{"v":1,"event":"failed","a":' + "[" * 10 + "]" * 10 + "}"
    very_deep = MARKER_PREFIX + '{"v":1,"event":"failed","a":' + "[" * 16000 + "]" * 16000 + "}"
    for line in (long_failed, wide, deep, very_deep):
        assert decode_text(line).events == [], line[:60]
    assert len(decode_text(encode_marker("failed", exit_code=1, message="ok")).events) == 1


def test_kept_events_are_bounded_in_count_and_characters() -> None:
    decoder = LogDecoder()
    decoder.feed_line(encode_marker("started", run_id="r"))
    big = "p" * 15_000  # each marker about 15 KB
    for i in range(3 * MAX_EVENTS):
        decoder.feed_line(encode_marker("progress", n=i, phase=big))
        decoder.feed_line(encode_marker("failed", exit_code=1, message=str(i)))
    result = decoder.result()
    kept = sum(len(json.dumps(e, separators=(",", ":"))) for e in result.events)
    assert kept <= 2 * MAX_EVENT_CHARS + protocol.MAX_MARKER_CHARS
    assert len(result.events) <= 2 * MAX_EVENTS
    assert result.dropped_events == 1 + 6 * MAX_EVENTS - len(result.events)
    # The newest are kept, and what the poller reads is never dropped.
    assert result.events[-1] == {"v": 1, "event": "failed", "exit_code": 1, "message": "1499"}
    assert result.last_progress is not None and result.last_progress["n"] == 3 * MAX_EVENTS - 1
    assert result.started is not None and result.outcome is not None


def test_a_fifty_megabyte_line_costs_one_line_of_memory() -> None:
    data = hostile_logs.long_lines_log().encode()
    decoded = decoded_within(2, lambda: decode_bytes(data))
    assert decoded.outcome is not None and decoded.outcome.event == "completed"
    assert decoded.results_error is not None


# -- the bounded parser --------------------------------------------------------------

SMALL = JsonLimits(max_bytes=1 << 20, max_depth=3, max_elements=12)


@pytest.mark.parametrize("pad", [0, 70_000])
def test_parser_counts_exactly_through_escapes(pad: int) -> None:
    tricky = {"a\\": 'b\\"]]]]]]', '"[[[[': ["x", 'y"{{{{'], "pad": " " * pad}
    assert parse_untrusted_json(json.dumps(tricky), SMALL) == tricky
    too_deep = {"a": [[["x"]]], "pad": " " * pad}
    with pytest.raises(UntrustedJsonError, match="deeper than 3"):
        parse_untrusted_json(json.dumps(too_deep).encode(), SMALL)
    too_wide = {"a": list(range(8)), "pad": " " * pad}
    with pytest.raises(UntrustedJsonError, match="more than 12 JSON elements"):
        parse_untrusted_json(json.dumps(too_wide).encode(), SMALL)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"\xff\xfe{}", "not UTF-8"),
        (b"{" * 100_000, "more than 12 JSON elements"),
        ("[" * 30_000, "more than 12 JSON elements"),
        ("[[[[]]]]", "deeper than 3"),
        (b"1" * 5000, "not valid JSON"),  # over Python's 4300-digit int limit
        (b'{"a": 1', "not valid JSON"),
        (b"x" * (2 << 20), "larger than"),
    ],
)
def test_parser_raises_only_its_own_error(raw: bytes | str, words: str) -> None:
    with pytest.raises(UntrustedJsonError, match=words):
        parse_untrusted_json(raw, SMALL)


def test_results_parser_wants_an_object() -> None:
    with pytest.raises(UntrustedJsonError, match="not an object"):
        parse_results_json(b"[1]")
    assert parse_results_json('{"results": {}}') == {"results": {}}


# -- never raises --------------------------------------------------------------------

MARKER_KEYS = ["v", "event", "run_id", "seq", "total", "size", "sha256", "encoding", "data",
               "exit_code", "signal", "message", "results_path", "results_sha256", "percent",
               "n", "phase", "results_note", "results_chunks"]  # fmt: skip
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**15), max_value=10**15)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(["results", "completed", "progress", "zlib+base64", "QUFBQQ=="]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children),
    max_leaves=12,
)
marker_bodies = st.dictionaries(st.sampled_from(MARKER_KEYS), json_values, max_size=10).map(
    lambda body: {"v": 1, "event": "results", **body}
)


def _as_line(body: dict[str, Any], cri: bool) -> str:
    line = MARKER_PREFIX + json.dumps(body)
    return f"2026-01-01T00:00:00Z stdout {'P' if cri else 'F'} {line}" if cri else line


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=60),
            st.builds(_as_line, marker_bodies, st.booleans()),
            st.sampled_from(
                [MARKER_PREFIX + "[" * 5000, MARKER_PREFIX + '{"v":1,"event":"results"']
                + [line for line in hostile_logs.huge_chunk_count_log(10**12).split("\n")]
            ),
        ),
        max_size=25,
    )
)
def test_the_decoder_never_raises(lines: list[str]) -> None:
    decoder = LogDecoder()
    for line in lines:
        decoder.feed_line(line)
        assert isinstance(decoder.result(), DecodedLog)
    result = decoder.result()
    assert result.results is None or isinstance(result.results, dict)


def test_an_unexpected_failure_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(self: LogDecoder, body: dict[str, Any], limits: object) -> None:
        raise MemoryError

    monkeypatch.setattr(LogDecoder, "_add_chunk", explode)
    decoded = decode_lines(completed_log(b'{"results": {}}'))
    assert decoded.results is None
    assert decoded.results_error is not None
    assert decoded.results_error.startswith("corrupt log: MemoryError while decoding a line")
    monkeypatch.setattr(LogDecoder, "_results", lambda self: 1 / 0)
    assert decode_text("x").results_error == (
        "corrupt log: ZeroDivisionError while decoding the results"
    )


def test_random_bytes_decode_to_nothing() -> None:
    decoded = decode_bytes(os.urandom(1 << 20))
    assert decoded.events == [] and decoded.results is None
