"""Hostile pod logs and a poisoned status on the real control plane (issue 15).

A job's pod exits 0 after printing what its author chose, served by kwok as
the container log in the runtime's format (lines split at 16 KiB, as the
kubelet writes them): a zip bomb of results, a results set declaring 10**12
chunks, a results JSON nested 100,000 deep, lines longer in total than the
read limit. Each job ends Failed within a few cycles with a message naming
what was wrong, and no cycle counts an error. A NaN progress marker leaves
the job running, with no percentage, until it completes. A log whose long
lines come before the results still succeeds (the narrower window). And a
finished job whose status.results an admin set to deeply nested JSON is
still deleted by its TTL. In exec mode, a results file over the limit is not
read past it (kwok's exec serves a 9 MiB file) and the log's results are used.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client
from lmeval_sandbox import kwok

from driver.protocol import encode_marker, encode_results
from poller import api
from poller.cycle.reconciler import Reconciler
from tests import hostile_logs
from tests.poller_fixtures import BASE_SETTINGS, Jobs, cycle_until, set_settings, terminate
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

CRI_SPLIT = 16 * 1024  # where the container runtime splits a long line
RESULTS = {"results": {"toy": {"acc,none": 0.75}}, "versions": {"toy": 1}}


def cri_file(text: str, split: int = CRI_SPLIT) -> str:
    """`text` in the runtime's log format, long lines split into partial (P) lines."""
    out: list[str] = []
    for line in text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"):
        pieces = [line[i : i + split] for i in range(0, len(line), split)] or [""]
        for index, piece in enumerate(pieces):
            tag = "F" if index == len(pieces) - 1 else "P"
            out.append(f"2026-12-01T08:00:00.{index:09d}Z stdout {tag} {piece}\n")
    return "".join(out)


def serve(
    admin_api: client.ApiClient,
    namespace: str,
    pod: str,
    text: str,
    where: Path,
    split: int = CRI_SPLIT,
) -> Path:
    path = where / f"{pod}.log"
    path.write_text(cri_file(text, split))
    client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
        "kwok.x-k8s.io", "v1alpha1", namespace, "logs", kwok.logs_body(namespace, pod, path)
    )
    return path


def running_pod(poller: Reconciler, jobs: Jobs, name: str, **spec: object) -> str:
    jobs.create(name, **spec)
    return str(
        cycle_until(
            poller,
            lambda: jobs.status(name).get("state") == "Running" and jobs.status(name)["podName"],
            what=f"{name} running",
        )
    )


def finish_within(poller: Reconciler, jobs: Jobs, name: str, cycles: int) -> dict[str, object]:
    """Run at most `cycles` cycles, none with an error, until the job is Complete."""
    for _ in range(cycles):
        report = poller.run_cycle()
        assert report.errors == 0, report.error_messages
        status = jobs.status(name)
        if status.get("state") == "Complete":
            return status
    raise AssertionError(f"{name} not Complete after {cycles} cycles: {jobs.status(name)}")


def long_lines_then(tail: str, lines: int = 200, size: int = 64 * 1024) -> str:
    return "".join(f"{i:05d}" + "y" * (size - 5) + "\n" for i in range(lines)) + tail


def results_log() -> str:
    raw = json.dumps(RESULTS).encode()
    lines = [
        encode_marker("started", run_id="r"),
        *encode_results(raw, "r"),
        encode_marker("completed", run_id="r", exit_code=0, message="lm_eval completed"),
    ]
    return "\n".join(lines) + "\n"


# Each case: the log, what the failure says, and where the runtime splits lines.
HOSTILE: dict[str, tuple[Callable[[], str], str, int]] = {
    "zip-bomb": (
        hostile_logs.zip_bomb_log,
        "chunks exceeds the 33 chunk limit (1048576 encoded characters)",
        CRI_SPLIT,
    ),
    "small-zip-bomb": (
        lambda: hostile_logs.small_zip_bomb_log(8 * 1024 * 1024),
        "exceed the 200:1 compression ratio limit",
        CRI_SPLIT,
    ),
    "chunk-total": (
        hostile_logs.huge_chunk_count_log,
        "a results set of 1000000000000 chunks exceeds the 33 chunk limit",
        CRI_SPLIT,
    ),
    "deep-results": (
        hostile_logs.deep_results_log,
        "results are not usable: JSON nested deeper than 64 levels",
        CRI_SPLIT,
    ),
    "wide-results": (
        hostile_logs.wide_results_log,
        "results are not usable: more than 200000 JSON elements",
        CRI_SPLIT,
    ),
    # Lines of 64 KiB that nothing splits (a runtime that does not, or a
    # server that is not what it should be): even the narrow window is cut.
    "long-lines": (
        lambda: long_lines_then(encode_marker("completed", run_id="r", exit_code=0) + "\n"),
        "the log window (its last 127 lines) exceeded 2097152 bytes",
        1 << 30,
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_log_fails_the_job_in_a_few_cycles_with_the_reason(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, tmp_path: Path, case: str
) -> None:
    make, words, split = HOSTILE[case]
    pod = running_pod(poller, jobs, case)
    serve(admin_api, jobs.namespace, pod, make(), tmp_path, split)
    terminate(admin_api, jobs.namespace, pod, 0)
    wait_for(lambda: _terminated(jobs, pod), what=f"{pod} terminated")
    final = finish_within(poller, jobs, case, cycles=3)
    assert final["reason"] == "Failed"
    message = str(final["message"])
    assert message.startswith("lm_eval exited 0 but the pod log holds no results: ")
    assert words in message


def test_long_lines_before_the_results_are_skipped_by_the_narrow_window(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, tmp_path: Path
) -> None:
    # A long run's tqdm redraws end in one newline: megabytes of one "line",
    # then lm_eval's table and the driver's markers.
    table = "".join(f"|toy_{i:03d}|      1|none  |     0|acc   |0.75|\n" for i in range(40))
    log = long_lines_then(table + results_log(), lines=3, size=1536 * 1024)
    pod = running_pod(poller, jobs, "tqdm")
    serve(admin_api, jobs.namespace, pod, log, tmp_path)
    terminate(admin_api, jobs.namespace, pod, 0)
    wait_for(lambda: _terminated(jobs, pod), what=f"{pod} terminated")
    final = finish_within(poller, jobs, "tqdm", cycles=3)
    assert final["reason"] == "Succeeded", final["message"]
    assert json.loads(str(final["results"]))["results"] == RESULTS["results"]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e999"])
def test_nan_progress_never_reaches_status_and_the_job_completes(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, tmp_path: Path, value: str
) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, "progress-interval": "1s"})
    name = f"nan-{value.lower()}"
    pod = running_pod(poller, jobs, name)
    path = serve(admin_api, jobs.namespace, pod, hostile_logs.nan_progress_log(value), tmp_path)
    status = cycle_until(
        poller,
        lambda: (jobs.status(name).get("progress") or {}).get("phase") and jobs.status(name),
        what="progress in status",
    )
    assert status["state"] == "Running"
    assert status["progress"]["phase"] == "Running loglikelihood requests"
    assert "percent" not in status["progress"]
    path.write_text(cri_file(hostile_logs.nan_progress_log(value) + results_log()))
    terminate(admin_api, jobs.namespace, pod, 0)
    final = cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == "Complete" and jobs.status(name),
        what=f"{name} Complete",
    )
    assert final["reason"] == "Succeeded", final["message"]


def test_an_admin_written_deep_status_results_does_not_stop_the_ttl(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, tmp_path: Path
) -> None:
    pod = running_pod(poller, jobs, "poisoned", ttlSecondsAfterFinished=3)
    serve(admin_api, jobs.namespace, pod, "Traceback: boom\n", tmp_path)
    terminate(admin_api, jobs.namespace, pod, 3, message="boom")
    final = cycle_until(
        poller, lambda: jobs.status("poisoned").get("state") == "Complete", what="Complete"
    )
    assert final
    deep = '{"results": ' + "[" * 100_000 + "]" * 100_000 + "}"
    jobs.custom.patch_namespaced_custom_object_status(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "poisoned",
        {"status": {"results": deep}},
    )
    assert jobs.status("poisoned")["results"] == deep

    def gone() -> bool:
        items = jobs.custom.list_namespaced_custom_object(
            api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL
        )["items"]
        return all(item["metadata"]["name"] != "poisoned" for item in items)

    cycle_until(poller, gone, what="poisoned job deleted by its TTL")


def _terminated(jobs: Jobs, pod: str) -> bool:
    statuses = jobs.core.read_namespaced_pod(pod, jobs.namespace).status.container_statuses
    return any(s.state.terminated for s in statuses or [])


def test_an_exec_results_file_over_the_limit_is_not_read_and_the_log_is_used(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, "results-source": "exec"})
    big = tmp_path / "results.json"
    big.write_text('{"results": {}, "pad": "' + "z" * (9 * 1024 * 1024) + '"}')
    pod = running_pod(poller, jobs, "held")
    client.CustomObjectsApi(admin_api).create_namespaced_custom_object(
        "kwok.x-k8s.io",
        "v1alpha1",
        jobs.namespace,
        "execs",
        kwok.exec_body(jobs.namespace, pod, tmp_path, env={"PATH": "/usr/bin:/bin"}),
    )
    raw = json.dumps(RESULTS).encode()
    log = [
        encode_marker("started", run_id="r"),
        *encode_results(raw, "r"),
        encode_marker("completed", run_id="r", exit_code=0, results_path=str(big)),
    ]
    serve(admin_api, jobs.namespace, pod, "\n".join(log) + "\n", tmp_path)
    stored = cycle_until(
        poller,
        lambda: jobs.status("held").get("results") and jobs.status("held"),
        what="results read while held",
    )
    assert stored["resultsSource"] == "log"
    assert json.loads(stored["results"]) == RESULTS
    assert "results file larger than 8388608 bytes; reading the log instead" in caplog.text
