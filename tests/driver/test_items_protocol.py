"""The ``items`` markers: per-item scores chunked like results, decoded and refused alike.

Checks that items round-trip through the decoder beside the results (and
verify against the completed marker's items_sha256), that every way an
items set can be cut, mixed up or inflated gives ``items: None`` with a
specific reason and leaves the results alone, that the items' chunk limit
fits the poller's narrow results window, and that a worst-case final marker
(long argv, task sources, non-ASCII texts) still decodes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zlib

from driver import protocol
from driver.decoder import decode_lines
from driver.itemscores import ItemScores, TaskItems, docs_digest, encode_item_scores, metric_items
from driver.protocol import (
    EVENT_ITEMS,
    ITEMS_LIMITS,
    MAX_ITEMS_CHUNKS,
    MAX_MARKER_CHARS,
    RESULTS_CHUNK_CHARS,
    FinalFields,
    encode_final,
    encode_items,
    encode_marker,
    encode_results,
)
from poller.cycle.podio import LOG_READ_RESULTS_BYTES
from poller.decisions import outcome

RESULTS = json.dumps({"results": {"t": {"acc,none": 0.5}}}).encode()


def items_bytes() -> bytes:
    task = TaskItems(
        (0, 1, 2),
        docs_digest((i, "h") for i in range(3)),
        {"acc,none": metric_items([1, 0, 1])},
    )
    return encode_item_scores(ItemScores({"t": task}, {"models": "m"}))


def log(items: list[str], raw_items: bytes, *, run_id: str = "r1", **final: object) -> list[str]:
    """A completed run's log: results, the given items markers, the final marker."""
    fields = {
        "run_id": run_id,
        "exit_code": 0,
        "message": "ok",
        "results_sha256": hashlib.sha256(RESULTS).hexdigest(),
        "items_sha256": hashlib.sha256(raw_items).hexdigest(),
        "items_chunks": len(items),
        **final,
    }
    return [*encode_results(RESULTS, run_id), *items, encode_marker("completed", **fields)]


def incompressible(size: int) -> bytes:
    """Bytes that need several items chunks (the decoder does not parse items)."""
    return os.urandom(size)


def test_items_round_trip_beside_the_results() -> None:
    raw = items_bytes()
    markers = encode_items(raw, "r1")
    assert len(markers) == 1 and json.loads(markers[0][len(protocol.MARKER_PREFIX) :])["event"] == (
        EVENT_ITEMS
    )
    decoded = decode_lines(log(markers, raw))
    assert decoded.items == raw and decoded.items_error is None
    assert decoded.results == json.loads(RESULTS)
    summary = decoded.to_json()["items"]
    assert summary["size"] == len(raw)
    assert summary["tasks"] == {"t": {"items": 3, "metrics": ["acc,none"]}}
    assert "data" not in json.dumps(summary)  # a summary, not the bytes
    # Items markers are not events (they are long, like results chunks).
    assert all(e["event"] != EVENT_ITEMS for e in decoded.events)


def test_a_multi_chunk_items_set_round_trips() -> None:
    raw = incompressible(90_000)
    markers = encode_items(raw, "r1")
    assert len(markers) == 4
    assert decode_lines(log(markers, raw)).items == raw


def test_a_missing_items_chunk_is_named() -> None:
    raw = incompressible(90_000)
    markers = encode_items(raw, "r1")
    decoded = decode_lines(log([markers[0], markers[2], markers[3]], raw))
    assert decoded.items is None
    assert decoded.items_error == "items chunks missing: 2 (3 of 4 chunks seen)"
    assert decoded.results is not None  # the results do not suffer
    cut = decode_lines(log(markers[1:], raw))
    assert cut.items_error == "log starts after the first items chunk (3 of 4 chunks seen)"


def test_items_of_another_run_are_refused_by_the_checksum() -> None:
    raw = items_bytes()
    decoded = decode_lines(log(encode_items(raw, "r1"), raw, items_sha256="0" * 64))
    assert decoded.items is None
    assert decoded.items_error is not None
    assert decoded.items_error.startswith(
        "the items chunks in the log do not belong to the completed run"
    )


def test_corrupt_items_data_fails_the_checksum() -> None:
    raw = items_bytes()
    body = json.loads(encode_items(raw, "r1")[0][len(protocol.MARKER_PREFIX) :])
    body["sha256"] = hashlib.sha256(b"other").hexdigest()  # a consistent but false set
    line = encode_marker(EVENT_ITEMS, **{k: v for k, v in body.items() if k not in ("v", "event")})
    decoded = decode_lines(log([line], raw, items_sha256=body["sha256"]))
    assert decoded.items_error == "items checksum mismatch (corrupt or mixed-up chunks)"


def _chunk(payload: bytes, size: int, *, total: int = 1, seq: int = 1) -> str:
    data = base64.b64encode(payload).decode()
    return encode_marker(
        EVENT_ITEMS,
        seq=seq,
        run_id="r1",
        total=total,
        sha256="a" * 64,
        size=size,
        encoding="zlib+base64",
        data=data,
    )


def test_an_items_bomb_is_refused_before_it_is_inflated() -> None:
    size = protocol.MAX_ITEMS_BYTES
    bomb = zlib.compress(b"\0" * size, 9)
    decoded = decode_lines(log([_chunk(bomb, size)], b"", items_sha256="a" * 64))
    assert decoded.items is None
    assert decoded.items_error == (
        f"per-item scores of {size} bytes from {len(bomb)} compressed bytes exceed the "
        f"{protocol.MAX_INFLATE_RATIO}:1 compression ratio limit"
    )


def test_small_items_pass_any_ratio_a_metric_all_zero_compresses_far() -> None:
    # 500,000 documents all wrong: 62,500 zero bytes, a run of 'A' in base64.
    values = [0] * 500_000
    task = TaskItems(tuple(range(500_000)), "0" * 64, {"acc,none": metric_items(values)})
    raw = encode_item_scores(ItemScores({"t": task}))
    assert len(raw) > protocol.MAX_INFLATE_RATIO * len(zlib.compress(raw, 6))
    assert decode_lines(log(encode_items(raw, "r1"), raw)).items == raw


def test_too_many_items_chunks_are_refused_unread() -> None:
    total = MAX_ITEMS_CHUNKS + 1
    lines = [_chunk(b"x", 100, total=total, seq=seq) for seq in range(1, total + 1)]
    decoded = decode_lines(log(lines, b"", items_sha256="a" * 64))
    assert decoded.items_error == (
        f"a per-item scores set of {total} chunks exceeds the {MAX_ITEMS_CHUNKS} chunk limit "
        f"({ITEMS_LIMITS.max_encoded_chars} encoded characters)"
    )


def test_items_over_the_limits_are_never_written_by_the_encoder() -> None:
    raw = incompressible(200_000)
    try:
        encode_items(raw, "r1")
    except ValueError as exc:
        assert "compressed per-item scores of" in str(exc)
        assert f"exceed the {protocol.MAX_COMPRESSED_ITEMS_BYTES} byte limit" in str(exc)
    else:
        raise AssertionError("encode_items wrote items the decoder refuses")


def test_why_a_log_has_no_items() -> None:
    raw = items_bytes()
    no_samples = decode_lines(log([], raw, items_chunks=None, items_sha256=None))
    assert no_samples.items_error == (
        "no per-item scores: lm_eval wrote no samples (run it with --log_samples)"
    )
    note = "compressed per-item scores of 1 bytes exceed ...: read /out/lmeval-items.json"
    too_big = decode_lines(log([], raw, items_chunks=0, items_note=note))
    assert too_big.items_error == note
    assert too_big.outcome is not None and too_big.outcome.items_note == note
    cut = decode_lines(log([], raw, items_chunks=2))
    assert cut.items_error == (
        "log starts after the items chunks (2 expected): only the completed marker is present"
    )
    failed = decode_lines([encode_marker("failed", exit_code=1, message="x")])
    assert failed.items_error == "no per-item scores: the run ended with 'failed'"


def test_the_newest_items_set_wins() -> None:
    old, new = items_bytes(), items_bytes().replace(b'"m"', b'"n"')
    lines = log([*encode_items(old, "r0"), *encode_items(new, "r1")], new)
    assert decode_lines(lines).items == new


def test_the_items_chunks_fit_the_narrow_results_window() -> None:
    # Every results and items chunk is 3 runtime lines of 16 KiB; the window
    # holds them all and stays within a results read's byte limit.
    pieces = -(-protocol.MAX_RESULTS_MARKER_CHARS // outcome.RUNTIME_LINE_BYTES)
    needed = pieces * (protocol.MAX_RESULTS_CHUNKS + MAX_ITEMS_CHUNKS)
    assert needed + 8 <= outcome.RESULTS_TAIL_LINES
    assert outcome.RESULTS_TAIL_LINES * outcome.RUNTIME_LINE_BYTES <= LOG_READ_RESULTS_BYTES
    assert protocol.MAX_ENCODED_ITEMS_CHARS == MAX_ITEMS_CHUNKS * RESULTS_CHUNK_CHARS


def worst_final() -> FinalFields:
    wide = "é" * 1000  # 6 characters each in ASCII-only JSON
    path = "/" + "p" * 250
    return {
        "run_id": "r" * 64,
        "ts": 1.0,
        "exit_code": 0,
        "message": wide,
        "duration": 1.0,
        "signal": None,
        "child_exit_code": 0,
        "last_line": wide,
        "results_path": path,
        "results_file": path,
        "results_size": 1,
        "results_sha256": "a" * 64,
        "results_chunks": 0,
        "results_note": wide,
        "results_artifact_error": wide,
        "items_chunks": 0,
        "items_sha256": "b" * 64,
        "items_size": 1,
        "items_path": path,
        "items_note": wide,
        "driver_version": "0.1.0",
        "lm_eval_version": "0.4.13",
        "argv": protocol.bounded_argv([f"--arg{i}=" + "ü" * 3000 for i in range(1000)]),
        "server_models": "m" * 512,
        "task_sources": [{"name": "n" * 64, "commit": "c" * 64} for _ in range(64)],
    }


def test_a_worst_case_final_marker_fits_and_decodes() -> None:
    fields = worst_final()
    assert len(fields["argv"]) < 1000 and fields["argv"][-1].endswith("more arguments)")
    line = encode_final("completed", fields)
    assert len(line) <= MAX_MARKER_CHARS
    decoded = decode_lines([line])
    assert decoded.outcome is not None and decoded.outcome.event == "completed"
    assert decoded.outcome.driver_version == "0.1.0"
    assert decoded.outcome.items_path == fields["items_path"]
    # What did not fit was shortened (free texts to 100 characters), not lost.
    assert decoded.outcome.message.startswith("é" * 100)
    assert decoded.outcome.server_models is not None
    assert decoded.outcome.server_models.startswith("m" * 100)
    assert len(decoded.outcome.task_sources) == 64


def test_a_long_but_real_argv_survives_in_the_final_marker() -> None:
    # 60 tasks and a long model_args: as a poller-built command can be.
    argv = ["python", "-m", "lm_eval", "--model", "local-completions", "--model_args"]
    argv += ["model=m,base_url=https://models.example/v1/completions," + "x=1," * 200]
    argv += ["--tasks", ",".join(f"mmlu_subject_{i}" for i in range(60)), "--log_samples"]
    argv += [f"--flag{i}" for i in range(150)]
    fields = worst_final()
    fields.update(message="ok", last_line=None, results_note="n", results_artifact_error="e")
    fields.update(items_note="n", argv=protocol.bounded_argv(argv))
    assert fields["argv"] == argv
    decoded = decode_lines([encode_final("completed", fields)])
    assert decoded.outcome is not None and decoded.outcome.argv == tuple(argv)
