"""Peak memory and time of decoding each hostile pod log (a script, not a test).

Why this exists: issue 15 found that one job author's pod output took the
poller from 56 MiB to over 1 GiB. This prints, for every log in
`tests.hostile_logs`, what the poller's log path costs: the bytes as the
apiserver would send them (all of them, or the first `LOG_READ_RESULTS_BYTES`
when the poller caps its reads), decoded the way `poller.cycle.reconciler` decodes them.
Each case runs in a fresh interpreter: the peak of traced allocations
(tracemalloc), the growth of the resident set (ru_maxrss) and the time, and
what the decoder said (or the exception that escaped it).

Run from the repository root::

    python tests/bench/bench_hostile_logs.py [--timeout 120] [CASE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, resource, sys, time, tracemalloc
from tests import hostile_logs
name = sys.argv[1]
data = hostile_logs.HOSTILE_LOGS[name]().encode()
try:
    from driver.decoder import decode_bytes as decode_log_bytes
    from poller.cycle.podio import LOG_READ_RESULTS_BYTES
    capped = True
except ImportError:  # before issue 15: the whole body, decoded as one string
    from driver.protocol import decode_text
    def decode_log_bytes(raw):
        return decode_text(raw.decode("utf-8", errors="replace"))
    capped = False
if capped:
    data = data[: LOG_READ_RESULTS_BYTES + 1]  # what the capped read keeps
def attempt():
    try:
        decoded = decode_log_bytes(data)
        said = decoded.results_error or ("results" if decoded.results is not None else "")
        if decoded.last_progress:
            said += f" progress={decoded.last_progress}"
        return said
    except BaseException as error:
        return f"RAISED {type(error).__name__}: {str(error)[:80]}"
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
said = attempt()  # timed without tracemalloc, which slows allocations down
elapsed = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
attempt()
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
print(json.dumps({"case": name, "input_bytes": len(data), "peak_mib": peak / 2**20,
                  "maxrss_growth_mib": (after - before) / 1024, "seconds": elapsed,
                  "said": said[:110]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("cases", nargs="*")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    from tests import hostile_logs

    names = args.cases or list(hostile_logs.HOSTILE_LOGS)
    for name in names:
        try:
            done = subprocess.run(
                [sys.executable, "-c", CHILD, name],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=args.timeout,
            )
        except subprocess.TimeoutExpired:
            print(json.dumps({"case": name, "said": f"did not finish in {args.timeout:g} s"}))
            continue
        out = done.stdout.strip() or json.dumps({"case": name, "said": done.stderr[-300:]})
        print(out, flush=True)


if __name__ == "__main__":
    main()
