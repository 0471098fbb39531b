"""Scale benchmark of the polling cycle on the real control plane (a script, not a test).

A polling controller is only acceptable if a cycle costs little more than
listing the objects, an idle cycle writes nothing, memory stays flat and
status follows the pods within one interval. This script starts its own
sandbox control plane (etcd, kube-apiserver, controller-manager, scheduler,
kwok) in a temporary directory, installs the CRD, the poller's RBAC and its
settings, creates N LMEvalJobs with their pods on kwok nodes in a mix of
states, and reports per N:

* **cycle / floor**: wall time of the real poller's cycle (in-process
  ``Reconciler.run_cycle`` as the poller's ServiceAccount), median and p95 over
  idle cycles, against a minimal client that GETs and ``json.loads`` the same
  LIST pages back to back (the floor the apiserver and JSON impose), measured
  alternately in the same run. Their ratio of medians is the headline; the
  floor's time in its GETs alone (no parsing) is reported too.
* **requests / writes per idle cycle**, from the apiserver's audit log
  (user ``system:serviceaccount:lmeval-system:lmeval-poller``, one user agent
  per cycle), for two state mixes.
* **peak RSS** (``VmHWM``) of the real ``lmeval-poller`` process: one
  ``--once`` run, which reports its own on exit (``ru_maxrss`` of a child
  would include the parent's memory at fork), and the service after the
  latency run.
* **termination -> Finished latency**, p50 / p99, with the service running
  as a process at a 5 s poll interval: running pods get the kwok exit
  annotation at random moments, their log (served by kwok) carries real
  driver markers with results, and a cheap LIST of the jobs detects the
  ``Finished`` condition. Pods are terminated only after the service's sweep
  of finished jobs has ended its first round (a fresh process reads every
  finished job whole once: start-up, not the steady state measured here).

Pods are created directly with the poller's deterministic names, labels and
ownerReferences (``podspec.build_pod``) and a ``nodeName`` on a kwok node;
finished jobs get their final status written directly; the poller then
settles the rest (adopts running and pending pods, queues new jobs behind
``max-running-jobs``) before anything is measured.

Run from the repository root::

    python tests/bench/bench_cycle.py --quick            # N=200, about 2 minutes (CI)
    python tests/bench/bench_cycle.py --sizes 100,1000,5000,10000 --json out.json

It prints a table and the targets missed; ``--check`` makes a missed target
exit 1. ``PYTHONPATH=<other checkout>`` runs everything (the in-process
poller and the poller processes) against another copy of ``poller``.

``--profile DIR`` also writes a pyinstrument profile of one idle cycle per N
(``pip install pyinstrument`` first; it is not a project dependency).

``--history 10000,50000,100000`` (with ``--active 1000``) and
``--half-running 5000`` run the retained-history mode instead of the sizes
above: thousands of finished jobs whose pods are gone next to a thousand
running ones, the hot cycle against the floor of the active jobs, and the
service's requests, bytes, CPU and memory per idle minute. It lives in
``tests/bench/history.py`` (its docstring says what it measures).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import importlib.util
import json
import math
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
# Last, so that PYTHONPATH can point the whole run (and the poller processes
# it starts) at another checkout of `poller`, e.g. to measure "before" figures.
sys.path.append(str(REPO_ROOT))

from lmeval_sandbox import kwok  # noqa: E402
from lmeval_sandbox.components import free_port  # noqa: E402
from lmeval_sandbox.controlplane import ControlPlane  # noqa: E402
from lmeval_sandbox.crd import CRD_PATHS  # noqa: E402
from lmeval_sandbox.identities import service_account_kubeconfig  # noqa: E402
from lmeval_sandbox.kueue import KueueServer  # noqa: E402

from driver import protocol  # noqa: E402
from poller import api  # noqa: E402
from poller.api.settings import CONFIGMAP_NAME, Settings  # noqa: E402
from poller.cycle.observe import MANAGED_SELECTOR  # noqa: E402
from poller.cycle.reconciler import Reconciler  # noqa: E402
from poller.decisions import kueueadmission  # noqa: E402
from poller.jobpod import podspec  # noqa: E402
from poller.kube.client import PAGE_SIZE, Kube  # noqa: E402
from poller.kube.transport import ApiTransport  # noqa: E402

POLLER_NS = "lmeval-system"
POLLER_SA = "lmeval-poller"
POLLER_USER = f"system:serviceaccount:{POLLER_NS}:{POLLER_SA}"
JOBS_API = f"/apis/{api.API_GROUP}/{api.API_VERSION}"
JOBS_LIST = f"{JOBS_API}/{api.PLURAL}"
PODS_LIST = "/api/v1/pods"
WORKLOADS_LIST = f"/apis/{kueueadmission.KUEUE_GROUP}/{kueueadmission.KUEUE_VERSION}/workloads"
KWOK_API = "/apis/kwok.x-k8s.io/v1alpha1"
NAMESPACES = 10  # jobs are spread over this many namespaces (teams)
LATENCY_LABEL = "bench.lmeval.io/latency"

# One character per job, repeated every 20 jobs: C Complete/Succeeded,
# F Complete/Failed, R Running, S Scheduled (pod Pending), N New (queued).
MIXES = {
    # A cluster that has been in use for a while: mostly history.
    "steady": "CCCCCCCCCCCCFFRRSSNN",  # 70 % complete, 10 % each of the rest
    # A busy moment: most jobs in flight.
    "busy": "CCCCFRRRRRRRSSSSNNNN",  # 25 % complete, 35 % running, 20 %, 20 %
}
# H (history, tests/bench/history.py): Complete/Succeeded long ago, its pod
# already reaped, as most of a long-used cluster's jobs are.
STATE_OF = {
    "C": "Complete",
    "F": "Complete",
    "H": "Complete",
    "R": "Running",
    "S": "Scheduled",
    "N": "New",
}

BASE_SETTINGS = {
    "pod-image": "registry.example/lmeval-job:bench",
    "poll-interval": "5s",
    # Pending pods stay pending for the whole run; they must not time out.
    "pod-pending-timeout": "24h",
    # Every running job's log is read once while settling; after that no
    # progress read is due during the measured idle cycles.
    "progress-interval": "1h",
}
# `lmeval-poller --once`, then its own peak RSS written to the file named last.
ONCE_WRAPPER = """\
import re, sys
from pathlib import Path
from poller.__main__ import main
report = sys.argv.pop()
code = main(sys.argv[1:])
status = Path("/proc/self/status").read_text()
Path(report).write_text(str(int(re.search(r"VmHWM:\\s+(\\d+)", status).group(1)) / 1024))
sys.exit(code)
"""
SERVICE_WRAPPER = "import sys; from poller.__main__ import main; sys.exit(main())"
# What the service logs when its sweep's first round after start ended.
FIRST_ROUND = "sweep of finished jobs: first round"
POD_SETTINGS = Settings.model_validate({"pod-image": BASE_SETTINGS["pod-image"]})


def has_sweep() -> bool:
    """Whether the measured revision has the sweep of finished jobs (poller/sweep.py, later
    poller/cycle/sweep.py): before it, there was no start-up round to wait out."""
    for name in ("poller.cycle.sweep", "poller.sweep"):
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except ModuleNotFoundError:
            continue
    return False


def _read_from(path: Path, offset: int) -> str:
    """The text of `path` from byte `offset` on."""
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace")


# -- small HTTP client ------------------------------------------------------------


class HttpError(Exception):
    def __init__(self, status: int, body: bytes, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:300]!r}")
        self.status = status


class Http:
    """A minimal keep-alive JSON client (client certificate or bearer token)."""

    def __init__(
        self,
        server: str,
        *,
        ca: Path,
        cert: Path | None = None,
        key: Path | None = None,
        token: str | None = None,
        maxsize: int = 4,
        user_agent: str = "bench-cycle",
    ) -> None:
        self.server = server
        self.pool = urllib3.PoolManager(
            num_pools=2,
            maxsize=maxsize,
            cert_reqs="CERT_REQUIRED",
            ca_certs=str(ca),
            cert_file=str(cert) if cert else None,
            key_file=str(key) if key else None,
        )
        self.headers = {"Accept": "application/json", "User-Agent": user_agent}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        retries: int = 5,
    ) -> bytes:
        params = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.server + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        for attempt in range(retries + 1):
            try:
                response = self.pool.request(
                    method, url, body=data, headers=headers, timeout=120, retries=False
                )
            except urllib3.exceptions.HTTPError:
                if attempt == retries:
                    raise
                time.sleep(0.5 * (attempt + 1))
                continue
            if response.status in (429, 500, 502, 503, 504) and attempt < retries:
                time.sleep(0.5 * (attempt + 1))
                continue
            if not 200 <= response.status <= 299:
                raise HttpError(response.status, response.data, f"{method} {path}")
            return bytes(response.data)
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return json.loads(self.request(method, path, **kwargs))

    def list_all(self, path: str, **query: Any) -> Iterable[dict[str, Any]]:
        token: str | None = None
        while True:
            page = self.json("GET", path, query={**query, "limit": 500, "continue": token})
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return


def admin_http(plane: ControlPlane, maxsize: int = 32) -> Http:
    pki = plane.pki
    assert pki is not None
    return Http(
        plane.server, ca=pki.ca_cert, cert=pki.admin.cert, key=pki.admin.key, maxsize=maxsize
    )


def kubeconfig_token(path: Path) -> str:
    config = yaml.safe_load(path.read_text())
    return str(config["users"][0]["user"]["token"])


# -- statistics ------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (p99 of 50 samples is the largest)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values) if values else math.nan,
        "p95": percentile(values, 0.95),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else math.nan,
        "samples": [round(v, 4) for v in values],
    }


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- what the jobs look like ---------------------------------------------------------


TASKS = ("arc_easy", "hellaswag")


def job_spec(index: int) -> dict[str, Any]:
    return {
        "model": "hf",
        "modelArgs": [
            {"name": "pretrained", "value": f"org/model-{index % 7}b"},
            {"name": "dtype", "value": "bfloat16"},
        ],
        "tasks": list(TASKS),
        "numFewShot": 5,
        "limit": "200",
        "batchSize": "auto:4",
        "logSamples": index % 3 == 0,
        "pod": {"resources": {"requests": {"cpu": "2", "memory": "8Gi"}}},
        "labels": {"team": f"team-{index % 4}"},
    }


def fake_results(index: int) -> dict[str, Any]:
    """An lm_eval 0.4 results document of realistic shape (about 6 KB as JSON)."""
    rng = random.Random(index)
    results: dict[str, Any] = {}
    configs: dict[str, Any] = {}
    for task in TASKS:
        acc, norm = rng.random(), rng.random()
        results[task] = {
            "alias": task,
            "acc,none": acc,
            "acc_stderr,none": rng.random() / 50,
            "acc_norm,none": norm,
            "acc_norm_stderr,none": rng.random() / 50,
        }
        configs[task] = {
            "task": task,
            "tag": ["multiple_choice", "ai2_arc" if "arc" in task else "hellaswag"],
            "dataset_path": f"allenai/{task}",
            "dataset_name": None,
            "training_split": "train",
            "validation_split": "validation",
            "test_split": "test",
            "doc_to_text": "Question: {{question}}\nAnswer:",
            "doc_to_target": "{{choices.label.index(answerKey)}}",
            "doc_to_choice": "{{choices.text}}",
            "description": "",
            "target_delimiter": " ",
            "fewshot_delimiter": "\n\n",
            "num_fewshot": 5,
            "metric_list": [
                {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
            ],
            "output_type": "multiple_choice",
            "repeats": 1,
            "should_decontaminate": True,
            "doc_to_decontamination_query": "Question: {{question}}\nAnswer:",
            "metadata": {"version": 1.0, "pretrained": f"org/model-{index % 7}b"},
        }
    return {
        "results": results,
        "group_subtasks": {task: [] for task in TASKS},
        "configs": configs,
        "versions": dict.fromkeys(TASKS, 1.0),
        "n-shot": dict.fromkeys(TASKS, 5),
        "higher_is_better": {task: {"acc": True, "acc_norm": True} for task in TASKS},
        "n-samples": {task: {"original": 2376, "effective": 200} for task in TASKS},
        "config": {
            "model": "hf",
            "model_args": f"pretrained=org/model-{index % 7}b,dtype=bfloat16",
            "batch_size": "auto:4",
            "batch_sizes": [32],
            "device": "cuda",
            "use_cache": None,
            "limit": 200.0,
            "bootstrap_iters": 100000,
            "gen_kwargs": None,
            "random_seed": 0,
            "numpy_seed": 1234,
            "torch_seed": 1234,
            "fewshot_seed": 1234,
        },
        "git_hash": None,
        "date": 1.7e9 + index,
        "pretty_env_info": "PyTorch version: 2.5.1\nIs debug build: False\nCUDA used to build "
        "PyTorch: 12.4\nOS: Red Hat Enterprise Linux 9.4 (x86_64)\nPython version: 3.11.9\n"
        "GPU models and configuration: GPU 0: NVIDIA A100-SXM4-80GB\nNvidia driver version: "
        "550.54.15\n[pip3] numpy==1.26.4\n[pip3] torch==2.5.1\n[pip3] triton==3.1.0",
        "transformers_version": "4.46.3",
        "lm_eval_version": "0.4.13",
        "upper_git_hash": None,
        "task_hashes": {task: f"{rng.getrandbits(256):064x}" for task in TASKS},
        "model_source": "hf",
        "model_name": f"org/model-{index % 7}b",
        "model_name_sanitized": f"org__model-{index % 7}b",
        "total_evaluation_time_seconds": f"{rng.uniform(300, 3000):.4f}",
    }


def stamp(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def final_status(index: int, pod: str, name: str, failed: bool) -> dict[str, Any]:
    """The status the poller leaves on a finished job (validated by its own model)."""
    now = dt.datetime.now(dt.UTC)
    begun, ended = stamp(now - dt.timedelta(minutes=40)), stamp(now - dt.timedelta(minutes=5))

    def condition(kind: str, status: bool, reason: str, message: str, when: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": "True" if status else "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": when,
            "observedGeneration": 1,
        }

    reason = "Failed" if failed else "Succeeded"
    message = (
        "exit code 1: RuntimeError: CUDA error: out of memory"
        if failed
        else f"evaluation finished: {', '.join(sorted(TASKS))}"
    )
    status: dict[str, Any] = {
        "state": "Complete",
        "reason": reason,
        "message": message,
        "podName": pod,
        "lastScheduleTime": begun,
        "startTime": begun,
        "completeTime": ended,
        "progress": {
            "percent": 100.0 if not failed else 37.0,
            "phase": "loglikelihood",
            "line": "100% loglikelihood (1600/1600)" if not failed else "37% loglikelihood",
            "updateTime": ended,
        },
        "conditions": [
            condition("Scheduled", True, "PodCreated", f"pod {pod} created", begun),
            condition("Running", False, "Finished", message, ended),
            condition("Finished", True, reason, message, ended),
            condition("Succeeded", not failed, reason, message, ended),
        ],
        "observedGeneration": 1,
    }
    if not failed:
        status.update(
            results=json.dumps(fake_results(index), separators=(",", ":"), sort_keys=True),
            resultsReduced=False,
            resultsConfigMap=f"{name}-results",
            resultsSource="log",
        )
    api.LMEvalJobStatus.model_validate(status)  # exactly what the poller could have written
    return status


def driver_log() -> str:
    """A successful run's pod log: lm_eval noise and the driver's real markers."""
    results = json.dumps(fake_results(0), indent=1, sort_keys=True).encode()
    run_id = "bench-run"
    lines = [
        protocol.encode_marker(
            "started", run_id=run_id, driver_version="0.1.0", lm_eval_version="0.4.13"
        ),
        "2025-01-01:00:00:00 INFO [__main__:440] Selected Tasks: ['arc_easy', 'hellaswag']",
        "2025-01-01:00:00:01 INFO [evaluator:180] Setting random seed to 0",
        *[
            protocol.encode_marker(
                "progress",
                run_id=run_id,
                percent=float(p),
                phase="loglikelihood",
                n=p * 16,
                total=1600,
            )
            for p in (10, 40, 70, 100)
        ],
        "|  Tasks  |Version|Filter|n-shot| Metric |   |Value|   |Stderr|",
        *protocol.encode_results(results, run_id),
        protocol.encode_marker(
            "completed",
            run_id=run_id,
            exit_code=0,
            message="lm_eval completed",
            duration=1234.5,
            results_path="/outputs/run/results.json",
        ),
    ]
    return kwok.cri_log_lines(lines)


# -- the cluster ------------------------------------------------------------------


@dataclass
class Population:
    """The jobs created so far, by mix, and what their pods should show."""

    mix: str
    prefix: str
    count: int = 0
    kinds: Counter[str] = field(default_factory=Counter)

    def namespaces(self) -> list[str]:
        return [f"{self.prefix}-{k:02d}" for k in range(NAMESPACES)]

    def slots(self) -> int:
        """Jobs whose pod is not finished: max-running-jobs is set to this, so
        New jobs stay queued (and idle) instead of being started."""
        return self.kinds["R"] + self.kinds["S"]


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.plane = ControlPlane(workdir / "plane", kwok_nodes=args.nodes)
        self.rng = random.Random(args.seed)
        self.results: list[dict[str, Any]] = []
        self.settings: dict[str, str] = dict(BASE_SETTINGS)
        # The LISTs a cycle makes, which the floor repeats (Kueue adds its workloads').
        self.floor_lists: list[tuple[str, dict[str, str]]] = [
            (JOBS_LIST, {}),
            (PODS_LIST, {"labelSelector": MANAGED_SELECTOR}),
        ]

    # -- setup --------------------------------------------------------------------

    def start(self) -> None:
        started = time.monotonic()
        self.plane.start()
        log(f"control plane up in {time.monotonic() - started:.1f} s ({self.plane.workdir})")
        self.admin = admin_http(self.plane, maxsize=self.args.workers * 2)
        for crd_path in CRD_PATHS:  # both kinds, as installed: the cycle lists suites too
            self.plane.kubectl("apply", "--server-side", "-f", str(crd_path))
        for manifest in ("namespace.yaml", "rbac.yaml"):
            self.plane.kubectl("apply", "-f", str(REPO_ROOT / "deploy" / "base" / manifest))
        self.plane.kubectl(
            "wait", "--for=condition=Established", f"crd/{api.PLURAL}.{api.API_GROUP}"
        )
        self.sa_kubeconfig = service_account_kubeconfig(self.plane, POLLER_NS, POLLER_SA)
        token = kubeconfig_token(self.sa_kubeconfig)
        assert self.plane.pki is not None
        self.floor_http = Http(
            self.plane.server,
            ca=self.plane.pki.ca_cert,
            token=token,
            maxsize=1,
            user_agent="bench-floor",
        )
        self.poller_api = ApiTransport.from_kubeconfig(self.sa_kubeconfig)
        # The hot cycle alone, as the service runs it: the sweep of finished
        # jobs has its own scheduler job there, not steps inside cycles (with
        # them, an idle cycle's requests vary with the sweep's pace).
        self.poller = Reconciler(
            Kube(self.poller_api), settings_namespace=POLLER_NS, sweep_in_cycle=False
        )
        # The poller's own key (made now, in its Secret), so that the pods the
        # benchmark makes in its stead carry the proof of origin it checks.
        self.proof = self.poller.pod_proof()
        log_file = self.workdir / "driver-run.log"
        log_file.write_text(driver_log())
        # One ClusterLogs serves the same driver log for every pod: progress
        # for running pods, results for finished ones.
        self.admin.request(
            "POST",
            f"{KWOK_API}/clusterlogs",
            body={
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "ClusterLogs",
                "metadata": {"name": "bench-driver-log"},
                "spec": {"selector": {}, "logs": [{"logsFile": str(log_file), "follow": False}]},
            },
        )
        self.put_settings()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.poller_api.close()
        self.plane.stop()

    def put_settings(self, **changes: str) -> None:
        self.settings.update(changes)
        path = f"/api/v1/namespaces/{POLLER_NS}/configmaps"
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP_NAME, "namespace": POLLER_NS},
            "data": self.settings,
        }
        try:
            self.admin.request("PUT", f"{path}/{CONFIGMAP_NAME}", body=body)
        except HttpError as error:
            if error.status != 404:
                raise
            self.admin.request("POST", path, body=body)

    def make_namespace(self, name: str) -> None:
        with contextlib.suppress(HttpError):
            self.admin.request(
                "POST", "/api/v1/namespaces", body={"metadata": {"name": name}}, retries=0
            )
        # The rights-free job ServiceAccount the pods name (admission checks it exists).
        with contextlib.suppress(HttpError):
            self.admin.request(
                "POST",
                f"/api/v1/namespaces/{name}/serviceaccounts",
                body={"metadata": {"name": "lmeval-job"}, "automountServiceAccountToken": False},
                retries=0,
            )

    def delete_namespaces(self, names: list[str], timeout: float = 600) -> None:
        for name in names:
            with contextlib.suppress(HttpError):
                self.admin.request("DELETE", f"/api/v1/namespaces/{name}")
        deadline = time.monotonic() + timeout
        for name in names:
            while time.monotonic() < deadline:
                try:
                    self.admin.request("GET", f"/api/v1/namespaces/{name}", retries=0)
                except HttpError as error:
                    if error.status == 404:
                        break
                    raise
                time.sleep(0.5)
            else:
                raise AssertionError(f"namespace {name} still there after {timeout:.0f} s")

    # -- population -------------------------------------------------------------

    def create_job(
        self, namespace: str, name: str, index: int, kind: str, labels: dict[str, str] | None = None
    ) -> str:
        """One job, its pod (unless New or History) and, when finished, its final status."""
        spec = job_spec(index)
        body = {
            "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
            "kind": api.KIND,
            "metadata": {"name": name, "labels": labels or {}},
            "spec": spec,
        }
        path = f"{JOBS_API}/namespaces/{namespace}/{api.PLURAL}"
        try:
            created = self.admin.json("POST", path, body=body)
        except HttpError as error:
            if error.status != 409:  # a retried POST that had gone through
                raise
            created = self.admin.json("GET", f"{path}/{name}")
        uid = str(created["metadata"]["uid"])
        if kind == "N":
            return uid
        if kind == "H":  # finished long ago: its pod was reaped
            pod = podspec.pod_name(name, uid)
        else:
            pod = self.create_pod(namespace, name, uid, spec, index, kind)
        if kind in "CFH":
            status = final_status(index, pod, name, failed=kind == "F")
            self.admin.request(
                "PATCH",
                f"{path}/{name}/status",
                body={"status": status},
                content_type="application/merge-patch+json",
            )
        return uid

    def create_pod(
        self, namespace: str, name: str, uid: str, spec: dict[str, Any], index: int, kind: str
    ) -> str:
        """Job `name`'s pod as the poller would make it, in the state `kind` says.

        The one place the benchmarks create pods (bench_hostile.py goes through
        `create_job` too), so whatever proof of origin the poller's pods must
        carry is added here once. Returns the pod's name.
        """
        manifest = podspec.build_pod(
            name=name,
            namespace=namespace,
            uid=uid,
            spec=api.LMEvalJobSpec.model_validate(spec),
            settings=POD_SETTINGS,
        )
        manifest = self.proof.stamp(manifest, uid, 1)
        # Bound at creation: the scheduler (50 binds/s by default) stays out of
        # the way of setting up thousands of pods; the poller never looks.
        manifest["spec"]["nodeName"] = f"kwok-node-{index % self.args.nodes}"
        annotations = manifest["metadata"].setdefault("annotations", {})
        if kind == "C":
            annotations[kwok.ANNOTATION_EXIT_CODE] = "0"
        elif kind == "F":
            annotations[kwok.ANNOTATION_EXIT_CODE] = "1"
            annotations[kwok.ANNOTATION_EXIT_MESSAGE] = "RuntimeError: CUDA error: out of memory"
        elif kind == "S":
            annotations[kwok.ANNOTATION_WAITING_REASON] = "ContainerCreating"
        try:
            self.admin.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=manifest)
        except HttpError as error:
            if error.status != 409:
                raise
        return str(manifest["metadata"]["name"])

    def populate(self, population: Population, target: int) -> float:
        """Grow `population` to `target` jobs; returns the seconds it took."""
        pattern = MIXES[population.mix]
        for namespace in population.namespaces():
            self.make_namespace(namespace)
        started = time.monotonic()
        indices = range(population.count, target)

        def one(index: int) -> str:
            kind = pattern[index % len(pattern)]
            namespace = f"{population.prefix}-{(index // len(pattern)) % NAMESPACES:02d}"
            self.create_job(namespace, f"eval-{index:05d}", index, kind)
            return kind

        done = 0
        with concurrent.futures.ThreadPoolExecutor(self.args.workers) as pool:
            for kind in pool.map(one, indices):
                population.kinds[kind] += 1
                done += 1
                if done % 1000 == 0:
                    log(f"  created {done}/{len(indices)} jobs")
        population.count = target
        return time.monotonic() - started

    def pod_states(self) -> Counter[str]:
        """terminated / running / waiting / other, over every managed pod."""
        states: Counter[str] = Counter()
        for pod in self.admin.list_all(PODS_LIST, labelSelector=MANAGED_SELECTOR):
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            state = (statuses[0].get("state") or {}) if statuses else {}
            states[next(iter(state), "other")] += 1
        return states

    def wait_for_kwok(self, population: Population, timeout: float) -> float:
        """Until every pod shows what its job's kind says (kwok works through them)."""
        want = Counter(
            terminated=population.kinds["C"] + population.kinds["F"],
            running=population.kinds["R"],
            waiting=population.kinds["S"],
        )
        started = time.monotonic()
        deadline = started + timeout
        while True:
            seen = self.pod_states()
            if all(seen[k] == v for k, v in want.items()):
                return time.monotonic() - started
            if time.monotonic() > deadline:
                raise AssertionError(f"kwok did not catch up: want {dict(want)}, see {dict(seen)}")
            time.sleep(2)

    def settle(self, max_cycles: int = 40) -> int:
        """Reconciler cycles until one writes nothing; returns the cycles run."""
        # Read every running job's progress once, now, not during the measurements
        # (1000 a cycle: the setting's upper bound; per minute, as many as that takes).
        self.put_settings(
            **{"progress-reads-per-cycle": "1000", "progress-reads-per-minute": "60000"}
        )
        try:
            for cycle in range(1, max_cycles + 1):
                self.poller.kube.transport.user_agent = "lmeval-poller/bench-settle"
                report = self.poller.run_cycle()
                log(
                    f"  settle cycle {cycle}: {report.jobs} jobs, {report.pods} pods, "
                    f"{report.patches} patches, {report.pods_created} pods created, "
                    f"{report.errors} errors, {report.duration:.2f} s"
                )
                if report.errors:
                    for message in report.error_messages[:3]:
                        log(f"    error: {message}")
                if not report.patches and not report.pods_created and not report.errors:
                    return cycle
        finally:
            self.settings.pop("progress-reads-per-minute", None)
            self.put_settings(**{"progress-reads-per-cycle": "50"})
        raise AssertionError(f"the poller did not settle in {max_cycles} cycles")

    # -- measurements -----------------------------------------------------------

    def floor(self) -> tuple[float, float, int]:
        """GET + json.loads of every LIST page a cycle reads, back to back.

        Returns (total seconds, seconds spent in GETs alone, pages).
        """
        started = time.perf_counter()
        fetching = 0.0
        pages = 0
        for path, query in self.floor_lists:
            token: str | None = None
            while True:
                begun = time.perf_counter()
                raw = self.floor_http.request(
                    # A list's own limit (the hot lists' page size) wins.
                    "GET",
                    path,
                    query={"limit": PAGE_SIZE, **query, "continue": token},
                )
                fetching += time.perf_counter() - begun
                page = json.loads(raw)
                pages += 1
                token = (page.get("metadata") or {}).get("continue")
                del raw, page
                if not token:
                    break
        return time.perf_counter() - started, fetching, pages

    def idle_cycles(self, count: int, tag: str) -> dict[str, Any]:
        cycle_times: list[float] = []
        floor_times: list[float] = []
        fetch_times: list[float] = []
        agents: list[str] = []
        floor_pages = 0
        # One warm-up of each (connections, caches), not counted.
        self.floor()
        self.poller.run_cycle()
        mark = self.plane.audit.mark()
        reports = []
        for k in range(count):
            # Alternate the order so neither side always runs right after the other.
            order = ("floor", "cycle") if k % 2 == 0 else ("cycle", "floor")
            for which in order:
                if which == "floor":
                    seconds, fetching, floor_pages = self.floor()
                    floor_times.append(seconds)
                    fetch_times.append(fetching)
                    continue
                agent = f"lmeval-poller/bench-{tag}-idle-{k}"
                agents.append(agent)
                self.poller.kube.transport.user_agent = agent
                started = time.perf_counter()
                report = self.poller.run_cycle()
                cycle_times.append(time.perf_counter() - started)
                reports.append(report)
        calls = self.audit_calls(mark, set(agents))
        per_cycle = [calls.get(agent, []) for agent in agents]
        last = reports[-1]
        return {
            "jobs": last.jobs,
            "pods": last.pods,
            "patches": sum(r.patches for r in reports),
            "errors": sum(r.errors for r in reports),
            "cycle": summary(cycle_times),
            "floor": summary(floor_times),
            "fetch": summary(fetch_times),
            "ratio": statistics.median(cycle_times) / statistics.median(floor_times),
            "ratio_fetch": statistics.median(cycle_times) / statistics.median(fetch_times),
            "floor_pages": floor_pages,
            "requests_per_cycle": [len(c) for c in per_cycle],
            "lists_per_cycle": [sum(1 for x in c if x.verb == "list") for c in per_cycle],
            "writes_per_cycle": [sum(1 for x in c if x.is_write) for c in per_cycle],
            "calls_first_cycle": sorted(
                Counter(
                    f"{x.verb} {x.resource}{'/' + x.subresource if x.subresource else ''}"
                    for x in per_cycle[0]
                ).items()
            ),
        }

    def audit_calls(self, mark: int, agents: set[str], timeout: float = 10) -> dict[str, list[Any]]:
        """The poller's audited calls after `mark`, by user agent (waits for the log)."""
        deadline = time.monotonic() + timeout
        while True:
            grouped: dict[str, list[Any]] = {}
            for call in self.plane.audit.calls_by(POLLER_USER, since=mark):
                if call.user_agent in agents:
                    grouped.setdefault(call.user_agent, []).append(call)
            if set(grouped) >= agents or time.monotonic() > deadline:
                return grouped
            time.sleep(0.2)

    def poller_argv(self, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-c",
            ONCE_WRAPPER if "--once" in extra else SERVICE_WRAPPER,
            "--kubeconfig",
            str(self.sa_kubeconfig),
            "--settings-namespace",
            POLLER_NS,
            "--metrics-port",
            "0",
            *extra,
        ]

    def rss_once(self) -> dict[str, Any]:
        """Peak RSS (VmHWM) and wall time of one ``lmeval-poller --once`` process.

        ``ru_maxrss`` of a child would be wrong here: Linux carries the
        parent's high-water mark across fork and exec. The child reports its
        own VmHWM (per address space, so it starts afresh at exec) on exit.
        """
        report = self.workdir / "once-vmhwm.txt"
        started = time.perf_counter()
        with (self.workdir / "poller-once.log").open("ab") as out:
            proc = subprocess.run(
                [*self.poller_argv("--once", "--identity", "bench-once"), str(report)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                check=False,
            )
        return {
            "rss_mib": float(report.read_text()) if report.exists() else math.nan,
            "seconds": time.perf_counter() - started,
            "exit_code": proc.returncode,
        }

    def latency(self, tag: str, population: Population) -> dict[str, Any]:
        """Terminate running pods at random moments; time until their job is Finished."""
        count, interval = self.args.latency_jobs, self.args.interval
        namespace = f"bench-latency-{tag}"
        self.make_namespace(namespace)
        self.put_settings(**{"poll-interval": f"{interval:g}s"})
        log_path = self.workdir / f"poller-service-{tag}.log"
        out = log_path.open("ab")
        log_start = out.tell()  # the file may hold an earlier service's lines
        metrics_port = free_port()
        service = subprocess.Popen(
            [
                *self.poller_argv("--identity", f"bench-service-{tag}"),
                "--metrics-address",
                "127.0.0.1",
                "--metrics-port",
                str(metrics_port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        out.close()
        try:
            names = [f"latency-{k:03d}" for k in range(count)]
            with concurrent.futures.ThreadPoolExecutor(self.args.workers) as pool:
                list(
                    pool.map(
                        lambda k: self.create_job(
                            namespace, names[k], 100_000 + k, "R", {LATENCY_LABEL: tag}
                        ),
                        range(count),
                    )
                )
            pods = {
                name: podspec.pod_name(name, uid)
                for name, uid in (
                    (job["metadata"]["name"], job["metadata"]["uid"])
                    for job in self.admin.list_all(
                        f"{JOBS_API}/namespaces/{namespace}/{api.PLURAL}"
                    )
                )
            }

            def states() -> dict[str, dict[str, Any]]:
                page = self.admin.json("GET", f"{JOBS_API}/namespaces/{namespace}/{api.PLURAL}")
                return {j["metadata"]["name"]: j.get("status") or {} for j in page["items"]}

            deadline = time.monotonic() + 60 + 10 * interval
            while not all(s.get("state") == "Running" for s in states().values()):
                if time.monotonic() > deadline or service.poll() is not None:
                    raise AssertionError(f"latency jobs not Running: {states()}")
                time.sleep(0.5)
            if has_sweep():
                # Measured in the steady state, as the idle minute is: a fresh
                # process's sweep reads every finished job whole first (start-up).
                deadline = time.monotonic() + 1800
                while FIRST_ROUND not in _read_from(log_path, log_start):
                    if time.monotonic() > deadline or service.poll() is not None:
                        raise AssertionError("the sweep's first round did not end")
                    time.sleep(1.0)
            log(
                f"  {count} latency jobs Running; terminating their pods over "
                f"{self.args.spread:g} s"
            )
            terminated: dict[str, float] = {}
            visible: dict[str, float] = {}  # the API shows the container terminated
            finished: dict[str, float] = {}
            scrapes: list[int] = []  # bytes of each /metrics scrape
            stop = threading.Event()
            owners = {pod: name for name, pod in pods.items()}

            def scrape() -> None:
                # As Prometheus would (every 15-30 s in practice; every 5 s here),
                # so the service's peak RSS includes the exposition of every job.
                url = f"http://127.0.0.1:{metrics_port}/metrics"
                while not stop.wait(5.0):
                    with (
                        contextlib.suppress(OSError),
                        urllib.request.urlopen(url, timeout=30) as response,
                    ):
                        scrapes.append(len(response.read()))

            def watch() -> None:
                while not stop.is_set():
                    now = time.time()
                    for pod in self.admin.json("GET", f"/api/v1/namespaces/{namespace}/pods")[
                        "items"
                    ]:
                        name = owners.get(pod["metadata"]["name"])
                        if name is None or name in visible or name not in terminated:
                            continue
                        statuses = (pod.get("status") or {}).get("containerStatuses") or []
                        if any("terminated" in (c.get("state") or {}) for c in statuses):
                            visible[name] = now
                    for name, status in states().items():
                        if name in finished or name not in terminated:
                            continue
                        conditions = status.get("conditions") or []
                        if any(
                            c["type"] == "Finished" and c["status"] == "True" for c in conditions
                        ):
                            finished[name] = now
                    time.sleep(0.1)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            scraper = threading.Thread(target=scrape, daemon=True)
            scraper.start()
            offsets = sorted(self.rng.uniform(0, self.args.spread) for _ in names)
            begin = time.monotonic()
            for name, offset in zip(names, offsets, strict=True):
                time.sleep(max(0.0, begin + offset - time.monotonic()))
                terminated[name] = time.time()
                self.admin.request(
                    "PATCH",
                    f"/api/v1/namespaces/{namespace}/pods/{pods[name]}",
                    body={"metadata": {"annotations": {kwok.ANNOTATION_EXIT_CODE: "0"}}},
                    content_type="application/merge-patch+json",
                )
            deadline = time.monotonic() + 60 + 6 * interval
            while len(finished) < count and time.monotonic() < deadline:
                time.sleep(0.2)
            stop.set()
            watcher.join()
            scraper.join()
            vm_hwm = read_vm_hwm(service.pid)
            final = states()
            outcomes = Counter(f"{s.get('state')}/{s.get('reason')}" for s in final.values())
        finally:
            service.send_signal(signal.SIGTERM)
            try:
                service.wait(timeout=60)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait()
        latencies = [finished[n] - terminated[n] for n in names if n in finished]
        from_visible = [finished[n] - visible[n] for n in names if n in finished and n in visible]
        cycles = service_cycle_times(log_path)
        self.delete_namespaces([namespace])
        self.put_settings(**{"poll-interval": BASE_SETTINGS["poll-interval"]})
        return {
            "jobs": count,
            "finished": len(latencies),
            "outcomes": dict(outcomes),
            "interval": interval,
            "latency": summary(latencies),
            "latency_from_visible": summary(from_visible),
            "kwok_reaction": summary([visible[n] - terminated[n] for n in names if n in visible]),
            "scrapes": len(scrapes),
            "scrape_bytes": max(scrapes, default=0),
            "service_cycle": summary(cycles),
            "service_vm_hwm_mib": vm_hwm,
            "service_exit_code": service.returncode,
        }

    # -- one size -------------------------------------------------------------

    def measure(self, population: Population, target: int, full: bool) -> dict[str, Any]:
        tag = f"{population.mix}-{target}"
        log(f"== {population.mix} mix, N={target}: creating {target - population.count} jobs")
        created = self.populate(population, target)
        self.put_settings(**{"max-running-jobs": str(population.slots())})
        log(f"  created in {created:.1f} s; waiting for kwok")
        kwok_wait = self.wait_for_kwok(population, timeout=120 + target / 10)
        log(f"  kwok caught up after {kwok_wait:.1f} s more; settling")
        settle_cycles = self.settle()
        result: dict[str, Any] = {
            "mix": population.mix,
            "n": target,
            "kinds": {
                STATE_OF[k] + ("/Failed" if k == "F" else ""): v
                for k, v in sorted(population.kinds.items())
            },
            "populate_seconds": round(created, 1),
            "kwok_wait_seconds": round(kwok_wait, 1),
            "settle_cycles": settle_cycles,
        }
        result.update(self.idle_cycles(self.args.cycles, tag))
        log(
            f"  idle: cycle {result['cycle']['median']:.3f} s, floor "
            f"{result['floor']['median']:.3f} s, ratio {result['ratio']:.2f}, requests "
            f"{result['requests_per_cycle']}, writes {sum(result['writes_per_cycle'])}"
        )
        if self.args.profile:
            result["profile"] = self.profile(tag)
        if full:
            result["once"] = self.rss_once()
            log(f"  --once: {result['once']['rss_mib']:.0f} MiB, {result['once']['seconds']:.1f} s")
            if self.args.latency_jobs:
                result["latency"] = self.latency(tag, population)
                lat = result["latency"]
                log(
                    f"  latency p50 {lat['latency']['median']:.2f} s, p99 "
                    f"{lat['latency']['p99']:.2f} s ({lat['finished']}/{lat['jobs']}), from "
                    f"visible p99 {lat['latency_from_visible']['p99']:.2f} s, kwok p50 "
                    f"{lat['kwok_reaction']['median']:.2f} s, service "
                    f"{lat['service_vm_hwm_mib']:.0f} MiB, {lat['scrapes']} scrapes of "
                    f"{lat['scrape_bytes'] / 2**20:.1f} MiB"
                )
        self.results.append(result)
        return result

    def measure_kueue(self, target: int) -> dict[str, Any]:
        """`target` jobs labelled for a Kueue LocalQueue whose ClusterQueue has no
        quota: every one has a Workload and waits Suspended, in Kueue's words.
        The idle cycle then lists the workloads too (and the floor with it)."""
        log(f"== kueue: starting Kueue, then {target} queued jobs")
        kueue = KueueServer(self.plane, self.workdir / "kueue").start()
        log(f"  Kueue ready in {kueue.startup_seconds:.1f} s")
        try:
            population = Population("kueue", "benchk")
            for namespace in population.namespaces():
                self.make_namespace(namespace)
            group = f"{kueueadmission.KUEUE_GROUP}/{kueueadmission.KUEUE_VERSION}"
            queues: list[dict[str, Any]] = [
                {"apiVersion": group, "kind": "ResourceFlavor", "metadata": {"name": "bench"}},
                {
                    "apiVersion": group,
                    "kind": "ClusterQueue",
                    "metadata": {"name": "bench"},
                    "spec": {
                        "namespaceSelector": {},
                        "resourceGroups": [
                            {
                                "coveredResources": ["cpu", "memory"],
                                "flavors": [
                                    {
                                        "name": "bench",
                                        "resources": [
                                            {"name": "cpu", "nominalQuota": 0},
                                            {"name": "memory", "nominalQuota": 0},
                                        ],
                                    }
                                ],
                            }
                        ],
                    },
                },
            ]
            queues += [
                {
                    "apiVersion": group,
                    "kind": "LocalQueue",
                    "metadata": {"name": "bench", "namespace": namespace},
                    "spec": {"clusterQueue": "bench"},
                }
                for namespace in population.namespaces()
            ]
            self.plane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(queues))
            labels = {kueueadmission.QUEUE_LABEL: "bench"}
            started = time.monotonic()

            def one(index: int) -> None:
                namespace = f"{population.prefix}-{index % NAMESPACES:02d}"
                self.create_job(namespace, f"eval-{index:05d}", index, "N", labels)

            with concurrent.futures.ThreadPoolExecutor(self.args.workers) as pool:
                list(pool.map(one, range(target)))
            population.count = target
            created = time.monotonic() - started
            log(f"  created in {created:.1f} s; settling (a workload each)")
            first = time.perf_counter()
            self.poller.kube.transport.user_agent = "lmeval-poller/bench-kueue-submit"
            submit = self.poller.run_cycle()
            submit_seconds = time.perf_counter() - first
            log(
                f"  submitting cycle: {submit.patches} patches, {submit.errors} errors, "
                f"{submit_seconds:.2f} s"
            )
            # Kueue tries its pending workloads one by one (about ten a second
            # here): until it has tried each, their jobs' messages keep changing.
            started = time.monotonic()
            while True:
                tried = sum(
                    1
                    for workload in self.admin.list_all(WORKLOADS_LIST)
                    if any(
                        c.get("type") == "QuotaReserved"
                        for c in (workload.get("status") or {}).get("conditions") or []
                    )
                )
                if tried >= target:
                    break
                if time.monotonic() - started > 900:
                    raise AssertionError(f"Kueue tried only {tried}/{target} workloads")
                time.sleep(2)
            kueue_seconds = time.monotonic() - started
            log(f"  Kueue tried every workload after {kueue_seconds:.0f} s more")
            settle_cycles = self.settle()
            waiting = sum(
                1
                for job in self.admin.list_all(JOBS_LIST)
                if (job.get("status") or {}).get("state") == "Suspended"
            )
            self.floor_lists.append((WORKLOADS_LIST, {"labelSelector": MANAGED_SELECTOR}))
            result: dict[str, Any] = {
                "mix": "kueue",
                "n": target,
                "kinds": {"Suspended (waiting for Kueue)": waiting},
                "populate_seconds": round(created, 1),
                "kueue_startup_seconds": round(kueue.startup_seconds, 1),
                "submit_cycle_seconds": round(submit_seconds, 2),
                "kueue_first_pass_seconds": round(kueue_seconds, 1),
                "settle_cycles": settle_cycles,
            }
            result.update(self.idle_cycles(self.args.cycles, "kueue"))
            log(
                f"  idle: cycle {result['cycle']['median']:.3f} s, floor "
                f"{result['floor']['median']:.3f} s, ratio {result['ratio']:.2f}, requests "
                f"{result['requests_per_cycle']}, writes {sum(result['writes_per_cycle'])}"
            )
            self.results.append(result)
            return result
        finally:
            kueue.stop()

    def profile(self, tag: str) -> str:
        from pyinstrument import Profiler  # optional: pip install pyinstrument

        profiler = Profiler(interval=0.0005)
        profiler.start()
        self.poller.run_cycle()
        profiler.stop()
        directory = Path(self.args.profile)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"cycle-{tag}.txt"
        path.write_text(profiler.output_text(unicode=False, color=False, show_all=False))
        return str(path)


def read_vm_hwm(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return math.nan
    match = re.search(r"^VmHWM:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) / 1024 if match else math.nan


def service_cycle_times(path: Path) -> list[float]:
    pattern = re.compile(r"cycle: .* in ([0-9.]+) s")
    return [float(m.group(1)) for m in pattern.finditer(path.read_text(errors="replace"))]


# -- output ----------------------------------------------------------------------


def fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(results: list[dict[str, Any]], interval: float) -> str:
    header = [
        "mix", "N", "pods", "cycle p50", "cycle p95", "floor p50", "floor p95", "ratio",
        "GETs p50", "cyc/GETs", "req/cycle", "lists", "writes", "RSS once", "RSS svc",
        "lat p50", "lat p99", "vis p99", "kwok p50",
    ]  # fmt: skip
    rows = [header]
    for r in results:
        lat = r.get("latency") or {}
        rows.append(
            [
                r["mix"],
                str(r["n"]),
                str(r["pods"]),
                fmt(r["cycle"]["median"], 3),
                fmt(r["cycle"]["p95"], 3),
                fmt(r["floor"]["median"], 3),
                fmt(r["floor"]["p95"], 3),
                fmt(r["ratio"]),
                fmt(r["fetch"]["median"], 3),
                fmt(r["ratio_fetch"]),
                "/".join(sorted({str(x) for x in r["requests_per_cycle"]})),
                "/".join(sorted({str(x) for x in r["lists_per_cycle"]})),
                str(sum(r["writes_per_cycle"])),
                fmt((r.get("once") or {}).get("rss_mib"), 0),
                fmt(lat.get("service_vm_hwm_mib"), 0),
                fmt((lat.get("latency") or {}).get("median")),
                fmt((lat.get("latency") or {}).get("p99")),
                fmt((lat.get("latency_from_visible") or {}).get("p99")),
                fmt((lat.get("kwok_reaction") or {}).get("median")),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [
        "",
        "seconds except RSS (MiB); ratio = cycle p50 / floor p50 (target <= 1.5);",
        "GETs = the floor's time in its GETs alone (no parsing); cyc/GETs = cycle p50 / GETs p50;",
        "req/cycle, lists, writes: per idle cycle from the audit log (target: 0 writes);",
        f"RSS target <= 150 MiB at N=10000 (RSS svc: the service, scraped every 5 s); "
        f"latency target p99 <= {interval + 2:g} s (interval {interval:g} s + 2 s),",
        "lat: from the exit PATCH sent to kwok; vis: from the API first showing the container",
        "terminated; kwok: the time between the two (kwok's reaction, not the poller's).",
    ]
    return "\n".join(lines + notes)


def targets(results: list[dict[str, Any]], interval: float) -> list[str]:
    missed = []
    for r in results:
        where = f"{r['mix']} N={r['n']}"
        if r["ratio"] > 1.5:
            missed.append(f"{where}: ratio {r['ratio']:.2f} > 1.5")
        if any(r["writes_per_cycle"]):
            missed.append(f"{where}: idle cycles wrote {r['writes_per_cycle']}")
        if len(set(r["requests_per_cycle"])) != 1:
            missed.append(f"{where}: requests per idle cycle vary: {r['requests_per_cycle']}")
        rss = (r.get("once") or {}).get("rss_mib")
        if r["n"] >= 10000 and rss is not None and rss > 150:
            missed.append(f"{where}: --once RSS {rss:.0f} MiB > 150")
        lat = r.get("latency")
        if lat:
            svc = lat.get("service_vm_hwm_mib")
            if r["n"] >= 10000 and svc is not None and svc > 150:
                missed.append(f"{where}: service RSS {svc:.0f} MiB > 150")
            if lat["finished"] < lat["jobs"]:
                missed.append(f"{where}: only {lat['finished']}/{lat['jobs']} jobs Finished")
            elif lat["latency"]["p99"] > interval + 2:
                missed.append(f"{where}: latency p99 {lat['latency']['p99']:.2f} s")
    # Independent of states: both mixes at one N need the same requests (the
    # Kueue mix adds its workloads' LIST by design).
    by_n: dict[int, set[tuple[int, ...]]] = {}
    for r in results:
        if r["mix"] == "kueue":
            continue
        by_n.setdefault(r["n"], set()).add(tuple(sorted(set(r["requests_per_cycle"]))))
    for n, variants in sorted(by_n.items()):
        if len(variants) > 1:
            missed.append(f"N={n}: requests per idle cycle differ between mixes: {variants}")
    return missed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000,5000,10000", help="N values, ascending")
    parser.add_argument("--quick", action="store_true", help="N=200 only, both mixes (CI)")
    parser.add_argument(
        "--second-mix-size",
        type=int,
        default=1000,
        help="N at which the 'busy' mix is also measured (0: never)",
    )
    parser.add_argument("--cycles", type=int, default=10, help="idle cycles measured per N")
    parser.add_argument(
        "--kueue",
        type=int,
        default=0,
        help="also measure N jobs waiting in a real Kueue's queue (0: never; builds Kueue)",
    )
    parser.add_argument("--latency-jobs", type=int, default=50, help="0 skips latency")
    parser.add_argument("--interval", type=float, default=5.0, help="poll interval (latency)")
    parser.add_argument(
        "--spread", type=float, default=20.0, help="terminations spread over this many seconds"
    )
    parser.add_argument("--nodes", type=int, default=4, help="kwok nodes")
    parser.add_argument("--workers", type=int, default=12, help="threads creating objects")
    parser.add_argument("--seed", type=int, default=9)
    retained = parser.add_argument_group(
        "retained history (tests/bench/history.py; replaces the sizes above when given)"
    )
    retained.add_argument(
        "--history",
        default="",
        help="finished-job counts, ascending, e.g. 10000,50000,100000 (with --active running jobs)",
    )
    retained.add_argument("--active", type=int, default=1000, help="running jobs (--history)")
    retained.add_argument(
        "--idle-seconds", type=float, default=60.0, help="service measured this long per figure"
    )
    retained.add_argument(
        "--warmup-seconds", type=float, default=30.0, help="service runs this long before that"
    )
    retained.add_argument(
        "--half-running",
        type=int,
        default=0,
        help="also N jobs, half running, half finished: the service's CPU per idle minute",
    )
    grid = parser.add_argument_group(
        "interval grid (tests/bench/intervals.py; replaces the sizes above when given)"
    )
    grid.add_argument(
        "--grid", default="", help="job counts, half running, ascending, e.g. 1000,5000"
    )
    grid.add_argument(
        "--intervals", default="1,2,3,5,10", help="poll intervals (s) measured at each count"
    )
    grid.add_argument(
        "--creation-jobs", type=int, default=20, help="jobs created one by one (creation -> pod)"
    )
    grid.add_argument("--burst", type=int, default=200, help="jobs created at once (0: none)")
    grid.add_argument(
        "--new-job-check-interval",
        default="",
        help="set this new-job-check-interval (e.g. 0: the check off); default: the built-in",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--profile", default=None, help="pyinstrument profiles into this dir")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a target is missed (default: report only)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes = "200"
        args.second_mix_size = 200
        args.latency_jobs = min(args.latency_jobs, 30)
        args.spread = min(args.spread, 15.0)
    args.size_list = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    args.history_list = sorted({int(s) for s in args.history.split(",") if s.strip()})
    args.grid_list = sorted({int(s) for s in args.grid.split(",") if s.strip()})
    args.interval_list = [float(s) for s in args.intervals.split(",") if s.strip()]
    return args


def write_json(path: Path, args: argparse.Namespace, results: Any, missed: list[str]) -> None:
    """The figures, the machine and the arguments, for `--json`."""
    path.write_text(
        json.dumps(
            {
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "args": {k: v for k, v in vars(args).items() if k != "json"},
                "results": results,
                "missed": missed,
            },
            indent=1,
            default=str,
        )
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.grid_list:
        sys.modules.setdefault("bench_cycle", sys.modules[__name__])
        import intervals  # tests/bench/intervals.py

        return intervals.main(args)
    if args.history_list or args.half_running:
        # Run as a script this module is __main__: history.py's
        # `from bench_cycle import ...` must find it, not load a second copy.
        sys.modules.setdefault("bench_cycle", sys.modules[__name__])
        import history  # tests/bench/history.py

        return history.main(args)
    workdir = Path(tempfile.mkdtemp(prefix="bench-cycle-"))
    bench = Bench(args, workdir)
    began = time.monotonic()
    try:
        bench.start()
        if args.second_mix_size:
            busy = Population("busy", "benchb")
            bench.measure(busy, args.second_mix_size, full=args.quick)
            log("  removing the busy mix")
            bench.delete_namespaces(busy.namespaces())
        steady = Population("steady", "bench")
        for size in args.size_list:
            bench.measure(steady, size, full=True)
        if args.kueue:
            bench.measure_kueue(args.kueue)
    finally:
        bench.stop()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(workdir)], check=False)
        else:
            log(f"work directory kept: {workdir}")
    report = table(bench.results, args.interval)
    print(report)
    missed = targets(bench.results, args.interval)
    print("\ntargets: " + ("all met" if not missed else "MISSED:\n  " + "\n  ".join(missed)))
    print(f"(total {time.monotonic() - began:.0f} s)")
    if args.json:
        write_json(args.json, args, bench.results, missed)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
