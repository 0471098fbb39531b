"""Parsing tqdm redraws and lm_eval log lines, rate limiting, error lines.

The sample lines are copied from real lm_eval 0.4.13 output (its own bars
have no description, so the phase comes from the preceding log line).
"""

from __future__ import annotations

import pytest

from driver.progress import (
    ErrorLineTracker,
    Progress,
    ProgressTracker,
    log_message,
    parse_duration,
    parse_tqdm,
)


@pytest.mark.parametrize(
    ("line", "phase", "percent", "n", "total", "elapsed", "remaining"),
    [
        ("  0%|          | 0/24 [00:00<?, ?it/s]", "", 0.0, 0, 24, 0.0, None),
        (
            "100%|" + "\u2588" * 10 + "| 24/24 [00:00<00:00, 79450.12it/s]",
            "",
            100.0,
            24,
            24,
            0.0,
            0.0,
        ),
        (
            "Requesting API:  38%|\u2588\u2588\u2588\u258a      | 3/8 [00:01<00:02,  2.10it/s]",
            "Requesting API",
            37.5,
            3,
            8,
            1.0,
            2.0,
        ),
        (
            "Running: 45%|#####     | 45/100 [1:02:03<10:00:01, 30.00it/s]",
            "Running",
            45.0,
            45,
            100,
            3723.0,
            36001.0,
        ),
        (
            "Map: 50%|#####     | 1.20k/2.40k [00:03<00:03, 400 examples/s]",
            "Map",
            50.0,
            1200,
            2400,
            3.0,
            3.0,
        ),
        (
            "Generating test split: 8 examples [00:00, 2920.32 examples/s]",
            "Generating test split",
            None,
            8,
            None,
            0.0,
            None,
        ),
        (
            "Generating test split: 0 examples [00:00, ? examples/s]",
            "Generating test split",
            None,
            0,
            None,
            0.0,
            None,
        ),
    ],
)
def test_parse_tqdm(
    line: str,
    phase: str,
    percent: float | None,
    n: int,
    total: int | None,
    elapsed: float | None,
    remaining: float | None,
) -> None:
    p = parse_tqdm(line)
    assert p is not None
    assert (p.phase, p.percent, p.n, p.total, p.elapsed, p.remaining) == (
        phase,
        percent,
        n,
        total,
        elapsed,
        remaining,
    )
    assert p.rate


@pytest.mark.parametrize(
    "line",
    [
        "",
        "2026-11-29:22:45:41 INFO     [evaluator:589] Running loglikelihood requests",
        "|toy_mc|Yaml|none|  0|acc|\u2191  |0.125|\u00b1  |0.125|",
        "ValueError: Tasks not found: x [really]",
        "50%| " + "x" * 5000 + " | 1/2 [00:00<00:00, 1it/s]",
        "nonsense [00:00<00:00]",
    ],
)
def test_not_tqdm(line: str) -> None:
    assert parse_tqdm(line) is None


def test_durations() -> None:
    assert parse_duration("00:05") == 5.0
    assert parse_duration("1:00:00") == 3600.0
    assert parse_duration("2d, 01:00:00") == 2 * 86400 + 3600.0
    assert parse_duration("?") is None
    assert parse_duration("") is None


def test_log_message() -> None:
    assert log_message(
        "2026-11-29:22:45:41 INFO     [api.task:312] Building contexts for t on rank 0..."
    ) == (
        "INFO",
        "Building contexts for t on rank 0...",
    )
    assert log_message("Traceback (most recent call last):") is None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def bar(n: int, total: int = 100, desc: str = "") -> str:
    head = f"{desc}: " if desc else ""
    return f"{head}{100 * n // total:3d}%|#         | {n}/{total} [00:01<00:02, 3.00it/s]"


def test_phase_comes_from_the_last_info_line() -> None:
    seen: list[Progress] = []
    tracker = ProgressTracker(0, seen.append)
    tracker.feed("2026-11-29:22:45:41 INFO     [evaluator:589] Running loglikelihood requests")
    tracker.feed("2026-11-29:22:45:41 WARNING  [evaluator:1] something odd")
    tracker.feed(bar(5))
    tracker.feed(bar(6, desc="Requesting API"))
    assert [p.phase for p in seen] == ["Running loglikelihood requests", "Requesting API"]


def test_rate_limit_reports_first_then_at_most_one_per_interval() -> None:
    clock = Clock()
    seen: list[Progress] = []
    tracker = ProgressTracker(5.0, seen.append, clock=clock)
    for n in range(100):  # 100 redraws within 0.99 s
        tracker.feed(bar(n))
        clock.now += 0.01
    assert [p.n for p in seen] == [0]
    clock.now += 5
    tracker.feed(bar(100))
    assert [p.n for p in seen] == [0, 100]
    tracker.flush()  # already reported: nothing new
    assert len(seen) == 2


def test_flush_reports_the_newest_unreported_state() -> None:
    clock = Clock()
    seen: list[Progress] = []
    tracker = ProgressTracker(5.0, seen.append, clock=clock)
    tracker.feed(bar(1))
    tracker.feed(bar(99))
    tracker.flush()
    assert [p.n for p in seen] == [1, 99]


def test_phase_change_reports_previous_phase_end_but_cannot_flood() -> None:
    clock = Clock()
    seen: list[Progress] = []
    tracker = ProgressTracker(5.0, seen.append, clock=clock)
    tracker.feed(bar(1, desc="A"))
    clock.now += 2
    tracker.feed(bar(100, desc="A"))
    tracker.feed(bar(1, desc="B"))
    assert [(p.phase, p.n) for p in seen] == [("A", 1), ("A", 100)]
    # Alternating phases very fast: bounded by min(1 s, interval) spacing.
    for i in range(1000):
        tracker.feed(bar(i % 100, desc="C" if i % 2 else "D"))
        clock.now += 0.001
    assert len(seen) <= 4


def test_error_line_prefers_the_exception_line() -> None:
    tracker = ErrorLineTracker()
    for line in [
        "2026-11-29:22:45:41 INFO     [_cli.run:391] Including path: /x",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "ValueError: Tasks not found: nope_x",
        "  0%|          | 0/8 [00:00<?, ?it/s]",
        "",
    ]:
        tracker.feed(line)
    assert tracker.best() == "ValueError: Tasks not found: nope_x"


def test_error_line_falls_back_to_error_log_then_last_line() -> None:
    tracker = ErrorLineTracker()
    tracker.feed("2026-11-29:22:45:41 ERROR    [x:1] API request failed after multiple retries.")
    tracker.feed("some trailing chatter")
    assert (
        tracker.best()
        == "2026-11-29:22:45:41 ERROR    [x:1] API request failed after multiple retries."
    )
    other = ErrorLineTracker()
    other.feed("just a line")
    assert other.best() == "just a line"
    assert ErrorLineTracker().best() is None
    warn = ErrorLineTracker()
    warn.feed(
        "2026-11-29:22:45:41 WARNING  [loggers.evaluation_tracker:310] "
        "Could not save results aggregated"
    )
    warn.feed("2026-11-29:22:45:41 INFO     [x:1] OSError(36, 'File name too long')")
    assert (
        warn.last_warning()
        == "Could not save results aggregated: OSError(36, 'File name too long')"
    )


def test_error_line_with_its_message_below_names_the_last_line() -> None:
    # numpy's ImportError (seen on a base image without libstdc++) prints its
    # advice after the exception line, and the cause last.
    tracker = ErrorLineTracker()
    for line in [
        '  File "/opt/lmeval/lib/python3.11/site-packages/numpy/_core/__init__.py", line 85',
        "    raise ImportError(msg) from exc",
        "ImportError: ",
        "",
        "IMPORTANT: PLEASE READ THIS FOR ADVICE ON HOW TO SOLVE THIS ISSUE!",
        "Original error was: libstdc++.so.6: cannot open shared object file: No such file",
    ]:
        tracker.feed(line)
    assert tracker.best() == (
        "ImportError: Original error was: libstdc++.so.6: cannot open shared object file: "
        "No such file"
    )
