"""`poller.malloc`: the service's malloc settings (one arena, a fixed mapping threshold).

Checks: on glibc (this machine, the images) `tune_malloc` sets both through
mallopt and says so; a setting the environment already makes is left to it
(an operator's MALLOC_ARENA_MAX wins); `release_freed_memory` runs. Each case
runs in a fresh interpreter, since mallopt changes the process for good. What
the settings save is measured by tests/bench/history.py, not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from poller import malloc

PROGRAM = (
    "import json; from poller import malloc; "
    "print(json.dumps(malloc.tune_malloc())); malloc.release_freed_memory()"
)


def _tuned(**environ: str) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        env={**env, **environ},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, int] = json.loads(done.stdout)
    return result


@pytest.mark.skipif(malloc._libc() is None, reason="not glibc")
def test_one_arena_and_a_fixed_mapping_threshold_on_glibc() -> None:
    assert _tuned() == {
        "MALLOC_ARENA_MAX": malloc.ARENAS,
        "MALLOC_MMAP_THRESHOLD_": malloc.MMAP_THRESHOLD,
    }


@pytest.mark.skipif(malloc._libc() is None, reason="not glibc")
def test_the_environment_wins() -> None:
    assert _tuned(MALLOC_ARENA_MAX="4") == {"MALLOC_MMAP_THRESHOLD_": malloc.MMAP_THRESHOLD}
    assert _tuned(MALLOC_ARENA_MAX="4", MALLOC_MMAP_THRESHOLD_="65536") == {}
