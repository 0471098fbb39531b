"""Retained-history mode of the scale benchmark: ``bench_cycle.py --history``.

A cluster that has run evaluations for a year holds hundreds of thousands of
finished LMEvalJobs (kept for their results, or waiting for their TTL) and a
few hundred running ones. A polling cycle is only acceptable there if its
cost follows the running jobs, not the history. This module measures exactly
that, black-box, against whatever ``poller`` is on ``PYTHONPATH`` (so the
same run on an older checkout gives the "before" figures). It reuses
bench_cycle.py's harness (control plane, ``Bench``, job and pod creation,
``idle_cycles``, ``latency``) on ONE control plane:

1. ``--active`` (1000) running jobs with kwok pods, then settled.
2. For each H of ``--history`` (ascending), the finished history is grown to
   H jobs. History jobs (kind ``H``) are Complete/Succeeded with an lm_eval
   results document in their status (the heaviest realistic finished job)
   and **no pod**: a long-used cluster's old jobs whose pods were reaped (by
   the poller's own cleanup, a TTL on pods, or an administrator). They are
   created by ``--workers`` threads (a POST and a status PATCH each) and the
   creation rate is printed. Then, at each H:

   a. **hot cycle / floor**: ``Reconciler.run_cycle`` in-process over idle
      cycles against the raw-list floor of the *active* jobs only: GET +
      ``json.loads`` of every page of ``lmevaljobs?fieldSelector=
      status.state!=Complete`` and of the managed pods with
      ``status.phase!=Succeeded,status.phase!=Failed`` (the CRD makes
      ``status.state`` selectable). Targets: ratio <= 1.5, and the cycle at
      the largest H within 20 % of the cycle at the smallest.
   b. **per idle minute of the service**: the ``lmeval-poller`` process at a
      5 s interval (``--interval``) runs ``--warmup-seconds`` (30), then is
      measured for ``--idle-seconds`` (60); with a poller that has the sweep
      of finished jobs, the window opens only after the sweep's first round
      (whole objects, at once: start-up, not the steady state) has ended. The
      window then holds one or two sweep steps (every 60 s). From the
      apiserver's own
      ``/metrics`` (scraped with admin credentials before and after):
      ``apiserver_request_total`` and ``apiserver_response_sizes_sum`` for
      resources ``lmevaljobs`` and ``pods`` (with their subresources), by
      verb: requests and bytes the apiserver sent per minute (no other client
      reads those resources while the service is measured; kwok's and the
      controllers' watches that happen to end in the window are listed by
      verb but left out of the totals: the poller never watches). The audit
      log gives the poller's own request count as a cross-check. From
      ``/proc/<pid>``: CPU seconds (``utime + stime``), ``VmRSS`` and
      ``VmHWM``. After the window one ``/metrics`` scrape of the service
      (every retained job's series) gives the exposition's size and what it
      costs; ``VmHWM`` is read again after it. Targets: requests/min, MB/min
      and CPU s/min flat in H (largest H within 20 % of the smallest), peak
      RSS <= 150 MiB.
   c. at the largest H only: **pod termination -> Finished**, p50 / p99
      (``Bench.latency``: ``--latency-jobs`` running pods terminated through
      kwok at random moments, the service running). Target: p99 <= interval
      + 1 s.

   The control plane's own memory (VmRSS of kube-apiserver and etcd) is
   recorded at each H: the apiserver's watch cache holds every job.
3. ``--half-running N`` (separately, first, in namespaces deleted
   afterwards): N jobs, half Running with kwok pods, half Complete with their
   Succeeded pods still there (kind ``C``), the service at a 10 s interval:
   its CPU seconds per idle minute. Target: <= 6 s (a third of the 18 s the
   poller used before issue 21 at 5,000 jobs).

Run from the repository root::

    python tests/bench/bench_cycle.py --history 10000,50000,100000 --json history.json
    python tests/bench/bench_cycle.py --half-running 5000
    # development sizes (a few minutes on 2 cores):
    python tests/bench/bench_cycle.py --history 2000,4000 --active 200 \\
        --idle-seconds 30 --latency-jobs 20 --half-running 1000

Other bench_cycle.py options that apply: ``--cycles``, ``--latency-jobs``,
``--interval``, ``--spread``, ``--nodes``, ``--workers``, ``--json``,
``--keep``, ``--check``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import math
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_cycle import (
    BASE_SETTINGS,
    FIRST_ROUND,
    JOBS_LIST,
    NAMESPACES,
    PODS_LIST,
    POLLER_USER,
    Bench,
    Population,
    fmt,
    has_sweep,
    log,
    write_json,
)
from lmeval_sandbox.components import free_port
from lmeval_sandbox.controlplane import ControlPlane

from poller.cycle.observe import HOT_PAGE_SIZE, MANAGED_SELECTOR

ACTIVE_JOBS = "status.state!=Complete"
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
# What a hot cycle has to read, in pages of the poller's size: the floor it
# is measured against.
HOT_LISTS: list[tuple[str, dict[str, str]]] = [
    (JOBS_LIST, {"fieldSelector": ACTIVE_JOBS, "limit": str(HOT_PAGE_SIZE)}),
    (PODS_LIST, {"labelSelector": MANAGED_SELECTOR, "fieldSelector": ACTIVE_PODS}),
]
# The apiserver's resources whose requests and bytes are counted.
RESOURCES = ("lmevaljobs", "pods")
HALF_INTERVAL = 10.0  # the interval of the 18 s "before" figure
FLAT = 1.2  # "flat in H": the largest H within 20 % of the smallest
CPU_PER_MINUTE_HALF = 6.0
RSS_LIMIT_MIB = 150.0
CYCLE_LINE = re.compile(r"cycle: .* in ([0-9.]+) s")
METRIC_LINE = re.compile(
    r"^(apiserver_request_total|apiserver_response_sizes_sum|apiserver_response_sizes_count)"
    r"\{(.*)\} (\S+)$"
)
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# -- what the apiserver and the service say about themselves ------------------------


def apiserver_counters(bench: Bench) -> dict[tuple[str, str, str], float]:
    """(metric, resource[/subresource], verb) -> value, summed over the other
    labels, for RESOURCES, from the apiserver's /metrics (admin credentials)."""
    response = bench.admin.pool.request(
        "GET",
        bench.admin.server + "/metrics",
        headers={**bench.admin.headers, "Accept": "text/plain"},
        timeout=60,
        retries=False,
    )
    if response.status != 200:
        raise AssertionError(f"apiserver /metrics: HTTP {response.status}")
    counters: dict[tuple[str, str, str], float] = {}
    for line in response.data.decode().splitlines():
        match = METRIC_LINE.match(line)
        if not match:
            continue
        labels = dict(LABEL.findall(match.group(2)))
        if labels.get("resource") not in RESOURCES:
            continue
        resource = labels["resource"]
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        key = (match.group(1), resource, labels.get("verb", ""))
        counters[key] = counters.get(key, 0.0) + float(match.group(3))
    return counters


def utc_now() -> str:
    """Now, in the audit log's format (RFC 3339, microseconds, UTC): comparable as text."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of process `pid`, MiB (NaN when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {"rss": math.nan, "hwm": math.nan}
    found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.MULTILINE))
    return {
        "rss": int(found.get("VmRSS", 0)) / 1024,
        "hwm": int(found.get("VmHWM", 0)) / 1024,
    }


def plane_memory(plane: ControlPlane) -> dict[str, float]:
    """VmRSS (MiB) of the apiserver and etcd: their watch cache and store hold every job."""
    pids = (ControlPlane.read_state(plane.workdir) or {}).get("pids", {})
    return {
        name: round(memory_mib(int(pids[name]))["rss"], 1)
        for name in ("kube-apiserver", "etcd")
        if name in pids
    }


# -- population ------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One job to create: where, its name, its index (content) and its kind."""

    namespace: str
    name: str
    index: int
    kind: str


def create_many(bench: Bench, specs: list[Spec], what: str) -> dict[str, float]:
    """Create `specs` with `--workers` threads; returns seconds and jobs/s."""
    started = time.monotonic()
    done = 0
    step = max(1000, len(specs) // 10)
    with concurrent.futures.ThreadPoolExecutor(bench.args.workers) as pool:
        for _ in pool.map(lambda s: bench.create_job(s.namespace, s.name, s.index, s.kind), specs):
            done += 1
            if done % step == 0:
                elapsed = time.monotonic() - started
                log(f"  {what}: {done}/{len(specs)} ({done / elapsed:.0f} jobs/s)")
    seconds = time.monotonic() - started
    rate = len(specs) / seconds if seconds > 0 else math.nan
    log(f"  {what}: {len(specs)} jobs in {seconds:.1f} s = {rate:.0f} jobs/s")
    return {"jobs": len(specs), "seconds": round(seconds, 1), "jobs_per_second": round(rate, 1)}


def namespace_of(prefix: str, index: int) -> str:
    return f"{prefix}-{index % NAMESPACES:02d}"


# -- the service over an idle window ---------------------------------------------


@contextlib.contextmanager
def service(bench: Bench, tag: str) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """The ``lmeval-poller`` service as a process (as `Bench.latency` starts it)."""
    log_path = bench.workdir / f"poller-service-{tag}.log"
    port = free_port()
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [
                *bench.poller_argv("--identity", f"bench-service-{tag}"),
                "--metrics-address",
                "127.0.0.1",
                "--metrics-port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=bench.workdir,
        )
    try:
        yield proc, port, log_path
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_alive(proc: subprocess.Popen[bytes], seconds: float, log_path: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise AssertionError(f"the service exited with {proc.returncode}:\n{tail}")
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def log_reads(bench: Bench, mark: int) -> int:
    """The poller's pod log reads since `mark` (audit log)."""
    return sum(
        1
        for call in bench.plane.audit.calls_by(POLLER_USER, since=mark)
        if call.resource == "pods" and call.subresource == "log"
    )


def idle_minute(bench: Bench, tag: str, interval: float) -> dict[str, Any]:
    """The service at `interval`, warmed up, then measured per idle minute.

    A fresh process reads every running job's log once for its progress
    (`progress-interval` is 1 h here, so never again): up to 1000 a cycle
    while warming up, as `Bench.settle` does, and the window starts only once
    an interval has passed without a log read, so it measures the idle
    steady state (with default settings a poller also reads up to
    `progress-reads-per-cycle` logs a cycle, which scales with running jobs).
    """
    args = bench.args
    bench.put_settings(
        **{
            "poll-interval": f"{interval:g}s",
            "progress-reads-per-cycle": "1000",
            "progress-reads-per-minute": "60000",
        }
    )
    try:
        with service(bench, tag) as (proc, port, log_path):
            wait_alive(proc, args.warmup_seconds, log_path)
            if has_sweep():
                # The sweep's first round (whole objects, at once) is start-up,
                # not the idle steady state: the window opens after it.
                started = time.monotonic()
                while FIRST_ROUND not in log_path.read_text(errors="replace"):
                    if time.monotonic() - started > 1800:
                        raise AssertionError("the sweep's first round did not end in 30 min")
                    wait_alive(proc, 2.0, log_path)
            bench.settings.pop("progress-reads-per-minute", None)
            bench.put_settings(**{"progress-reads-per-cycle": "50"})
            deadline = time.monotonic() + 900
            while True:
                mark = bench.plane.audit.mark()
                wait_alive(proc, 2 * interval, log_path)
                reads = log_reads(bench, mark)
                if not reads:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"the service still reads logs: {reads} in 2 intervals")
                log(f"  still warming up: {reads} log reads in 2 intervals")
            offset = log_path.stat().st_size
            mark = bench.plane.audit.mark()
            before = apiserver_counters(bench)
            cpu_before = cpu_seconds(proc.pid)
            began, began_at = time.monotonic(), utc_now()
            wait_alive(proc, args.idle_seconds, log_path)
            cpu_after = cpu_seconds(proc.pid)
            after = apiserver_counters(bench)
            elapsed, ended_at = time.monotonic() - began, utc_now()
            end = log_path.stat().st_size
            memory = memory_mib(proc.pid)
            # One scrape, as Prometheus would: every retained job's series.
            scrape_cpu = cpu_seconds(proc.pid)
            scrape_began = time.monotonic()
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=120) as response:
                exposition = len(response.read())
            scrape_seconds = time.monotonic() - scrape_began
            scrape_cpu = cpu_seconds(proc.pid) - scrape_cpu
            hwm_after_scrape = memory_mib(proc.pid)["hwm"]
            with log_path.open("rb") as handle:
                handle.seek(offset)
                window_log = handle.read(end - offset).decode(errors="replace")
        calls = [
            call
            for call in bench.plane.audit.calls_by(POLLER_USER, since=mark)
            if began_at <= call.timestamp <= ended_at
        ]
    finally:
        bench.settings.pop("progress-reads-per-minute", None)
        bench.put_settings(
            **{"poll-interval": BASE_SETTINGS["poll-interval"], "progress-reads-per-cycle": "50"}
        )
    per_minute = 60.0 / elapsed
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    requests = {
        f"{verb} {resource}": round(value * per_minute, 1)
        for (metric, resource, verb), value in sorted(delta.items())
        if metric == "apiserver_request_total" and value
    }
    sent = {
        f"{verb} {resource}": round(value * per_minute / 2**20, 3)
        for (metric, resource, verb), value in sorted(delta.items())
        if metric == "apiserver_response_sizes_sum" and value
    }
    cycles = [float(m.group(1)) for m in CYCLE_LINE.finditer(window_log)]
    audited = Counter(
        f"{c.verb} {c.resource}{'/' + c.subresource if c.subresource else ''}" for c in calls
    )
    # Only the poller should be reading jobs and pods now; say so if not.
    ours = sum(1 for c in calls if c.resource in RESOURCES) * per_minute
    # The poller never watches; other clients' watches that end in the
    # window (kwok, the controllers) are listed but not counted.
    total_requests = sum(v for k, v in requests.items() if not k.startswith("WATCH "))
    total_mib = sum(v for k, v in sent.items() if not k.startswith("WATCH "))
    others = total_requests - ours
    if others > 0.1 * ours + 5:
        log(f"  WARNING: {others:.0f} requests/min on {RESOURCES} by other clients: {requests}")
    return {
        "interval": interval,
        "seconds": round(elapsed, 1),
        "requests_per_minute": round(total_requests, 1),
        "requests_per_minute_by_verb": requests,
        "mib_per_minute": round(total_mib, 3),
        "mib_per_minute_by_verb": sent,
        "poller_requests_per_minute": round(len(calls) * per_minute, 1),
        "other_clients_requests_per_minute": round(others, 1),
        "poller_requests_by_verb": dict(sorted(audited.items())),
        "cpu_seconds_per_minute": round((cpu_after - cpu_before) * per_minute, 2),
        "cycles_per_minute": round(len(cycles) * per_minute, 1),
        "service_cycle": {
            "median": round(sorted(cycles)[len(cycles) // 2], 3) if cycles else math.nan,
            "max": max(cycles, default=math.nan),
        },
        "rss_mib": round(memory["rss"], 1),
        "hwm_mib": round(memory["hwm"], 1),
        "scrape_mib": round(exposition / 2**20, 2),
        "scrape_seconds": round(scrape_seconds, 2),
        "scrape_cpu_seconds": round(scrape_cpu, 2),
        "hwm_after_scrape_mib": round(hwm_after_scrape, 1),
        "exit_code": proc.returncode,
    }


def log_idle(what: str, idle: dict[str, Any]) -> None:
    log(
        f"  {what}: {idle['requests_per_minute']:.0f} req/min "
        f"({idle['poller_requests_per_minute']:.0f} by the poller), "
        f"{idle['mib_per_minute']:.2f} MiB/min, CPU {idle['cpu_seconds_per_minute']:.2f} s/min, "
        f"{idle['cycles_per_minute']:.0f} cycles/min, RSS {idle['rss_mib']:.0f} MiB "
        f"(peak {idle['hwm_mib']:.0f}, {idle['hwm_after_scrape_mib']:.0f} after a "
        f"{idle['scrape_mib']:.1f} MiB scrape)"
    )


# -- the two measurements ------------------------------------------------------------


def half_running(bench: Bench, count: int) -> dict[str, Any]:
    """`count` jobs, half Running, half Complete with their pods: CPU per idle minute."""
    log(f"== half running: {count} jobs")
    population = Population("half", "half")
    for namespace in population.namespaces():
        bench.make_namespace(namespace)
    specs = [
        Spec(namespace_of("half", i), f"half-{i:05d}", 300_000 + i, "R" if i % 2 else "C")
        for i in range(count)
    ]
    population.kinds.update(s.kind for s in specs)
    population.count = count
    created = create_many(bench, specs, "half running")
    bench.put_settings(**{"max-running-jobs": str(population.slots())})
    kwok_wait = bench.wait_for_kwok(population, timeout=120 + count / 10)
    log(f"  kwok caught up after {kwok_wait:.1f} s; settling")
    settle_cycles = bench.settle()
    idle = idle_minute(bench, "half", HALF_INTERVAL)
    log_idle("half running", idle)
    log("  removing the half-running jobs")
    bench.delete_namespaces(population.namespaces())
    return {
        "n": count,
        "kinds": dict(population.kinds),
        "create": created,
        "kwok_wait_seconds": round(kwok_wait, 1),
        "settle_cycles": settle_cycles,
        "idle": idle,
    }


def history(bench: Bench) -> list[dict[str, Any]]:
    """`--active` running jobs, then the history grown to each H and measured."""
    args = bench.args
    population = Population("history", "hist")
    for namespace in population.namespaces():
        bench.make_namespace(namespace)
    log(f"== retained history: {args.active} running jobs first")
    active = [Spec(namespace_of("hist", i), f"run-{i:05d}", i, "R") for i in range(args.active)]
    population.kinds["R"] = args.active
    population.count = args.active
    created_active = create_many(bench, active, "active")
    bench.put_settings(**{"max-running-jobs": str(args.active + args.latency_jobs + 10)})
    kwok_wait = bench.wait_for_kwok(population, timeout=120 + args.active / 10)
    log(f"  kwok caught up after {kwok_wait:.1f} s; settling")
    bench.settle()
    bench.floor_lists = list(HOT_LISTS)
    results: list[dict[str, Any]] = []
    have = 0
    for target in args.history_list:
        log(f"== H={target}: creating {target - have} finished jobs without pods")
        specs = [
            Spec(namespace_of("hist", i), f"done-{i:06d}", 200_000 + i, "H")
            for i in range(have, target)
        ]
        created = create_many(bench, specs, f"history to {target}")
        have = target
        population.kinds["H"] = target
        population.count = args.active + target
        settle_cycles = bench.settle(max_cycles=10)
        result: dict[str, Any] = {
            "history": target,
            "active": args.active,
            "create": created,
            "create_active": created_active,
            "settle_cycles": settle_cycles,
            "plane_mib": plane_memory(bench.plane),
        }
        result.update(bench.idle_cycles(args.cycles, f"history-{target}"))
        log(
            f"  hot cycle {result['cycle']['median']:.3f} s, floor "
            f"{result['floor']['median']:.3f} s ({result['floor_pages']} pages), ratio "
            f"{result['ratio']:.2f}, requests {result['requests_per_cycle']}, writes "
            f"{sum(result['writes_per_cycle'])}; apiserver/etcd {result['plane_mib']} MiB"
        )
        result["idle"] = idle_minute(bench, f"history-{target}", args.interval)
        log_idle(f"H={target}", result["idle"])
        if target == args.history_list[-1] and args.latency_jobs:
            try:
                result["latency"] = bench.latency(f"history-{target}", population)
                lat = result["latency"]
                log(
                    f"  latency p50 {lat['latency']['median']:.2f} s, p99 "
                    f"{lat['latency']['p99']:.2f} s ({lat['finished']}/{lat['jobs']})"
                )
            except AssertionError as error:  # e.g. a cycle longer than the wait
                log(f"  latency not measured: {error}")
                result["latency"] = {"error": str(error)[:500]}
        results.append(result)
    return results


# -- output ----------------------------------------------------------------------


def table(figures: dict[str, Any], interval: float) -> str:
    header = [
        "H", "active", "make/s", "cycle p50", "cycle p95", "floor p50", "ratio", "req/cyc",
        "writes", "req/min", "MiB/min", "poller req/min", "CPU s/min", "RSS", "peak",
        "peak+scrape", "scrape MiB", "apiserver", "etcd", "lat p50", "lat p99",
    ]  # fmt: skip
    rows = [header]
    for r in figures.get("history", []):
        idle = r["idle"]
        lat = (r.get("latency") or {}).get("latency") or {}
        rows.append(
            [
                str(r["history"]),
                str(r["active"]),
                fmt(r["create"]["jobs_per_second"], 0),
                fmt(r["cycle"]["median"], 3),
                fmt(r["cycle"]["p95"], 3),
                fmt(r["floor"]["median"], 3),
                fmt(r["ratio"]),
                "/".join(sorted({str(x) for x in r["requests_per_cycle"]})),
                str(sum(r["writes_per_cycle"])),
                fmt(idle["requests_per_minute"], 0),
                fmt(idle["mib_per_minute"], 2),
                fmt(idle["poller_requests_per_minute"], 0),
                fmt(idle["cpu_seconds_per_minute"], 2),
                fmt(idle["rss_mib"], 0),
                fmt(idle["hwm_mib"], 0),
                fmt(idle["hwm_after_scrape_mib"], 0),
                fmt(idle["scrape_mib"], 1),
                fmt(r["plane_mib"].get("kube-apiserver"), 0),
                fmt(r["plane_mib"].get("etcd"), 0),
                fmt(lat.get("median")),
                fmt(lat.get("p99")),
            ]
        )
    lines: list[str] = []
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = [
            "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines += [
            "",
            "H finished jobs (no pods) + `active` running ones; make/s: history jobs created per",
            "second; cycle/floor: in-process idle cycle vs GET+json.loads of the active jobs' and",
            "pods' field-selected LISTs (ratio target <= 1.5); req/cyc, writes: per idle cycle",
            f"(audit log). Service at a {interval:g} s interval, per idle minute: req/min and",
            "MiB/min the apiserver served for lmevaljobs + pods (its /metrics), the poller's own",
            "requests (audit), CPU s/min, RSS / peak (MiB), peak after one /metrics scrape of",
            "`scrape MiB`; apiserver / etcd: their RSS (MiB); lat: termination -> Finished (s,",
            f"largest H only, target p99 <= {interval + 1:g} s).",
        ]
    half = figures.get("half_running")
    if half:
        idle = half["idle"]
        lines += [
            "",
            f"half running: {half['n']} jobs ({half['kinds']}), service at "
            f"{idle['interval']:g} s: CPU {idle['cpu_seconds_per_minute']:.2f} s/min "
            f"(target <= {CPU_PER_MINUTE_HALF:g}), {idle['requests_per_minute']:.0f} req/min, "
            f"{idle['mib_per_minute']:.2f} MiB/min, {idle['cycles_per_minute']:.0f} cycles/min, "
            f"RSS {idle['rss_mib']:.0f} MiB (peak {idle['hwm_mib']:.0f})",
        ]
    return "\n".join(lines)


def flat(results: list[dict[str, Any]], what: str, value: Any) -> list[str]:
    """`what` at the largest H within 20 % of the smallest H's."""
    if len(results) < 2:
        return []
    first, last = value(results[0]), value(results[-1])
    if first > 0 and last > FLAT * first:
        return [
            f"{what}: {last:.3f} at H={results[-1]['history']} > {FLAT:g} x {first:.3f} "
            f"at H={results[0]['history']}"
        ]
    return []


def targets(figures: dict[str, Any], interval: float) -> list[str]:
    missed: list[str] = []
    results: list[dict[str, Any]] = figures.get("history", [])
    for r in results:
        where = f"H={r['history']}"
        if r["ratio"] > 1.5:
            missed.append(f"{where}: hot cycle / floor {r['ratio']:.2f} > 1.5")
        if any(r["writes_per_cycle"]):
            missed.append(f"{where}: idle cycles wrote {r['writes_per_cycle']}")
        peak = max(r["idle"]["hwm_mib"], r["idle"]["hwm_after_scrape_mib"])
        if peak > RSS_LIMIT_MIB:
            missed.append(f"{where}: service peak RSS {peak:.0f} MiB > {RSS_LIMIT_MIB:g}")
        lat = r.get("latency")
        if lat and "error" in lat:
            missed.append(f"{where}: latency not measured: {lat['error'][:200]}")
        elif lat:
            if lat["finished"] < lat["jobs"]:
                missed.append(f"{where}: only {lat['finished']}/{lat['jobs']} jobs Finished")
            elif lat["latency"]["p99"] > interval + 1:
                missed.append(
                    f"{where}: latency p99 {lat['latency']['p99']:.2f} s > {interval + 1:g} s"
                )
    missed += flat(results, "hot cycle p50 (s)", lambda r: r["cycle"]["median"])
    missed += flat(results, "requests/min", lambda r: r["idle"]["requests_per_minute"])
    missed += flat(results, "MiB/min", lambda r: r["idle"]["mib_per_minute"])
    missed += flat(results, "CPU s/min", lambda r: r["idle"]["cpu_seconds_per_minute"])
    half = figures.get("half_running")
    if half and half["idle"]["cpu_seconds_per_minute"] > CPU_PER_MINUTE_HALF:
        missed.append(
            f"half running N={half['n']}: CPU {half['idle']['cpu_seconds_per_minute']:.2f} "
            f"s/min > {CPU_PER_MINUTE_HALF:g}"
        )
    return missed


def main(args: argparse.Namespace) -> int:
    """The whole retained-history run (bench_cycle.py's main hands over to it)."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-history-"))
    bench = Bench(args, workdir)
    began = time.monotonic()
    figures: dict[str, Any] = {}
    try:
        bench.start()
        # The garbage collector learns of a new CRD at its next discovery
        # resync (30 s); until then it GETs the owner of every new pod, a
        # thousand requests that would land in the measured minutes.
        log("  waiting 35 s for the garbage collector to learn of the CRD")
        time.sleep(35)
        if args.half_running:
            figures["half_running"] = half_running(bench, args.half_running)
        if args.history_list:
            figures["history"] = history(bench)
    finally:
        bench.stop()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(workdir)], check=False)
        else:
            log(f"work directory kept: {workdir}")
    print(table(figures, args.interval))
    missed = targets(figures, args.interval)
    print("\ntargets: " + ("all met" if not missed else "MISSED:\n  " + "\n  ".join(missed)))
    print(f"(total {time.monotonic() - began:.0f} s)")
    if args.json:
        write_json(args.json, args, figures, missed)
    return 1 if args.check and missed else 0
