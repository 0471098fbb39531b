"""The contract in driver.protocol describes what the driver really writes and parses.

Three promises are checked here: every marker a real driver process writes
has exactly the typed payload its ``*Fields`` type declares (so the types
are the wire, not a wish); the command line built by ``run_argv`` and
``release_argv`` is read back by the driver's own parser as what was meant;
and the typed readers keep only well-typed values of an untrusted body.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest

from driver import __main__ as cli
from driver import contract, payloads, protocol
from driver.progress import Progress
from driver.protocol import (
    ENV_OUTPUT_ROOT,
    EVENT_RESULTS,
    FinalFields,
    ItemsChunkFields,
    ProgressFields,
    ResultsChunkFields,
    StartedFields,
    read_complete_fields,
    read_fields,
)
from tests.driver.conftest import WRITE_RESULTS, fake_child, run_driver

PAYLOADS: dict[str, Any] = {
    "started": StartedFields,
    "progress": ProgressFields,
    "results": ResultsChunkFields,
    "items": ItemsChunkFields,
    "completed": FinalFields,
    "failed": FinalFields,
    "cancelled": FinalFields,
}

PROGRESS_CHILD = (
    "import sys\n"
    "for i in range(1, 11):\n"
    "    sys.stderr.write(f'\\rRunning: {i*10}%|#| {i}/10 [00:00<00:01, 99.5it/s]')\n"
    "    sys.stderr.flush()\n"
    "sys.stderr.write('\\n')\n"
)


def _bodies(stdout: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[len(protocol.MARKER_PREFIX) :])
        for line in stdout.splitlines()
        if line.startswith(protocol.MARKER_PREFIX)
    ]


def _assert_payload_is_typed(body: dict[str, Any]) -> None:
    kind = PAYLOADS[body["event"]]
    payload = {k: v for k, v in body.items() if k not in ("v", "event")}
    assert set(payload) <= set(typing.get_type_hints(kind)), body
    assert read_complete_fields(payload, kind) == payload, body  # every value well typed


# After WRITE_RESULTS: a samples file of lm_eval's shape beside the results.
WRITE_SAMPLES = """
line = {"doc_id": 0, "filter": "none", "metrics": ["acc"], "doc_hash": "a" * 64, "acc": 1.0}
import json
with open(os.path.join(out, "fake", "samples_t_2026.jsonl"), "w") as g:
    g.write(json.dumps(line) + "\\n")
"""


@pytest.mark.parametrize(
    "child",
    [
        pytest.param(fake_child(PROGRESS_CHILD + WRITE_RESULTS), id="completed"),
        pytest.param(fake_child(WRITE_RESULTS + WRITE_SAMPLES), id="completed-with-items"),
        pytest.param(fake_child(PROGRESS_CHILD + "raise SystemExit(3)"), id="failed"),
        pytest.param(fake_child("import os; os.kill(os.getpid(), 9)"), id="killed"),
        pytest.param(fake_child("pass"), id="no-results"),
    ],
)
def test_every_marker_the_driver_writes_has_its_typed_payload(
    child: list[str], tmp_path: Path, env: dict[str, str]
) -> None:
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"results": {"t": {"acc,none": 0.5}}}), encoding="utf-8")
    env["FAKE_RESULTS"] = str(results)
    run = run_driver([f"{protocol.OPT_OUTPUT_ROOT}={tmp_path / 'root'}"], child, env)
    bodies = _bodies(run.out)
    assert bodies[0]["event"] == "started" and bodies[-1]["event"] in protocol.FINAL_EVENTS
    if "samples_t" in child[-1]:
        assert [b["event"] for b in bodies[-3:]] == ["results", "items", "completed"]
        assert bodies[-1]["items_chunks"] == 1
        # Back to back, the last lines written: the slow steps (samples, the
        # model server's identity) come before them, so a kubelet rotating the
        # log cannot leave the final marker without the results in one file.
        last = [line for line in run.out.splitlines() if line.strip()][-3:]
        assert all(line.startswith(protocol.MARKER_PREFIX) for line in last), last
    for body in bodies:
        _assert_payload_is_typed(body)


def test_a_usage_error_is_a_typed_final_marker(env: dict[str, str]) -> None:
    run = run_driver([f"{protocol.option_flag('grace_period')}=soon"], fake_child("pass"), env)
    assert run.returncode == protocol.EXIT_DRIVER_ERROR
    (body,) = _bodies(run.out)
    assert body["event"] == "failed"
    _assert_payload_is_typed(body)


def test_payload_builders_write_the_documented_bytes() -> None:
    progress = Progress("Running", 45.0, 45, 100, 1.0, 2.0, "30.00it/s")
    assert protocol.encode_progress(progress.marker_fields("r1", 1.5)) == (
        '::lmeval::{"v":1,"event":"progress","run_id":"r1","ts":1.5,"phase":"Running",'
        '"percent":45.0,"n":45,"total":100,"elapsed":1.0,"remaining":2.0,"rate":"30.00it/s"}'
    )
    final: FinalFields = {"exit_code": 72, "signal": None, "message": "usage"}
    assert protocol.encode_final("failed", final) == (
        '::lmeval::{"v":1,"event":"failed","exit_code":72,"signal":null,"message":"usage"}'
    )
    (chunk,) = protocol.encode_results(b"{}", "r1")
    body = json.loads(chunk[len(protocol.MARKER_PREFIX) :])
    order = ["v", "event", "seq", "run_id", "total", "sha256", "size", "encoding", "data"]
    assert list(body) == order
    assert body["event"] == EVENT_RESULTS


# -- the command line -------------------------------------------------------------------


def test_run_argv_round_trips_through_the_driver_parser(tmp_path: Path) -> None:
    child = ["python", "-m", "lm_eval", "--model=hf", "--output-root=not-ours", "--", "x"]
    argv = protocol.run_argv(
        protocol.driver_command(),
        child,
        protocol.RunArgs(
            output_root=str(tmp_path),
            grace_period=20,
            hold_seconds=2.5,
            log_copy="/outputs/pod.log",
            progress_interval=1,
            run_id="job-1",
        ),
    )
    assert argv[0] == protocol.DRIVER_PROGRAM
    options = cli.parse_run_options(argv[1:])
    assert options.child_argv == child  # everything after the first "--" is the child's
    assert options.output_root == str(tmp_path)
    assert (options.grace_period, options.hold_seconds) == (20.0, 2.5)
    assert (options.progress_interval, options.run_id) == (1.0, "job-1")
    assert options.log_copy == "/outputs/pod.log"


def test_run_argv_leaves_the_driver_defaults_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_OUTPUT_ROOT, "/from/env")
    monkeypatch.delenv(protocol.ENV_RUN_ID, raising=False)
    argv = protocol.run_argv(protocol.driver_command("python"), ["lm_eval"], protocol.RunArgs())
    assert argv == ["python", "-m", protocol.DRIVER_MODULE, protocol.END_OF_OPTIONS, "lm_eval"]
    options = cli.parse_run_options(argv[3:])
    assert options.output_root == "/from/env" and options.run_id is None
    assert (options.grace_period, options.hold_seconds, options.log_copy) == (20.0, 0.0, None)


def test_the_drivers_options_are_the_one_table() -> None:
    # The parser's options are exactly RunArgs's fields, under the same names:
    # an option added, renamed or removed on one side fails here.
    parser = cli._run_parser()
    flags = {
        flag
        for action in parser._actions
        for flag in action.option_strings
        if flag not in ("-h", "--help", "--version")
    }
    assert flags == {protocol.option_flag(field) for field in protocol.RunArgs._fields}
    dests = {a.dest for a in parser._actions} - {"help", "version"}
    assert dests == set(protocol.RunArgs._fields)


def test_release_argv_releases_the_same_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = protocol.release_argv(protocol.driver_command(), str(tmp_path))
    assert argv[:2] == [protocol.DRIVER_PROGRAM, protocol.CMD_RELEASE]
    assert cli.main(argv[1:]) == 0
    assert (tmp_path / ".release").exists()
    # Without a root, the driver's environment names it (the pod sets it).
    other = tmp_path / "env-root"
    monkeypatch.setenv(ENV_OUTPUT_ROOT, str(other))
    assert cli.main(protocol.release_argv([])) == 0
    assert (other / ".release").exists()
    assert "released" in capsys.readouterr().out


def test_shard_argv_round_trips_through_the_shards_parser(tmp_path: Path) -> None:
    from driver import shards
    from driver.argv import find_output_path_flag

    lm_args = ["--model=hf", "--tasks=a,b", "--limit=5", "--log_samples"]
    root = str(tmp_path / "claim")
    for argv, command in (
        (protocol.shard_run_argv(2, 8, root, lm_args), "run"),
        (protocol.shard_merge_argv(8, root, lm_args), "merge"),
    ):
        assert argv[:5] == ["python", "-P", "-m", protocol.SHARD_MODULE, command]
        split = argv.index(protocol.END_OF_OPTIONS)
        assert argv[split + 1 :] == lm_args
        assert all(word.startswith("--") and "=" in word for word in argv[5:split])
        opts = shards._parse(argv[4:split])
        assert (opts.command, opts.count, opts.root) == (command, 8, root)
        assert getattr(opts, "index", 2) == 2
        # The driver takes it as its child; none of its words reads as --output_path.
        options = cli.parse_run_options(protocol.run_argv([], argv, protocol.RunArgs()))
        assert options.child_argv == argv
        assert find_output_path_flag(argv[1:]) is None
    assert shards._parse(["merge", f"--count={protocol.MAX_SHARDS}", "--root=r"]).count == 32
    for bad in (
        ["merge", f"--count={protocol.MAX_SHARDS + 1}"],
        ["merge", "--count=0"],
        ["run", "--index=3", "--count=3"],
        ["run", "--count=3"],
    ):
        with pytest.raises(shards.ShardingRefusedError):
            shards._parse([*bad, "--root=r"])


def test_protocol_exports_the_whole_contract() -> None:
    for module in (contract, payloads):
        for name in module.__all__:
            assert getattr(protocol, name) is getattr(module, name)
            assert name in protocol.__all__
    for name in protocol.__all__:
        assert hasattr(protocol, name), name


# -- reading untrusted bodies ------------------------------------------------------------


def test_readers_keep_only_well_typed_values() -> None:
    body = {
        "percent": True,  # a bool is no number
        "n": 3,
        "total": 2.5,
        "phase": 5,
        "rate": None,
        "unknown": "x",
    }
    assert read_fields(body, ProgressFields) == {"n": 3, "total": 2.5, "rate": None}
    started = read_fields({"argv": ["a", 1], "pid": 7.0, "ts": 3}, StartedFields)
    assert started == {"ts": 3}  # a list with a non-string, a float pid: dropped


def test_complete_reader_wants_every_required_key() -> None:
    chunk = {
        "seq": 1,
        "run_id": "r",
        "total": 1,
        "sha256": "x",
        "size": 2,
        "encoding": protocol.RESULTS_ENCODING,
        "data": "eJw=",
    }
    assert read_complete_fields(chunk, ResultsChunkFields) == chunk
    assert read_complete_fields({**chunk, "seq": True}, ResultsChunkFields) is None
    assert (
        read_complete_fields({k: v for k, v in chunk.items() if k != "data"}, ResultsChunkFields)
        is None
    )
    # A final marker's details are optional; its exit code, message and signal are not.
    assert read_complete_fields({"exit_code": 0, "message": "", "signal": None}, FinalFields)
    assert read_complete_fields({"exit_code": 0, "message": ""}, FinalFields) is None


def test_marker_event_accepts_only_this_protocol() -> None:
    assert protocol.marker_event({"v": 1, "event": "progress"}) == "progress"
    assert protocol.marker_event({"v": True, "event": "progress"}) is None
    assert protocol.marker_event({"v": 2, "event": "progress"}) is None
    assert protocol.marker_event({"v": 1, "event": "bogus"}) is None


def test_signal_text() -> None:
    assert protocol.signal_text(9) == "signal 9 (SIGKILL)"
    assert protocol.signal_text(99) == "signal 99"
