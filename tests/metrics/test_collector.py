"""Unit tests of `poller.metrics`, each on a fresh registry, without a cluster.

Checks: per-job series (`lmeval_jobs` with zeros per namespace, `lmeval_job_info`,
timestamps, progress, scores split into task/metric/filter labels with stderr
as a separate metric) come exactly from the last snapshot, so a deleted job's
series are gone after the next one; a failed cycle keeps the snapshot and is
counted; the job-duration histogram observes the jobs a cycle moved to
Complete (`CycleReport.finished`), so each once, and never one that finished
before the process started; API requests are counted
by verb/resource/code; a standby (its cycles skipped, not the leader) is
alive but exposes no per-job series; ``lmeval_build_info`` is one series, 1,
labelled with the version and revision given (by default the installed
metadata's, `poller.buildinfo`), named so in both exposition formats; no
label is named `job` or `instance`, counters and histograms carry no user
strings, and no `_created` series is exposed; the
HTTP server serves /metrics, /healthz and /readyz and stops; the streamed
exposition gives prometheus_client's own bytes for every format, gzip and
name[] filter, also when large families are built in parts.
"""

from __future__ import annotations

import datetime as dt
import gzip
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from poller import api, buildinfo
from poller.cycle.reconciler import CycleReport
from poller.decisions.views import JobView
from poller.metrics import MetricsServer, PollerMetrics, exposition_app, serve
from poller.results.lmeval import parse_scores
from tests.metrics.conftest import TOY_RESULTS, make_job

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC).timestamp()  # the jobs' lastScheduleTime


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(T0 - 100)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry, clock: Clock) -> PollerMetrics:
    return PollerMetrics(registry, clock=clock)


def cycle(
    metrics: PollerMetrics,
    *jobs: JobView,
    errors: int = 0,
    duration: float = 0.2,
    finished: Sequence[JobView] = (),
) -> None:
    report = CycleReport(
        jobs=len(jobs),
        errors=errors,
        duration=duration,
        snapshot=list(jobs),
        finished=list(finished),
    )
    metrics.observe_cycle(report, None, interval=10.0)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def all_samples(registry: CollectorRegistry) -> Iterator[tuple[str, str, dict[str, str]]]:
    text = generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield family.type, sample.name, dict(sample.labels)


def test_jobs_by_state_with_zeros_per_namespace(
    metrics: PollerMetrics, registry: CollectorRegistry
) -> None:
    cycle(
        metrics,
        make_job("a1", state="Running"),
        make_job("a2", state="Running"),
        make_job("a3", state="Complete", reason="Failed"),
        make_job("b1", namespace="team-b", state=None),  # not yet seen by the poller
    )
    assert value(registry, "lmeval_jobs", namespace="team-a", state="Running") == 2
    assert value(registry, "lmeval_jobs", namespace="team-a", state="Complete") == 1
    assert value(registry, "lmeval_jobs", namespace="team-b", state="New") == 1
    for state in ("New", "Scheduled", "Suspended"):
        assert value(registry, "lmeval_jobs", namespace="team-a", state=state) == 0
    for state in ("Scheduled", "Running", "Complete", "Suspended"):
        assert value(registry, "lmeval_jobs", namespace="team-b", state=state) == 0


def test_job_info_timestamps_and_progress(
    metrics: PollerMetrics, registry: CollectorRegistry
) -> None:
    cycle(
        metrics,
        make_job("run", model="local-completions", percent=42.0),
        make_job(
            "done",
            state="Complete",
            reason="Succeeded",
            completed="2030-01-01T00:10:00Z",
        ),
        make_job("new", state=None, scheduled=None),
    )
    ids = {"namespace": "team-a"}
    assert (
        value(
            registry,
            "lmeval_job_info",
            **ids,
            lmevaljob="run",
            model="local-completions",
            state="Running",
            reason="NoReason",
        )
        == 1
    )
    assert (
        value(
            registry,
            "lmeval_job_info",
            **ids,
            lmevaljob="done",
            model="dummy",
            state="Complete",
            reason="Succeeded",
        )
        == 1
    )
    assert value(registry, "lmeval_job_start_timestamp_seconds", **ids, lmevaljob="run") == T0
    assert value(registry, "lmeval_job_start_timestamp_seconds", **ids, lmevaljob="new") is None
    assert (
        value(registry, "lmeval_job_completion_timestamp_seconds", **ids, lmevaljob="run") is None
    )
    assert (
        value(registry, "lmeval_job_completion_timestamp_seconds", **ids, lmevaljob="done")
        == T0 + 600
    )
    assert value(registry, "lmeval_job_progress_ratio", **ids, lmevaljob="run") == 0.42
    assert value(registry, "lmeval_job_progress_ratio", **ids, lmevaljob="done") == 1.0
    assert value(registry, "lmeval_job_progress_ratio", **ids, lmevaljob="new") is None


def test_scores_split_into_task_metric_filter_and_stderr_apart(
    metrics: PollerMetrics, registry: CollectorRegistry
) -> None:
    cycle(metrics, make_job("scored", state="Complete", reason="Succeeded", results=TOY_RESULTS))
    ids = {"namespace": "team-a", "lmevaljob": "scored"}

    def result(task: str, metric: str, filter: str, stderr: bool = False) -> float | None:
        name = "lmeval_job_result_stderr" if stderr else "lmeval_job_result"
        return value(registry, name, **ids, task=task, metric=metric, filter=filter)

    assert result("toy_mc", "acc", "none") == 0.5
    assert result("toy_mc", "acc", "none", stderr=True) == 0.25
    assert result("toy_mc", "acc_norm", "none") == 0.75
    assert result("toy_mc", "acc_norm", "none", stderr=True) is None  # "N/A"
    assert result("toy_gen", "exact_match", "strict-match") == 0.125
    assert result("toy_gen", "exact_match", "strict-match", stderr=True) == 0.0625
    assert result("toy_gen", "exact_match", "flexible-extract") == 1.0
    assert result("toy", "acc", "none") == 0.4  # a group score
    assert result("toy_gen", "bleu", "none") is None  # a boolean is no score
    # The stderr never appears as a metric of its own in lmeval_job_result.
    assert result("toy_mc", "acc_stderr", "none") is None
    names = {(name, labels.get("metric")) for _, name, labels in all_samples(registry)}
    assert ("lmeval_job_result", "alias") not in names
    assert ("lmeval_job_result", "sample_len") not in names
    scores = [s for _, name, s in all_samples(registry) if name == "lmeval_job_result"]
    assert len(scores) == 5


def test_parse_scores_tolerates_junk() -> None:
    assert parse_scores(None) == ()
    assert parse_scores("") == ()
    assert parse_scores("{not json") == ()
    assert parse_scores("[1, 2]") == ()
    assert parse_scores('{"results": {"t": "x", "u": {"acc,none": null}}}') == ()
    (only,) = parse_scores('{"results": {"t": {"acc,none": 1, "acc": 2}}}')
    assert (only.task, only.metric, only.filter, only.value, only.stderr) == (
        "t",
        "acc",
        "none",
        1.0,
        False,
    )


def test_deleted_job_series_vanish_on_next_snapshot(
    metrics: PollerMetrics, registry: CollectorRegistry
) -> None:
    kept = make_job("kept", state="Complete", reason="Succeeded", results=TOY_RESULTS)
    gone = make_job(
        "gone",
        namespace="team-z",
        state="Complete",
        reason="Succeeded",
        results=TOY_RESULTS,
        completed="2030-01-01T00:05:00Z",
        percent=100,
    )
    cycle(metrics, kept, gone)
    assert b'lmevaljob="gone"' in generate_latest(registry)
    cycle(metrics, kept)
    text = generate_latest(registry).decode()
    assert 'lmevaljob="gone"' not in text
    assert 'namespace="team-z"' not in text  # not even a zero count
    assert 'lmevaljob="kept"' in text
    assert (
        value(
            registry,
            "lmeval_job_result",
            namespace="team-a",
            lmevaljob="kept",
            task="toy_mc",
            metric="acc",
            filter="none",
        )
        == 0.5
    )


def test_changed_results_are_reparsed(metrics: PollerMetrics, registry: CollectorRegistry) -> None:
    job = make_job("j", state="Complete", reason="Succeeded", results=TOY_RESULTS)
    cycle(metrics, job)
    changed = make_job(
        "j",
        state="Complete",
        reason="Succeeded",
        results={"results": {"toy_mc": {"acc,none": 0.9}}},
    )
    cycle(metrics, changed)
    ids = {"namespace": "team-a", "lmevaljob": "j", "task": "toy_mc", "filter": "none"}
    assert value(registry, "lmeval_job_result", **ids, metric="acc") == 0.9
    assert value(registry, "lmeval_job_result", **ids, metric="acc_norm") is None


def test_failed_cycle_is_counted_and_keeps_the_snapshot(
    metrics: PollerMetrics, registry: CollectorRegistry, clock: Clock
) -> None:
    cycle(metrics, make_job("a"), errors=2, duration=0.3)
    assert value(registry, "lmeval_poll_cycles_total", outcome="success") == 1
    assert value(registry, "lmeval_poll_errors_total", scope="job") == 2
    assert value(registry, "lmeval_poll_errors_total", scope="cycle") == 0
    assert value(registry, "lmeval_last_successful_cycle_timestamp_seconds") == clock.now
    assert value(registry, "lmeval_poll_cycle_duration_seconds_count") == 1
    assert value(registry, "lmeval_poll_cycle_duration_seconds_sum") == pytest.approx(0.3)
    assert value(registry, "lmeval_poll_cycle_duration_seconds_bucket", le="0.5") == 1
    assert value(registry, "lmeval_poll_interval_seconds") == 10.0
    last = clock.now
    clock.now += 30
    metrics.observe_cycle(None, RuntimeError("LIST failed"), interval=5.0)
    assert value(registry, "lmeval_poll_cycles_total", outcome="failure") == 1
    assert value(registry, "lmeval_poll_errors_total", scope="cycle") == 1
    assert value(registry, "lmeval_last_successful_cycle_timestamp_seconds") == last
    assert value(registry, "lmeval_poll_interval_seconds") == 5.0
    assert value(registry, "lmeval_jobs", namespace="team-a", state="Running") == 1


def test_standby_exposes_no_job_series_and_is_not_leader(
    metrics: PollerMetrics, registry: CollectorRegistry, clock: Clock
) -> None:
    cycle(metrics, make_job("a"))
    acted_at = clock.now
    clock.now += 120
    metrics.observe_cycle(CycleReport(skipped=True), None, interval=10.0)
    assert value(registry, "lmeval_poll_cycles_total", outcome="skipped") == 1
    assert value(registry, "lmeval_leader") == 0
    assert b"lmeval_jobs{" not in generate_latest(registry)
    assert value(registry, "lmeval_last_successful_cycle_timestamp_seconds") == acted_at
    assert metrics.health() == (True, "ok")  # a standby that cycles stays alive
    cycle(metrics, make_job("a"))
    assert value(registry, "lmeval_leader") == 1
    assert value(registry, "lmeval_jobs", namespace="team-a", state="Running") == 1


def test_job_duration_observed_for_the_jobs_a_cycle_finished(
    metrics: PollerMetrics, registry: CollectorRegistry
) -> None:
    running = make_job("j", state="Running")
    done = make_job("j", state="Complete", reason="Succeeded", completed="2030-01-01T00:10:00Z")
    failed = make_job(
        "f",
        state="Complete",
        reason="Failed",
        scheduled=None,  # never scheduled: measured from creation
        completed="2030-01-01T00:00:30Z",
    )
    # Finished before this process started: listed (or retained), never
    # moved to Complete by this process, so never observed by it.
    old = make_job(
        "old",
        state="Complete",
        reason="Succeeded",
        scheduled="2029-12-01T00:00:00Z",
        completed="2029-12-01T01:00:00Z",
    )
    cycle(metrics, running, old)
    cycle(metrics, done, failed, old, finished=[done, failed])
    cycle(metrics, done, failed, old)  # still listed: observed once only
    count = "lmeval_job_duration_seconds_count"
    assert value(registry, count, reason="Succeeded") == 1
    assert value(registry, "lmeval_job_duration_seconds_sum", reason="Succeeded") == 600
    assert (
        value(registry, "lmeval_job_duration_seconds_bucket", reason="Succeeded", le="600.0") == 1
    )
    assert (
        value(registry, "lmeval_job_duration_seconds_bucket", reason="Succeeded", le="300.0") == 0
    )
    assert value(registry, count, reason="Failed") == 1
    assert value(registry, "lmeval_job_duration_seconds_sum", reason="Failed") == 90
    assert value(registry, count, reason="Cancelled") == 0
    # A job the report says finished but that is not Complete (or has no
    # completeTime) has no duration to observe.
    cycle(metrics, finished=[running, make_job("x", state="Complete", reason="Failed")])
    assert value(registry, count, reason="Failed") == 1


def test_kube_requests_leader_and_settings_problems(
    metrics: PollerMetrics, registry: CollectorRegistry
) -> None:
    metrics.on_request("list", "lmevaljobs", "200")
    metrics.on_request("list", "lmevaljobs", "200")
    metrics.on_request("create", "pods", "error")
    name = "lmeval_kube_requests_total"
    assert value(registry, name, verb="list", resource="lmevaljobs", code="200") == 2
    assert value(registry, name, verb="create", resource="pods", code="error") == 1
    assert value(registry, "lmeval_leader") == 1
    metrics.set_leader(False)
    assert value(registry, "lmeval_leader") == 0
    poller = SimpleNamespace(
        settings=SimpleNamespace(poll_interval=2.5),
        tracker=SimpleNamespace(problem_count=2),
    )
    metrics.cycle_hook(poller)(CycleReport(), None)
    assert value(registry, "lmeval_poll_interval_seconds") == 2.5
    assert value(registry, "lmeval_settings_problems") == 2


def test_label_hygiene_and_no_created_series(
    metrics: PollerMetrics, registry: CollectorRegistry
) -> None:
    cycle(
        metrics,
        make_job("running", percent=10),
        make_job(
            "done",
            state="Complete",
            reason="Succeeded",
            results=TOY_RESULTS,
            completed="2030-01-01T00:10:00Z",
        ),
    )
    metrics.on_request("list", "pods", "200")
    metrics.observe_cycle(None, RuntimeError("x"))
    samples = list(all_samples(registry))
    assert samples
    fixed_vocabulary = {"verb", "resource", "code", "outcome", "scope", "reason", "le"}
    for family_type, name, labels in samples:
        assert not {"job", "instance"} & set(labels), (name, labels)
        assert not name.endswith("_created"), name
        if family_type in ("counter", "histogram"):
            assert set(labels) <= fixed_vocabulary, (name, labels)
    for text in (generate_latest(registry), generate_openmetrics(registry)):
        assert b"_created" not in text
    expected = {
        "lmeval_poll_cycle_duration_seconds_count",
        "lmeval_poll_cycles_total",
        "lmeval_poll_errors_total",
        "lmeval_last_successful_cycle_timestamp_seconds",
        "lmeval_poll_interval_seconds",
        "lmeval_kube_requests_total",
        "lmeval_leader",
        "lmeval_settings_problems",
        "lmeval_build_info",
        "lmeval_job_duration_seconds_count",
        "lmeval_jobs",
        "lmeval_job_info",
        "lmeval_job_start_timestamp_seconds",
        "lmeval_job_completion_timestamp_seconds",
        "lmeval_job_progress_ratio",
        "lmeval_job_result",
        "lmeval_job_result_stderr",
    }
    assert expected <= {name for _, name, _ in samples}


def test_build_info_is_one_series_labelled_with_the_build(clock: Clock) -> None:
    registry = CollectorRegistry()
    PollerMetrics(registry, clock=clock, version="1.2.3", revision="0123abc")
    build = [(t, name, labels) for t, name, labels in all_samples(registry) if "build" in name]
    assert build == [("gauge", "lmeval_build_info", {"version": "1.2.3", "revision": "0123abc"})]
    assert value(registry, "lmeval_build_info", version="1.2.3", revision="0123abc") == 1
    # OpenMetrics too: a gauge of that very name (an Info would be family `lmeval_build`).
    families = {f.name: f.type for f in om_families(generate_openmetrics(registry).decode())}
    assert families["lmeval_build_info"] == "gauge"
    # By default, what the process is: the installed metadata and the revision.
    default = CollectorRegistry()
    PollerMetrics(default, clock=clock)
    labels = {"version": buildinfo.version(), "revision": buildinfo.revision()}
    assert buildinfo.version() != buildinfo.UNKNOWN_VERSION  # this checkout is installed
    assert value(default, "lmeval_build_info", **labels) == 1


def test_registries_are_independent(clock: Clock) -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    one, _ = PollerMetrics(first, clock=clock), PollerMetrics(second, clock=clock)
    cycle(one, make_job("a"))
    assert first.get_sample_value("lmeval_poll_cycles_total", {"outcome": "success"}) == 1
    assert second.get_sample_value("lmeval_poll_cycles_total", {"outcome": "success"}) == 0
    assert second.get_sample_value("lmeval_jobs", {"namespace": "team-a", "state": "New"}) is None


@pytest.fixture
def server(metrics: PollerMetrics) -> Iterator[MetricsServer]:
    running = serve(metrics, port=0, address="127.0.0.1")
    yield running
    running.stop()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_server_metrics_health_and_readiness(
    server: MetricsServer, metrics: PollerMetrics, clock: Clock
) -> None:
    assert get(f"{server.url}/readyz")[0] == 503
    assert get(f"{server.url}/healthz") == (200, "ok\n")  # within the start-up grace
    clock.now += 61
    status, body = get(f"{server.url}/healthz")
    assert status == 503 and "no successful cycle" in body
    cycle(metrics, make_job("a"))
    assert get(f"{server.url}/readyz") == (200, "ok\n")
    assert get(f"{server.url}/healthz") == (200, "ok\n")
    status, text = get(f"{server.url}/metrics")
    assert status == 200
    assert 'lmeval_jobs{namespace="team-a",state="Running"} 1.0' in text
    # Stale after 5 intervals of 10 s, never sooner than 60 s.
    clock.now += 59
    assert get(f"{server.url}/healthz")[0] == 200
    clock.now += 2
    status, body = get(f"{server.url}/healthz")
    assert status == 503 and "last successful cycle" in body
    assert get(f"{server.url}/")[0] == 404


def test_server_stops(metrics: PollerMetrics) -> None:
    running = serve(metrics, port=0, address="127.0.0.1")
    url = running.url
    assert get(f"{url}/metrics")[0] == 200
    running.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/metrics", timeout=2)


def test_reason_vocabulary_matches_the_api() -> None:
    """The histogram's `reason` label takes only the API's fixed values."""
    registry = CollectorRegistry()
    PollerMetrics(registry)
    reasons = {
        labels["reason"]
        for _, name, labels in all_samples(registry)
        if name == "lmeval_job_duration_seconds_count"
    }
    assert reasons == {r.value for r in api.JobReason} - {"NoReason"}


def _wsgi_get(app: Any, query: str, headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": query}
    environ.update({f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()})
    sent: dict[str, str] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        assert status == "200 OK"
        sent.update(response_headers)

    body = b"".join(app(environ, start_response))
    return sent, body


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({}, ""),
        ({"Accept": "application/openmetrics-text; version=1.0.0"}, ""),
        ({"Accept-Encoding": "gzip"}, ""),
        ({"Accept": "application/openmetrics-text", "Accept-Encoding": "gzip"}, ""),
        ({}, "name[]=lmeval_job_result&name[]=lmeval_poll_cycles_total"),
    ],
)
def test_streamed_exposition_is_what_prometheus_client_serves(
    metrics: PollerMetrics, registry: CollectorRegistry, headers: dict[str, str], query: str
) -> None:
    # A scrape streams one family at a time; the bytes must be the library's own.
    jobs = [
        make_job(f"j{i}", state="Complete", reason="Succeeded", results=TOY_RESULTS)
        for i in range(30)
    ]
    cycle(metrics, *jobs, make_job("running", percent=40.0))
    want_headers, want = _wsgi_get(make_wsgi_app(registry), query, headers)
    got_headers, got = _wsgi_get(exposition_app(registry), query, headers)
    assert got_headers == want_headers
    if want_headers.get("Content-Encoding") == "gzip":
        want, got = gzip.decompress(want), gzip.decompress(got)
    assert got == want
    assert b"lmeval_job_result" in got


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({}, ""),
        ({"Accept": "application/openmetrics-text; version=1.0.0"}, ""),
        ({"Accept-Encoding": "gzip"}, ""),
        ({}, "name[]=lmeval_job_result&name[]=lmeval_job_progress_ratio"),
    ],
)
def test_families_in_parts_read_as_one(
    metrics: PollerMetrics,
    registry: CollectorRegistry,
    headers: dict[str, str],
    query: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Large families are built a few jobs at a time; a scrape cannot tell.
    jobs = [
        make_job(f"j{i:02d}", state="Complete", reason="Succeeded", results=TOY_RESULTS)
        for i in range(23)
    ]
    # Parts with no progress sample at all, then parts with some.
    jobs += [make_job(f"r{i:02d}", percent=10.0 * i) for i in range(9)]
    cycle(metrics, *jobs)
    _, whole = _wsgi_get(make_wsgi_app(registry), query, headers)
    monkeypatch.setattr(metrics.jobs, "chunk_jobs", 4)
    _, parted = _wsgi_get(exposition_app(registry), query, headers)
    if headers.get("Accept-Encoding") == "gzip":
        whole, parted = gzip.decompress(whole), gzip.decompress(parted)
    assert parted == whole
    assert parted.count(b"# TYPE lmeval_job_result gauge") == 1
    assert parted.count(b"lmeval_job_result{") == 23 * 5  # five scores in TOY_RESULTS
