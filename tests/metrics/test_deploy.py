"""The monitoring manifests in ``deploy/metrics`` and promtool's verdicts.

Checks: ``promtool check metrics`` finds no problem in a /metrics payload
served over HTTP by the poller's own server; ``promtool check rules`` accepts
the PrometheusRule's groups and ``promtool test rules`` proves each alert
fires on the series it is meant for (and the poller alert stays quiet on a
healthy poller); the kustomize Component builds, and its ServiceMonitor
selects the base's metrics Service on its named port with ``honorLabels``;
the Grafana dashboard is valid JSON whose queries use only metrics the
poller exposes. PromQL of the dashboard is evaluated by a real Prometheus in
``test_prometheus.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from lmeval_sandbox import build
from lmeval_sandbox.prometheus import promtool
from prometheus_client import CollectorRegistry

from poller.cycle.reconciler import CycleReport
from poller.metrics import PollerMetrics, serve
from tests.metrics.conftest import TOY_RESULTS, make_job

REPO = Path(__file__).resolve().parents[2]
METRICS_DIR = REPO / "deploy" / "metrics"
RULES = METRICS_DIR / "prometheusrule.yaml"
DASHBOARD = METRICS_DIR / "grafana-dashboard.json"

# The first test needing promtool may build Prometheus (minutes, once per machine).
pytestmark = pytest.mark.timeout(1500)


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec, which is exactly a Prometheus rules file."""
    rule = yaml.safe_load(RULES.read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    spec: dict[str, Any] = rule["spec"]
    return spec


def write_rules(directory: Path) -> Path:
    path = directory / "rules.yml"
    path.write_text(yaml.safe_dump(rule_groups()))
    return path


def test_promtool_check_metrics_on_a_served_payload(prometheus_bin: Path) -> None:
    metrics = PollerMetrics(CollectorRegistry())
    snapshot = [
        make_job("running", percent=30),
        make_job(
            "done",
            state="Complete",
            reason="Succeeded",
            results=TOY_RESULTS,
            completed="2030-01-01T00:10:00Z",
        ),
        make_job("other", namespace="team-b", state="Complete", reason="Failed"),
    ]
    metrics.observe_cycle(CycleReport(jobs=3, snapshot=snapshot), None, interval=10.0)
    metrics.observe_cycle(None, RuntimeError("LIST failed"), interval=10.0)
    metrics.on_request("list", "lmevaljobs", "200")
    server = serve(metrics, port=0, address="127.0.0.1")
    try:
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as response:
            payload = response.read().decode()
    finally:
        server.stop()
    assert "lmeval_job_result{" in payload
    checked = promtool("check", "metrics", stdin=payload)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == ""


def test_promtool_check_rules(prometheus_bin: Path, tmp_path: Path) -> None:
    checked = promtool("check", "rules", str(write_rules(tmp_path)))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    names = [r["alert"] for g in rule_groups()["groups"] for r in g["rules"]]
    assert f"SUCCESS: {len(names)} rules found" in checked.stdout
    assert {"LMEvalPollerNotCycling", "LMEvalPollerCycleErrors", "LMEvalJobFailed"} <= set(names)


POLLER = {"namespace": "lmeval-system", "pod": "lmeval-poller-1", "instance": "10.0.0.1:8080"}
HEALTHY = {**POLLER, "pod": "lmeval-poller-2", "instance": "10.0.0.2:8080"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


RULE_TESTS: list[dict[str, Any]] = [
    {
        # A poller whose last good cycle was at t=0, and one cycling every minute.
        "interval": "1m",
        "input_series": [
            series("lmeval_last_successful_cycle_timestamp_seconds", POLLER, "0x20"),
            series("lmeval_poll_interval_seconds", POLLER, "10x20"),
            series("lmeval_leader", POLLER, "1x20"),
            series("lmeval_last_successful_cycle_timestamp_seconds", HEALTHY, "0+60x20"),
            series("lmeval_poll_interval_seconds", HEALTHY, "10x20"),
            series("lmeval_leader", HEALTHY, "1x20"),
        ],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "LMEvalPollerNotCycling", "exp_alerts": []},
            {
                "eval_time": "10m",
                "alertname": "LMEvalPollerNotCycling",
                "exp_alerts": [
                    {
                        "exp_labels": {**POLLER, "severity": "critical"},
                        "exp_annotations": {
                            "summary": "The LMEvalJob poller has not completed a cycle for 10m 0s.",
                            "description": "lmeval-poller-1 has not listed and reconciled "
                            'LMEvalJobs recently. Check its log for "poll cycle failed" '
                            "(API unreachable, RBAC refused).",
                        },
                    }
                ],
            },
        ],
    },
    {
        # Every cycle fails, and a 403 on listing pods.
        "interval": "1m",
        "input_series": [
            series("lmeval_poll_errors_total", {**POLLER, "scope": "cycle"}, "0+1x40"),
            series("lmeval_poll_errors_total", {**POLLER, "scope": "job"}, "0x40"),
            series("lmeval_poll_errors_total", {**HEALTHY, "scope": "job"}, "0+1x40"),
            series(
                "lmeval_kube_requests_total",
                {**POLLER, "verb": "list", "resource": "pods", "code": "403"},
                "0+1x40",
            ),
            series(
                "lmeval_kube_requests_total",
                {**POLLER, "verb": "list", "resource": "pods", "code": "200"},
                "0+5x40",
            ),
        ],
        "alert_rule_test": [
            {
                "eval_time": "30m",
                "alertname": "LMEvalPollerCycleErrors",
                "exp_alerts": [
                    {
                        "exp_labels": {**POLLER, "scope": "cycle", "severity": "warning"},
                        "exp_annotations": {
                            "summary": "15 poll cycles of the LMEvalJob poller failed "
                            "in 15 minutes.",
                            "description": "Cycles fail when the API cannot be listed; see "
                            "the poller's log.",
                        },
                    }
                ],
            },
            {
                # Only the poller with per-job errors.
                "eval_time": "30m",
                "alertname": "LMEvalPollerJobErrors",
                "exp_alerts": [
                    {
                        "exp_labels": {**HEALTHY, "scope": "job", "severity": "warning"},
                        "exp_annotations": {
                            "summary": "The LMEvalJob poller hit 15 per-job errors in 15 minutes.",
                            "description": 'Look for "error handling LMEvalJob" in the '
                            "poller's log.",
                        },
                    }
                ],
            },
            {
                "eval_time": "30m",
                "alertname": "LMEvalPollerAPIRequestsFailing",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "namespace": "lmeval-system",
                            "pod": "lmeval-poller-1",
                            "verb": "list",
                            "resource": "pods",
                            "code": "403",
                            "severity": "warning",
                        },
                        "exp_annotations": {
                            "summary": "Kubernetes API list pods requests fail with 403."
                        },
                    }
                ],
            },
        ],
    },
    {
        # One failed job among two, and more failures than successes.
        "interval": "1m",
        "input_series": [
            series(
                "lmeval_job_info",
                {
                    **POLLER,
                    "namespace": "team-a",
                    "lmevaljob": "bad",
                    "model": "hf",
                    "state": "Complete",
                    "reason": "Failed",
                },
                "1x80",
            ),
            series(
                "lmeval_job_info",
                {
                    **POLLER,
                    "namespace": "team-a",
                    "lmevaljob": "good",
                    "model": "hf",
                    "state": "Complete",
                    "reason": "Succeeded",
                },
                "1x80",
            ),
            series("lmeval_job_duration_seconds_count", {**POLLER, "reason": "Failed"}, "0+1x80"),
            series("lmeval_job_duration_seconds_count", {**POLLER, "reason": "Succeeded"}, "0x80"),
        ],
        "alert_rule_test": [
            {
                "eval_time": "5m",
                "alertname": "LMEvalJobFailed",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "namespace": "team-a",
                            "lmevaljob": "bad",
                            "model": "hf",
                            "severity": "info",
                        },
                        "exp_annotations": {
                            "summary": "LMEvalJob team-a/bad (hf) failed.",
                            "description": "See `kubectl describe lmevaljob -n team-a bad`.",
                        },
                    }
                ],
            },
            {
                "eval_time": "75m",
                "alertname": "LMEvalJobsFailingOften",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "warning"},
                        "exp_annotations": {
                            "summary": "100% of the LMEvalJobs finished in the last hour failed."
                        },
                    }
                ],
            },
        ],
    },
]


def test_promtool_test_rules(prometheus_bin: Path, tmp_path: Path) -> None:
    write_rules(tmp_path)
    tests = tmp_path / "rules_test.yml"
    tests.write_text(
        yaml.safe_dump(
            {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": RULE_TESTS}
        )
    )
    tested = promtool("test", "rules", str(tests))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout, tested.stdout
    alerts = {r["alert"] for g in rule_groups()["groups"] for r in g["rules"]}
    covered = {c["alertname"] for t in RULE_TESTS for c in t["alert_rule_test"] if c["exp_alerts"]}
    assert covered == alerts


def test_component_builds_and_selects_the_metrics_service(tmp_path: Path) -> None:
    kubectl = build.ensure_binaries() / "kubectl"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "components": [os.path.relpath(METRICS_DIR, overlay)],
            }
        )
    )
    built = subprocess.run(
        [str(kubectl), "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, built.stderr
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(built.stdout)}
    assert set(objects) == {
        ("ServiceMonitor", "lmeval-poller"),
        ("PrometheusRule", "lmeval-poller"),
        ("ConfigMap", "lmeval-poller-dashboard"),
    }
    dashboard = objects[("ConfigMap", "lmeval-poller-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["grafana-dashboard.json"])["uid"] == "lmeval-poller"

    service = yaml.safe_load((REPO / "deploy" / "base" / "service.yaml").read_text())
    monitor = objects[("ServiceMonitor", "lmeval-poller")]["spec"]
    selected = monitor["selector"]["matchLabels"].items()
    assert selected <= service["metadata"]["labels"].items()
    assert monitor["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True
    assert 8080 in {p["port"] for p in service["spec"]["ports"]}


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["query"]["query"])
    return queries


def test_dashboard_uses_only_exposed_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "lmeval-poller"
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Jobs by state", "Scores per model and task", "Poll cycle duration"} <= titles
    exposed = {
        "lmeval_jobs",
        "lmeval_job_info",
        "lmeval_job_result",
        "lmeval_job_result_stderr",
        "lmeval_job_progress_ratio",
        "lmeval_job_duration_seconds_bucket",
        "lmeval_job_duration_seconds_count",
        "lmeval_poll_cycle_duration_seconds_bucket",
        "lmeval_poll_interval_seconds",
        "lmeval_poll_errors_total",
        "lmeval_last_successful_cycle_timestamp_seconds",
        "lmeval_leader",
        "lmeval_kube_requests_total",
    }
    used = {name for q in dashboard_queries() for name in re.findall(r"\blmeval_\w+", q)}
    assert used and used <= exposed, used - exposed
