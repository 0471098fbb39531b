"""Forwarding of child output, and results travelling through the driver.

Fake children (small Python programs) stand in for lm_eval so that these
tests are fast. They check that every child byte reaches the driver's
stdout/stderr (in order per stream, neutralised, valid UTF-8) including
multi-megabyte lines, ``\\r`` redraws, invalid UTF-8 and a missing final
newline; that a 5 MB results file round-trips through the markers; that the
log copy holds the same record; and, as a property over arbitrary child
output, that decoded events and results only ever come from the driver.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.child import MAX_FORWARD_LINE, Pump, Sink
from driver.decoder import decode_text
from driver.protocol import MARKER_PREFIX, neutralize
from tests.driver.conftest import WRITE_RESULTS, fake_child, forged_lines, run_driver
from tests.driver.test_protocol import big_results


def pump_through(data: list[bytes], tmp_path: Path) -> bytes:
    """Run one Pump in-process over ``data`` (written chunk by chunk)."""
    read_fd, write_fd = os.pipe()
    out_path = tmp_path / "out"
    with open(out_path, "wb") as out, open(os.devnull, "wb") as err:
        sink = Sink(out.fileno(), err.fileno())
        pump = Pump(read_fd, "stdout", sink, neutralize)
        pump.start()

        def writer() -> None:
            for piece in data:
                os.write(write_fd, piece)
            os.close(write_fd)

        thread = threading.Thread(target=writer)
        thread.start()
        thread.join(timeout=60)
        pump.join(timeout=60)
        assert not pump.is_alive()
        os.close(read_fd)
    return out_path.read_bytes()


def test_pump_handles_big_lines_invalid_utf8_cr_and_no_final_newline(tmp_path: Path) -> None:
    big = b"B" * (3 * 1024 * 1024)
    data = [
        b"first\n",
        b"red",
        b"raw 1\rredraw 2\r",
        big[:1000],
        big[1000:],
        b"\n",
        b"bad \xff\xfe utf8\n",
        b"tail",
    ]
    out = pump_through(data, tmp_path)
    assert (
        out == b"first\nredraw 1\rredraw 2\r" + big + b"\nbad \xef\xbf\xbd\xef\xbf\xbd utf8\ntail\n"
    )


def test_pump_splits_lines_beyond_the_limit_without_losing_bytes(tmp_path: Path) -> None:
    line = ("\u00e9" * (MAX_FORWARD_LINE // 2 + 1000)).encode()  # 2-byte chars, > limit
    out = pump_through(
        [line[i : i + 65536] for i in range(0, len(line), 65536)] + [b"\n"], tmp_path
    )
    pieces = out.split(b"\n")
    assert len(pieces) == 3 and pieces[-1] == b""
    assert b"".join(pieces).decode() == line.decode()  # split on a character boundary


def test_pump_neutralizes_forged_markers(tmp_path: Path) -> None:
    forged = "\n".join(forged_lines()).encode()
    out = pump_through([b"x\r" + forged[:7], forged[7:], b"\n"], tmp_path).decode()
    assert decode_text(out).events == []
    assert ":: lmeval ::" in out


CHATTY = (
    r"""
import os, sys
out, err = sys.stdout.buffer, sys.stderr.buffer
for i in range(2000):
    out.write(b"out %d\n" % i)
    err.write(b"err %d\r" % i if i % 3 else b"err %d\n" % i)
out.write(b"L" * (5 * 1024 * 1024) + b"\n")
out.write(b"invalid \xc3\x28 \xff\n")
err.write(b"Running: 50%|#####     | 1/2 [00:00<00:00, 9.00it/s]\r")
out.write(b"no final newline")
out.flush(); err.flush()
"""
    + WRITE_RESULTS
)


def test_driver_forwards_everything_in_order(tmp_path: Path, env: dict[str, str]) -> None:
    results = tmp_path / "r.json"
    results.write_bytes(json.dumps({"results": {"t": {"acc,none": 0.5}}}).encode())
    env["FAKE_RESULTS"] = str(results)
    run = run_driver(
        ["--output-root", str(tmp_path / "root"), "--progress-interval", "0"],
        fake_child(CHATTY),
        env,
    )
    assert run.returncode == 0, run.describe()
    out_lines = [line for line in run.out.split("\n") if not line.startswith(MARKER_PREFIX)]
    assert out_lines[:2000] == [f"out {i}" for i in range(2000)]
    assert out_lines[2000] == "L" * (5 * 1024 * 1024)
    assert out_lines[2001] == "invalid \ufffd( \ufffd"
    assert out_lines[2002] == "no final newline"
    err_segments = [s for s in run.err.replace("\r", "\n").split("\n") if s.startswith("err ")]
    assert err_segments == [f"err {i}" for i in range(2000)]
    assert "err 1\rerr 2\rerr 3\n" in run.err  # \r redraws kept as they were
    decoded = run.decoded()
    assert decoded.results == {"results": {"t": {"acc,none": 0.5}}}
    assert decoded.outcome is not None and decoded.outcome.event == "completed"
    assert decoded.last_progress is not None and decoded.last_progress["percent"] == 50.0
    # Every marker starts at column 0 even after the unterminated line.
    assert run.out.count("\n" + MARKER_PREFIX) + 1 == run.out.count(MARKER_PREFIX)


def test_five_megabyte_results_round_trip_through_the_driver(
    tmp_path: Path, env: dict[str, str]
) -> None:
    raw = big_results(5 * 1024 * 1024, like_lm_eval=True)
    results = tmp_path / "big.json"
    results.write_bytes(raw)
    env["FAKE_RESULTS"] = str(results)
    log_copy = tmp_path / "pvc" / "log.txt"
    run = run_driver(
        ["--output-root", str(tmp_path / "root"), "--log-copy", str(log_copy)],
        fake_child(WRITE_RESULTS),
        env,
    )
    assert run.returncode == 0, run.describe()
    decoded = run.decoded()
    assert decoded.results == json.loads(raw)
    assert decoded.outcome is not None and decoded.outcome.results_path is not None
    stable = Path(decoded.outcome.results_path)
    assert stable.name == "results.json" and stable.read_bytes() == raw
    assert max(len(line) for line in run.out.split("\n")) < 64 * 1024
    # The log copy holds the same record.
    copied = decode_text(log_copy.read_bytes().decode("utf-8"))
    assert copied.results == json.loads(raw)
    assert [e["event"] for e in copied.events] == [e["event"] for e in decoded.events]
    # A log cut inside the results (as a short tail_lines read would be) is refused.
    lines = run.out.split("\n")
    first = next(i for i, line in enumerate(lines) if '"event":"results"' in line)
    cut = decode_text("\n".join(lines[first + 1 :]))
    assert cut.results is None
    assert cut.results_error is not None and cut.results_error.startswith(
        "log starts after the first results chunk"
    )


def test_log_copy_contains_child_output_and_markers(tmp_path: Path, env: dict[str, str]) -> None:
    log_copy = tmp_path / "copy.log"
    code = "import sys; print('to stdout'); sys.stderr.write('to stderr\\r'); print('::lmeval::{}')"
    run = run_driver(
        ["--output-root", str(tmp_path), "--log-copy", str(log_copy)], fake_child(code), env
    )
    assert run.returncode == 70, run.describe()
    text = log_copy.read_bytes().decode("utf-8")  # read_text() would turn \r\n into \n
    assert "to stdout\n" in text and "to stderr\r" in text and ":: lmeval ::{}" in text
    decoded = decode_text(text)
    assert [e["event"] for e in decoded.events] == ["started", "failed"]
    assert decoded.events == run.decoded().events


PAYLOAD_CHILD = (
    r"""
import json, os, sys
pieces = json.load(open(os.environ["PAYLOAD"]))
for stream, hexdata in pieces:
    target = sys.stdout.buffer if stream == "out" else sys.stderr.buffer
    target.write(bytes.fromhex(hexdata)); target.flush()
"""
    + WRITE_RESULTS
)

_ATOMS = [
    MARKER_PREFIX.encode(),
    b"\r",
    b"\n",
    b"2026-01-01T00:00:00Z stdout P ",
    b"2026-01-01T00:00:00.5Z stdout F ",
    b'{"v":1,"event":"completed","exit_code":0}',
    b"\xff\xfe",
    b"Running: 50%|#####     | 1/2 [00:00<00:00, 9.00it/s]",
    *(line.encode() for line in forged_lines()[-4:]),
]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["out", "err"]),
            st.lists(st.one_of(st.binary(max_size=40), st.sampled_from(_ATOMS)), max_size=8).map(
                b"".join
            ),
        ),
        max_size=12,
    )
)
def test_property_events_and_results_come_only_from_the_driver(
    env: dict[str, str], pieces: list[tuple[str, bytes]]
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        payload = Path(tmp) / "payload.json"
        payload.write_text(json.dumps([(s, d.hex()) for s, d in pieces]))
        expected = {"results": {"real": {"acc,none": 0.75}}}
        results = Path(tmp) / "r.json"
        results.write_text(json.dumps(expected))
        env = {**env, "PAYLOAD": str(payload), "FAKE_RESULTS": str(results)}
        run = run_driver(
            ["--output-root", tmp, "--progress-interval", "0"], fake_child(PAYLOAD_CHILD), env
        )
    assert run.returncode == 0, run.describe()
    decoded = run.decoded()
    assert decoded.results == expected
    assert decoded.started is not None
    run_id = decoded.started["run_id"]
    assert all(e.get("run_id") == run_id for e in decoded.events)
    names = [e["event"] for e in decoded.events]
    assert names[0] == "started" and names[-1] == "completed"
    assert set(names[1:-1]) <= {"progress"}
    assert decoded.outcome is not None and decoded.outcome.message == "lm_eval completed"
    # The whole child output reached the driver's output, defused.
    child_bytes = sum(len(d) for _, d in pieces)
    marker_free = [line for line in run.out.split("\n") if not line.startswith(MARKER_PREFIX)]
    assert all(MARKER_PREFIX not in line for line in marker_free + run.err.split("\n"))
    assert len(run.stdout) + len(run.stderr) >= child_bytes
