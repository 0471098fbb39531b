"""Observe, then decide once, then act (issue 17): the needs, the log rule, one decide.

Checks, without a cluster: `what_to_observe` asks for exactly what the
branch `decide` takes will read (the namespace for a pod about to be made,
the log of a terminated container unless its results were read while held,
a progress window only when due, the held results file only in exec mode)
and never for anything of a pod the poller did not make or of a job that is
ending for another reason; the stated log rule (FIRST_TAIL_LINES widened by
WIDENING up to MAX_TAIL_LINES, within MAX_RESULTS_READS reads); and, through
a whole cycle against a recording stand-in for the API, that every job
enters `decide` exactly once per cycle, in the typical and the worst cases,
while the requests made stay those of a cycle that decided step by step.
"""

from __future__ import annotations

import base64
import collections
import json
import threading
from dataclasses import replace
from typing import Any

import pytest

from driver.protocol import encode_marker, encode_results
from poller.api.settings import Settings
from poller.cycle.podproof import KEY_FIELD, PodProof
from poller.cycle.reconciler import Reconciler
from poller.decisions import decide, outcome
from poller.decisions.actions import Decision, LogRequest, Needs
from poller.decisions.observed import Observed
from poller.decisions.routing import Step, route
from poller.decisions.views import PROOF_ANNOTATION
from poller.jobpod import podspec
from poller.kube.client import JobsPage, LogTail
from tests.unit.test_decide import NOW, SETTINGS, job, log_view, pod, running_status

EXEC = Settings.model_validate({"results-source": "exec"})
RESULTS_LOG = LogRequest("eval-abc123", "lmeval", outcome.FIRST_TAIL_LINES)
PROGRESS_LOG = LogRequest("eval-abc123", "lmeval", decide.PROGRESS_TAIL_LINES, "progress")
FINISHED = pod("terminated", exit_code=0)


# -- what_to_observe -----------------------------------------------------------------


def test_a_pod_about_to_be_made_needs_the_namespace_and_nothing_else() -> None:
    assert decide.what_to_observe(Observed(job(), None), SETTINGS, NOW) == Needs(namespace_uid=True)


def test_a_terminated_container_needs_its_log_unless_results_were_read_while_held() -> None:
    assert decide.what_to_observe(
        Observed(job(running_status()), FINISHED), SETTINGS, NOW
    ) == Needs(log=RESULTS_LOG)
    stored = job(running_status(results=json.dumps({"results": {}})))
    assert decide.what_to_observe(Observed(stored, FINISHED), SETTINGS, NOW) == Needs()
    failed = pod("terminated", exit_code=1)
    assert decide.what_to_observe(Observed(stored, failed), SETTINGS, NOW) == Needs(log=RESULTS_LOG)


def test_a_running_container_needs_a_progress_window_only_when_due() -> None:
    running = job(running_status())
    assert decide.what_to_observe(Observed(running, pod()), SETTINGS, NOW) == Needs()
    due = decide.what_to_observe(Observed(running, pod()), SETTINGS, NOW, progress_due=True)
    assert due == Needs(log=PROGRESS_LOG)
    held = decide.what_to_observe(Observed(running, pod()), EXEC, NOW, progress_due=True)
    assert held == Needs(log=PROGRESS_LOG, held_results=True)


@pytest.mark.parametrize(
    ("status", "spec", "changes"),
    [
        ("running", {}, {"proof_attempt": None}),  # not the poller's pod: never read
        ("running", {}, {"owner_uid": "uid-other"}),
        ("running", {"cancel": True}, {}),  # archived and deleted, not read
        ("running", {"suspend": True}, {}),
        ("complete", {}, {}),
    ],
)
def test_nothing_is_read_for_a_job_ending_otherwise_or_a_pod_not_ours(
    status: str, spec: dict[str, Any], changes: dict[str, Any]
) -> None:
    done = {"state": "Complete", "reason": "Succeeded", "completeTime": "2026-11-29T11:00:00Z"}
    listed = job(running_status() if status == "running" else done, **spec)
    finished = replace(FINISHED, **changes)
    for settings in (SETTINGS, EXEC):
        needs = decide.what_to_observe(Observed(listed, finished), settings, NOW, progress_due=True)
        assert needs == Needs()


def test_what_to_observe_and_decide_take_the_same_branch() -> None:
    cases = [
        (job(), None),
        (job(running_status()), FINISHED),
        (job(running_status()), pod()),
        (job(running_status()), pod("waiting", phase="Pending")),
        (job(running_status(), cancel=True), FINISHED),
    ]
    for listed, observed_pod in cases:
        step = route(Observed(listed, observed_pod), NOW)
        needs = decide.what_to_observe(
            Observed(listed, observed_pod), SETTINGS, NOW, progress_due=True
        )
        assert (needs.log is not None) == (step in (Step.FINISHED, Step.RUNNING))
        assert needs.namespace_uid == (step is Step.SCHEDULE)


# -- the log rule --------------------------------------------------------------------


def test_the_log_rule_is_stated_by_its_constants() -> None:
    assert outcome.MAX_TAIL_LINES == outcome.FIRST_TAIL_LINES * outcome.WIDENING**outcome.WIDENINGS
    assert outcome.MAX_RESULTS_READS == 1 + outcome.WIDENINGS
    windows: list[int] = []
    window: int | None = outcome.FIRST_TAIL_LINES
    lines = ["x"]
    while window is not None:
        windows.append(window)
        full = log_view(lines * window, tail=window)
        window = outcome.next_results_window(FINISHED, full)
    assert windows == [400, 1600, 6400, 25_600]
    assert len(windows) == outcome.MAX_RESULTS_READS


def test_only_a_success_without_results_reads_more() -> None:
    full = log_view(["x"] * outcome.FIRST_TAIL_LINES)
    assert outcome.next_results_window(pod("terminated", exit_code=1), full) is None
    chunks = encode_results(json.dumps({"results": {"t": {"a,none": 1}}}).encode(), "r")
    found = log_view([*chunks, *["x"] * outcome.FIRST_TAIL_LINES])
    assert outcome.next_results_window(FINISHED, found) is None


# -- one decide per job per cycle ----------------------------------------------------

KEY = bytes(range(32))
PROOF = PodProof(KEY)
RESULTS = {"results": {"toy": {"acc,none": 0.5}}, "configs": {}}


def _pod_of(name: str) -> str:
    return podspec.pod_name(name, f"uid-{name}")


def _running(name: str) -> dict[str, Any]:
    def condition(kind: str, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": "2026-11-30T00:00:00Z",
            "observedGeneration": 1,
        }

    return {
        "state": "Running",
        "reason": "NoReason",
        "message": "evaluation running",
        "podName": _pod_of(name),
        "podAttempt": 1,
        "podUID": f"pod-{name}",
        "startTime": "2026-11-30T00:00:00Z",
        "observedGeneration": 1,
        "conditions": [
            condition("Scheduled", "PodCreated", "m"),
            condition("Running", "ContainerRunning", "the evaluation container runs"),
        ],
    }


def _job(name: str, status: dict[str, Any] | None) -> dict[str, Any]:
    meta = {"namespace": "ns", "name": name, "uid": f"uid-{name}", "generation": 1}
    meta |= {"resourceVersion": "5", "creationTimestamp": "2026-11-30T00:00:00Z"}
    return {"metadata": meta, "spec": {"model": "dummy", "tasks": ["toy"]}, "status": status or {}}


def _pod(name: str, exit_code: int | None) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": "2026-11-30T00:00:01Z"}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "reason": "Error" if exit_code else ""}}
    proof = PROOF.sign("ns", _pod_of(name), f"uid-{name}", 1)
    return {
        "metadata": {
            "namespace": "ns",
            "name": _pod_of(name),
            "uid": f"pod-{name}",
            "creationTimestamp": "2026-11-30T00:00:00Z",
            "ownerReferences": [{"uid": f"uid-{name}", "controller": True}],
            "annotations": {PROOF_ANNOTATION: proof},
        },
        "status": {
            "phase": "Running" if exit_code is None else "Succeeded",
            "containerStatuses": [{"name": podspec.MAIN_CONTAINER, "state": state}],
        },
    }


class RecordingKube:
    """Lists one job and its pod, serves its log and exec, records every request."""

    def __init__(self, job: dict[str, Any], pods: list[dict[str, Any]], log: list[str]) -> None:
        self.job, self.pods, self.log = job, pods, log
        self.settings: dict[str, str] = {"pod-image": "registry.example/job:1"}
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def _note(self, what: str) -> None:
        with self.lock:
            self.calls.append(what)

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str]:
        return self.settings

    def read_secret(self, namespace: str, name: str) -> dict[str, Any]:
        return {"data": {KEY_FIELD: base64.b64encode(KEY).decode()}}

    def list_suites(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return []  # no LMEvalSuite: the suites' half of the cycle lists and stops

    def list_jobs(
        self, namespace: str | None = None, *, field_selector: str | None = None, **_: Any
    ) -> list[dict[str, Any]]:
        return [self.job]

    def list_pods(
        self,
        selector: str,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        **_: Any,
    ) -> list[dict[str, Any]]:
        return self.pods

    # No finished jobs: the sweep lists none, and nothing is read by name.
    def list_jobs_page(self, namespace: str | None, **_: Any) -> JobsPage:
        return JobsPage([], None)

    def find_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def find_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def read_log_tail(
        self, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int
    ) -> LogTail:
        self._note("log")
        return LogTail("".join(f"{line}\n" for line in self.log[-tail_lines:]).encode(), False)

    def exec_in_pod(
        self, namespace: str, pod: str, container: str, argv: list[str], **_: Any
    ) -> tuple[int, str, str]:
        self._note("exec")
        return 0, json.dumps(RESULTS), ""

    def namespace_annotations(self, namespace: str) -> dict[str, str]:
        self._note("namespace")
        return {"openshift.io/sa.scc.uid-range": "1000680000/10000"}

    def create_pod(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self._note("create")
        return {**manifest, "metadata": {**manifest["metadata"], "uid": "new-pod-uid"}}

    def patch_job_status(self, namespace: str, name: str, status: Any, version: str) -> None:
        self._note("patch")

    def post_event(self, **event: Any) -> None:
        self._note("event")

    def apply_configmap(self, manifest: dict[str, Any], *, merge: bool = False) -> None:
        self._note("configmap")

    def read_configmap(self, namespace: str, name: str) -> None:
        return None


def _completed(path: str | None = None) -> list[str]:
    chunks = encode_results(json.dumps(RESULTS).encode(), "r")
    extra = {"results_path": path} if path else {}
    return [*chunks, encode_marker("completed", run_id="r", exit_code=0, message="ok", **extra)]


PROGRESS = encode_marker("progress", phase="p", percent=40.0, n=4, total=10)
# (job status, pod: None, "running" or an exit code, its log, settings) -> requests
CASES = {
    "a pod is made": (None, None, [], {}, ["namespace", "create", "patch", "event"]),
    "running, no read due": ("running", "running", [], {"progress-reads-per-cycle": "0"}, []),
    "running, progress read": ("running", "running", [PROGRESS], {}, ["log", "patch"]),
    "results in the first window": (
        "running",
        0,
        _completed(),
        {},
        ["log", "configmap", "patch", "event"],
    ),
    "no results, every window full (the worst case)": (
        "running",
        0,
        ["x"] * 30_000,
        {},
        ["log"] * outcome.MAX_RESULTS_READS + ["patch", "event"],
    ),
    "exec mode, the driver holds its results": (
        "running",
        "running",
        _completed("/x"),
        {"results-source": "exec"},
        ["log", "exec", "configmap", "patch", "exec"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_job_enters_decide_once_per_cycle(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    status, pod_state, log, settings, requests = CASES[case]
    pods = [] if pod_state is None else [_pod("j", None if pod_state == "running" else pod_state)]
    kube = RecordingKube(_job("j", _running("j") if status else None), pods, log)
    kube.settings |= settings
    entries: collections.Counter[str] = collections.Counter()
    original = decide.decide

    def counting(observed: Observed, *args: Any, **kwargs: Any) -> Decision:
        entries[observed.job.uid] += 1
        return original(observed, *args, **kwargs)

    monkeypatch.setattr(decide, "decide", counting)
    poller = Reconciler(kube, settings_namespace="lmeval-system")  # type: ignore[arg-type]
    report = poller.run_cycle()
    assert report.errors == 0, report.error_messages
    assert entries == {"uid-j": 1}
    assert kube.calls == requests
