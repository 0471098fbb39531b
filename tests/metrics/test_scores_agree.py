"""The metrics, ``lmeval results`` and the sandbox read the same scores from grouped results.

Each used to parse lm_eval's JSON its own way (the CLI ignored ``groups``,
the sandbox listed a group's scores from ``groups`` and skipped it in
``results``, the metrics merged both), so a job with a task group could
show different scores in Prometheus, in the terminal and in the sandbox.
All three now read `poller.results.lmeval.iter_score_rows`; this test feeds them a
results JSON shaped the way lm_eval 0.4.13 writes it for a group with
subtasks, and the same with the group's scores only under ``groups`` (the
shape the other metrics tests use, where the CLI used to miss the group),
and checks they agree on every score and stderr.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from lmeval_cli import facts, render
from lmeval_sandbox import demo
from prometheus_client import CollectorRegistry

from poller.cycle.reconciler import CycleReport
from poller.metrics import PollerMetrics
from tests.metrics.conftest import make_job

# lm_eval 0.4.13 (evaluator_utils.EvalAcc._to_eval_results): "results" holds
# every task and every group (a group's entry from api/group.py
# Group.aggregate: alias, name, sample_len, the aggregated "metric,filter"
# and its stderr, sample_count); "groups" repeats the groups that aggregate;
# "group_subtasks" names each group's direct children. Here "suite" (no
# aggregation) holds the group "arith" (acc, averaged over its two
# subtasks) and the generative task "arith_gen" (two filters, one stderr
# "N/A").
GROUPED_RESULTS: dict[str, Any] = {
    "results": {
        "arith_add": {
            "name": "arith_add",
            "alias": "arith_add",
            "sample_len": 4,
            "acc,none": 0.75,
            "acc_stderr,none": 0.25,
        },
        "arith_mul": {
            "name": "arith_mul",
            "alias": "arith_mul",
            "sample_len": 4,
            "acc,none": 0.25,
            "acc_stderr,none": 0.25,
        },
        "arith_gen": {
            "name": "arith_gen",
            "alias": "arith_gen",
            "sample_len": 8,
            "exact_match,strict-match": 0.5,
            "exact_match_stderr,strict-match": 0.1889822365046136,
            "exact_match,flexible-extract": 0.625,
            "exact_match_stderr,flexible-extract": "N/A",
        },
        "arith": {
            "alias": "arith",
            "name": "arith",
            "sample_len": 8,
            "acc,none": 0.5,
            "acc_stderr,none": 0.1767766952966369,
            "sample_count": {"acc,none": 8},
        },
        "suite": {"alias": "suite", "name": "suite"},
    },
    "groups": {
        "arith": {
            "alias": "arith",
            "name": "arith",
            "sample_len": 8,
            "acc,none": 0.5,
            "acc_stderr,none": 0.1767766952966369,
            "sample_count": {"acc,none": 8},
        },
    },
    "group_subtasks": {"arith": ["arith_add", "arith_mul"], "suite": ["arith", "arith_gen"]},
    "configs": {"arith_add": {"task": "arith_add"}, "arith_mul": {"task": "arith_mul"}},
    "versions": {"arith": "N/A", "arith_add": 0, "arith_gen": 0, "arith_mul": 0, "suite": "N/A"},
    "n-shot": {"arith": 0, "arith_add": 0, "arith_gen": 0, "arith_mul": 0, "suite": 0},
    "higher_is_better": {"arith": {"acc": True}, "arith_add": {"acc": True}},
    "n-samples": {
        "arith_add": {"original": 4, "effective": 4},
        "arith_mul": {"original": 4, "effective": 4},
        "arith_gen": {"original": 8, "effective": 8},
    },
    "config": {"model": "dummy", "limit": None},
    "git_hash": None,
    "date": 1900000000.0,
}

# Every score of GROUPED_RESULTS: (task, metric, filter) -> (value, stderr).
EXPECTED: dict[tuple[str, str, str], tuple[float, float | None]] = {
    ("arith", "acc", "none"): (0.5, 0.1767766952966369),
    ("arith_add", "acc", "none"): (0.75, 0.25),
    ("arith_mul", "acc", "none"): (0.25, 0.25),
    ("arith_gen", "exact_match", "strict-match"): (0.5, 0.1889822365046136),
    ("arith_gen", "exact_match", "flexible-extract"): (0.625, None),
}


def _metric_series(registry: CollectorRegistry, name: str) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["task"], s.labels["metric"], s.labels["filter"]): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == name
    }


def _group_only_under_groups() -> dict[str, Any]:
    results = dict(GROUPED_RESULTS["results"])
    del results["arith"], results["suite"]
    return {**GROUPED_RESULTS, "results": results}


@pytest.mark.parametrize(
    "document",
    [GROUPED_RESULTS, _group_only_under_groups()],
    ids=["lm_eval-0.4.13", "group-only-under-groups"],
)
def test_metrics_cli_and_sandbox_agree_on_grouped_results(document: dict[str, Any]) -> None:
    text = json.dumps(document)

    registry = CollectorRegistry()
    metrics = PollerMetrics(registry, clock=lambda: 0.0)
    job = make_job("grouped", state="Complete", reason="Succeeded", results=text)
    report = CycleReport(jobs=1, errors=0, duration=0.1, snapshot=[job])
    metrics.observe_cycle(report, None, interval=10.0)
    values = _metric_series(registry, "lmeval_job_result")
    stderrs = _metric_series(registry, "lmeval_job_result_stderr")

    # `lmeval results` reads the status as the API returns it, tasks of the spec first.
    cli_job = {"spec": {"tasks": ["suite"]}, "status": {"results": text}}
    parsed = facts.job_results(cli_job)
    assert parsed is not None
    _, cli_rows = render.scores_grid(facts.score_rows(parsed, facts.spec(cli_job).get("tasks")))

    sandbox_rows = demo.results_rows(json.loads(text))

    assert values == {key: value for key, (value, _) in EXPECTED.items()}
    assert stderrs == {key: err for key, (_, err) in EXPECTED.items() if err is not None}
    # The same rows (each score once, the group's too), and the same text for each.
    assert len(cli_rows) == len(sandbox_rows) == len(EXPECTED)
    cli_shown = {(t, m, f): (v, "" if e == "-" else e) for t, m, f, v, e in cli_rows}
    sandbox_shown = {(t, m, f): (v, e) for t, m, f, v, e in sandbox_rows}
    assert cli_shown == sandbox_shown
    for key, (value, err) in EXPECTED.items():
        shown_err = "N/A" if key[2] == "flexible-extract" else f"{err:.4f}"
        assert sandbox_shown[key] == (f"{value:.4f}", shown_err)
        assert float(cli_shown[key][0]) == values[key] == value
