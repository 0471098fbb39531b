"""Interval grid of the scale benchmark: ``bench_cycle.py --grid 1000,5000 --intervals 1,2,3,5,10``.

What a user feels of a poller is how soon a change reaches the job's status;
what the cluster pays is the poller's requests, bytes and CPU per minute. Both
follow ``poll-interval``, so the default interval is chosen from this grid:
for each population and each interval, ONE ``lmeval-poller`` service process
with **default settings** (progress reads included; only ``pod-image`` and
``poll-interval`` are set) is measured for

1. **idle cost per minute** (``--idle-seconds``, 60, after ``--warmup-seconds``
   and the sweep's first round): requests and MiB the apiserver served for
   ``lmevaljobs`` and ``pods`` (its ``/metrics``), the poller's own requests
   (audit log), the service's CPU seconds and RSS, and the apiserver's and
   etcd's CPU seconds (``/proc``), which the poller's LISTs cost them;
2. **termination -> Finished**, p50 / p99: ``--latency-jobs`` (50) running
   jobs whose pods get kwok's exit annotation at random moments over
   ``--spread`` (20) seconds; a LIST every 0.1 s records when ``Finished``
   appears;
3. **creation -> pod**, p50 / p99: ``--creation-jobs`` (20) jobs created at
   random moments over the same spread; a LIST every 0.1 s records when each
   one's pod exists. Then a **burst** of ``--burst`` (200) jobs created at
   once by 12 threads: when the first and the last pod exist, counted from the
   first POST (the figure the issue compared with a watch-based operator's
   1.0-1.5 s).

Populations (grown in place, ascending): ``--grid`` N jobs, half Running with
kwok pods, half Complete with their Succeeded pods (``--half-running``'s
mix). The latency and creation jobs live in namespaces of their own,
deleted after each interval, so every interval starts from the same
population.

Run from the repository root::

    python tests/bench/bench_cycle.py --grid 1000,5000 --intervals 1,2,3,5,10 --json grid.json
    python tests/bench/bench_cycle.py --grid 200 --intervals 2,10 --idle-seconds 30   # quick look

``--check`` exits 1 when the default interval (the one in
``poller.api.settings``) misses a target: termination -> Finished p50 <= 2.5
s and p99 <= 5 s, creation -> pod p50 <= 2 s, and at 5,000 jobs idle CPU <= 9 s
and requests <= 2,000 per minute.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import math
import random
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import history
from bench_cycle import (
    BASE_SETTINGS,
    FIRST_ROUND,
    JOBS_API,
    POLLER_USER,
    Bench,
    Population,
    fmt,
    has_sweep,
    log,
    percentile,
    summary,
    write_json,
)
from lmeval_sandbox import kwok

from poller import api
from poller.api.settings import Settings
from poller.jobpod import podspec

# Targets of issue 35, judged at the default interval.
FINISHED_P50, FINISHED_P99 = 2.5, 5.0
CREATED_P50 = 2.0
CPU_PER_MINUTE, REQUESTS_PER_MINUTE = 9.0, 2000.0
TARGET_SIZE = 5000  # the population the cost targets are for
LATENCY_NS, CREATION_NS, BURST_NS = "grid-latency", "grid-created", "grid-burst"


def _plane_cpu(bench: Bench) -> dict[str, float]:
    """CPU seconds so far of the apiserver and etcd."""
    pids = (bench.plane.read_state(bench.plane.workdir) or {}).get("pids", {})
    return {
        name: history.cpu_seconds(int(pids[name]))
        for name in ("kube-apiserver", "etcd")
        if name in pids
    }


def grid_settings(interval: float, check: str = "") -> dict[str, str]:
    """Default settings, but the benchmark's image name, `interval` and, when given,
    the check for new jobs' interval (`--new-job-check-interval`: 0 turns it off)."""
    settings = {"pod-image": BASE_SETTINGS["pod-image"], "poll-interval": f"{interval:g}s"}
    if check:
        settings["new-job-check-interval"] = check
    return settings


def grow(bench: Bench, population: Population, target: int) -> dict[str, Any]:
    """Grow the half-running population to `target` jobs and settle it."""
    specs = [
        history.Spec(
            history.namespace_of("grid", i), f"half-{i:05d}", 300_000 + i, "R" if i % 2 else "C"
        )
        for i in range(population.count, target)
    ]
    population.kinds.update(s.kind for s in specs)
    population.count = target
    created = history.create_many(bench, specs, f"grid to {target}")
    kwok_wait = bench.wait_for_kwok(population, timeout=120 + target / 10)
    log(f"  kwok caught up after {kwok_wait:.1f} s; settling")
    # Settling runs in-process cycles with the benchmark's own settings.
    bench.settings = dict(BASE_SETTINGS)
    bench.put_settings(**{"max-running-jobs": "0"})
    cycles = bench.settle()
    return {"create": created, "kwok_wait_seconds": round(kwok_wait, 1), "settle_cycles": cycles}


def _window(bench: Bench, proc: subprocess.Popen[bytes], log_path: Path) -> dict[str, Any]:
    """The service's cost over `--idle-seconds`, per minute."""
    args = bench.args
    mark = bench.plane.audit.mark()
    before, plane_before = history.apiserver_counters(bench), _plane_cpu(bench)
    cpu_before = history.cpu_seconds(proc.pid)
    began, began_at = time.monotonic(), history.utc_now()
    offset = log_path.stat().st_size
    history.wait_alive(proc, args.idle_seconds, log_path)
    cpu_after = history.cpu_seconds(proc.pid)
    after, plane_after = history.apiserver_counters(bench), _plane_cpu(bench)
    elapsed, ended_at = time.monotonic() - began, history.utc_now()
    window_log = log_path.read_bytes()[offset:].decode(errors="replace")
    memory = history.memory_mib(proc.pid)
    calls = [
        c
        for c in bench.plane.audit.calls_by(POLLER_USER, since=mark)
        if began_at <= c.timestamp <= ended_at
    ]
    per_minute = 60.0 / elapsed
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    requests = sum(
        v
        for (metric, _, verb), v in delta.items()
        if metric == "apiserver_request_total" and verb != "WATCH"
    )
    sent = sum(
        v
        for (metric, _, verb), v in delta.items()
        if metric == "apiserver_response_sizes_sum" and verb != "WATCH"
    )
    audited = Counter(
        f"{c.verb} {c.resource}{'/' + c.subresource if c.subresource else ''}" for c in calls
    )
    cycles = [float(m.group(1)) for m in history.CYCLE_LINE.finditer(window_log)]
    return {
        "seconds": round(elapsed, 1),
        "requests_per_minute": round(requests * per_minute, 1),
        "mib_per_minute": round(sent * per_minute / 2**20, 2),
        "poller_requests_per_minute": round(len(calls) * per_minute, 1),
        "poller_requests_by_verb": {
            k: round(v * per_minute, 1) for k, v in sorted(audited.items())
        },
        "cpu_seconds_per_minute": round((cpu_after - cpu_before) * per_minute, 2),
        "plane_cpu_seconds_per_minute": {
            name: round((plane_after[name] - plane_before.get(name, 0.0)) * per_minute, 2)
            for name in plane_after
        },
        "cycles_per_minute": round(len(cycles) * per_minute, 1),
        "cycle_p50": round(sorted(cycles)[len(cycles) // 2], 3) if cycles else math.nan,
        "rss_mib": round(memory["rss"], 1),
        "hwm_mib": round(memory["hwm"], 1),
    }


class Watcher:
    """A LIST every 0.1 s of one namespace's jobs or pods, recording when each
    named object first meets `seen`."""

    def __init__(self, bench: Bench, path: str, seen: Any) -> None:
        self.bench, self.path, self.seen = bench, path, seen
        self.first: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            now = time.time()
            with contextlib.suppress(Exception):  # a slow apiserver: try again
                for item in self.bench.admin.json("GET", self.path)["items"]:
                    key = self.seen(item)
                    if key is not None and key not in self.first:
                        self.first[key] = now
            self.stop.wait(0.1)

    def wait(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not set(names) <= set(self.first) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.stop.set()
        self.thread.join()


def _finished(item: dict[str, Any]) -> str | None:
    conditions = (item.get("status") or {}).get("conditions") or []
    if any(c.get("type") == "Finished" and c.get("status") == "True" for c in conditions):
        return str(item["metadata"]["name"])
    return None


def _owner(item: dict[str, Any]) -> str | None:
    labels = item["metadata"].get("labels") or {}
    return labels.get(podspec.LABEL_JOB_NAME)


def terminations(bench: Bench, interval: float, rng: random.Random) -> dict[str, Any]:
    """Running jobs' pods exit at random moments: termination -> Finished."""
    args = bench.args
    names = [f"lat-{k:03d}" for k in range(args.latency_jobs)]
    bench.make_namespace(LATENCY_NS)
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        uids = list(
            pool.map(
                lambda k: bench.create_job(LATENCY_NS, names[k], 100_000 + k, "R"),
                range(len(names)),
            )
        )
    pods = {name: podspec.pod_name(name, uid) for name, uid in zip(names, uids, strict=True)}
    path = f"{JOBS_API}/namespaces/{LATENCY_NS}/{api.PLURAL}"

    def running() -> int:
        items = bench.admin.json("GET", path)["items"]
        return sum(1 for j in items if (j.get("status") or {}).get("state") == "Running")

    deadline = time.monotonic() + 60 + 10 * interval
    while running() < len(names):
        if time.monotonic() > deadline:
            raise AssertionError(f"latency jobs not Running after {60 + 10 * interval:.0f} s")
        time.sleep(0.5)
    watcher = Watcher(bench, path, _finished)
    terminated: dict[str, float] = {}
    offsets = sorted(rng.uniform(0, args.spread) for _ in names)
    begin = time.monotonic()
    for name, offset in zip(names, offsets, strict=True):
        time.sleep(max(0.0, begin + offset - time.monotonic()))
        terminated[name] = time.time()
        bench.admin.request(
            "PATCH",
            f"/api/v1/namespaces/{LATENCY_NS}/pods/{pods[name]}",
            body={"metadata": {"annotations": {kwok.ANNOTATION_EXIT_CODE: "0"}}},
            content_type="application/merge-patch+json",
        )
    watcher.wait(names, 60 + 6 * interval)
    latencies = [watcher.first[n] - terminated[n] for n in names if n in watcher.first]
    return {"jobs": len(names), "finished": len(latencies), "latency": summary(latencies)}


def creations(bench: Bench, rng: random.Random) -> dict[str, Any]:
    """Jobs created at random moments: creation -> pod; then a burst at once."""
    args = bench.args
    bench.make_namespace(CREATION_NS)
    names = [f"new-{k:03d}" for k in range(args.creation_jobs)]
    watcher = Watcher(bench, f"/api/v1/namespaces/{CREATION_NS}/pods", _owner)
    created: dict[str, float] = {}
    offsets = sorted(rng.uniform(0, args.spread) for _ in names)
    begin = time.monotonic()
    for k, (name, offset) in enumerate(zip(names, offsets, strict=True)):
        time.sleep(max(0.0, begin + offset - time.monotonic()))
        created[name] = time.time()
        bench.create_job(CREATION_NS, name, 200_000 + k, "N")
    watcher.wait(names, 60)
    latencies = [watcher.first[n] - created[n] for n in names if n in watcher.first]
    result: dict[str, Any] = {
        "jobs": len(names),
        "with_pod": len(latencies),
        "latency": summary(latencies),
    }
    if args.burst:
        bench.make_namespace(BURST_NS)
        burst = [f"burst-{k:03d}" for k in range(args.burst)]
        watcher = Watcher(bench, f"/api/v1/namespaces/{BURST_NS}/pods", _owner)
        first_post = time.time()
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            list(
                pool.map(
                    lambda k: bench.create_job(BURST_NS, burst[k], 250_000 + k, "N"),
                    range(len(burst)),
                )
            )
        posted = time.time() - first_post
        watcher.wait(burst, 120)
        seen = sorted(watcher.first[n] - first_post for n in burst if n in watcher.first)
        result["burst"] = {
            "jobs": len(burst),
            "posted_seconds": round(posted, 2),
            "with_pod": len(seen),
            "first_pod": round(seen[0], 2) if seen else math.nan,
            "median_pod": round(percentile(seen, 0.5), 2) if seen else math.nan,
            "last_pod": round(seen[-1], 2) if seen else math.nan,
        }
    return result


def one_interval(bench: Bench, interval: float, n: int) -> dict[str, Any]:
    """One service process at `interval` with default settings: cost, then latencies."""
    args = bench.args
    rng = random.Random(f"{args.seed}-{n}-{interval}")
    bench.settings = grid_settings(interval, args.new_job_check_interval)
    bench.put_settings()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    result: dict[str, Any] = {"n": n, "interval": interval, "settings": dict(bench.settings)}
    with history.service(bench, f"grid-{n}-{interval:g}") as (proc, _, log_path):
        history.wait_alive(proc, args.warmup_seconds, log_path)
        if has_sweep():
            deadline = time.monotonic() + 1800
            while FIRST_ROUND not in log_path.read_text(errors="replace"):
                if time.monotonic() > deadline:
                    raise AssertionError("the sweep's first round did not end")
                history.wait_alive(proc, 1.0, log_path)
        result["idle"] = _window(bench, proc, log_path)
        if args.latency_jobs:
            result["terminations"] = terminations(bench, interval, rng)
        if args.creation_jobs:
            result["creations"] = creations(bench, rng)
    result["load"] = {"before": load_before, "after": Path("/proc/loadavg").read_text().split()[:3]}
    bench.delete_namespaces([LATENCY_NS, CREATION_NS, BURST_NS])
    return result


def log_point(r: dict[str, Any]) -> None:
    idle = r["idle"]
    term = (r.get("terminations") or {}).get("latency") or {}
    made = r.get("creations") or {}
    burst = made.get("burst") or {}
    log(
        f"  N={r['n']} interval {r['interval']:g} s: {idle['requests_per_minute']:.0f} req/min, "
        f"{idle['mib_per_minute']:.1f} MiB/min, CPU {idle['cpu_seconds_per_minute']:.2f} s/min "
        f"(apiserver {idle['plane_cpu_seconds_per_minute'].get('kube-apiserver', math.nan):.1f}), "
        f"RSS {idle['rss_mib']:.0f} MiB; finished p50 {term.get('median', math.nan):.2f} "
        f"p99 {term.get('p99', math.nan):.2f}; pod p50 "
        f"{(made.get('latency') or {}).get('median', math.nan):.2f} p99 "
        f"{(made.get('latency') or {}).get('p99', math.nan):.2f}; burst first "
        f"{burst.get('first_pod', math.nan)} last {burst.get('last_pod', math.nan)}; "
        f"load {r['load']['before']} -> {r['load']['after']}"
    )


def table(points: list[dict[str, Any]]) -> str:
    header = [
        "N", "interval", "req/min", "poller req/min", "MiB/min", "CPU s/min", "apiserver CPU",
        "etcd CPU", "RSS", "peak", "cycles/min", "fin p50", "fin p99", "pod p50", "pod p99",
        "burst first", "burst last", "load",
    ]  # fmt: skip
    rows = [header]
    for r in points:
        idle = r["idle"]
        term = (r.get("terminations") or {}).get("latency") or {}
        made = r.get("creations") or {}
        burst = made.get("burst") or {}
        plane = idle["plane_cpu_seconds_per_minute"]
        rows.append(
            [
                str(r["n"]),
                f"{r['interval']:g}",
                fmt(idle["requests_per_minute"], 0),
                fmt(idle["poller_requests_per_minute"], 0),
                fmt(idle["mib_per_minute"], 1),
                fmt(idle["cpu_seconds_per_minute"], 2),
                fmt(plane.get("kube-apiserver"), 1),
                fmt(plane.get("etcd"), 1),
                fmt(idle["rss_mib"], 0),
                fmt(idle["hwm_mib"], 0),
                fmt(idle["cycles_per_minute"], 0),
                fmt(term.get("median")),
                fmt(term.get("p99")),
                fmt((made.get("latency") or {}).get("median")),
                fmt((made.get("latency") or {}).get("p99")),
                fmt(burst.get("first_pod")),
                fmt(burst.get("last_pod")),
                "/".join(r["load"]["before"][:1] + r["load"]["after"][:1]),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [
        "",
        "per idle minute of the service (default settings): req/min and MiB/min the apiserver",
        "served for lmevaljobs + pods, the poller's own requests (audit), its CPU s, the",
        "apiserver's and etcd's CPU s, RSS / peak (MiB); fin: termination -> Finished (s);",
        "pod: creation -> pod (s); burst: first / last pod after a burst of jobs, from the",
        "first POST (s); load: 1-minute load average before / after.",
    ]
    return "\n".join(lines)


def targets(points: list[dict[str, Any]]) -> list[str]:
    """Issue 35's targets, at the default interval."""
    default = Settings().poll_interval
    missed: list[str] = []
    for r in points:
        if r["interval"] != default or "new-job-check-interval" in r.get("settings", {}):
            continue
        where = f"N={r['n']} interval {default:g} s"
        term = r.get("terminations")
        if term:
            lat = term["latency"]
            if term["finished"] < term["jobs"]:
                missed.append(f"{where}: only {term['finished']}/{term['jobs']} jobs Finished")
            elif lat["median"] > FINISHED_P50 or lat["p99"] > FINISHED_P99:
                missed.append(
                    f"{where}: termination -> Finished p50 {lat['median']:.2f} s, "
                    f"p99 {lat['p99']:.2f} s (targets {FINISHED_P50:g} / {FINISHED_P99:g})"
                )
        made = r.get("creations")
        if made:
            lat = made["latency"]
            if made["with_pod"] < made["jobs"]:
                missed.append(f"{where}: only {made['with_pod']}/{made['jobs']} jobs got a pod")
            elif lat["median"] > CREATED_P50:
                missed.append(f"{where}: creation -> pod p50 {lat['median']:.2f} s")
        idle = r["idle"]
        if r["n"] >= TARGET_SIZE:
            if idle["cpu_seconds_per_minute"] > CPU_PER_MINUTE:
                missed.append(f"{where}: CPU {idle['cpu_seconds_per_minute']:.2f} s/min")
            if idle["requests_per_minute"] > REQUESTS_PER_MINUTE:
                missed.append(f"{where}: {idle['requests_per_minute']:.0f} requests/min")
    return missed


def main(args: argparse.Namespace) -> int:
    """The whole grid (bench_cycle.py's main hands over to it)."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-grid-"))
    bench = Bench(args, workdir)
    began = time.monotonic()
    points: list[dict[str, Any]] = []
    setups: list[dict[str, Any]] = []
    try:
        bench.start()
        # The garbage collector learns of a new CRD at its next discovery resync
        # (30 s); until then it GETs the owner of every new pod.
        log("  waiting 35 s for the garbage collector to learn of the CRD")
        time.sleep(35)
        population = Population("half", "grid")
        for namespace in population.namespaces():
            bench.make_namespace(namespace)
        for n in args.grid_list:
            log(f"== grid: {n} jobs, half running")
            setups.append({"n": n, **grow(bench, population, n)})
            for interval in args.interval_list:
                point = one_interval(bench, interval, n)
                log_point(point)
                points.append(point)
                if args.json:  # a long run leaves what it measured so far
                    write_json(args.json, args, {"setup": setups, "points": points}, [])
    finally:
        bench.stop()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(workdir)], check=False)
    print(table(points))
    missed = targets(points)
    print("\ntargets: " + ("all met" if not missed else "MISSED:\n  " + "\n  ".join(missed)))
    print(f"(total {time.monotonic() - began:.0f} s)")
    if args.json:
        write_json(args.json, args, {"setup": setups, "points": points}, missed)
    return 1 if args.check and missed else 0
