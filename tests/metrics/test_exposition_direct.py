"""The per-job families written straight to text (`JobFamilyPart.text`).

Checks: a plain scrape, Prometheus text or OpenMetrics, with the Accept
headers Prometheus 2 and 3 send, gives byte for byte what prometheus_client's
own encoders give from the same samples, also for label values that need
escaping (quotes, backslashes, newlines in a model name or a task) and for
values Go spells its own way (NaN, infinities, large and tiny numbers,
timestamps, negative zero); a plain scrape never builds the `Sample`s (that is
its whole point: the generic path cost 11 s of CPU a scrape at 100,000
finished jobs), while a ``name[]`` filter or an escaping that rewrites names
takes the library's path and still gives its bytes; a family's labels must be
sorted (the order every exposition writes them in).
"""

from __future__ import annotations

import gzip
import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, make_wsgi_app

from poller import jobmetrics
from poller.cycle.jobseries import GateSeries, JobSeries, _layout, _pack
from poller.jobmetrics import JobCollector, JobFamilyPart
from poller.metrics import exposition_app
from poller.results.lmeval import Score

AWKWARD = 'llama "7b"\\q\nnew line'


def _series(index: int, *, model: str = "hf", task: str = "arc_easy") -> JobSeries:
    values = [0.5, math.nan, math.inf, -math.inf, 1.5e7, 1e-9, -2.5e6, -0.0, 1234567.5]
    scores = tuple(
        Score(task, f"m{k}", "none" if k % 2 else 'strict "match"', value, stderr=k % 3 == 0)
        for k, value in enumerate(values)
    )
    gate = (
        GateSeries("base", task, "m1", "Regressed" if index % 2 else "NotRegressed", -0.1, None)
        if index % 3
        else None
    )
    return JobSeries(
        uid=f"uid-{index}",
        namespace=f"team-{index % 2}",
        name=f"job-{index}",
        model=model,
        state="Complete",
        reason="Succeeded",
        started=1_764_630_000.25 + index if index % 4 else None,
        completed=1_764_630_100.0 + index,
        progress=1.0 if index % 2 else 0.375,
        score_layout=_layout(scores),
        score_values=_pack(s.value for s in scores),
        gate=gate,
    )


@pytest.fixture
def registry() -> CollectorRegistry:
    collector = JobCollector()
    collector.update(
        (), [_series(0, model=AWKWARD), _series(1, task=AWKWARD), *map(_series, range(2, 9))]
    )
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def _get(app: Any, headers: dict[str, str], query: str = "") -> tuple[dict[str, str], bytes]:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": query}
    environ.update({f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()})
    sent: dict[str, str] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        sent.update(response_headers)

    body = b"".join(app(environ, start_response))
    if sent.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return sent, body


PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,*/*;q=0.1"
)
DIRECT = [
    {},
    {"Accept": PROMETHEUS_2, "Accept-Encoding": "gzip"},
    {"Accept": PROMETHEUS_3, "Accept-Encoding": "gzip"},
    {"Accept": "text/plain;version=1.0.0;escaping=allow-utf-8"},
]


@pytest.mark.parametrize("headers", DIRECT)
def test_direct_text_is_the_librarys_bytes(
    registry: CollectorRegistry, headers: dict[str, str]
) -> None:
    want_headers, want = _get(make_wsgi_app(registry), headers)
    got_headers, got = _get(exposition_app(registry), headers)
    assert got_headers == want_headers
    assert got == want
    assert b"NaN" in got and b"+Inf" in got and b"-Inf" in got and b"e+09" in got
    assert b'model="llama \\"7b\\"\\\\q\\nnew line"' in got


@pytest.mark.parametrize("headers", DIRECT)
def test_a_plain_scrape_builds_no_samples(
    registry: CollectorRegistry, headers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, want = _get(exposition_app(registry), headers)

    def no_samples(self: JobFamilyPart) -> None:
        raise AssertionError("a plain scrape built prometheus_client Samples")

    setter = vars(JobFamilyPart)["samples"].fset  # Metric.__init__ sets an empty list
    monkeypatch.setattr(JobFamilyPart, "samples", property(no_samples, setter))
    _, got = _get(exposition_app(registry), headers)
    assert got == want and b"lmeval_job_result{" in got


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({"Accept": "application/openmetrics-text;version=1.0.0;escaping=dots"}, ""),
        ({"Accept": "text/plain;version=1.0.0;escaping=values"}, ""),
        ({}, "name[]=lmeval_job_result&name[]=lmeval_job_info"),
    ],
)
def test_other_escapings_and_filters_take_the_librarys_path(
    registry: CollectorRegistry, headers: dict[str, str], query: str
) -> None:
    _, want = _get(make_wsgi_app(registry), headers, query)
    _, got = _get(exposition_app(registry), headers, query)
    assert got == want
    assert b"lmeval" in got


def test_a_familys_labels_are_sorted() -> None:
    with pytest.raises(ValueError, match="not sorted"):
        jobmetrics._Family("x", "doc", "gauge", ("namespace", "lmevaljob"), lambda job: ())
    assert all(list(f.labels) == sorted(f.labels) for f in jobmetrics.FAMILIES)
