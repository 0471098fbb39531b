"""Pure parts of ``lmeval compare``'s paired test and ``get``'s provenance, without a cluster.

Checks: the plain verdicts (significance by p < 1 - confidence, direction by
lm_eval's higher_is_better, lower-is-better metrics, an assumed direction
flagged); which rows a comparison has (the spec's task order, ``--metric
acc`` matching every filter of acc but not acc_norm, tasks and metrics
only one run has, metrics the driver could not itemise, documents without
a value left out and listed); provenance warnings
(each differing field, task hashes only of compared tasks, a run without
provenance, long values cut); per-item scores read from a ConfigMap (a
decompression bomb and junk refused with a reason, status.itemScores'
message when there are none); and what ``get`` prints for provenance,
per-item scores and the gate condition; names and reasons from the job's
pod printed without control characters.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip

from lmeval_cli import facts, paired, render

from driver.itemscores import ItemScores, TaskItems, docs_digest, encode_item_scores, metric_items
from poller.results import pairedstats
from poller.results.lmeval import ITEMS_KEY


def _task(values: dict[str, list[float]], n: int = 40) -> TaskItems:
    digest = docs_digest((i, f"d{i}") for i in range(n))
    return TaskItems(tuple(range(n)), digest, {m: metric_items(v) for m, v in values.items()})


def _side(label: str, tasks: dict[str, TaskItems], **kwargs: object) -> paired.Side:
    skipped = kwargs.pop("skipped", {})
    return paired.Side(
        label,
        kwargs.pop("results", None),  # type: ignore[arg-type]
        ItemScores(tasks, {}, skipped),  # type: ignore[arg-type]
        kwargs.pop("provenance", {}),  # type: ignore[arg-type]
    )


def test_verdicts() -> None:
    worse = pairedstats.compare_paired(
        [1.0] * 30 + [0.0] * 10, [0.0] * 30 + [0.0] * 10, binary=True
    )
    assert paired.verdict(worse, True) == "B is worse (significant)"
    assert paired.verdict(worse, None) == "B is worse (significant)"  # assumed higher is better
    assert paired.verdict(worse, False) == "B is better (significant)"  # an error rate fell
    same = pairedstats.compare_paired([1.0, 0.0, 1.0], [0.0, 1.0, 1.0], binary=True)
    assert paired.verdict(same, True) == "no significant difference"
    row = paired.Row("t", "acc,none", worse, paired.verdict(worse, None))
    (headers, rows), notes = render.paired_grid(paired.Report([row], []), footnotes=True)
    assert headers[6] == "95% CI" and rows[0][-1].endswith("(assumed higher is better)")
    assert notes == []


def test_rows_order_filters_and_refusals() -> None:
    a = _side(
        "a",
        {
            "zeta": _task({"acc,none": [1.0] * 40}),
            "alpha": _task({"acc,none": [1.0] * 40, "acc_norm,none": [0.0] * 40}),
            "only_a": _task({"acc,none": [1.0] * 40}),
        },
        skipped={"alpha": ("bleu,none: a corpus-level metric",)},
    )
    b = _side(
        "b",
        {
            "zeta": _task({"acc,none": [1.0] * 40, "acc,strict": [0.0] * 40}),
            "alpha": _task({"acc,none": [0.0] * 40, "acc_norm,none": [0.0] * 40}),
        },
    )
    report = paired.compare_sides(a, b, metrics=["acc"], task_order=["zeta"])
    assert [(r.task, r.metric, r.reason) for r in report.rows] == [
        ("zeta", "acc,none", ""),
        ("zeta", "acc,strict", "only B has per-item values of it"),
        ("alpha", "acc,none", ""),
        ("only_a", "*", "only A has per-item scores of this task"),
    ]
    everything = paired.compare_sides(a, b, tasks=["alpha"])
    assert [(r.metric, r.reason) for r in everything.rows] == [
        ("acc,none", ""),
        ("acc_norm,none", ""),
        ("bleu,none", "no per-item values (bleu,none: a corpus-level metric)"),
    ]
    alpha = everything.rows[0]
    assert alpha.result is not None and alpha.verdict == "B is worse (significant)"
    (_, rows), notes = render.paired_grid(everything, footnotes=True)
    assert rows[2][-1] == "not compared (1)"
    assert notes == ["alpha bleu,none: no per-item values (bleu,none: a corpus-level metric)"]
    (_, rows), _ = render.paired_grid(everything, footnotes=False)  # csv, markdown
    assert rows[2][-1] == "not compared: no per-item values (bleu,none: a corpus-level metric)"


def test_documents_without_values_are_left_out_and_said_so() -> None:
    values = [0.5, float("nan"), 0.25, 1.0] * 10
    a = _side("a", {"t": _task({"f1,none": values})})
    b = _side("b", {"t": _task({"f1,none": [0.5] * 40})})
    report = paired.compare_sides(a, b)
    (row,) = report.rows
    assert row.result is not None and (row.result.n, row.dropped) == (30, 10)
    assert render.paired_notes(report, []) == [
        "",
        "Left out (lm_eval wrote NaN):",
        "  t f1,none: 10 documents without a value in both runs",
        "",
        "Warnings (provenance differs):",
        "  neither job records its provenance (versions, image, seeds): runs from before it",
    ]


def test_names_and_reasons_are_printed_without_control_characters() -> None:
    task = "evil\x1b]0;owned\x07"
    a = _side("a", {task: _task({"acc,none": [1.0] * 40})})
    b = _side("b", {task: _task({"acc,none": [1.0] * 39 + [0.0]}, n=40)}, provenance={"x": 1})
    report = paired.compare_sides(a, b)
    (_, rows), _ = render.paired_grid(report, footnotes=True)
    assert rows[0][0] == "evil?]0;owned?"
    refused = paired.compare_sides(a, _side("c", {task: _task({"f1,none": [0.5] * 40})}))
    (_, rows), notes = render.paired_grid(refused, footnotes=True)
    lines = render.paired_notes(refused, notes)
    assert all("\x1b" not in line and "\x07" not in line for line in lines)
    assert "  (1) evil?]0;owned? acc,none: only A has per-item values of it" in lines


def test_provenance_warnings() -> None:
    base = {
        "lmEvalVersion": "0.4.13",
        "seeds": {"random": 0},
        "taskHashes": {"t": "h1", "u": "x1"},
        "modelName": "m" * 500,
    }
    a = _side("a", {}, provenance=base)
    b = _side(
        "b",
        {},
        provenance={**base, "seeds": {"random": 1}, "taskHashes": {"t": "h2", "u": "x2"}},
    )
    assert paired.provenance_warnings(a, b, ["t"]) == [
        'seeds differs: {"random": 0} (A) vs {"random": 1} (B)',
        "taskHashes[t] differs: h1 (A) vs h2 (B)",
    ]
    # provenance.json's per-task datasets: a revision that moved.
    revised = _side(
        "r", {}, provenance={**base, "tasks": {"t": {"datasetPath": "p", "datasetRevision": "v2"}}}
    )
    pinned = _side(
        "p", {}, provenance={**base, "tasks": {"t": {"datasetPath": "p", "datasetRevision": "v1"}}}
    )
    assert paired.provenance_warnings(pinned, revised, ["t"]) == [
        "datasetRevision[t] differs: v1 (A) vs v2 (B)"
    ]
    long = _side("c", {}, provenance={**base, "modelName": "n" * 500})
    (warning,) = paired.provenance_warnings(a, long, [])
    assert warning.startswith("modelName differs: mmm") and len(warning) < 300
    assert paired.provenance_warnings(a, _side("d", {}), []) == [
        "d records no provenance: versions, image and seeds cannot be compared"
    ]
    assert paired.provenance_warnings(_side("e", {}), _side("f", {}), [])[0].startswith(
        "neither job records"
    )


def _configmap(raw: bytes) -> dict:
    return {"binaryData": {ITEMS_KEY: base64.b64encode(gzip.compress(raw)).decode()}}


def test_item_scores_from_the_configmap() -> None:
    scores = ItemScores({"t": _task({"acc,none": [1.0, 0.0] * 20})})
    found, why = facts.item_scores({}, _configmap(encode_item_scores(scores)))
    assert found == scores and why == ""
    bomb, why = facts.item_scores({}, _configmap(b" " * (9 * 1024 * 1024)))
    assert bomb is None and "more than 8388608 bytes once decompressed" in why
    junk, why = facts.item_scores({}, {"binaryData": {ITEMS_KEY: "not base64!"}})
    assert junk is None and why.startswith("its per-item scores cannot be read")
    stored = {"status": {"itemScores": {"stored": "None", "message": "too large for a log"}}}
    assert facts.item_scores(stored, None) == (None, "too large for a log")
    assert facts.item_scores({}, {}) == (None, facts.NO_ITEMS_HINT)


def test_get_shows_provenance_item_scores_and_the_gate() -> None:
    job = {
        "metadata": {"name": "j", "namespace": "ns", "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {"model": "local-completions", "tasks": ["t"]},
        "status": {
            "state": "Complete",
            "reason": "Succeeded",
            "provenance": {
                "lmEvalVersion": "0.4.13",
                "imageID": "sha256:abc",
                "seeds": {"random": 0, "fewshot": 1234},
                "taskHashes": {"t": "0123456789abcdef0123"},
                "argv": ["lm_eval", "--tasks", "t"],
            },
            "itemScores": {"stored": "ConfigMap", "tasks": 1, "items": 40, "bytes": 99},
            "conditions": [
                {
                    "type": "Regressed",
                    "status": "False",
                    "reason": "NoRegression",
                    "message": "m" * 90,
                }
            ],
        },
    }
    now = dt.datetime(2026, 12, 1, 11, tzinfo=dt.UTC)
    pairs = dict(render._status_pairs(job, now))
    assert pairs["Regressed"] == "False (NoRegression): " + "m" * 90
    assert pairs["Per-item scores"] == "ConfigMap (1 tasks, 40 items, 99 bytes)"
    assert dict(facts.provenance_pairs(job)) == {
        "lm_eval version": "0.4.13",
        "Image ID": "sha256:abc",
        "Seeds": "random=0 fewshot=1234",
        "Task hashes": "t=0123456789abcdef",
        "Argv": "lm_eval --tasks t",
    }
    texts = [str(getattr(part, "plain", "")) for part in render.details(job, [], "", now)]
    assert "Provenance:" in texts
    none = {"status": {"itemScores": {"stored": "None", "message": "no --log_samples"}}}
    assert facts.item_scores_text(none) == "none: no --log_samples"
