"""Sharded evaluations (``spec.parallelism``): wall time at 1 to 8 shards, and what shard
pods cost the poller's cycle (a script, not a test).

Why this exists: sharding is only worth its pods if an evaluation finishes
sooner, and only affordable if the poller's idle cycle stays the cost of the
pods it lists. Two measurements, each printed as a table:

1. **wall** (``--part wall``): one evaluation run exactly as the pods run it,
   as local processes against the sandbox's loopback model server
   (``lmeval_sandbox.model_server.ModelServer``, a thread per connection,
   so as many requests at once as clients send, each answered after
   ``--delay`` seconds: a model with capacity for many concurrent requests).
   The tasks are tests/driver/shardtasks (multiple choice, a group of two,
   generation with bleu and chrf, loglikelihood perplexity, rolling
   loglikelihood, two-shot with random examples) on generated data of
   ``--docs`` documents (two thirds as many for shard_mcb). Per round, in an
   order rotated each round:

   * the unsharded baseline, ``python -P -m lm_eval <args> --output_path=...``;
   * for each N of ``--shards``: N concurrent ``python -P -m driver.shards
     run --index=k --count=N --root=DIR -- <args> --output_path=...`` (the
     argv ``driver.protocol.shard_run_argv`` gives the shard pods), then
     ``python -P -m driver.shards merge ...``, each N on a fresh claim
     directory (empty response caches).

   Per run: wall time (shards: first start to last exit), CPU seconds of
   every process (``wait4``'s rusage, their children included), the model
   server's CPU (this process), and the machine's other load (CPU seconds
   /proc/stat counted busy beyond those). The speed-up is the round's
   unsharded wall time over the sharded total (shards + merge), median over
   rounds. Every merged results file must equal the unsharded one (results,
   groups, configs, n-samples, task hashes, config...) and every merged
   samples file must equal the unsharded one line for line: otherwise the
   script prints no figures and exits 1.

   The fixed cost each lm_eval process pays before its first request
   (interpreter, ``import lm_eval``, lm_eval's task index, the job's tasks)
   is measured by a probe that does exactly the shard's start-up
   (``driver.shardplan.parse_lm_eval_args`` + ``load_job``), alone, and
   (full mode) as ``max(--shards)`` probes at once.

2. **cycle** (``--part cycle``): on bench_cycle.py's sandbox control plane
   (``Bench``: etcd, kube-apiserver, kwok; imported, not copied), the real
   poller's idle cycle (in-process ``Reconciler.run_cycle``) against the
   raw-list floor, and its requests and writes per idle cycle (audit log),
   for J jobs of ``--shards-per-job`` (8) running shards each (J x 8 shard
   pods on kwok made with ``podspec.build_pod(shard=k)`` and the poller's
   proof, the jobs' status recording each shard Running with its attempt and
   pod UID, as the poller writes it), then, on the same plane after those
   are deleted, J x 8 single-pod jobs with running pods (bench_cycle's
   ``create_job``), for each J of ``--jobs``. The poller then settles both
   populations (cycles until one writes nothing) before the idle cycles.

Run from the repository root::

    python tests/bench/bench_shards.py --quick                 # both parts, 4-5 minutes
    python tests/bench/bench_shards.py --json shards.json      # 80 docs, 3 rounds; 1000 x 8
    python tests/bench/bench_shards.py --part wall --rounds 3 --docs 80
    python tests/bench/bench_shards.py --part cycle --jobs 100,250

``PYTHONPATH=<other checkout>`` measures another copy of ``poller`` (cycle
part), as with bench_cycle.py.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, this file's directory is on sys.path: bench_cycle is a sibling.
from bench_cycle import (
    JOBS_API,
    JOBS_LIST,
    POD_SETTINGS,
    PODS_LIST,
    REPO_ROOT,
    Bench,
    HttpError,
    Population,
    fmt,
    job_spec,
    log,
    stamp,
)
from lmeval_sandbox.model_server import ModelServer

from driver.protocol import shard_merge_argv, shard_run_argv
from driver.shardplan import ENV_TERMINATION_LOG
from poller import api
from poller.cycle.observe import MANAGED_SELECTOR
from poller.jobpod import podspec

SHARDTASKS = REPO_ROOT / "tests" / "driver" / "shardtasks"
TASKS = "shard_grp,shard_gen,shard_ll,shard_roll,shard_fs"
LEAF_TASKS = ("shard_mc", "shard_mcb", "shard_gen", "shard_ll", "shard_roll", "shard_fs")
# The results file's keys a merge computes (tests/driver/test_shards.py's list):
# all must equal the unsharded run's.
COMPUTED = (
    "results",
    "groups",
    "group_subtasks",
    "configs",
    "versions",
    "n-shot",
    "higher_is_better",
    "n-samples",
    "task_hashes",
    "config",
)
COMPLETIONS = "POST /v1/completions"
CLOCK_TICK = os.sysconf("SC_CLK_TCK")

# What one shard's process does before its first request (driver.shards.run_shard's
# start: lm_eval's CLI parser, the task index, the job's tasks), timed in parts.
PROBE = """\
import json, sys, time
w0, c0 = time.perf_counter(), time.process_time()
from driver.shardplan import lm_eval_module, load_job, parse_lm_eval_args
lm_eval_module("lm_eval._cli.harness")
lm_eval_module("lm_eval.evaluator")
w1, c1 = time.perf_counter(), time.process_time()
index = lm_eval_module("lm_eval.tasks._index")
built = index.TaskIndex.build
spent = [0.0, 0.0]
def timed(*args, **kwargs):
    w, c = time.perf_counter(), time.process_time()
    try:
        return built(*args, **kwargs)
    finally:
        spent[0] += time.perf_counter() - w
        spent[1] += time.process_time() - c
index.TaskIndex.build = staticmethod(timed)
job = load_job(parse_lm_eval_args(sys.argv[1:]))
w2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({
    "import_wall": w1 - w0, "import_cpu": c1 - c0,
    "index_wall": spent[0], "index_cpu": spent[1],
    "tasks_wall": w2 - w1 - spent[0], "tasks_cpu": c2 - c1 - spent[1],
    "documents": sum(plan.documents for plan in job.plans.values()),
}))
"""


# -- part 1: wall time of one evaluation at 1 to 8 shards -----------------------------


def write_tasks(directory: Path, docs: int) -> dict[str, int]:
    """tests/driver/shardtasks with generated data: `docs` documents (shard_mcb: 2/3)."""
    directory.mkdir(parents=True, exist_ok=True)
    for source in SHARDTASKS.glob("*.yaml"):
        text = source.read_text(encoding="utf-8").replace("__SHARDTASKS__", str(directory))
        (directory / source.name).write_text(text, encoding="utf-8")

    def doc(i: int) -> str:
        return json.dumps(
            {
                "question": f"What is {i} plus {i}?",
                "choices": [str(2 * i), str(2 * i + 1), "7"],
                "answer": i % 3,
                "text": f"The number {i} doubled is {2 * i} and tripled is {3 * i}.",
            }
        )

    small = max(1, round(docs * 2 / 3))
    (directory / "data.jsonl").write_text("".join(doc(i) + "\n" for i in range(docs)))
    (directory / "data13.jsonl").write_text("".join(doc(1000 + i) + "\n" for i in range(small)))
    return {"data.jsonl": docs, "data13.jsonl": small}


def lm_env(hf_home: Path) -> dict[str, str]:
    """What the job pods' lm_eval runs with, offline (tests/driver/conftest.py's child_env)."""
    env = dict(os.environ)
    env.update(
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(hf_home),
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
    )
    for name in ("LMEVAL_OUTPUT_ROOT", "LMEVAL_RUN_ID"):
        env.pop(name, None)
    return env


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy since boot (every core; /proc/stat)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICK


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Proc:
    """One process run to its end: wall seconds, CPU seconds (its waited-for children too)."""

    argv: list[str]
    log: Path
    started: float = 0.0
    ended: float = 0.0
    returncode: int = -1
    cpu: float = 0.0

    @property
    def wall(self) -> float:
        return self.ended - self.started

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


@dataclass
class Phase:
    """Processes started together: wall from the first start to the last exit."""

    procs: list[Proc]
    wall: float
    cpu: float  # sum over the processes
    server_cpu: float  # this process: the model server's threads
    others_cpu: float  # the machine's busy CPU seconds beyond those two
    load: tuple[float, float, float]  # load averages at the end
    began: float  # perf_counter() at the first start


def run_together(argvs: list[list[str]], env_of: list[dict[str, str]], logs: list[Path]) -> Phase:
    """Start every argv at once and wait for all; rusage of each from wait4."""
    procs = [Proc(argv, log) for argv, log in zip(argvs, logs, strict=True)]
    busy0, own0 = machine_busy(), own_cpu()
    began = time.perf_counter()
    waiters = []
    with contextlib.ExitStack() as stack:
        for proc, env in zip(procs, env_of, strict=True):
            out = stack.enter_context(proc.log.open("wb"))
            proc.started = time.perf_counter()
            popen = subprocess.Popen(
                proc.argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=proc.log.parent
            )

            def wait(popen: subprocess.Popen[bytes] = popen, proc: Proc = proc) -> None:
                _pid, status, usage = os.wait4(popen.pid, 0)
                proc.ended = time.perf_counter()
                proc.returncode = os.waitstatus_to_exitcode(status)
                popen.returncode = proc.returncode  # reaped here, not by Popen
                proc.cpu = usage.ru_utime + usage.ru_stime

            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            waiters.append(thread)
        for thread in waiters:
            thread.join()
    wall = time.perf_counter() - began
    cpu = sum(p.cpu for p in procs)
    server = own_cpu() - own0
    return Phase(
        procs,
        wall,
        cpu,
        server,
        max(0.0, machine_busy() - busy0 - cpu - server),
        os.getloadavg(),
        began,
    )


@dataclass
class Outputs:
    results: dict[str, Any]
    samples: dict[str, list[str]]  # task -> lines of its samples file


def read_outputs(output_path: Path) -> Outputs:
    """The results file lm_eval (or the merge) wrote under `output_path`, and its samples."""
    found = sorted(output_path.rglob("results_*.json"))
    if len(found) != 1:
        raise AssertionError(f"{output_path}: {len(found)} results files")
    path = found[0]
    date_id = path.name[len("results_") : -len(".json")]
    samples = {
        task: (path.parent / f"samples_{task}_{date_id}.jsonl").read_text().splitlines()
        for task in LEAF_TASKS
    }
    return Outputs(json.loads(path.read_text()), samples)


def differences(merged: Outputs, expected: Outputs) -> list[str]:
    """Where a merge's outputs differ from the unsharded run's (empty: equal)."""
    found = [key for key in COMPUTED if merged.results.get(key) != expected.results.get(key)]
    if json.dumps(merged.results.get("results")) != json.dumps(expected.results.get("results")):
        found.append("results (key order)")
    found += [
        f"samples of {task}"
        for task in LEAF_TASKS
        if merged.samples.get(task) != expected.samples.get(task)
    ]
    return found


class TimedServer(ModelServer):
    """The sandbox model server, noting when each completion request arrived."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arrivals: list[float] = []  # perf_counter() of each completion request

    def _bump(self, endpoint: str) -> int:
        number = super()._bump(endpoint)
        if endpoint == COMPLETIONS:
            with self._lock:
                self.arrivals.append(time.perf_counter())
        return number


class WallBench:
    """Part 1: the unsharded run and N shards + a merge, in rounds."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.tasks = workdir / "tasks"
        self.sizes = write_tasks(self.tasks, args.docs)
        self.env = lm_env(workdir / "hf-home")
        self.server = TimedServer(generation_text="4", delay=args.delay)
        self.runs: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.reference: Outputs | None = None

    def lm_args(self) -> list[str]:
        """The job's lm_eval arguments, as the poller writes them (one token per option)."""
        return [
            "--model=local-completions",
            f"--model_args={self.server.model_args()}",
            f"--tasks={TASKS}",
            f"--include_path={self.tasks}",
            "--batch_size=1",
            "--log_samples",
        ]

    def child_env(self, termination: Path | None = None) -> dict[str, str]:
        env = dict(self.env)
        if termination is not None:
            env[ENV_TERMINATION_LOG] = str(termination)
        return env

    # -- the fixed cost of a process ---------------------------------------------

    def probe(self, count: int, tag: str) -> dict[str, Any]:
        """`count` start-up probes at once: each one's parts, and the wall of all."""
        directory = self.workdir / "probe" / tag
        directory.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-P", "-c", PROBE, *self.lm_args()]
        argv.append(f"--output_path={directory / 'out'}")
        phase = run_together(
            [argv] * count,
            [self.child_env()] * count,
            [directory / f"probe-{k}.log" for k in range(count)],
        )
        parts = []
        for proc in phase.procs:
            if proc.returncode != 0:
                raise AssertionError(f"probe failed ({proc.returncode}):\n{proc.tail()}")
            last = proc.log.read_text().strip().splitlines()[-1]
            parts.append({**json.loads(last), "wall": proc.wall, "cpu": proc.cpu})
        return {
            "count": count,
            "wall": phase.wall,
            "cpu": phase.cpu,
            "others_cpu": phase.others_cpu,
            "load": phase.load,
            "parts": parts,
        }

    # -- the runs ----------------------------------------------------------------------

    def requests_sent(self) -> int:
        return self.server.count(COMPLETIONS)

    def request_times(self, phase: Phase, first: int) -> dict[str, float]:
        """When `phase`'s requests (the arrivals from index `first` on) came, from its start."""
        arrivals = self.server.arrivals[first:]
        if not arrivals:
            return {"first_request": math.nan, "last_request": math.nan}
        return {
            "first_request": arrivals[0] - phase.began,
            "last_request": arrivals[-1] - phase.began,
        }

    def unsharded(self, tag: str) -> dict[str, Any]:
        directory = self.workdir / "runs" / tag
        directory.mkdir(parents=True)
        out = directory / "out"
        argv = [sys.executable, "-P", "-m", "lm_eval", *self.lm_args(), f"--output_path={out}"]
        before, first = self.requests_sent(), len(self.server.arrivals)
        phase = run_together([argv], [self.child_env()], [directory / "lm_eval.log"])
        (proc,) = phase.procs
        if proc.returncode != 0:
            raise AssertionError(f"lm_eval exited {proc.returncode}:\n{proc.tail()}")
        outputs = read_outputs(out)
        if self.reference is None:
            self.reference = outputs
        elif diff := differences(outputs, self.reference):
            self.problems.append(f"{tag}: the unsharded runs differ: {', '.join(diff)}")
        return {
            "variant": "unsharded",
            "shards": 0,
            "total": phase.wall,
            "shards_wall": None,
            "merge_wall": None,
            "cpu": phase.cpu,
            "server_cpu": phase.server_cpu,
            "others_cpu": phase.others_cpu,
            "load": phase.load,
            "requests": self.requests_sent() - before,
            **self.request_times(phase, first),
        }

    def sharded(self, count: int, tag: str) -> dict[str, Any]:
        directory = self.workdir / "runs" / tag
        directory.mkdir(parents=True)
        claim = str(directory / "claim")
        args = self.lm_args()
        python = [sys.executable]  # the contract's argv says "python"
        before, first = self.requests_sent(), len(self.server.arrivals)
        shards = run_together(
            [
                [*python, *shard_run_argv(k, count, claim, args)[1:], f"--output_path={out}"]
                for k, out in enumerate(directory / f"shard-{k}" for k in range(count))
            ],
            [self.child_env(directory / f"termination-{k}") for k in range(count)],
            [directory / f"shard-{k}.log" for k in range(count)],
        )
        for k, proc in enumerate(shards.procs):
            if proc.returncode != 0:
                raise AssertionError(f"{tag} shard {k} exited {proc.returncode}:\n{proc.tail()}")
        sent = self.requests_sent() - before
        merge_out = directory / "merged"
        merge = run_together(
            [[*python, *shard_merge_argv(count, claim, args)[1:], f"--output_path={merge_out}"]],
            [self.child_env(directory / "termination-merge")],
            [directory / "merge.log"],
        )
        (merge_proc,) = merge.procs
        if merge_proc.returncode != 0:
            raise AssertionError(
                f"{tag}: merge exited {merge_proc.returncode}:\n{merge_proc.tail()}"
            )
        merged = read_outputs(merge_out)
        assert self.reference is not None
        if diff := differences(merged, self.reference):
            self.problems.append(
                f"{tag}: the merged outputs differ from the unsharded run's: {', '.join(diff)}"
            )
        done = [
            json.loads((Path(claim) / f"shard-{k}" / "done.json").read_text()) for k in range(count)
        ]
        return {
            "variant": f"{count} shard" + ("s" if count > 1 else ""),
            "shards": count,
            "total": shards.wall + merge.wall,
            "shards_wall": shards.wall,
            "shard_walls": [p.wall for p in shards.procs],
            "merge_wall": merge.wall,
            "cpu": shards.cpu + merge.cpu,
            "shards_cpu": shards.cpu,
            "merge_cpu": merge.cpu,
            "server_cpu": shards.server_cpu + merge.server_cpu,
            "others_cpu": shards.others_cpu + merge.others_cpu,
            "load": merge.load,
            "requests": sent,
            "shard_requests": [d["requests"] for d in done],
            "cached": sum(d["cached"] for d in done),
            "merge_message": (directory / "termination-merge").read_text(),
            **self.request_times(shards, first),
        }

    def run(self) -> dict[str, Any]:
        args = self.args
        self.server.start()
        try:
            log(
                f"wall: {self.sizes} documents, model server delay {args.delay:g} s, "
                f"thread per connection; warming up (datasets cache)"
            )
            self.probe(1, "warm-up")
            probes = [self.probe(1, f"alone-{k}") for k in range(args.probes)]
            alone = [p["parts"][0] for p in probes]
            log(
                "  start-up alone: "
                + ", ".join(f"{p['wall']:.1f} s wall / {p['cpu']:.1f} s CPU" for p in alone)
            )
            together = None
            if args.probe_together:
                together = self.probe(max(args.shard_list), "together")
                log(
                    f"  {together['count']} start-ups at once: {together['wall']:.1f} s wall, "
                    f"{together['cpu']:.1f} s CPU"
                )
            variants: list[int] = [0, *args.shard_list]
            for round_ in range(args.rounds):
                shift = round_ % len(variants)
                order = variants[shift:] + variants[:shift]
                # The first round's unsharded run gives the reference outputs.
                if round_ == 0:
                    order = [0, *[v for v in order if v]]
                for count in order:
                    tag = f"r{round_}-" + (f"n{count}" if count else "unsharded")
                    run = self.sharded(count, tag) if count else self.unsharded(tag)
                    run["round"] = round_
                    self.runs.append(run)
                    log(
                        f"  round {round_} {run['variant']}: total {run['total']:.1f} s"
                        + (
                            f" (shards {run['shards_wall']:.1f} + merge {run['merge_wall']:.1f})"
                            if count
                            else ""
                        )
                        + f", CPU {run['cpu']:.1f} s, server {run['server_cpu']:.1f} s, "
                        f"others {run['others_cpu']:.1f} s, {run['requests']} requests, "
                        f"load {run['load'][0]:.2f}"
                    )
        finally:
            self.server.stop()
        return {
            "documents": self.sizes,
            "delay": args.delay,
            "probes": probes,
            "together": together,
            "runs": self.runs,
            "problems": self.problems,
        }


def wall_rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Per variant: medians over rounds; speed-up against the same round's unsharded run."""
    runs = figures["runs"]
    baseline = {r["round"]: r["total"] for r in runs if r["shards"] == 0}
    rows = []
    for count in sorted({r["shards"] for r in runs}):
        mine = [r for r in runs if r["shards"] == count]

        def median(key: str, mine: list[dict[str, Any]] = mine) -> float:
            values = [r[key] for r in mine if r.get(key) is not None]
            return statistics.median(values) if values else math.nan

        speedups = [baseline[r["round"]] / r["total"] for r in mine if r["round"] in baseline]
        rows.append(
            {
                "variant": mine[0]["variant"],
                "shards": count,
                "rounds": len(mine),
                "shards_wall": median("shards_wall"),
                "slowest_minus_fastest": statistics.median(
                    [max(r["shard_walls"]) - min(r["shard_walls"]) for r in mine]
                )
                if count
                else math.nan,
                "merge_wall": median("merge_wall"),
                "total": median("total"),
                "speedup": statistics.median(speedups) if speedups else math.nan,
                "cpu": median("cpu"),
                "merge_cpu": median("merge_cpu"),
                "server_cpu": median("server_cpu"),
                "others_cpu": median("others_cpu"),
                "requests": median("requests"),
                "first_request": median("first_request"),
                "last_request": median("last_request"),
            }
        )
    return rows


def fixed_cost(figures: dict[str, Any]) -> dict[str, float]:
    """The start-up probe's parts (medians), and the least-squares slope of the shards'
    CPU over N: the CPU seconds each more shard process costs."""
    alone = [p["parts"][0] for p in figures["probes"]]
    out = {
        key: statistics.median(p[key] for p in alone)
        for key in ("wall", "cpu", "import_cpu", "index_cpu", "tasks_cpu")
    }
    points = [(r["shards"], r["shards_cpu"]) for r in figures["runs"] if r["shards"]]
    if len({n for n, _ in points}) >= 2:
        mean_n = statistics.fmean(n for n, _ in points)
        mean_c = statistics.fmean(c for _, c in points)
        slope = sum((n - mean_n) * (c - mean_c) for n, c in points) / sum(
            (n - mean_n) ** 2 for n, _ in points
        )
        out["cpu_per_shard_fit"] = slope
        out["cpu_at_zero_fit"] = mean_c - slope * mean_n
    together = figures.get("together")
    if together:
        out["together_count"] = together["count"]
        out["together_wall"] = together["wall"]
        out["together_cpu"] = together["cpu"]
    return out


def wall_table(figures: dict[str, Any]) -> str:
    rows = wall_rows(figures)
    header = [
        "variant", "rounds", "1st req", "last req", "shards wall", "spread", "merge wall",
        "total", "speed-up",
        "CPU s", "merge CPU", "server CPU", "others' CPU", "requests",
    ]  # fmt: skip
    lines = [header]
    for r in rows:
        lines.append(
            [
                r["variant"],
                str(r["rounds"]),
                fmt(r["first_request"], 1),
                fmt(r["last_request"], 1),
                fmt(r["shards_wall"], 1),
                fmt(r["slowest_minus_fastest"], 1),
                fmt(r["merge_wall"], 1),
                fmt(r["total"], 1),
                fmt(r["speedup"], 2),
                fmt(r["cpu"], 1),
                fmt(r["merge_cpu"], 1),
                fmt(r["server_cpu"], 1),
                fmt(r["others_cpu"], 1),
                fmt(round(r["requests"])),
            ]
        )
    text = render(lines)
    cost = fixed_cost(figures)
    notes = [
        "",
        f"documents {figures['documents']}; model server delay {figures['delay']:g} s per "
        "request, a thread per connection (no limit on concurrent requests);",
        "seconds; medians over rounds; 1st req / last req = the first / last request the model "
        "got, from the start",
        "(of lm_eval, or of the shards); speed-up = the round's unsharded wall / total; spread = "
        "slowest shard - fastest;",
        "CPU s = every process's CPU (shards + merge); server CPU = the model server's; "
        "others' CPU = the machine's other work meanwhile.",
        f"fixed cost of one process before its first request (probe, alone): {cost['wall']:.1f} "
        f"s wall, {cost['cpu']:.1f} s CPU, of which import lm_eval {cost['import_cpu']:.1f} s, "
        f"task index {cost['index_cpu']:.1f} s, the job's tasks {cost['tasks_cpu']:.1f} s",
    ]
    if "cpu_per_shard_fit" in cost:
        notes.append(
            f"shards' CPU over N (least squares): {cost['cpu_per_shard_fit']:.1f} s per shard "
            f"process + {cost['cpu_at_zero_fit']:.1f} s"
        )
    cores = os.cpu_count() or 1
    disturbed = [
        f"round {r['round']} {r['variant']} ({r['others_cpu']:.0f} s)"
        for r in figures["runs"]
        if r["others_cpu"] > 0.1 * cores * r["total"]
    ]
    if disturbed:
        notes.append("beside other work (others' CPU > 10 % of the cores): " + ", ".join(disturbed))
    if "together_wall" in cost:
        notes.append(
            f"{cost['together_count']} start-ups at once: {cost['together_wall']:.1f} s wall, "
            f"{cost['together_cpu']:.1f} s CPU on {os.cpu_count()} cores"
        )
    return text + "\n" + "\n".join(notes)


# -- part 2: the poller's cycle beside shard pods ---------------------------------------------

SHARD_CLAIM = "bench-shards"  # spec.outputs.pvcName (never mounted: kwok runs no containers)


def running_condition(kind: str, reason: str, message: str, when: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": when,
        "observedGeneration": 1,
    }


def sharded_status(count: int, pod_uids: list[str]) -> dict[str, Any]:
    """A sharded job's status with every shard Running (the poller's run_shards writes this)."""
    now = dt.datetime.now(dt.UTC)
    begun = stamp(now - dt.timedelta(minutes=10))
    status = {
        "state": "Running",
        "reason": "NoReason",
        "message": f"{count} of {count} shards running, 0 done",
        "startTime": begun,
        "shards": [
            {"index": k, "state": "Running", "attempt": 1, "podUID": uid}
            for k, uid in enumerate(pod_uids)
        ],
        "shardsDone": f"0/{count}",
        "progress": {
            "percent": 0.0,
            "phase": "shards",
            "line": f"0/{count} shards done",
            "updateTime": stamp(now),
        },
        "conditions": [
            running_condition("Scheduled", "ShardsCreated", f"{count} shard pods created", begun),
            running_condition("Running", "ShardsRunning", "the shards' evaluations run", begun),
        ],
        "observedGeneration": 1,
    }
    api.LMEvalJobStatus.model_validate(status)  # what the poller could have written
    return status


def create_sharded_job(bench: Bench, namespace: str, name: str, index: int, count: int) -> None:
    """One job with spec.parallelism `count`, its shard pods Running on one kwok node
    (the pods the poller makes: build_pod with a shard index, its proof for attempt 1),
    and its status recording them."""
    spec = {**job_spec(index), "parallelism": count, "outputs": {"pvcName": SHARD_CLAIM}}
    path = f"{JOBS_API}/namespaces/{namespace}/{api.PLURAL}"
    body = {
        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": spec,
    }
    try:
        created = bench.admin.json("POST", path, body=body)
    except HttpError as error:
        if error.status != 409:  # a retried POST that had gone through
            raise
        created = bench.admin.json("GET", f"{path}/{name}")
    uid = str(created["metadata"]["uid"])
    validated = api.LMEvalJobSpec.model_validate(spec)
    node = f"kwok-node-{index % bench.args.nodes}"  # the shards' pod affinity: one node
    pod_uids = []
    for k in range(count):
        manifest = podspec.build_pod(
            name=name, namespace=namespace, uid=uid, spec=validated, settings=POD_SETTINGS, shard=k
        )
        manifest = bench.proof.stamp(manifest, uid, 1)
        manifest["spec"]["nodeName"] = node
        pods = f"/api/v1/namespaces/{namespace}/pods"
        try:
            pod = bench.admin.json("POST", pods, body=manifest)
        except HttpError as error:
            if error.status != 409:
                raise
            pod = bench.admin.json("GET", f"{pods}/{manifest['metadata']['name']}")
        pod_uids.append(str(pod["metadata"]["uid"]))
    bench.admin.request(
        "PATCH",
        f"{path}/{name}/status",
        body={"status": sharded_status(count, pod_uids)},
        content_type="application/merge-patch+json",
    )


def listed_bytes(bench: Bench) -> tuple[int, int]:
    """Bytes of every page of the jobs LIST and of the managed pods LIST (JSON)."""
    sizes = []
    for path, query in ((JOBS_LIST, {}), (PODS_LIST, {"labelSelector": MANAGED_SELECTOR})):
        total, token = 0, None
        while True:
            raw = bench.admin.request("GET", path, query={**query, "limit": 500, "continue": token})
            total += len(raw)
            token = (json.loads(raw).get("metadata") or {}).get("continue")
            if not token:
                break
        sizes.append(total)
    return sizes[0], sizes[1]


@dataclass
class CycleBench:
    args: argparse.Namespace
    workdir: Path
    results: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bench = Bench(self.args, self.workdir)

    def populate(self, kind: str, jobs: int, per_job: int) -> tuple[Population, float]:
        """`jobs` sharded jobs of `per_job` shards, or `jobs` single-pod jobs (kind)."""
        population = Population(kind, "shd" if kind == "sharded" else "one")
        for namespace in population.namespaces():
            self.bench.make_namespace(namespace)
        started = time.monotonic()

        def one(index: int) -> None:
            namespace = f"{population.prefix}-{index % 10:02d}"
            name = f"eval-{index:05d}"
            if kind == "sharded":
                create_sharded_job(self.bench, namespace, name, index, per_job)
            else:
                self.bench.create_job(namespace, name, index, "R")

        done = 0
        with concurrent.futures.ThreadPoolExecutor(self.args.workers) as pool:
            for _ in pool.map(one, range(jobs)):
                done += 1
                if done % 1000 == 0:
                    log(f"  created {done}/{jobs} jobs")
        population.count = jobs
        # wait_for_kwok counts every managed pod by state: all of them run.
        population.kinds["R"] = jobs * (per_job if kind == "sharded" else 1)
        return population, time.monotonic() - started

    def measure(self, kind: str, jobs: int, per_job: int) -> Population:
        pods = jobs * (per_job if kind == "sharded" else 1)
        log(f"== {kind}: {jobs} jobs, {pods} running pods")
        population, created = self.populate(kind, jobs, per_job)
        log(f"  created in {created:.1f} s; waiting for kwok")
        kwok_wait = self.bench.wait_for_kwok(population, timeout=180 + pods / 10)
        log(f"  kwok caught up after {kwok_wait:.1f} s more; settling")
        settle_started = time.monotonic()
        settle_cycles = self.bench.settle()
        settle_seconds = time.monotonic() - settle_started
        job_bytes, pod_bytes = listed_bytes(self.bench)
        result: dict[str, Any] = {
            "kind": kind,
            "jobs_made": jobs,
            "shards_per_job": per_job if kind == "sharded" else 1,
            "populate_seconds": round(created, 1),
            "kwok_wait_seconds": round(kwok_wait, 1),
            "settle_cycles": settle_cycles,
            "settle_seconds": round(settle_seconds, 1),
            "jobs_list_bytes": job_bytes,
            "pods_list_bytes": pod_bytes,
            "loadavg_before": os.getloadavg(),
        }
        result.update(self.bench.idle_cycles(self.args.cycles, f"{kind}-{jobs}"))
        result["loadavg_after"] = os.getloadavg()
        log(
            f"  idle: cycle {result['cycle']['median']:.3f} s, floor "
            f"{result['floor']['median']:.3f} s, ratio {result['ratio']:.2f}, requests "
            f"{result['requests_per_cycle']}, writes {sum(result['writes_per_cycle'])}, "
            f"load {result['loadavg_after'][0]:.2f}"
        )
        self.results.append(result)
        return population

    def run(self) -> list[dict[str, Any]]:
        bench = self.bench
        bench.start()
        try:
            # No queue: every job runs (a sharded job would otherwise take 8 slots).
            bench.put_settings(**{"max-running-jobs": "0"})
            sizes = self.args.job_list
            for position, jobs in enumerate(sizes):
                sharded = self.measure("sharded", jobs, self.args.shards_per_job)
                log("  removing the sharded jobs")
                began = time.monotonic()
                bench.delete_namespaces(sharded.namespaces(), timeout=1800)
                log(f"  removed in {time.monotonic() - began:.0f} s")
                single = self.measure("single", jobs * self.args.shards_per_job, 1)
                if position < len(sizes) - 1:
                    log("  removing the single-pod jobs")
                    bench.delete_namespaces(single.namespaces(), timeout=1800)
        finally:
            bench.stop()
        return self.results


def cycle_table(results: list[dict[str, Any]]) -> str:
    header = [
        "population", "jobs", "pods", "cycle p50", "cycle p95", "floor p50", "ratio",
        "req/cycle", "lists", "writes", "jobs MiB", "pods MiB", "KiB/job", "settle", "load",
    ]  # fmt: skip
    lines = [header]
    for r in results:
        label = (
            f"{r['jobs']} x {r['shards_per_job']} shards" if r["kind"] == "sharded" else "single"
        )
        lines.append(
            [
                label,
                str(r["jobs"]),
                str(r["pods"]),
                fmt(r["cycle"]["median"], 3),
                fmt(r["cycle"]["p95"], 3),
                fmt(r["floor"]["median"], 3),
                fmt(r["ratio"]),
                "/".join(sorted({str(x) for x in r["requests_per_cycle"]})),
                "/".join(sorted({str(x) for x in r["lists_per_cycle"]})),
                str(sum(r["writes_per_cycle"])),
                fmt(r["jobs_list_bytes"] / 2**20, 1),
                fmt(r["pods_list_bytes"] / 2**20, 1),
                fmt(r["jobs_list_bytes"] / 1024 / max(1, r["jobs"]), 1),
                f"{r['settle_cycles']} ({r['settle_seconds']:.0f} s)",
                fmt(r["loadavg_after"][0]),
            ]
        )
    notes = [
        "",
        "seconds; cycle = in-process Reconciler.run_cycle over idle cycles, floor = GET + "
        "json.loads of the same LIST pages,",
        "measured alternately; req/cycle, lists, writes per idle cycle from the audit log; MiB "
        "= the JSON of the LISTs' pages;",
        "settle = cycles (and seconds) until one wrote nothing; load = the 1-minute load "
        "average after the idle cycles.",
    ]
    pairs = []
    for r in results:
        if r["kind"] != "sharded":
            continue
        twin = next((s for s in results if s["kind"] == "single" and s["pods"] == r["pods"]), None)
        if twin:
            pairs.append(
                f"{r['jobs']} x {r['shards_per_job']} against {twin['jobs']} single: cycle "
                f"{r['cycle']['median'] / twin['cycle']['median']:.2f}x, ratio to floor "
                f"{r['ratio']:.2f} vs {twin['ratio']:.2f}"
            )
    return render(lines) + "\n" + "\n".join(notes + pairs)


# -- the command ------------------------------------------------------------------------------


def render(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("both", "wall", "cycle"), default="both")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="16 documents, 1 round, 2/4/8 shards; 100 x 8 against 800 (4-5 minutes)",
    )
    wall = parser.add_argument_group("wall time (part 1)")
    wall.add_argument("--docs", type=int, default=80, help="documents per task (shard_mcb 2/3)")
    wall.add_argument("--delay", type=float, default=0.05, help="model server seconds a request")
    wall.add_argument("--shards", default=None, help="shard counts (1,2,4,8; --quick 2,4,8)")
    wall.add_argument("--rounds", type=int, default=3, help="rounds, each in a rotated order")
    wall.add_argument("--probes", type=int, default=3, help="start-up probes, one at a time")
    cycle = parser.add_argument_group("the poller's cycle (part 2)")
    cycle.add_argument("--jobs", default="1000", help="sharded job counts, e.g. 100,250")
    cycle.add_argument("--shards-per-job", type=int, default=8)
    cycle.add_argument("--cycles", type=int, default=10, help="idle cycles measured")
    cycle.add_argument("--nodes", type=int, default=4, help="kwok nodes")
    cycle.add_argument("--workers", type=int, default=12, help="threads creating objects")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    args.probe_together = not args.quick
    if args.quick:
        args.docs = min(args.docs, 16)
        args.rounds = 1
        args.probes = 1
        args.jobs = "100"
        args.shards = args.shards or "2,4,8"
    args.shards = args.shards or "1,2,4,8"
    args.shard_list = sorted({int(s) for s in args.shards.split(",") if s.strip()})
    args.job_list = sorted({int(s) for s in args.jobs.split(",") if s.strip()})
    if args.docs < max(args.shard_list) * 3 // 2:
        parser.error("--docs must leave every task at least as many documents as shards")
    # What bench_cycle's Bench reads of its arguments.
    args.profile = None
    args.latency_jobs = 0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-shards-"))
    began = time.monotonic()
    figures: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_at_start": os.getloadavg(),
        },
        "args": {k: v for k, v in vars(args).items() if k != "json"},
    }
    code = 0
    try:
        if args.part in ("both", "wall"):
            wall = WallBench(args, workdir / "wall").run()
            figures["wall"] = wall
            if wall["problems"]:
                print("the merged results differ from the unsharded run's: no figures")
                print("\n".join(f"  {p}" for p in wall["problems"]))
                code = 1
            else:
                figures["wall_rows"] = wall_rows(wall)
                figures["fixed_cost"] = fixed_cost(wall)
                print(wall_table(wall))
                print("merged results equal the unsharded run's: checked for every run")
                print()
        if code == 0 and args.part in ("both", "cycle"):
            figures["cycle"] = CycleBench(args, workdir / "cycle").run()
            print(cycle_table(figures["cycle"]))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"work directory kept: {workdir}")
        figures["seconds"] = round(time.monotonic() - began)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1, default=str))
    print(f"(total {time.monotonic() - began:.0f} s; load average at the end {os.getloadavg()})")
    return code


if __name__ == "__main__":
    sys.exit(main())
