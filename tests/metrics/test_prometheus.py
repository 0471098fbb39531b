"""A real Prometheus scrapes the poller while a job runs to completion.

On the real control plane, the poller runs as in production (its
ServiceAccount, the APScheduler service, the metrics hooks wired as in
``poller.__main__``) with ``/metrics`` on 127.0.0.1, and a Prometheus built
from its Go module scrapes it every second with the PrometheusRule's alerts
loaded. Checks, through PromQL over Prometheus's HTTP API: the job is seen
Running, then Complete/Succeeded with its lm_eval score for the task (from a
real lm_eval run) and its duration observed; API requests are counted by the
API layer; the poller's health series are fresh; every alert rule evaluates
without error and the not-cycling alert is quiet; every dashboard query
evaluates. ``promtool check metrics`` accepts the live payload. After the
finished job is deleted, its series are gone once the sweep of finished jobs
has listed them without it (``finished-sweep-interval`` 1s here), from the
next scrape and from PromQL.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from lmeval_sandbox.prometheus import PrometheusServer, promtool
from prometheus_client import CollectorRegistry

from poller import api
from poller.cycle.reconciler import Reconciler
from poller.kube.client import Kube
from poller.metrics import MetricsServer, PollerMetrics, serve
from poller.service import PollingService
from tests.metrics.test_deploy import DASHBOARD, write_rules
from tests.poller_fixtures import (
    BASE_SETTINGS,
    POLLER_NS,
    CapturedRun,
    Jobs,
    serve_log,
    set_settings,
    terminate,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1500)]  # a cold Prometheus build


@dataclass
class Stack:
    metrics: PollerMetrics
    server: MetricsServer
    prometheus: PrometheusServer
    service: PollingService

    def values(self, promql: str) -> list[tuple[dict[str, str], float]]:
        return [(r["metric"], float(r["value"][1])) for r in self.prometheus.query(promql)]

    def value(self, promql: str) -> float | None:
        found = self.values(promql)
        assert len(found) <= 1, found
        return found[0][1] if found else None

    def scrape(self) -> str:
        with urllib.request.urlopen(f"{self.server.url}/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text


@pytest.fixture
def stack(
    poller: Reconciler,  # writes the settings (poll-interval 1s)
    admin_api: client.ApiClient,
    poller_kube: Kube,
    namespace: str,
    prometheus_bin: Path,
    tmp_path: Path,
) -> Iterator[Stack]:
    set_settings(admin_api, {**BASE_SETTINGS, "finished-sweep-interval": "1s"})
    metrics = PollerMetrics(CollectorRegistry())
    kube = Kube(poller_kube.transport, on_request=metrics.on_request)
    watched = Reconciler(kube, settings_namespace=POLLER_NS, namespaces=[namespace])
    server = serve(metrics, port=0, address="127.0.0.1")
    prometheus = PrometheusServer(
        tmp_path / "prometheus",
        [f"127.0.0.1:{server.port}"],
        rule_files=[write_rules(tmp_path)],
    )
    service = PollingService(watched, on_cycle=metrics.cycle_hook(watched))
    try:
        prometheus.start()
        service.start()
        yield Stack(metrics, server, prometheus, service)
    finally:
        service.stop()
        prometheus.stop()
        server.stop()


def dashboard_queries(namespace: str) -> list[tuple[str, str]]:
    """(panel title, PromQL) of the dashboard, with Grafana's variables filled in."""
    dashboard = json.loads(DASHBOARD.read_text())
    filled = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            query = target["expr"].replace("$namespace", namespace).replace("$task", ".*")
            filled.append((panel["title"], query.replace("$__rate_interval", "1m")))
    return filled


def test_prometheus_scrapes_a_job_to_completion_and_forgets_it(
    stack: Stack,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    ns = jobs.namespace
    assert succeeded_run.results is not None
    expected_acc = succeeded_run.results["results"]["toy_mc"]["acc,none"]
    jobs.create("scored", limit="4", modelArgs=[{"name": "pretrained", "value": "dummy"}])
    running = wait_for(
        lambda: jobs.status("scored").get("state") == "Running" and jobs.status("scored"),
        timeout=60,
        what="job Running",
    )
    # Prometheus saw it running, in the job's own namespace (honor_labels).
    wait_for(
        lambda: stack.value(f'lmeval_jobs{{namespace="{ns}", state="Running"}}') == 1,
        timeout=30,
        what="lmeval_jobs Running = 1 in Prometheus",
    )

    serve_log(admin_api, ns, running["podName"], succeeded_run.log, tmp_path)
    terminate(admin_api, ns, running["podName"], 0)
    final = wait_for(
        lambda: jobs.status("scored").get("state") == "Complete" and jobs.status("scored"),
        timeout=60,
        what="job Complete",
    )
    assert final["reason"] == "Succeeded", final.get("message")

    score = (
        f'lmeval_job_result{{namespace="{ns}", lmevaljob="scored", task="toy_mc", '
        'metric="acc", filter="none"}'
    )
    found = wait_for(lambda: stack.values(score), timeout=30, what="the score in Prometheus")
    ((labels, acc),) = found
    assert acc == pytest.approx(expected_acc)
    assert labels["job"] == "lmeval-poller"  # Prometheus's own label, untouched
    assert stack.value(
        f'lmeval_job_result_stderr{{namespace="{ns}", lmevaljob="scored"}}'
    ) == pytest.approx(succeeded_run.results["results"]["toy_mc"]["acc_stderr,none"])
    info = stack.values(f'lmeval_job_info{{namespace="{ns}", lmevaljob="scored"}}')
    assert [(i["model"], i["state"], i["reason"], v) for i, v in info] == [
        ("dummy", "Complete", "Succeeded", 1.0)
    ]
    assert stack.value(f'lmeval_jobs{{namespace="{ns}", state="Complete"}}') == 1
    assert stack.value(f'lmeval_jobs{{namespace="{ns}", state="Running"}}') == 0
    assert stack.value('lmeval_job_duration_seconds_count{reason="Succeeded"}') == 1
    assert stack.value(f'lmeval_job_progress_ratio{{namespace="{ns}"}}') == 1
    started = stack.value(f'lmeval_job_start_timestamp_seconds{{namespace="{ns}"}}')
    completed = stack.value(f'lmeval_job_completion_timestamp_seconds{{namespace="{ns}"}}')
    assert started is not None and completed is not None and started <= completed

    # The poller's health, and the API layer's counts.
    created = 'sum(lmeval_kube_requests_total{verb="create", resource="pods", code="201"})'
    assert stack.value(created) == 1
    listed = 'sum(lmeval_kube_requests_total{verb="list", resource="lmevaljobs", code="200"})'
    assert (stack.value(listed) or 0) >= 3
    patched = f'sum(lmeval_kube_requests_total{{resource="{api.PLURAL}/status"}})'
    assert (stack.value(patched) or 0) >= 3
    assert stack.value("lmeval_poll_interval_seconds") == 1
    assert stack.value('lmeval_poll_errors_total{scope="cycle"}') == 0
    assert stack.value("lmeval_leader") == 1
    age = stack.value("time() - lmeval_last_successful_cycle_timestamp_seconds")
    assert age is not None and age < 10
    assert (stack.value("sum(lmeval_poll_cycles_total)") or 0) >= 3

    # The dashboard's queries evaluate; its score table shows the model.
    for _, query in dashboard_queries(ns):
        stack.prometheus.query(query)
    scores_query = next(q for t, q in dashboard_queries(ns) if t == "Scores per model and task")
    rows = stack.values(scores_query)
    assert {(r["model"], r["task"], r["metric"]) for r, _ in rows} >= {("dummy", "toy_mc", "acc")}

    # Every alert rule evaluates cleanly; the poller is healthy.
    def evaluated() -> list[dict[str, Any]] | None:
        rules = [r for g in stack.prometheus.api("rules")["groups"] for r in g["rules"]]
        return (
            rules
            if rules and all(r.get("lastEvaluation", "").startswith("2") for r in rules)
            else None
        )

    rules = wait_for(evaluated, timeout=30, what="alert rules evaluated")
    assert [
        (r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"
    ] == []
    firing = {a["labels"]["alertname"] for a in stack.prometheus.api("alerts")["alerts"]}
    assert "LMEvalPollerNotCycling" not in firing

    payload = stack.scrape()
    assert 'lmevaljob="scored"' in payload
    checked = promtool("check", "metrics", stdin=payload)
    assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), (
        checked.stdout + checked.stderr
    )

    # Deleted: gone after the next sweep step, and from Prometheus (staleness markers).
    client.CustomObjectsApi(admin_api).delete_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, ns, api.PLURAL, "scored"
    )

    def deleted() -> bool:
        try:
            jobs.get("scored")
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(deleted, timeout=30, what="job deleted")
    wait_for(
        lambda: 'lmevaljob="scored"' not in stack.scrape(),
        timeout=30,
        what="the job's series gone from /metrics",
    )
    wait_for(
        lambda: stack.values(f'{{namespace="{ns}", lmevaljob="scored"}}') == [],
        timeout=30,
        what="the job's series gone from Prometheus",
    )
    assert stack.values(f'lmeval_jobs{{namespace="{ns}"}}') == []
    # The poller itself is still scraped and healthy.
    assert stack.value('up{job="lmeval-poller"}') == 1
    assert stack.value('lmeval_job_duration_seconds_count{reason="Succeeded"}') == 1
