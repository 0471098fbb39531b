"""Hostile-tenant benchmark: is the poller's cost bounded whatever a job's pod writes?

A job's pod log is written by the job's author, so one tenant can feed the
poller anything. The poller must stay within its Deployment's memory limit
(deploy/base/deployment.yaml) and keep every other tenant's jobs within the
latency target (termination -> Finished p99 <= poll interval + 2 s) while
hostile jobs run beside ordinary ones. This script measures both on the real
sandbox control plane, reusing bench_cycle.py's harness (its own control
plane in a temporary directory, CRD, RBAC, settings, jobs and pods created
with the poller's own manifests on kwok nodes):

* N ordinary jobs in bench_cycle's "steady" mix (1000; 200 with --quick),
  settled by an in-process poller;
* 10 hostile jobs (tests/bench/hostile_logs.py says what each log does),
  each pod with its own kwok-served log file; 7 pods exit 0 during the run,
  3 keep running and are read for progress (progress-interval 30 s);
* 50 ordinary jobs with running pods (30 with --quick), terminated at random
  moments over --spread seconds while the hostile pods terminate too; the
  run ends when all of them are Finished and the service has completed 6
  cycles since the last termination (so every running job's log was read),
  or --deadline seconds after the last termination.

The poller runs as a service process (`poll-interval` --interval). Every
0.1 s a guard reads its VmRSS and kills it above --guard-mib (SIGABRT, so
faulthandler logs each thread's stack, then SIGKILL); every 0.5 s the sample
is kept. An address-space limit (RLIMIT_AS) is a backstop.
A process that exits or is killed is restarted after 10, 20, 40, ... s, as
kubelet would (--max-restarts). It reports: peak RSS (VmHWM, the largest of
all the processes) and the time spent above the Deployment's limit; the
ordinary jobs' latency p50/p99 (from the exit PATCH sent to kwok); the
longest cycle (`cycle: ... in X s` log lines) and the longest time without a
completed cycle; what each hostile job ended as (state/reason/message read
from the API); whether the poller survived (exits, guard kills, restarts);
and the errors the poller logged per job.

Disk: the hostile logs are written to the work directory (under $TMPDIR,
about 450 MB, never more than 2 GiB; the script checks the free space
first). Run from the repository root::

    python tests/bench/bench_hostile.py --quick     # N=200, a few minutes
    python tests/bench/bench_hostile.py --json hostile.json
    python tests/bench/bench_hostile.py --hostile zip-bomb,deep-results   # a subset

Targets: peak RSS <= the limit; every timed job Finished, p99 <= interval
+ 2 s; the process never ends; every hostile job whose pod exited is Complete;
no job's handling raised. ``--check`` exits 1 when one is missed. Everything it starts is stopped
on exit, failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from bench_cycle import (
    JOBS_API,
    KWOK_API,
    REPO_ROOT,
    Bench,
    HttpError,
    Population,
    fmt,
    free_port,
    log,
    summary,
)
from guarded_service import GUARD_MIB, SAMPLE_EVERY, Guarded, cycle_figures, logged_errors
from hostile_logs import HOSTILE, MAX_DISK_BYTES, Hostile, last_line, write_logs
from lmeval_sandbox import kwok

from poller import api
from poller.jobpod import podspec

# Completed cycles to wait for after the last termination: with 150 running
# jobs and 50 progress reads a cycle, every running job's log is read by then.
CYCLES_AFTER = 6
HOSTILE_NS = "hostile"
LATENCY_NS = "ordinary-latency"


def deployment_limit_mib() -> float:
    """The poller container's memory limit in deploy/base/deployment.yaml, in MiB."""
    docs = yaml.safe_load_all((REPO_ROOT / "deploy" / "base" / "deployment.yaml").read_text())
    deployment = next(d for d in docs if d and d.get("kind") == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    text = str(container["resources"]["limits"]["memory"])
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(text[:-2]) * units[text[-2:]] if text[-2:] in units else int(text) / 2**20


class HostileRun:
    """The measured part: hostile and latency jobs, the guarded service, the figures."""

    def __init__(self, bench: Bench, args: argparse.Namespace, hostile: list[Hostile]) -> None:
        self.bench = bench
        self.args = args
        self.hostile = hostile
        self.rng = random.Random(args.seed)
        self.service: Guarded | None = None

    def jobs_in(self, namespace: str) -> dict[str, dict[str, Any]]:
        page = self.bench.admin.json("GET", f"{JOBS_API}/namespaces/{namespace}/{api.PLURAL}")
        return {job["metadata"]["name"]: job for job in page["items"]}

    def create_jobs(self, namespace: str, names: list[str], first_index: int) -> dict[str, str]:
        """Jobs with running pods (through bench_cycle's one pod-creating path); name -> pod."""
        self.bench.make_namespace(namespace)
        with concurrent.futures.ThreadPoolExecutor(self.args.workers) as pool:
            list(
                pool.map(
                    lambda k: self.bench.create_job(namespace, names[k], first_index + k, "R"),
                    range(len(names)),
                )
            )
        return {
            name: podspec.pod_name(name, job["metadata"]["uid"])
            for name, job in self.jobs_in(namespace).items()
        }

    def serve_hostile_logs(self, pods: dict[str, str], log_dir: Path) -> None:
        """A kwok Logs object per hostile pod (it wins over the ClusterLogs); wait till served."""
        for job in self.hostile:
            body = kwok.logs_body(HOSTILE_NS, pods[job.name], log_dir / job.log)
            with contextlib.suppress(HttpError):
                self.bench.admin.request(
                    "POST", f"{KWOK_API}/namespaces/{HOSTILE_NS}/logs", body=body
                )
        deadline = time.monotonic() + 120
        for job in self.hostile:
            want = last_line(log_dir / job.log)[:200]
            path = f"/api/v1/namespaces/{HOSTILE_NS}/pods/{pods[job.name]}/log"
            while True:
                with contextlib.suppress(HttpError):
                    got = self.bench.admin.request("GET", path, query={"tailLines": 1}, retries=0)
                    if got.decode(errors="replace").startswith(want):
                        break
                if time.monotonic() > deadline:
                    raise AssertionError(f"kwok does not serve {job.log} for {job.name}")
                time.sleep(0.5)

    def terminate(self, namespace: str, pod: str) -> None:
        self.bench.admin.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{pod}",
            body={"metadata": {"annotations": {kwok.ANNOTATION_EXIT_CODE: "0"}}},
            content_type="application/merge-patch+json",
        )

    def measure(self, log_dir: Path, workdir: Path) -> dict[str, Any]:
        args, interval = self.args, self.args.interval
        self.bench.put_settings(
            **{"poll-interval": f"{interval:g}s", "progress-interval": args.progress_interval}
        )
        hostile_pods = self.create_jobs(HOSTILE_NS, [h.name for h in self.hostile], 200_000)
        self.serve_hostile_logs(hostile_pods, log_dir)
        names = [f"latency-{k:03d}" for k in range(args.latency_jobs)]
        latency_pods = self.create_jobs(LATENCY_NS, names, 100_000)
        metrics_port = free_port()
        argv = self.bench.poller_argv(
            "--identity", "bench-hostile", "--metrics-address", "127.0.0.1",
            "--metrics-port", str(metrics_port),
        )  # fmt: skip
        log_path = workdir / "poller-service.log"
        self.service = service = Guarded(argv, log_path, workdir, args.guard_mib, args.max_restarts)
        began = time.time()
        service.start()
        log(f"  service started (pid {service.proc.pid if service.proc else '?'})")
        deadline = time.monotonic() + 60 + 10 * interval
        running_at = math.nan
        while time.monotonic() < deadline:
            states = {
                n: (j.get("status") or {}).get("state") for n, j in self.jobs_in(LATENCY_NS).items()
            }
            if all(s == "Running" for s in states.values()):
                running_at = time.time() - began
                break
            time.sleep(0.5)
        log(f"  latency jobs Running after {running_at:.1f} s; terminating over {args.spread:g} s")

        terminated: dict[str, float] = {}
        finished: dict[str, float] = {}
        stop = threading.Event()
        scrapes: list[int] = []
        scrape_failures: Counter[str] = Counter()

        def watch() -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    now = time.time()
                    for name, job in self.jobs_in(LATENCY_NS).items():
                        conditions = (job.get("status") or {}).get("conditions") or []
                        done = any(
                            c["type"] == "Finished" and c["status"] == "True" for c in conditions
                        )
                        if done and name in terminated and name not in finished:
                            finished[name] = now
                stop.wait(0.2)

        def scrape() -> None:  # as Prometheus would, so the peak includes /metrics
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            while not stop.wait(5.0):
                try:
                    with urllib.request.urlopen(url, timeout=30) as response:
                        scrapes.append(len(response.read()))
                except OSError as error:
                    scrape_failures[f"{type(error).__name__}: {error}"[:80]] += 1

        threads = [threading.Thread(target=f, daemon=True) for f in (watch, scrape)]
        for thread in threads:
            thread.start()
        plan = [(self.rng.uniform(0, args.spread), LATENCY_NS, n, latency_pods[n]) for n in names]
        plan += [
            (self.rng.uniform(0, args.spread), HOSTILE_NS, h.name, hostile_pods[h.name])
            for h in self.hostile
            if h.terminates
        ]
        start = time.monotonic()
        hostile_exits: dict[str, float] = {}
        for offset, namespace, name, pod in sorted(plan):
            time.sleep(max(0.0, start + offset - time.monotonic()))
            (terminated if namespace == LATENCY_NS else hostile_exits)[name] = time.time()
            self.terminate(namespace, pod)
        last, last_wall = time.monotonic(), time.time()
        # Until every ordinary job finished and the service completed enough
        # cycles for every hostile job to be read, or the deadline.
        while time.monotonic() < last + args.deadline:
            if len(finished) == len(names):
                text = log_path.read_text(errors="replace")
                if cycle_figures(text, last_wall, time.time())["cycles"] >= CYCLES_AFTER:
                    break
            time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join(timeout=40)
        ended = time.time()
        hostile_final = self.jobs_in(HOSTILE_NS)
        alive = service.alive
        service.stop()
        text = log_path.read_text(errors="replace")
        latencies = [finished[n] - terminated[n] for n in names if n in finished]
        hwms = [s[3] for s in service.samples] + [e["vm_hwm"] for e in service.ends]
        limit = deployment_limit_mib()
        over = [s for s in service.samples if s[2] > limit]
        return {
            "ordinary_jobs": args.jobs,
            "latency_jobs": len(names),
            "hostile": [h.name for h in self.hostile],
            "interval": interval,
            "limit_mib": limit,
            "guard_mib": args.guard_mib,
            "peak_vm_hwm_mib": max(hwms, default=math.nan),
            "peak_vm_size_mib": service.peak_size_mib,
            "seconds_over_limit": len(over) * SAMPLE_EVERY,
            "first_over_limit": (over[0][0] - began) if over else None,
            "samples": [
                (round(t - began, 2), pid, round(r, 1)) for t, pid, r, _ in service.samples
            ],
            "finished": len(latencies),
            "latency": summary(latencies),
            "running_after": running_at,
            **cycle_figures(text, began, ended),
            "alive_at_end": alive,
            "process_ends": [
                {**e, "at": round(e["at"] - began, 1)} for e in service.ends if not e.get("stopped")
            ],
            "starts": len(service.starts),
            "errors": logged_errors(text),
            "scrapes": len(scrapes),
            "scrape_failures": dict(scrape_failures),
            "hostile_jobs": {
                h.name: {
                    "attack": h.attack,
                    "pod_exits": h.terminates,
                    "exited_at": round(hostile_exits[h.name] - began, 1)
                    if h.name in hostile_exits
                    else None,
                    **{
                        key: (hostile_final.get(h.name, {}).get("status") or {}).get(key)
                        for key in ("state", "reason", "message", "progress")
                    },
                }
                for h in self.hostile
            },
        }


# -- output ----------------------------------------------------------------------


def report(result: dict[str, Any]) -> str:
    lat, target = result["latency"], result["interval"] + 2
    ends = result["process_ends"]
    kills = sum(1 for e in ends if e["guard"])
    lines = [
        f"{result['ordinary_jobs']} ordinary jobs (steady mix) + {result['latency_jobs']} "
        f"terminated during the run + {len(result['hostile'])} hostile; poll interval "
        f"{result['interval']:g} s",
        f"peak RSS (VmHWM)      {result['peak_vm_hwm_mib']:.0f} MiB   limit "
        f"{result['limit_mib']:.0f} MiB; above it for {result['seconds_over_limit']:.1f} s"
        + (f" (first at +{result['first_over_limit']:.1f} s)" if result["first_over_limit"] else "")
        + f"; guard {result['guard_mib']:.0f} MiB",
        f"ordinary latency      p50 {fmt(lat['median'])} s, p99 {fmt(lat['p99'])} s "
        f"({result['finished']}/{result['latency_jobs']} Finished); target p99 <= {target:g} s",
        f"cycles                {result['cycles']} completed, longest "
        f"{fmt(result['cycle']['max'])} s, p50 {fmt(result['cycle']['median'])} s; "
        "longest without a completed cycle "
        f"{result['longest_without_cycle']:.1f} s",
        f"poller process        {'alive' if result['alive_at_end'] else 'NOT alive'} at the end; "
        f"{result['starts']} start(s), {len(ends)} ended early ({kills} by the memory guard)",
    ]
    errors = result["errors"]
    stacks = iter(errors["at_guard_kill"])
    for end in ends:
        how = "killed by the guard" if end["guard"] else f"exit code {end['exit_code']}"
        lines.append(f"  +{end['at']:.1f} s pid {end['pid']}: {how}, VmHWM {end['vm_hwm']:.0f} MiB")
        if end["guard"]:
            lines += [f"      busy: {frame}" for frame in next(stacks, [])]
    lines.append(
        f"logged                {errors['cycle_failures']} failed cycles; exceptions "
        f"{errors['exceptions'] or '-'}; /metrics {result['scrapes']} scrapes, "
        f"{sum(result['scrape_failures'].values())} failed"
    )
    lines += [
        "",
        "hostile job             pod      state/reason           message"
        "   (exit@: seconds after the service started)",
    ]
    for name, job in result["hostile_jobs"].items():
        pod = f"exit@{job['exited_at']:.0f}s" if job["exited_at"] is not None else "running"
        state = f"{job['state']}/{job['reason']}"
        message = (job["message"] or "-").replace("\n", " ")[:90]
        lines.append(f"{name:23} {pod:8} {state:22} {message}")
        logged = errors["per_job"].get(f"{HOSTILE_NS}/{name}")
        if logged:
            lines.append(f"{'':23} {logged['count']} errors logged, first: {logged['first'][:90]}")
    others = {k: v for k, v in errors["per_job"].items() if not k.startswith(f"{HOSTILE_NS}/")}
    if others:
        lines.append(f"errors logged for {len(others)} ordinary jobs, e.g. {next(iter(others))}")
    return "\n".join(lines)


def targets(result: dict[str, Any]) -> list[str]:
    missed = []
    if not result["peak_vm_hwm_mib"] <= result["limit_mib"]:
        missed.append(
            f"peak RSS {result['peak_vm_hwm_mib']:.0f} MiB > limit {result['limit_mib']:.0f} MiB"
        )
    if result["finished"] < result["latency_jobs"]:
        missed.append(f"only {result['finished']}/{result['latency_jobs']} ordinary jobs Finished")
    elif result["latency"]["p99"] > result["interval"] + 2:
        missed.append(f"ordinary latency p99 {result['latency']['p99']:.2f} s")
    if result["process_ends"] or not result["alive_at_end"]:
        missed.append(f"the poller process ended {len(result['process_ends'])} time(s)")
    # Poison must not wedge a job: an exited pod's job ends, whatever its log said.
    wedged = [
        name
        for name, job in result["hostile_jobs"].items()
        if job["pod_exits"] and job["state"] != "Complete"
    ]
    if wedged:
        missed.append(f"hostile jobs not Complete after their pod exited: {', '.join(wedged)}")
    # A log's content is data: handling a job must not raise because of it.
    raised = sorted(result["errors"]["per_job"])
    if raised:
        missed.append(f"errors handling {len(raised)} job(s): {', '.join(raised)}")
    return missed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [h.name for h in HOSTILE]
    parser.add_argument("--jobs", type=int, default=1000, help="ordinary jobs, steady mix")
    parser.add_argument("--quick", action="store_true", help="200 ordinary jobs, 30 latency jobs")
    parser.add_argument("--latency-jobs", type=int, default=50, help="ordinary jobs terminated")
    parser.add_argument(
        "--hostile", default=",".join(names), help=f"hostile jobs, any of: {', '.join(names)}"
    )
    parser.add_argument("--interval", type=float, default=5.0, help="poll interval, seconds")
    parser.add_argument("--progress-interval", default="30s", help="setting (the default 30s)")
    parser.add_argument(
        "--spread", type=float, default=20.0, help="terminations spread over this many seconds"
    )
    parser.add_argument(
        "--deadline", type=float, default=180.0, help="seconds to wait after the last termination"
    )
    parser.add_argument("--guard-mib", type=float, default=GUARD_MIB, help="kill the poller above")
    parser.add_argument("--max-restarts", type=int, default=5, help="restarts after an exit/kill")
    parser.add_argument("--nodes", type=int, default=4, help="kwok nodes")
    parser.add_argument("--workers", type=int, default=12, help="threads creating objects")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs = 200
        args.latency_jobs = min(args.latency_jobs, 30)
        args.spread = min(args.spread, 15.0)
    wanted = [n.strip() for n in args.hostile.split(",") if n.strip()]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        parser.error(f"--hostile: unknown {', '.join(unknown)} (known: {', '.join(names)})")
    args.hostile_jobs = [h for h in HOSTILE if h.name in wanted]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    free = shutil.disk_usage(workdir).free
    if free < MAX_DISK_BYTES + 2 * 1024**3:
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"not enough disk in {workdir.parent}: {free / 2**30:.1f} GiB free", file=sys.stderr)
        return 2
    began = time.monotonic()
    bench = Bench(args, workdir)
    run = HostileRun(bench, args, args.hostile_jobs)
    result: dict[str, Any] | None = None
    try:
        log_dir = workdir / "hostile-logs"
        sizes = write_logs(log_dir, args.hostile_jobs)
        log(f"hostile logs: {sum(sizes.values()) / 2**20:.0f} MiB in {log_dir}")
        bench.start()
        population = Population("steady", "bench")
        log(f"creating {args.jobs} ordinary jobs")
        bench.populate(population, args.jobs)
        bench.put_settings(**{"max-running-jobs": str(population.slots())})
        bench.wait_for_kwok(population, timeout=120 + args.jobs / 10)
        bench.settle()
        result = run.measure(log_dir, workdir)
    finally:
        if run.service is not None:
            run.service.stop()
        bench.stop()
        if args.keep:
            log(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report(result))
    missed = targets(result)
    print("\ntargets: " + ("all met" if not missed else "MISSED:\n  " + "\n  ".join(missed)))
    print(f"(total {time.monotonic() - began:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
