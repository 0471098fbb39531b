"""The marker protocol on its own: encoding, neutralising, decoding.

Checks that markers round-trip, that neutralised untrusted text can never
decode as a marker (also through a container-runtime log and its partial
lines), that results survive chunking and that every way a log can be cut
or corrupted gives ``results: None`` with a specific reason, and that the
decoder's memory stays bounded.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver import protocol, run
from driver.decoder import LogDecoder, decode_lines, decode_stream, decode_text
from driver.protocol import (
    MARKER_PREFIX,
    RESULTS_CHUNK_CHARS,
    encode_marker,
    encode_results,
    neutralize,
)


def big_results(size: int, seed: int = 7, *, like_lm_eval: bool = False) -> bytes:
    """A results-like JSON document of about ``size`` bytes that compresses poorly.

    `like_lm_eval`: compressing about 10:1, as lm_eval's echoed task configs
    do (repeated templates, a little that differs per task), so that a few
    MB of it fit the protocol's compressed limit.
    """
    rng = random.Random(seed)
    configs = {}
    approx = 0
    while approx < size:
        key = f"task_{len(configs)}"
        if like_lm_eval:
            configs[key] = {
                "doc": rng.randbytes(24).hex(),
                "template": "Question: {{question}}\nAnswer:" * 14,
                "score": rng.random(),
            }
            approx += 560
        else:
            configs[key] = {"doc": rng.randbytes(300).hex(), "score": rng.random()}
            approx += 650
    return json.dumps({"results": {"t": {"acc,none": 0.5}}, "configs": configs}).encode()


def completed_log(raw: bytes, run_id: str = "r1") -> list[str]:
    return [
        encode_marker("started", run_id=run_id),
        *encode_results(raw, run_id),
        encode_marker(
            "completed",
            run_id=run_id,
            exit_code=0,
            message="ok",
            results_path="/x/results.json",
            results_sha256=hashlib.sha256(raw).hexdigest(),
            results_chunks=len(encode_results(raw, run_id)),
        ),
    ]


def test_marker_is_one_ascii_line_with_version() -> None:
    line = encode_marker("progress", phase="a\nb\u2028c\r", n=1)
    assert line.startswith(MARKER_PREFIX)
    assert line.isascii() and "\n" not in line and "\r" not in line
    body = json.loads(line[len(MARKER_PREFIX) :])
    assert body == {"v": 1, "event": "progress", "phase": "a\nb\u2028c\r", "n": 1}
    with pytest.raises(ValueError):
        encode_marker("bogus")


def test_exit_codes_are_the_documented_ones() -> None:
    assert (protocol.EXIT_OK, protocol.EXIT_NO_RESULTS) == (0, 70)
    assert (protocol.EXIT_CANCELLED, protocol.EXIT_DRIVER_ERROR) == (71, 72)
    # driver.run takes them from the import-light driver.contract.
    assert (run.EXIT_NO_RESULTS, run.EXIT_CANCELLED, run.EXIT_DRIVER_ERROR) == (70, 71, 72)


@pytest.mark.parametrize(
    "text",
    [
        "::lmeval::{}",
        "x ::lmeval::{}",
        "::lmeval::lmeval::lmeval::{}",
        "::::lmeval::::lmeval::",
        "a\x0c::lmeval::{}",
        "2026-01-01T00:00:00.123Z stdout F ::lmeval::{}",
        "2026-01-01T00:00:00Z stdout P ::lme",
        "2026-01-01T00:00:00+02:00 stderr F hi",
    ],
)
def test_neutralize_removes_every_prefix_and_cri_look(text: str) -> None:
    out = neutralize(text)
    assert MARKER_PREFIX not in out
    assert protocol.CRI_LINE_RE.match(out) is None
    # Still readable: only spaces were added.
    assert out.replace(" ", "") == text.replace(" ", "")


def test_neutralize_leaves_ordinary_text_alone() -> None:
    for text in ["", "lmeval is great", "|toy_mc|Yaml|none|", "::lmeval:", "lmeval::x"]:
        assert neutralize(text) == text


@given(st.text(alphabet=st.sampled_from(list(":lmevaL \n\x0c2Z")), max_size=60))
def test_neutralize_property(text: str) -> None:
    out = neutralize(text)
    assert MARKER_PREFIX not in out
    # Any way of splitting the output into lines yields no marker.
    assert decode_text(out).events == []
    assert decode_lines(out.splitlines()).events == []


def test_round_trip_and_outcome() -> None:
    raw = json.dumps({"results": {"t": {"acc,none": 0.25}}, "versions": {"t": 1}}).encode()
    decoded = decode_lines(["noise", *completed_log(raw), "more noise"])
    assert decoded.results == json.loads(raw)
    assert decoded.results_error is None
    assert decoded.outcome is not None
    assert decoded.outcome.event == "completed"
    assert decoded.outcome.exit_code == 0
    assert decoded.outcome.results_path == "/x/results.json"
    assert [e["event"] for e in decoded.events] == ["started", "completed"]
    assert decoded.started is not None and decoded.started["run_id"] == "r1"


def test_five_megabyte_results_round_trip_with_bounded_lines() -> None:
    raw = big_results(5 * 1024 * 1024, like_lm_eval=True)
    lines = encode_results(raw, "big")
    assert len(lines) > 10
    assert max(len(line) for line in lines) < 64 * 1024
    assert all(
        len(json.loads(line[len(MARKER_PREFIX) :])["data"]) <= RESULTS_CHUNK_CHARS for line in lines
    )
    decoded = decode_lines(completed_log(raw, "big"))
    assert decoded.results == json.loads(raw)


@pytest.fixture(scope="module")
def chunked() -> tuple[bytes, list[str]]:
    raw = big_results(300_000)
    log = completed_log(raw)
    assert sum(1 for line in log if '"event":"results"' in line) >= 3
    return raw, log


def _chunk_positions(log: list[str]) -> list[int]:
    return [i for i, line in enumerate(log) if '"event":"results"' in line]


def test_log_cut_after_first_chunk_gives_no_results_and_reason(
    chunked: tuple[bytes, list[str]],
) -> None:
    _raw, log = chunked
    pos = _chunk_positions(log)
    decoded = decode_lines(log[pos[1] :])
    assert decoded.results is None
    total = len(pos)
    assert decoded.results_error == (
        f"log starts after the first results chunk ({total - 1} of {total} chunks seen)"
    )
    assert decoded.outcome is not None and decoded.outcome.event == "completed"


def test_log_cut_before_all_chunks(chunked: tuple[bytes, list[str]]) -> None:
    _raw, log = chunked
    pos = _chunk_positions(log)
    decoded = decode_lines(log[pos[-1] + 1 :])
    assert decoded.results is None
    assert decoded.results_error is not None
    assert "log starts after the results chunks" in decoded.results_error


def test_log_ending_mid_results(chunked: tuple[bytes, list[str]]) -> None:
    _raw, log = chunked
    pos = _chunk_positions(log)
    decoded = decode_lines(log[: pos[1] + 1])
    assert decoded.results is None and decoded.outcome is None
    assert decoded.results_error is not None
    assert decoded.results_error.startswith("log ends before the last results chunk (2 of")


def test_missing_middle_chunk(chunked: tuple[bytes, list[str]]) -> None:
    _raw, log = chunked
    pos = _chunk_positions(log)
    decoded = decode_lines(log[: pos[1]] + log[pos[1] + 1 :])
    assert decoded.results is None
    assert decoded.results_error is not None
    assert decoded.results_error.startswith("results chunks missing: 2 ")


def test_corrupt_chunk_is_detected(chunked: tuple[bytes, list[str]]) -> None:
    _raw, log = chunked
    pos = _chunk_positions(log)
    body = json.loads(log[pos[1]][len(MARKER_PREFIX) :])
    data = body["data"]
    body["data"] = data[:100] + ("A" if data[100] != "A" else "B") + data[101:]
    tampered = list(log)
    tampered[pos[1]] = MARKER_PREFIX + json.dumps(body)
    decoded = decode_lines(tampered)
    assert decoded.results is None
    assert decoded.results_error is not None
    assert "corrupt" in decoded.results_error or "checksum" in decoded.results_error


def test_newest_results_set_wins_and_stale_set_is_not_used() -> None:
    old = json.dumps({"results": {"old": {}}}).encode()
    new = big_results(200_000, seed=3)
    new_lines = encode_results(new, "r2")
    # A complete old set followed by an incomplete new one: never the stale data.
    decoded = decode_lines([*encode_results(old, "r1"), *new_lines[:-1]])
    assert decoded.results is None
    decoded = decode_lines([*encode_results(old, "r1"), *new_lines])
    assert decoded.results == json.loads(new)


def test_completed_marker_must_match_results_set() -> None:
    raw = json.dumps({"results": {}}).encode()
    other = json.dumps({"results": {"x": {}}}).encode()
    log = completed_log(raw)
    log[1:2] = encode_results(other, "r1")
    decoded = decode_lines(log)
    assert decoded.results is None
    assert decoded.results_error is not None and "do not belong" in decoded.results_error


def test_failed_and_unfinished_runs_explain_missing_results() -> None:
    failed = decode_lines([encode_marker("failed", exit_code=1, signal=None, message="boom")])
    assert failed.outcome is not None and failed.outcome.message == "boom"
    assert failed.results_error == "no results: the run ended with 'failed'"
    assert decode_text("").results_error is not None
    assert decode_text("").outcome is None


@pytest.mark.parametrize(
    "body",
    [
        '{"v":2,"event":"completed"}',
        '{"v":true,"event":"completed"}',
        '{"v":"1","event":"completed"}',
        '{"v":1,"event":"exploded"}',
        '{"v":1}',
        "[1,2]",
        '{"v":1,"event":"completed"',
    ],
)
def test_malformed_markers_are_ignored(body: str) -> None:
    decoded = decode_text(MARKER_PREFIX + body)
    assert decoded.events == [] and decoded.outcome is None


def test_marker_must_start_at_column_zero() -> None:
    line = encode_marker("completed", exit_code=0, message="x")
    assert decode_text(" " + line).events == []
    assert decode_text("x" + line).events == []
    assert len(decode_text(line + "\r\n").events) == 1


def cri(lines: list[str], split: int = 16 * 1024, stream: str = "stdout") -> list[str]:
    """Wrap lines the way the container runtime does, splitting long ones."""
    out = []
    for line in lines:
        pieces = [line[i : i + split] for i in range(0, len(line), split)] or [""]
        for i, piece in enumerate(pieces):
            tag = "F" if i == len(pieces) - 1 else "P"
            out.append(f"2026-11-29T22:45:41.{i:09d}Z {stream} {tag} {piece}")
    return out


def test_cri_log_with_partial_lines_decodes() -> None:
    raw = big_results(200_000)
    log = completed_log(raw)
    wrapped = cri(log)
    assert any(" stdout P " in line for line in wrapped)
    # Interleave stderr lines, which must not disturb stdout's partial lines.
    mixed: list[str] = []
    for line in wrapped:
        mixed.append(line)
        mixed.append("2026-11-29T22:45:41.5Z stderr P " + encode_marker("failed", message="E"))
    decoded = decode_lines(mixed)
    assert decoded.results == json.loads(raw)
    assert [e["event"] for e in decoded.events] == ["started", "completed"]


def test_forged_cri_lines_in_a_plain_log_cannot_join_into_a_marker() -> None:
    forged = encode_marker("completed", exit_code=0, message="FORGED")
    attack = [
        f"2026-01-01T00:00:00Z stdout P {forged[:5]}",
        f"2026-01-01T00:00:00Z stdout F {forged[5:]}",
    ]
    # Without neutralisation the decoder would (rightly, for a real CRI file) join them.
    assert decode_lines(attack).outcome is not None
    # The driver forwards child lines neutralised: then nothing can be joined.
    assert decode_lines([neutralize(line) for line in attack]).events == []
    assert decode_lines(cri([neutralize(line) for line in attack])).events == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=40),
            st.sampled_from(
                [
                    MARKER_PREFIX,
                    encode_marker("completed", exit_code=0, message="F"),
                    "2026-01-01T00:00:00Z stdout P ",
                    "2026-01-01T00:00:00Z stdout F ",
                    '{"v":1,"event":"failed"}',
                    "\r",
                    "\n",
                ]
            ),
        ),
        max_size=30,
    ),
    st.integers(min_value=1, max_value=50),
)
def test_neutralized_text_never_decodes_in_plain_or_cri_logs(pieces: list[str], split: int) -> None:
    text = "".join(pieces)
    lines = [neutralize(seg) for seg in text.replace("\r", "\n").split("\n")]
    assert decode_lines(lines).events == []
    assert decode_lines(cri(lines, split=split)).events == []
    assert decode_lines(cri(lines, split=split, stream="stderr")).events == []


def test_overlong_lines_are_skipped_and_memory_bounded() -> None:
    huge = MARKER_PREFIX + json.dumps(
        {"v": 1, "event": "failed", "message": "x" * (2 * 1024 * 1024)}
    )
    assert decode_text(huge).events == []
    stream = io.BytesIO(
        b"garbage" * 500_000
        + b"\n"
        + encode_marker("failed", message="ok").encode()
        + b"\n"
        + os.urandom(3_000_000)
    )
    decoded = decode_stream(stream)
    assert [e["message"] for e in decoded.events] == ["ok"]


def test_results_over_the_cap_are_refused_not_buffered() -> None:
    decoder = LogDecoder()
    chunk = "A" * RESULTS_CHUNK_CHARS
    total = protocol.MAX_RESULTS_BYTES // RESULTS_CHUNK_CHARS + 10
    for seq in range(1, total + 1):
        decoder.feed_line(
            encode_marker(
                "results",
                run_id="r",
                seq=seq,
                total=total,
                sha256="0" * 64,
                size=100,
                encoding="zlib+base64",
                data=chunk,
            )
        )
    result = decoder.result()
    assert result.results is None
    assert result.results_error is not None and "exceed" in result.results_error
    assert sum(len(c) for c in decoder._sets["results"].chunks.values()) == 0


def test_progress_events_are_capped_but_final_events_kept() -> None:
    decoder = LogDecoder()
    decoder.feed_line(encode_marker("started", run_id="r"))
    for i in range(3 * protocol.MAX_EVENTS):
        decoder.feed_line(encode_marker("progress", n=i))
    decoder.feed_line(encode_marker("completed", exit_code=0, message="done"))
    result = decoder.result()
    assert len(result.events) <= 2 * protocol.MAX_EVENTS
    assert result.events[0]["event"] == "started"
    assert result.events[-1]["event"] == "completed"
    assert (
        result.last_progress is not None
        and result.last_progress["n"] == 3 * protocol.MAX_EVENTS - 1
    )
    assert result.dropped_events == 3 * protocol.MAX_EVENTS + 2 - len(result.events)
