"""Prometheus metrics: the poller's own health, and every job's state and scores.

Two kinds of series, kept apart on purpose:

* **Health** (counters, gauges and histograms owned by `PollerMetrics`):
  cycles, their duration and failures, the age of the last good cycle, the
  poll interval in force, every API request by verb/resource/code (counted in
  `poller.kube.client`, the one layer that talks to the API), whether this replica
  is the acting one, and which build runs (``lmeval_build_info``: always 1,
  the version and source revision as labels, `poller.buildinfo`). Their
  labels are fixed vocabularies written in the code (or, for the build, in
  its metadata); a string from a user never becomes a label of a counter or
  a histogram, because those series live as long as the process and a user
  who creates jobs with fresh names would otherwise grow them without bound.
* **Jobs** (`poller.jobmetrics.JobCollector`, registered here): built at
  scrape time from the last cycle's snapshot and the finished jobs the
  poller retains (`poller.cycle.retained`), so a deleted job's series are gone from the
  next scrape after it leaves both.

No label is ever named ``job`` or ``instance``: Prometheus attaches those to
every scraped series itself. ``_created`` series are switched off: they double
the series count and nothing here needs them.

`serve` exposes ``/metrics`` plus ``/healthz`` (liveness: a cycle succeeded
recently enough) and ``/readyz`` (a first cycle succeeded) on one small
threaded HTTP server that tests can start on 127.0.0.1:0 and stop.
"""

from __future__ import annotations

import functools
import itertools
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import Metric
from prometheus_client.exposition import (
    ThreadingWSGIServer,
    choose_encoder,
    generate_latest,
    gzip_accepted,
)
from prometheus_client.openmetrics.exposition import ALLOWUTF8, UNDERSCORES
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector

from poller import api, buildinfo
from poller.cycle.reconciler import CycleReport
from poller.decisions.views import JobView
from poller.jobmetrics import JobCollector, JobFamilyPart
from poller.suitemetrics import SuiteCollector, SuiteSeries
from poller.timefmt import timestamp

__all__ = [
    "JOB_DURATION_BUCKETS",
    "JobCollector",
    "MetricsServer",
    "PollerMetrics",
    "exposition_app",
    "serve",
]

log = logging.getLogger(__name__)

# Off for every registry in the process (a global switch of prometheus_client).
disable_created_metrics()  # type: ignore[no-untyped-call]

REASONS = tuple(reason.value for reason in api.JobReason)
# Evaluations take from seconds (tiny tasks, `limit`) to days (full suites).
JOB_DURATION_BUCKETS = (
    10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
    7200.0, 14400.0, 28800.0, 86400.0, 172800.0,
)  # fmt: skip
CYCLE_DURATION_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
# /healthz fails when no cycle succeeded for this many intervals (or cycle durations).
STALE_CYCLES = 5
STALE_FLOOR_SECONDS = 60.0


class _PollerLike(Protocol):
    """What `PollerMetrics.cycle_hook` reads from the poller after each cycle."""

    @property
    def settings(self) -> Any: ...

    @property
    def tracker(self) -> Any: ...


class PollerMetrics:
    """Every metric of the poller, registered on one (injected) registry."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.time,
        version: str | None = None,
        revision: str | None = None,
    ) -> None:
        """`version` and `revision` label ``lmeval_build_info`` (default: `poller.buildinfo`'s)."""
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry()
        self.clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._last_success: float | None = None
        self._last_duration = 0.0
        self._interval = 0.0
        self._define_cycle_metrics(self.registry)
        self._define_api_and_job_metrics(self.registry)
        self._define_build_info(
            self.registry,
            buildinfo.version() if version is None else version,
            buildinfo.revision() if revision is None else revision,
        )

    def _define_cycle_metrics(self, r: CollectorRegistry) -> None:
        self.cycle_duration = Histogram(
            "lmeval_poll_cycle_duration_seconds",
            "Duration of poll cycles (settings read, LISTs, decisions and actions).",
            buckets=CYCLE_DURATION_BUCKETS,
            registry=r,
        )
        self.cycles = Counter(
            "lmeval_poll_cycles",
            "Poll cycles run, by outcome (skipped: this replica is not the leader).",
            ["outcome"],
            registry=r,
        )
        self.errors = Counter(
            "lmeval_poll_errors",
            "Poll errors: scope=cycle when a whole cycle failed, scope=job per job that raised.",
            ["scope"],
            registry=r,
        )
        self.last_success = Gauge(
            "lmeval_last_successful_cycle_timestamp_seconds",
            "When the last poll cycle that acted on jobs completed (0 before the first).",
            registry=r,
        )
        self.interval = Gauge(
            "lmeval_poll_interval_seconds",
            "The poll interval in force (settings key poll-interval).",
            registry=r,
        )
        self.settings_problems = Gauge(
            "lmeval_settings_problems",
            "Keys of the settings ConfigMap currently ignored as invalid or unknown.",
            registry=r,
        )
        # Known label values start at zero, so rate() and alerts see them from the start.
        for outcome in ("success", "failure", "skipped"):
            self.cycles.labels(outcome)
        for scope in ("cycle", "job"):
            self.errors.labels(scope)

    def _define_api_and_job_metrics(self, r: CollectorRegistry) -> None:
        self.kube_requests = Counter(
            "lmeval_kube_requests",
            "Kubernetes API requests by verb, resource and HTTP status code "
            "(code=error when no response came back).",
            ["verb", "resource", "code"],
            registry=r,
        )
        self.leader = Gauge(
            "lmeval_leader",
            "1 on the replica that acts on jobs, 0 on a standby.",
            registry=r,
        )
        self.job_duration = Histogram(
            "lmeval_job_duration_seconds",
            "Run time of jobs that finished while this poller was running "
            "(from lastScheduleTime, else creation, to completeTime), by reason.",
            ["reason"],
            buckets=JOB_DURATION_BUCKETS,
            registry=r,
        )
        self.jobs = JobCollector()
        r.register(self.jobs)
        self.suites = SuiteCollector()
        r.register(self.suites)
        for reason in REASONS[1:]:
            self.job_duration.labels(reason)
        self.leader.set(1)

    def _define_build_info(self, r: CollectorRegistry, version: str, revision: str) -> None:
        # A gauge, not prometheus_client's Info: that one appends `_info` to
        # its name, and OpenMetrics shows it as a family of type info without
        # the suffix. A gauge is `lmeval_build_info` in both formats, the
        # conventional name, one series to join onto others with `on()`.
        self.build_info = Gauge(
            "lmeval_build_info",
            "Always 1: the running poller's version and source revision, as labels.",
            ["version", "revision"],
            registry=r,
        )
        self.build_info.labels(version, revision).set(1)

    # -- hooks -------------------------------------------------------------------

    def on_request(self, verb: str, resource: str, code: str) -> None:
        """`Kube`'s ``on_request`` hook: count one API request."""
        self.kube_requests.labels(verb, resource, code).inc()

    def set_leader(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    def observe_cycle(
        self,
        report: CycleReport | None,
        failure: BaseException | None,
        interval: float | None = None,
        settings_problems: int | None = None,
    ) -> None:
        """`PollingService`'s ``on_cycle``: record one cycle and take its snapshot.

        A failed cycle (no report) keeps the previous snapshot: the jobs did not
        vanish because a LIST failed, and the age of the last good cycle says
        how old it is. A cycle skipped because this replica is not the leader
        clears it: only the acting replica exposes per-job series, so sums over
        replicas count each job once.
        """
        if interval is not None:
            self.interval.set(interval)
            self._interval = interval
        if settings_problems is not None:
            self.settings_problems.set(settings_problems)
        if report is None or failure is not None:
            self.cycles.labels("failure").inc()
            self.errors.labels("cycle").inc()
            return
        now = self.clock()
        if report.errors:
            self.errors.labels("job").inc(report.errors)
        with self._lock:  # a standby that cycles is healthy too
            self._last_success = now
            self._last_duration = report.duration
        if report.skipped:
            self.cycles.labels("skipped").inc()
            self.set_leader(False)
            self.jobs.update(())
            self.suites.update(())
            return
        self.set_leader(True)
        self.cycles.labels("success").inc()
        self.cycle_duration.observe(report.duration)
        self.jobs.update(report.snapshot, report.retained)
        if report.suites is not None:  # None: the suites' LIST failed; keep what was shown
            self.suites.update(
                [
                    SuiteSeries(view.namespace, view.name, dict(view.raw_status))
                    for view in report.suites.snapshot
                ]
            )
        self._observe_durations(report.finished)
        self.last_success.set(now)

    def cycle_hook(
        self, poller: _PollerLike
    ) -> Callable[[CycleReport | None, BaseException | None], None]:
        """An ``on_cycle`` callback that also reads the poller's current settings."""

        def hook(report: CycleReport | None, failure: BaseException | None) -> None:
            self.observe_cycle(
                report,
                failure,
                interval=float(poller.settings.poll_interval),
                settings_problems=poller.tracker.problem_count,
            )

        return hook

    def _observe_durations(self, finished: Iterable[JobView]) -> None:
        """Observe the run time of each job this cycle moved to Complete.

        Only those: each job is moved to Complete once, by one cycle, so it is
        observed once with nothing remembered, and a job that finished before
        this process started (listed or retained, never moved by it) is not
        observed again after a restart.
        """
        for job in finished:
            status = job.status
            end = timestamp(status.complete_time)
            begin = timestamp(status.last_schedule_time) or timestamp(job.creation_timestamp)
            if status.state != api.JobState.COMPLETE or end is None or begin is None:
                continue
            reason = (status.reason or api.JobReason.FAILED).value
            self.job_duration.labels(reason).observe(max(end - begin, 0.0))

    # -- health ------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        """Liveness: has a cycle succeeded recently enough?"""
        now = self.clock()
        with self._lock:
            last, duration, interval = self._last_success, self._last_duration, self._interval
        allowed = max(STALE_CYCLES * max(interval, duration), STALE_FLOOR_SECONDS)
        since = self._started if last is None else last
        age = now - since
        if age > allowed:
            what = "no successful cycle" if last is None else "last successful cycle"
            return False, f"{what} for {age:.0f} s (allowed {allowed:.0f} s)"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        """Readiness: a first cycle has succeeded."""
        with self._lock:
            last = self._last_success
        return (True, "ok") if last is not None else (False, "no successful cycle yet")


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would drown the poller's own log."""


@dataclass
class MetricsServer:
    """A running ``/metrics`` server; `stop()` closes it."""

    server: ThreadingWSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        host = str(self.server.server_address[0])
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


_OPENMETRICS_EOF = b"# EOF\n"
WsgiApp = Callable[[WSGIEnvironment, StartResponse], Iterable[bytes]]


class _OneFamily:
    """One metric family as a collector, so that an encoder formats just it."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return (self._family,)


def exposition_app(registry: CollectorRegistry) -> WsgiApp:
    """prometheus_client's ``make_wsgi_app``, streamed one metric family at a time.

    ``make_wsgi_app`` formats the whole registry into one string, encodes it
    and gzips it: at 10000 jobs about 10 MB of text, held three times over,
    on top of every sample at once. Streamed, a scrape holds one family's
    samples and text, or one part's of a family that comes in parts. The
    same text comes out (text or OpenMetrics by the Accept header, gzip by
    Accept-Encoding, at the fastest level, the ``name[]`` filter); per-job
    parts write it themselves (`JobFamilyPart.text`) when the encoder is one
    whose output they reproduce.
    """

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        params = parse_qs(environ.get("QUERY_STRING", ""))
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        source = registry.restricted_registry(params["name[]"]) if "name[]" in params else registry
        gzipped = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
        headers = [("Content-Type", content_type)]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        openmetrics = content_type.startswith("application/openmetrics-text")
        # `JobFamilyPart.text` writes what these encoders write; others (another
        # escaping of names, a filtered registry's copies) take the generic path.
        direct = source is registry and _writes_names_as_they_are(encoder)
        return _stream(source, encoder, openmetrics=openmetrics, gzipped=gzipped, direct=direct)

    return app


def _writes_names_as_they_are(encoder: Callable[[Collector], bytes]) -> bool:
    """Whether `encoder` (from ``choose_encoder``) leaves valid metric names as
    they are: the plain text format or OpenMetrics, escaping underscores (the
    default) or allowing UTF-8 (Prometheus 3's default)."""
    function, keywords = encoder, {}
    if isinstance(encoder, functools.partial):
        function, keywords = encoder.func, encoder.keywords
    escaping = keywords.get("escaping", UNDERSCORES)
    return function in (generate_latest, generate_openmetrics) and escaping in (
        UNDERSCORES,
        ALLOWUTF8,
    )


def _stream(
    source: Collector,
    encoder: Callable[[Collector], bytes],
    *,
    openmetrics: bool,
    gzipped: bool,
    direct: bool,
) -> Iterator[bytes]:
    # 31: a gzip stream. Level 1: a third of level 6's CPU (0.07 s against 0.2 s
    # per 27 MiB of exposition, measured), and the text is so repetitive that
    # both shrink it about twenty times.
    compressor = zlib.compressobj(1, wbits=31) if gzipped else None
    chunks: Iterator[bytes] = _family_texts(source, encoder, direct=direct, openmetrics=openmetrics)
    if openmetrics:  # each encoding ends with "# EOF"; the whole must end so, once
        chunks = itertools.chain(
            (chunk.removesuffix(_OPENMETRICS_EOF) for chunk in chunks), [_OPENMETRICS_EOF]
        )
    for chunk in chunks:
        out = compressor.compress(chunk) if compressor is not None else chunk
        if out:
            yield out
    if compressor is not None:
        yield compressor.flush()


def _family_texts(
    source: Collector,
    encoder: Callable[[Collector], bytes],
    *,
    direct: bool,
    openmetrics: bool,
) -> Iterator[bytes]:
    """Each family's exposition; a part that continues the previous family (same
    name, see `JobCollector`) without the comment lines that open a family.
    With `direct`, per-job parts write themselves (`JobFamilyPart.text`)."""
    previous = None
    for family in source.collect():
        if direct and isinstance(family, JobFamilyPart):
            text = family.text(openmetrics=openmetrics)
        else:
            text = encoder(_OneFamily(family))
        if family.name == previous:
            while text.startswith(b"#") and not text.startswith(_OPENMETRICS_EOF):
                text = text.partition(b"\n")[2]
        previous = family.name
        yield text


def _app(metrics: PollerMetrics) -> WsgiApp:
    exposition = exposition_app(metrics.registry)
    checks: Mapping[str, Callable[[], tuple[bool, str]]] = {
        "/healthz": metrics.health,
        "/readyz": metrics.ready,
    }

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        check = checks.get(path)
        if check is not None:
            ok, detail = check()
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "text/plain; charset=utf-8")],
            )
            return [f"{detail}\n".encode()]
        if path == "/metrics":
            body: Iterable[bytes] = exposition(environ, start_response)
            return body
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"see /metrics, /healthz, /readyz\n"]

    return app


def serve(metrics: PollerMetrics, port: int = 8080, address: str = "0.0.0.0") -> MetricsServer:  # noqa: S104
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` from a daemon thread.

    ``port=0`` picks a free port (see `MetricsServer.port`).
    """

    class Server(ThreadingWSGIServer):
        pass

    if ":" in address:
        Server.address_family = socket.AF_INET6
    server = make_server(address, port, _app(metrics), Server, handler_class=_QuietHandler)
    thread = threading.Thread(
        target=server.serve_forever, name="lmeval-metrics", kwargs={"poll_interval": 0.5}
    )
    thread.daemon = True
    thread.start()
    running = MetricsServer(server, thread)
    log.info("serving metrics on %s/metrics", running.url)
    return running
