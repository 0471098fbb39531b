"""``lmeval compare A B``'s paired test and ``lmeval get``'s provenance, on the real control plane.

Checks: for two finished jobs whose results ConfigMaps hold per-item scores
(built with driver.itemscores, gzip'd under ITEMS_KEY, as the poller stores
them), compare prints per task and metric the numbers `poller.results.pairedstats`
gives (n, both means, the difference and its interval, p, the flips each
way, the test, the verdict) for a 0/1 metric with a known number of flips
and for a fixed-precision metric; it refuses a task whose documents differ
and one whose lm_eval task hash differs, each with its reason; it warns
about provenance that differs (lm_eval version, image ID); ``-o json``
parses and carries the same numbers; ``--task``/``--metric`` select rows;
without per-item scores, or before a job has finished, it prints the
side-by-side scores and says why there is no paired test. ``get`` shows the
per-item scores' line, the gate condition ``Regressed`` with its whole
message, and status.provenance (when the installed CRD keeps it). Jobs and
statuses are written as an admin; no poller runs.
"""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import pytest

from driver.itemscores import ItemScores, TaskItems, docs_digest, encode_item_scores, metric_items
from poller import api
from poller.results import pairedstats
from poller.results.lmeval import ITEMS_KEY, PROVENANCE_KEY, RESULTS_KEY
from tests.cli.conftest import Cli
from tests.poller_fixtures import Jobs

pytestmark = pytest.mark.cluster

N_MC, N_GEN = 200, 50
# toy_mc acc: B gets 18 of A's right answers wrong and 5 of its wrong ones right.
A_ACC = [1.0 if i % 10 < 7 else 0.0 for i in range(N_MC)]
DOWN = [i for i in range(N_MC) if A_ACC[i] == 1.0][:18]
UP = [i for i in range(N_MC) if A_ACC[i] == 0.0][:5]
B_ACC = [1.0 - v if i in DOWN or i in UP else v for i, v in enumerate(A_ACC)]
A_F1 = [round((i * 37 % 101) / 100, 6) for i in range(N_MC)]
B_F1 = [round(max(0.0, v - (0.05 if i % 3 == 0 else 0.0)), 6) for i, v in enumerate(A_F1)]


def _task(values: dict[str, list[float]], n: int, salt: str = "") -> TaskItems:
    digest = docs_digest((i, f"doc{i}{salt}") for i in range(n))
    return TaskItems(tuple(range(n)), digest, {m: metric_items(v) for m, v in values.items()})


def _items(acc: list[float], f1: list[float], gen_salt: str) -> ItemScores:
    return ItemScores(
        tasks={
            "toy_mc": _task({"acc,none": acc, "f1,none": f1}, N_MC),
            "toy_gen": _task(
                {"exact_match,none": [float(i % 2) for i in range(N_GEN)]}, N_GEN, gen_salt
            ),
        },
        server={"models": "m1"},
    )


def _results(acc: list[float], task_hash: str = "mc-hash") -> dict[str, Any]:
    return {
        "results": {
            "toy_mc": {"alias": "toy_mc", "acc,none": sum(acc) / len(acc), "acc_stderr,none": 0.03},
            "toy_gen": {"alias": "toy_gen", "exact_match,none": 0.5},
        },
        "task_hashes": {"toy_mc": task_hash, "toy_gen": "gen-hash"},
        "n-shot": {"toy_mc": 0, "toy_gen": 0},
        "versions": {"toy_mc": 1.0, "toy_gen": 1.0},
        "higher_is_better": {"toy_mc": {"acc": True, "f1": True}, "toy_gen": {"exact_match": True}},
    }


def _provenance(lm_eval: str, image_id: str) -> dict[str, Any]:
    return {
        "driverVersion": "0.1.0",
        "lmEvalVersion": lm_eval,
        "image": "registry.example/lmeval-job:test",
        "imageID": image_id,
        "model": "local-completions",
        "modelName": "m1",
        "serverModels": "m1",
        "seeds": {"random": 0, "numpy": 1234, "torch": 1234, "fewshot": 1234},
        "taskHashes": {"toy_mc": "mc-hash"},
        "argv": ["lm_eval", "--model", "local-completions", "--tasks", "toy_mc,toy_gen"],
    }


def _finished(
    jobs: Jobs,
    name: str,
    results: dict[str, Any],
    items: ItemScores | None,
    provenance: dict[str, Any] | None,
    **extra_status: Any,
) -> None:
    """A Complete job with its results ConfigMap, as the poller leaves them (owned by the job)."""
    created = jobs.create(name, tasks=["toy_mc", "toy_gen"])
    data = {RESULTS_KEY: json.dumps(results)}
    binary = {}
    if provenance is not None:
        data[PROVENANCE_KEY] = json.dumps(provenance)
    if items is not None:
        binary[ITEMS_KEY] = base64.b64encode(gzip.compress(encode_item_scores(items))).decode()
    jobs.core.create_namespaced_config_map(
        jobs.namespace,
        {
            "metadata": {
                "name": f"{name}-results",
                "ownerReferences": [
                    {
                        "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
                        "kind": api.KIND,
                        "name": name,
                        "uid": created["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "data": data,
            "binaryData": binary,
        },
    )
    status: dict[str, Any] = {
        "state": "Complete",
        "reason": "Succeeded",
        "message": "evaluation finished",
        "results": json.dumps(results),
        "resultsConfigMap": f"{name}-results",
        **extra_status,
    }
    if provenance is not None:
        status["provenance"] = provenance
    jobs.custom.patch_namespaced_custom_object_status(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, name, {"status": status}
    )


def _table(stdout: str) -> dict[tuple[str, str], list[str]]:
    """The paired table's rows by (task, metric); the verdict joined back into one cell."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["TASK", "METRIC"])
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = line.split()
        rows[(cells[0], cells[1])] = [*cells[:11], " ".join(cells[11:])]
    return rows


def _expected(result: pairedstats.PairedResult) -> list[str]:
    """The cells N to UP of `result`'s row."""
    return [
        str(result.n),
        f"{result.mean_a:.4f}",
        f"{result.mean_b:.4f}",
        f"{result.difference:+.4f}",
        f"[{result.ci_low:+.4f},{result.ci_high:+.4f}]",
        pairedstats.format_p(result.p_value),
        str(result.a_only),
        str(result.b_only),
    ]


def test_compare_pairs_refuses_and_warns(cli: Cli, jobs: Jobs) -> None:
    _finished(
        jobs, "base", _results(A_ACC), _items(A_ACC, A_F1, ""), _provenance("0.4.13", "sha256:aaa")
    )
    _finished(
        jobs,
        "cand",
        _results(B_ACC),
        _items(B_ACC, B_F1, "-changed"),
        _provenance("0.4.12", "sha256:bbb"),
    )
    acc = pairedstats.compare_paired(A_ACC, B_ACC, binary=True)
    f1 = pairedstats.compare_paired(A_F1, B_F1, binary=False)
    assert (acc.a_only, acc.b_only) == (18, 5) and acc.p_value < 0.05
    assert f1.test == pairedstats.BOOTSTRAP and f1.p_value < 0.05

    shown = cli("compare", "base", "cand")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == (
        "A = base (baseline), B = cand (candidate); 95% intervals, significant when p < 0.05"
    )
    rows = _table(shown.stdout)
    assert list(rows) == [  # the spec's task order
        ("toy_mc", "acc,none"),
        ("toy_mc", "f1,none"),
        ("toy_gen", "exact_match,none"),
    ]
    mc_acc = rows[("toy_mc", "acc,none")]
    assert mc_acc[2:10] == _expected(acc)
    assert mc_acc[10:] == ["McNemar", "B is worse (significant)"]
    mc_f1 = rows[("toy_mc", "f1,none")]
    assert mc_f1[2:10] == _expected(f1)
    assert mc_f1[10:] == ["bootstrap", "B is worse (significant)"]
    assert rows[("toy_gen", "exact_match,none")][11] == "not compared (1)"
    assert "  (1) toy_gen exact_match,none: same 50 document ids but different documents" in (
        shown.stdout
    )
    assert "Warnings (provenance differs):" in lines
    assert "  lmEvalVersion differs: 0.4.13 (A) vs 0.4.12 (B)" in lines
    assert "  imageID differs: sha256:aaa (A) vs sha256:bbb (B)" in lines
    assert not any("seeds differs" in line for line in lines)

    as_json = cli("compare", "base", "cand", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["jobs"] == ["base", "cand"]
    by_key = {(r["task"], r["metric"]): r for r in document["paired"]}
    got = by_key[("toy_mc", "acc,none")]
    assert (got["n"], got["down"], got["up"], got["test"]) == (N_MC, 18, 5, pairedstats.MCNEMAR)
    assert (got["pValue"], got["ciLow"], got["ciHigh"]) == (acc.p_value, acc.ci_low, acc.ci_high)
    assert got["verdict"] == "B is worse (significant)"
    assert by_key[("toy_mc", "f1,none")]["pValue"] == f1.p_value
    refused = by_key[("toy_gen", "exact_match,none")]
    assert refused["compared"] is False and "different documents" in refused["reason"]
    assert "lmEvalVersion differs: 0.4.13 (A) vs 0.4.12 (B)" in document["warnings"]
    assert any(s["task"] == "toy_mc" and s["metric"] == "acc" for s in document["scores"])

    only = cli(
        "compare", "base", "cand", "--task", "toy_mc", "--metric", "acc", "--confidence", "0.9"
    )
    assert only.returncode == 0, only.stderr
    assert list(_table(only.stdout)) == [("toy_mc", "acc,none")]
    narrower = pairedstats.compare_paired(A_ACC, B_ACC, binary=True, confidence=0.9)
    assert _table(only.stdout)[("toy_mc", "acc,none")][6] == (
        f"[{narrower.ci_low:+.4f},{narrower.ci_high:+.4f}]"
    )
    assert "90% CI" in only.stdout


def test_compare_refuses_a_changed_task_and_explains_a_missing_test(cli: Cli, jobs: Jobs) -> None:
    _finished(jobs, "base", _results(A_ACC), _items(A_ACC, A_F1, ""), _provenance("0.4.13", "x"))
    _finished(jobs, "rehashed", _results(A_ACC, task_hash="other"), _items(A_ACC, A_F1, ""), None)
    shown = cli("compare", "base", "rehashed", "--metric", "acc,none")
    assert shown.returncode == 0, shown.stderr
    assert _table(shown.stdout)[("toy_mc", "acc,none")][11] == "not compared (1)"
    assert (
        "  (1) toy_mc acc,none: different task hashes (documents, prompts or targets changed): "
        "mc-hash in A, other in B"
    ) in shown.stdout
    assert "  rehashed records no provenance: versions, image and seeds cannot be compared" in (
        shown.stdout
    )

    _finished(jobs, "plain", _results(B_ACC), None, None)
    side_by_side = cli("compare", "base", "plain")
    assert side_by_side.returncode == 0, side_by_side.stderr
    rows = [line.split() for line in side_by_side.stdout.splitlines()]
    assert rows[0] == ["TASK", "METRIC", "FILTER", "base", "plain"]
    assert ["toy_mc", "acc", "none", f"{sum(A_ACC) / N_MC:.4f}", f"{sum(B_ACC) / N_MC:.4f}"] in rows
    assert side_by_side.stderr.strip() == (
        "no paired test: plain: its results ConfigMap holds no per-item scores "
        "(submit with --log-samples)"
    )
    no_test = json.loads(cli("compare", "base", "plain", "-o", "json").stdout)
    assert no_test["paired"] is None and no_test["noPairedTest"].startswith("plain: ")

    jobs.create("pending")
    unfinished = cli("compare", "base", "pending")
    assert unfinished.returncode == 0, unfinished.stderr
    assert "no paired test: pending has not finished (state New)" in unfinished.stderr


def test_get_shows_provenance_item_scores_and_the_gate(cli: Cli, jobs: Jobs) -> None:
    message = "regressed: drop 0.0650 > max drop 0 and p < alpha 0.05; " + "x" * 100
    _finished(
        jobs,
        "prov",
        _results(A_ACC),
        _items(A_ACC, A_F1, ""),
        _provenance("0.4.13", "sha256:aaa"),
        itemScores={"stored": "ConfigMap", "tasks": 2, "items": 250, "bytes": 1234, "message": ""},
        conditions=[
            {
                "type": "Regressed",
                "status": "True",
                "reason": "Regressed",
                "message": message,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    )
    shown = cli("get", "prov")
    assert shown.returncode == 0, shown.stderr
    lines = [" ".join(line.split()) for line in shown.stdout.splitlines()]
    assert f"Regressed: True (Regressed): {message}" in lines  # whole, not cut at 80
    if "provenance" not in jobs.status("prov"):
        pytest.skip(
            "the installed CRD prunes status.provenance (it lands with the provenance work)"
        )
    assert "Provenance:" in lines
    assert "lm_eval version: 0.4.13" in lines
    assert "Image ID: sha256:aaa" in lines
    assert "Seeds: random=0 numpy=1234 torch=1234 fewshot=1234" in lines
    assert "Task hashes: toy_mc=mc-hash" in lines
    assert "Argv: lm_eval --model local-completions --tasks toy_mc,toy_gen" in lines
    assert "Per-item scores: ConfigMap (2 tasks, 250 items, 1234 bytes)" in lines
