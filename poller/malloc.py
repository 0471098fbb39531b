"""What the operator process asks of glibc's malloc: few arenas, big blocks given back.

Python's own allocator (pymalloc) serves objects up to 512 bytes from 1 MiB
arenas it returns when empty; everything larger (a LIST page's body, its
decoded text, a dict's table) comes from glibc's malloc, whose defaults suit
a short-lived program, not a service that keeps 100,000 finished jobs in
memory for months:

* one arena per thread that ever allocated, up to 8 per core: the cycle, the
  sweep, four readers, APScheduler's workers and the metrics server's request
  threads each keep their arena's freed memory for themselves;
* blocks of 128 KiB and more are mapped on their own and unmapped when
  freed, until the first such free raises that threshold (up to 32 MiB):
  after it, a 3 MB page body stays in the heap when freed.

`tune_malloc` (called first thing by ``lmeval-poller``) asks for one arena
and a fixed 128 KiB mapping threshold. Measured with 1,000 running and
100,000 finished jobs (the idle minute of tests/bench/history.py): the
service's RSS was 167 MiB with glibc's defaults, 153 with two arenas, 145
and 148 with one (two runs). Python's own allocator serves nearly all the
objects under the GIL, so one arena costs no measurable contention (CPU per
idle minute 3.05 s against 3.28). `release_freed_memory` (malloc_trim)
hands back what is free, after each step of the sweep of finished jobs.
Where the C library is not glibc both do nothing, and an operator's own
MALLOC_ARENA_MAX or MALLOC_MMAP_THRESHOLD_ wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping

__all__ = ["ARENAS", "MMAP_THRESHOLD", "release_freed_memory", "tune_malloc"]

ARENAS = 1
MMAP_THRESHOLD = 128 * 1024
# mallopt's parameters (glibc's malloc.h).
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def tune_malloc(environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """Set glibc's arena count and mapping threshold unless the environment
    already does; returns what was set (empty elsewhere than glibc)."""
    libc = _libc()
    if libc is None:
        return {}
    done: dict[str, int] = {}
    for variable, parameter, value in (
        ("MALLOC_ARENA_MAX", _M_ARENA_MAX, ARENAS),
        ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ):
        if variable not in environ and libc.mallopt(parameter, value) == 1:
            done[variable] = value
    return done


def release_freed_memory() -> None:
    """Hand the heap glibc keeps after frees back to the system (malloc_trim).

    Called after each step of the sweep of finished jobs (once a minute).
    Its first round parses every finished job's whole object while the
    records it keeps are made; then a fresh process reads every running job's
    log once. Measured with 100,000 finished and 1,000 running jobs, the RSS
    sampled twice a second: 153 MiB at the end of the first round, 147 after
    the trim, then 164 after the log reads, where it stayed without the next
    trims, and 148 with them. With one arena, one call covers every thread.
    """
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
