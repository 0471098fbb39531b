"""`lmeval compare A B`'s paired comparison: which metrics to pair, the verdicts, the warnings.

Why this module exists: a paired test answers "did B get worse than A?"
only for the same documents under the same task configuration, and a person
needs to see why a pair was refused and what else differed between the runs
(lm_eval version, image, model, seeds) before trusting the answer. This
module decides all of that from what the command read (each job's lm_eval
results JSON, its decoded per-item scores, its provenance) and leaves the
statistics to `poller.results.pairedstats` and the printing to ``render``. Pure: no
requests, no printing. A is the baseline (the first job named), B the
candidate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver.itemscores import ItemScores
from poller.cliapi import pairedstats

__all__ = [
    "PROVENANCE_FIELDS",
    "Report",
    "Row",
    "Side",
    "compare_sides",
    "provenance_warnings",
    "verdict",
]

# What must match for two runs to be the same evaluation of different models
# (or the same model twice); status.provenance's camelCase keys.
PROVENANCE_FIELDS = (
    "lmEvalVersion",
    "driverVersion",
    "imageID",
    "model",
    "modelName",
    "serverModels",
    "seeds",
)
_DATASET_FIELDS = ("datasetPath", "datasetName", "datasetRevision")
_SHOWN = 120  # characters of one provenance value (the job's author wrote it)


@dataclass(frozen=True)
class Side:
    """One job as the comparison sees it."""

    label: str
    results: Mapping[str, Any] | None  # lm_eval's results JSON (complete when the ConfigMap has it)
    items: ItemScores | None
    provenance: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    task: str
    metric: str
    result: pairedstats.PairedResult | None = None
    verdict: str = ""
    reason: str = ""  # why the pair was refused (result is None)
    dropped: int = 0  # documents without a defined value in both runs
    higher_is_better: bool | None = None  # None: lm_eval did not say (assumed higher)

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"task": self.task, "metric": self.metric}
        if self.result is None:
            return {**found, "compared": False, "reason": self.reason}
        r = self.result
        return {
            **found,
            "compared": True,
            "test": r.test,
            "n": r.n,
            "a": r.mean_a,
            "b": r.mean_b,
            "difference": r.difference,
            "ciLow": r.ci_low,
            "ciHigh": r.ci_high,
            "confidence": r.confidence,
            "ciMethod": r.ci_method,
            "pValue": r.p_value,
            "down": r.a_only,
            "up": r.b_only,
            "resamples": r.resamples,
            "dropped": self.dropped,
            "higherIsBetter": self.higher_is_better,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Report:
    rows: list[Row]
    warnings: list[str]


def _higher_is_better(results: Mapping[str, Any] | None, task: str, metric: str) -> bool | None:
    table = (results or {}).get("higher_is_better")
    found = table.get(task) if isinstance(table, dict) else None
    value = found.get(metric.partition(",")[0]) if isinstance(found, dict) else None
    return value if isinstance(value, bool) else None


def verdict(result: pairedstats.PairedResult, higher_is_better: bool | None) -> str:
    """Plain words: significant when p < 1 - confidence; the direction by the metric's."""
    if result.p_value >= 1 - result.confidence or result.difference == 0:
        return "no significant difference"
    better = (result.difference > 0) == (higher_is_better is not False)
    return f"B is {'better' if better else 'worse'} (significant)"


def _wanted(name: str, filters: Sequence[str]) -> bool:
    """A metric filter matches ``acc,none`` exactly, or ``acc`` with any lm_eval filter."""
    return not filters or any(name == f or name.partition(",")[0] == f for f in filters)


def _pair_one(a: Side, b: Side, task: str, metric: str, confidence: float, seed: int) -> Row:
    assert a.items is not None and b.items is not None
    try:
        paired = pairedstats.pair_tasks(a.items.tasks[task], b.items.tasks[task], metric)
        pairedstats.check_results_comparable(task, a.results or {}, b.results or {})
    except pairedstats.NotComparable as refused:
        return Row(task, metric, reason=str(refused))
    result = pairedstats.compare_paired(
        paired.a, paired.b, binary=paired.binary, confidence=confidence, seed=seed
    )
    direction = _higher_is_better(a.results, task, metric)
    if direction is None:
        direction = _higher_is_better(b.results, task, metric)
    return Row(task, metric, result, verdict(result, direction), "", paired.dropped, direction)


def compare_sides(
    a: Side,
    b: Side,
    *,
    tasks: Sequence[str] = (),
    metrics: Sequence[str] = (),
    confidence: float = 0.95,
    seed: int = 0,
    task_order: Sequence[str] = (),
) -> Report:
    """Every task and metric with per-item scores in A or B, paired where they can be.

    Tasks named in `task_order` (A's spec) come first, the rest in name order.
    """
    assert a.items is not None and b.items is not None
    rows: list[Row] = []
    present = {*a.items.tasks, *b.items.tasks}
    first = [task for task in dict.fromkeys(task_order) if task in present]
    order = first + sorted(present - set(first))
    for task in order:
        if tasks and task not in tasks:
            continue
        in_a, in_b = a.items.tasks.get(task), b.items.tasks.get(task)
        if in_a is None or in_b is None:
            only = "A" if in_b is None else "B"
            rows.append(Row(task, "*", reason=f"only {only} has per-item scores of this task"))
            continue
        names = list(dict.fromkeys([*in_a.metrics, *in_b.metrics]))
        for metric in names:
            if not _wanted(metric, metrics):
                continue
            if metric in in_a.metrics and metric in in_b.metrics:
                rows.append(_pair_one(a, b, task, metric, confidence, seed))
            else:
                only = "A" if metric in in_a.metrics else "B"
                rows.append(Row(task, metric, reason=f"only {only} has per-item values of it"))
        for reason in dict.fromkeys(
            [*a.items.skipped.get(task, ()), *b.items.skipped.get(task, ())]
        ):
            metric = reason.partition(":")[0].strip() or "?"
            if _wanted(metric, metrics):
                rows.append(Row(task, metric, reason=f"no per-item values ({reason})"))
    compared = [row.task for row in rows if row.result is not None]
    return Report(rows, provenance_warnings(a, b, compared))


def _shown(value: Any) -> str:
    if value is None or value == "" or value == {} or value == []:
        return "(none)"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def provenance_warnings(a: Side, b: Side, tasks: Sequence[str]) -> list[str]:
    """What differs between the two runs' provenance (for the compared `tasks`' hashes)."""
    if not a.provenance and not b.provenance:
        return ["neither job records its provenance (versions, image, seeds): runs from before it"]
    if not a.provenance or not b.provenance:
        missing = a.label if not a.provenance else b.label
        return [f"{missing} records no provenance: versions, image and seeds cannot be compared"]
    warnings = []
    for key in PROVENANCE_FIELDS:
        value_a, value_b = a.provenance.get(key), b.provenance.get(key)
        if value_a != value_b:
            warnings.append(f"{key} differs: {_shown(value_a)} (A) vs {_shown(value_b)} (B)")
    hashes_a, hashes_b = _mapping(a.provenance, "taskHashes"), _mapping(b.provenance, "taskHashes")
    tasks_a, tasks_b = _mapping(a.provenance, "tasks"), _mapping(b.provenance, "tasks")
    for task in dict.fromkeys(tasks):
        hash_a, hash_b = hashes_a.get(task), hashes_b.get(task)
        if hash_a and hash_b and hash_a != hash_b:
            warnings.append(
                f"taskHashes[{task}] differs: {_shown(hash_a)} (A) vs {_shown(hash_b)} (B)"
            )
        # provenance.json's per-task dataset, as lm_eval's configs name it.
        entry_a, entry_b = _mapping(tasks_a, task), _mapping(tasks_b, task)
        for key in _DATASET_FIELDS:
            if key in entry_a and key in entry_b and entry_a[key] != entry_b[key]:
                warnings.append(
                    f"{key}[{task}] differs: {_shown(entry_a[key])} (A) vs "
                    f"{_shown(entry_b[key])} (B)"
                )
    return warnings


def _mapping(found: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = found.get(key)
    return value if isinstance(value, dict) else {}
