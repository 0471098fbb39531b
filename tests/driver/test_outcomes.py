"""Outcomes, exit codes, cancellation, exec hold and the CLI, with fake children.

Each case of the failure matrix that does not need lm_eval itself is played
by a small Python child: a non-zero exit with a traceback, a SIGKILL (what
an OOM kill looks like), an exit 0 without results, SIGTERM/SIGINT to the
driver (with children that die, ignore the signal, or leave grandchildren),
a driver that is itself SIGKILLed. Each must give the specified final
marker, message and exit code, and leave no process behind. The exec hold,
``release``, ``decode`` and start-up cost are checked here too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from driver.decoder import decode_text
from driver.protocol import EXIT_CANCELLED, EXIT_DRIVER_ERROR, EXIT_NO_RESULTS
from tests.driver.conftest import (
    WRITE_RESULTS,
    DriverRun,
    LiveDriver,
    fake_child,
    pid_alive,
    run_driver,
)
from tests.waiting import wait_for


def only_final(run: DriverRun) -> dict[str, object]:
    finals = [e for e in run.decoded().events if e["event"] in ("completed", "failed", "cancelled")]
    assert len(finals) == 1, run.describe()
    return finals[0]


def test_nonzero_exit_reports_last_exception_line(tmp_path: Path, env: dict[str, str]) -> None:
    code = "import sys; print('partial table'); raise RuntimeError('boom: model exploded')"
    run = run_driver(
        ["--output-root", str(tmp_path)], [*fake_child(code), "--exit", "ignored"], env
    )
    assert run.returncode == 1, run.describe()
    final = only_final(run)
    assert final["event"] == "failed" and final["exit_code"] == 1
    assert final["message"] == "RuntimeError: boom: model exploded"
    assert final["signal"] is None
    outcome = run.decoded().outcome
    assert outcome is not None and outcome.exit_code == 1 and outcome.event == "failed"


def test_exit_code_is_passed_through(tmp_path: Path, env: dict[str, str]) -> None:
    run = run_driver(["--output-root", str(tmp_path)], fake_child("import sys; sys.exit(3)"), env)
    assert run.returncode == 3
    assert only_final(run)["message"] == "lm_eval exited with code 3"


def test_sigkill_is_reported_like_an_oom_kill(tmp_path: Path, env: dict[str, str]) -> None:
    code = (
        "import os, signal, sys; sys.stderr.write('loading\\n'); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    run = run_driver(["--output-root", str(tmp_path)], fake_child(code), env)
    assert run.returncode == 128 + 9, run.describe()
    final = only_final(run)
    assert final["event"] == "failed"
    assert final["signal"] == 9 and final["exit_code"] == 137
    assert final["message"] == "killed by signal 9 (SIGKILL)"


def test_exit_zero_without_results_is_its_own_failure(tmp_path: Path, env: dict[str, str]) -> None:
    # A results file from an earlier run on the same volume must not count.
    old = tmp_path / "run-earlier" / "dummy"
    old.mkdir(parents=True)
    (old / "results_2020.json").write_text('{"results": {}}')
    warning = "2026-11-29:22:45:41 WARNING  [x:1] Could not save results aggregated"
    code = f"import sys; sys.stderr.write({warning!r} + '\\n')"
    run = run_driver(["--output-root", str(tmp_path)], fake_child(code), env)
    assert run.returncode == EXIT_NO_RESULTS, run.describe()
    final = only_final(run)
    run_dir = run.decoded().started["output_dir"]  # type: ignore[index]
    assert final["event"] == "failed" and final["exit_code"] == 70
    assert str(final["message"]).startswith(
        f"lm_eval exited 0 but wrote no results file in {run_dir}"
    )
    assert "Could not save results aggregated" in str(final["message"])
    assert run.decoded().results is None


def test_unparseable_results_file(tmp_path: Path, env: dict[str, str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    env["FAKE_RESULTS"] = str(bad)
    run = run_driver(["--output-root", str(tmp_path / "root")], fake_child(WRITE_RESULTS), env)
    assert run.returncode == EXIT_NO_RESULTS
    assert "is unusable" in str(only_final(run)["message"])


@pytest.mark.parametrize("flag", [["--output_path", "/x"], ["-o", "/x"], ["--output=/x"]])
def test_command_setting_output_path_is_refused(
    tmp_path: Path, env: dict[str, str], flag: list[str]
) -> None:
    touched = tmp_path / "child-ran"
    run = run_driver(
        ["--output-root", str(tmp_path)], fake_child(f"open({str(touched)!r}, 'w')") + flag, env
    )
    assert run.returncode == EXIT_DRIVER_ERROR
    assert "the driver owns it" in str(only_final(run)["message"])
    assert not touched.exists()


@pytest.mark.parametrize(
    ("options", "child", "expected"),
    [
        (["--output-root", "/proc/lmeval-not-writable"], None, "cannot create run directory"),
        ([], ["/nonexistent/lm_eval"], "cannot start '/nonexistent/lm_eval'"),
        (["--run-id", "../escape"], None, "invalid run id"),
        (["--grace-period", "-1"], None, "usage error"),
        (["--bogus-option"], None, "usage error"),
    ],
)
def test_driver_errors(
    tmp_path: Path, env: dict[str, str], options: list[str], child: list[str] | None, expected: str
) -> None:
    if "--output-root" not in options:
        options = ["--output-root", str(tmp_path), *options]
    run = run_driver(options, child or fake_child("pass"), env)
    assert run.returncode == EXIT_DRIVER_ERROR, run.describe()
    final = only_final(run)
    assert final["event"] == "failed" and final["exit_code"] == EXIT_DRIVER_ERROR
    assert expected in str(final["message"])


def test_missing_separator_and_reused_run_id(tmp_path: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "driver", "--output-root", str(tmp_path)],
        capture_output=True,
        env=env,
    )
    assert proc.returncode == EXIT_DRIVER_ERROR
    assert decode_text(proc.stdout.decode()).outcome is not None
    first = run_driver(
        ["--output-root", str(tmp_path), "--run-id", "job-1"], fake_child("pass"), env
    )
    assert first.returncode == EXIT_NO_RESULTS
    again = run_driver(
        ["--output-root", str(tmp_path), "--run-id", "job-1"], fake_child("pass"), env
    )
    assert again.returncode == EXIT_DRIVER_ERROR
    assert "already exists" in str(only_final(again)["message"])


def test_secrets_never_reach_the_log(tmp_path: Path, env: dict[str, str]) -> None:
    child = [
        *fake_child("pass"),
        "--model_args",
        "model=m,api_key=SUPERSECRET1",
        "--api_key",
        "SUPERSECRET2",
    ]
    run = run_driver(["--output-root", str(tmp_path)], child, env)
    started = run.decoded().started
    assert started is not None and "model=m,api_key=***" in started["argv"]
    assert "SUPERSECRET" not in run.out and "SUPERSECRET" not in run.err


SLEEPER = """
import os, signal, subprocess, sys, time
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, lambda *_: print("GOT TERM", flush=True))
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("READY", grandchild.pid, flush=True)
time.sleep(600)
"""


def start_sleeper(
    tmp_path: Path, env: dict[str, str], live: list[LiveDriver], *extra: str, grace: str = "20"
) -> tuple[LiveDriver, int, int]:
    driver = LiveDriver(
        ["--output-root", str(tmp_path), "--grace-period", grace],
        fake_child(SLEEPER) + list(extra),
        env,
    )
    live.append(driver)
    line = wait_for(
        lambda: next((ln for ln in driver.output().splitlines() if ln.startswith("READY")), None),
        timeout=60,
        what="child ready",
    )
    child_pid = int(driver.wait_event("started")["pid"])  # type: ignore[call-overload]
    return driver, child_pid, int(line.split()[1])


def test_sigterm_cancels_within_the_grace_period_without_orphans(
    tmp_path: Path, env: dict[str, str], live_drivers: list[LiveDriver]
) -> None:
    driver, child_pid, grandchild_pid = start_sleeper(tmp_path, env, live_drivers)
    sent = driver.send(signal.SIGTERM)
    run = driver.finish(timeout=60)
    took = time.monotonic() - sent
    assert run.returncode == EXIT_CANCELLED, run.describe()
    assert took < 20
    final = only_final(run)
    assert final["event"] == "cancelled" and final["signal"] == signal.SIGTERM
    assert final["message"] == "cancelled by SIGTERM: lm_eval was stopped with SIGTERM"
    assert final["killed"] is False
    assert not pid_alive(child_pid)
    wait_for(lambda: not pid_alive(grandchild_pid), timeout=10, what="grandchild gone")


def test_child_ignoring_sigterm_is_killed_after_the_grace_period(
    tmp_path: Path, env: dict[str, str], live_drivers: list[LiveDriver]
) -> None:
    driver, child_pid, grandchild_pid = start_sleeper(
        tmp_path, env, live_drivers, "--ignore-term", grace="1"
    )
    sent = driver.send(signal.SIGTERM)
    run = driver.finish(timeout=60)
    took = time.monotonic() - sent
    assert run.returncode == EXIT_CANCELLED, run.describe()
    assert 1 <= took < 10
    assert "GOT TERM" in run.out
    final = only_final(run)
    assert final["killed"] is True
    assert "did not stop within 1 s and was killed (SIGKILL)" in str(final["message"])
    assert not pid_alive(child_pid)
    wait_for(lambda: not pid_alive(grandchild_pid), timeout=10, what="grandchild gone")


def test_second_signal_kills_at_once_and_sigint_is_a_cancel(
    tmp_path: Path, env: dict[str, str], live_drivers: list[LiveDriver]
) -> None:
    driver, child_pid, _ = start_sleeper(tmp_path, env, live_drivers, "--ignore-term", grace="300")
    driver.send(signal.SIGINT)
    wait_for(
        lambda: "GOT TERM" in driver.output(), timeout=30, what="SIGTERM forwarded to the child"
    )
    assert driver.proc.poll() is None  # still within the (long) grace period
    sent = driver.send(signal.SIGTERM)
    run = driver.finish(timeout=60)
    assert time.monotonic() - sent < 30
    assert run.returncode == EXIT_CANCELLED
    final = only_final(run)
    assert final["signal"] == signal.SIGINT and final["killed"] is True
    assert not pid_alive(child_pid)


def test_child_dies_with_a_sigkilled_driver(
    tmp_path: Path, env: dict[str, str], live_drivers: list[LiveDriver]
) -> None:
    driver, child_pid, _ = start_sleeper(tmp_path, env, live_drivers)
    driver.send(signal.SIGKILL)
    driver.finish(timeout=30)
    wait_for(lambda: not pid_alive(child_pid), timeout=10, what="child killed with its driver")


def test_exec_hold_until_release(
    tmp_path: Path, env: dict[str, str], live_drivers: list[LiveDriver]
) -> None:
    results = tmp_path / "r.json"
    results.write_text('{"results": {}}')
    env["FAKE_RESULTS"] = str(results)
    root = tmp_path / "root"
    root.mkdir()
    stale = root / ".release"
    stale.touch()
    os.utime(stale, (time.time() - 3600, time.time() - 3600))  # from an earlier pod: ignored
    driver = LiveDriver(
        ["--output-root", str(root), "--hold-seconds", "120"], fake_child(WRITE_RESULTS), env
    )
    live_drivers.append(driver)
    completed = driver.wait_event("completed")
    path = Path(str(completed["results_path"]))
    assert json.loads(path.read_text()) == {"results": {}}  # what `exec cat` reads
    wait_for(
        lambda: "holding for up to 120 s" in driver.output("stderr"), timeout=30, what="hold note"
    )
    assert driver.proc.poll() is None
    release = subprocess.run(
        [sys.executable, "-m", "driver", "release", "--output-root", str(root)],
        capture_output=True,
        env=env,
    )
    assert release.returncode == 0
    run = driver.finish(timeout=30)
    assert run.returncode == 0
    assert run.elapsed < 60


def test_exec_hold_times_out_and_keeps_the_exit_code(tmp_path: Path, env: dict[str, str]) -> None:
    run = run_driver(
        ["--output-root", str(tmp_path), "--hold-seconds", "1"],
        fake_child("raise SystemExit(4)"),
        env,
    )
    assert run.returncode == 4
    assert run.elapsed >= 1


def test_sigterm_ends_the_hold(
    tmp_path: Path, env: dict[str, str], live_drivers: list[LiveDriver]
) -> None:
    driver = LiveDriver(
        ["--output-root", str(tmp_path), "--hold-seconds", "300"],
        fake_child("raise SystemExit(5)"),
        env,
    )
    live_drivers.append(driver)
    driver.wait_event("failed")
    wait_for(lambda: "holding" in driver.output("stderr"), timeout=30, what="hold note")
    sent = driver.send(signal.SIGTERM)
    run = driver.finish(timeout=30)
    assert run.returncode == 5
    assert time.monotonic() - sent < 10
    assert [e["event"] for e in run.decoded().events] == ["started", "failed"]


def test_progress_markers_are_rate_limited(tmp_path: Path, env: dict[str, str]) -> None:
    code = (
        "import sys\n"
        "for i in range(1, 501):\n"
        "    sys.stderr.write(f'\\rRequesting API: {i//5}%|#| {i}/500 [00:00<00:01, 999it/s]')\n"
        "    sys.stderr.flush()\n"
    )
    run = run_driver(["--output-root", str(tmp_path)], fake_child(code), env)
    progress = run.events("progress")
    assert 1 <= len(progress) <= 3, progress
    assert progress[-1]["n"] == 500 and progress[-1]["percent"] == 100.0
    assert progress[-1]["phase"] == "Requesting API"


def test_decode_command_reads_files_and_stdin(tmp_path: Path, env: dict[str, str]) -> None:
    results = tmp_path / "r.json"
    results.write_text('{"results": {"t": {"acc,none": 1}}}')
    env["FAKE_RESULTS"] = str(results)
    run = run_driver(["--output-root", str(tmp_path / "root")], fake_child(WRITE_RESULTS), env)
    log = tmp_path / "pod.log"
    log.write_bytes(run.stdout)
    by_file = subprocess.run(
        [sys.executable, "-m", "driver", "decode", str(log)], capture_output=True, env=env
    )
    by_stdin = subprocess.run(
        [sys.executable, "-m", "driver", "decode"], input=run.stdout, capture_output=True, env=env
    )
    assert by_file.returncode == by_stdin.returncode == 0
    parsed = json.loads(by_file.stdout)
    assert parsed == json.loads(by_stdin.stdout)
    assert parsed["results"] == {"results": {"t": {"acc,none": 1}}}
    assert parsed["outcome"]["event"] == "completed" and parsed["results_error"] is None
    assert [e["event"] for e in parsed["events"]] == ["started", "completed"]


def test_help_is_fast_and_imports_nothing_heavy(env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "driver", "--help"], capture_output=True, env=env
    )
    assert proc.returncode == 0
    assert b"--hold-seconds" in proc.stdout
    imported = {
        line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines() if "|" in line
    }
    # (argparse itself pulls in shutil, hence zlib, to size the help text.)
    for heavy in (
        "dataclasses",
        "json",
        "hashlib",
        "importlib.metadata",
        "lm_eval",
        "kubernetes",
        "poller",
    ):
        assert heavy not in imported, heavy
    cumulative = sum(
        int(line.split("|")[0].split(":")[1])
        for line in proc.stderr.decode().splitlines()
        if line.startswith("import time:") and "self" not in line
    )
    assert cumulative < 200_000  # microseconds of self time; ~30 ms on a quiet machine


# The modules that run as lm_eval's child in the job image (``python -m
# driver.shards``, a sharded job's shard and merge pods): they load lm_eval,
# and nothing else of the driver imports them.
LM_EVAL_CHILD = {"shards.py", "shardplan.py", "shardmerge.py"}


def test_driver_package_imports_only_the_standard_library() -> None:
    driver_dir = Path(__file__).resolve().parents[2] / "driver"
    pattern = re.compile(r"^\s*(?:import|from)\s+(kubernetes|poller|lm_eval)\b", re.MULTILINE)
    child = re.compile(r"^\s*(?:import|from)\s+driver\.(shards|shardplan|shardmerge)\b", re.M)
    sources = list(driver_dir.glob("*.py"))
    assert len(sources) >= 6
    assert {source.name for source in sources} >= LM_EVAL_CHILD
    for source in sources:
        text = source.read_text()
        assert pattern.search(text) is None, source.name
        if source.name not in LM_EVAL_CHILD:
            assert child.search(text) is None, f"{source.name} imports lm_eval's child modules"
    for name in LM_EVAL_CHILD:
        # They name lm_eval where it is loaded (in the job image only).
        assert "lm_eval" in (driver_dir / name).read_text(), name


def test_internal_driver_error_still_ends_in_a_final_marker(
    tmp_path: Path, env: dict[str, str]
) -> None:
    # Break the driver on purpose (after the child ran) to see the safety net.
    code = (
        "import sys, driver.run as r\n"
        "def boom(run_dir): raise RuntimeError('injected bug')\n"
        "r.find_results = boom\n"
        "from driver.__main__ import main\n"
        f"args = ['--output-root', {str(tmp_path)!r}, '--', sys.executable, '-c', 'pass']\n"
        "sys.exit(main(args))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=60)
    assert proc.returncode == EXIT_DRIVER_ERROR
    decoded = decode_text(proc.stdout.decode())
    assert [e["event"] for e in decoded.events] == ["started", "failed"]
    assert decoded.outcome is not None
    assert decoded.outcome.message == "internal driver error: RuntimeError('injected bug')"
    assert b"injected bug" in proc.stderr
