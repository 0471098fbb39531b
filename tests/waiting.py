"""Wait on conditions with a deadline, never on fixed sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None], *, timeout: float = 30.0, interval: float = 0.1, what: str = ""
) -> T:
    """Call `probe` until it returns something truthy, and return that.

    Raises AssertionError naming `what` and the last value seen on timeout.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what or probe}: {last!r}"
            )
        time.sleep(interval)
