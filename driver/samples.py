"""Per-item scores from lm_eval's samples files, and their trip to the log.

Why a module of its own: with ``--log_samples`` lm_eval writes, next to its
``results_<date_id>.json``, one ``samples_<task>_<date_id>.jsonl`` per task:
a line per (document, filter) with ``doc_id``, the document, the prompts and
the model's answers, ``filter``, ``metrics`` (the names of the metrics that
line scores), ``doc_hash``, ``prompt_hash``, ``target_hash``, and each
metric's value under its own name (lm_eval 0.4's evaluator and
``EvaluationTracker.save_results_samples``). The driver turns them into
`driver.itemscores.ItemScores` after lm_eval has finished, writes them to
``lmeval-items.json`` in the run directory and sends them as ``items``
markers; this keeps :mod:`driver.run` about the run, not about lm_eval's
file formats.

The files are written in the pod by lm_eval, but their content echoes the
datasets and the model's answers: they are read a line at a time, each line
bounded (`MAX_SAMPLE_LINE_BYTES`), as are the lines per file, the files and
the metrics; a task whose file breaks a rule is reported (``skipped``) and
the others are kept. Values that are not one number per document (bleu's
``(reference, prediction)`` tuples, perplexity's pairs, infinity) are named
in ``skipped`` with the reason: they have no per-document score to pair.
Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

from driver.itemscores import (
    FIXED_SCALE,
    MAX_ITEMS_PER_TASK,
    MAX_TASKS,
    ItemScores,
    MetricItems,
    TaskItems,
    docs_digest,
    encode_item_scores,
    metric_items,
)
from driver.payloads import FinalDetails

if TYPE_CHECKING:
    from driver.child import Sink

__all__ = [
    "ITEMS_FILE",
    "MAX_METRICS",
    "MAX_SAMPLE_LINES",
    "MAX_SAMPLE_LINE_BYTES",
    "MAX_TOTAL_SAMPLE_LINES",
    "SendItems",
    "extract_items",
    "items_markers",
    "prepare_items",
    "read_task",
    "samples_files",
]

ITEMS_FILE = "lmeval-items.json"
# One sample line holds a document, its prompts and the model's answers: a
# long-context task's line is a few hundred KB. Longer lines are refused, so
# the driver never holds more than this (and its parse) at once.
MAX_SAMPLE_LINE_BYTES = 16 * 1024 * 1024
# Lines of one task's file: its documents times its filters.
MAX_SAMPLE_LINES = 2 * MAX_ITEMS_PER_TASK
# Lines over all files (values are kept as 8-byte doubles: ~32 MB per metric).
MAX_TOTAL_SAMPLE_LINES = 4_000_000
# Metrics (per filter) of one task that are kept; itemscores decodes 64.
MAX_METRICS = 64
MAX_TASK_NAME = 256
MAX_REASON = 300
_FIXED_MAX = (2**63 - 1) / FIXED_SCALE
_HEX = frozenset("0123456789abcdef")


class _TaskError(Exception):
    """Why a task's samples cannot give per-item scores."""


@dataclass
class _Filter:
    """One filter's lines of a task: doc ids in file order, each metric's values."""

    doc_ids: array[int] = field(default_factory=lambda: array("q"))
    values: dict[str, array[float]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # metric -> why


def samples_files(results_file: str) -> dict[str, str]:
    """task -> its samples file, beside `results_file` and of the same run (date id).

    lm_eval names both files after one ``date_id`` (``results_<id>.json``,
    ``samples_<task>_<id>.jsonl``); date ids hold no ``_``. A results file
    named otherwise takes every samples file in its directory.
    """
    directory, name = os.path.split(results_file)
    suffix = None
    if name.startswith("results_") and name.endswith(".json"):
        suffix = "_" + name[len("results_") : -len(".json")] + ".jsonl"
    try:
        names = sorted(os.listdir(directory or "."))
    except OSError:
        return {}
    found: dict[str, str] = {}
    for entry in names:
        if not (entry.startswith("samples_") and entry.endswith(".jsonl")):
            continue
        if suffix is not None:
            if not entry.endswith(suffix):
                continue
            task = entry[len("samples_") : -len(suffix)]
        else:
            task = entry[len("samples_") : entry.rfind("_")]
        if task and len(task) <= MAX_TASK_NAME and len(found) < MAX_TASKS:
            found[task] = os.path.join(directory, entry)
    return found


def _value(raw: object) -> float | str:
    """A per-document metric value as a float, or why it is not one."""
    if isinstance(raw, bool):
        return 1.0 if raw else 0.0
    if isinstance(raw, int):
        if abs(raw) > _FIXED_MAX:
            return f"value {raw} is beyond the fixed-point range"
        return float(raw)
    if isinstance(raw, float):
        if math.isnan(raw):
            return raw
        if math.isinf(raw) or abs(raw) > _FIXED_MAX:
            return f"value {raw} is not finite or beyond the fixed-point range"
        return raw
    kind = "null" if raw is None else type(raw).__name__
    return f"per-document values are {kind}, not numbers (lm_eval aggregates them as a whole)"


def _add_line(filters: dict[str, _Filter], sample: object, hashes: bytearray) -> None:
    if not isinstance(sample, dict):
        raise _TaskError("a sample line is not a JSON object")
    doc_id, name, metrics, doc_hash = (
        sample.get(k) for k in ("doc_id", "filter", "metrics", "doc_hash")
    )
    if type(doc_id) is not int or doc_id < 0:
        raise _TaskError("a sample line has no doc_id (a non-negative integer)")
    if not isinstance(name, str) or not isinstance(metrics, list):
        raise _TaskError(f"the sample of document {doc_id} has no filter or metrics list")
    if len(name) > MAX_TASK_NAME:
        raise _TaskError(f"a filter name is longer than {MAX_TASK_NAME} characters")
    entry = filters.get(name)
    if entry is None:
        if len(filters) >= MAX_METRICS:
            raise _TaskError(f"more than {MAX_METRICS} filters")
        entry = filters[name] = _Filter()
    position = len(entry.doc_ids)
    if position >= MAX_ITEMS_PER_TASK:
        raise _TaskError(f"more than {MAX_ITEMS_PER_TASK} documents")
    if entry is next(iter(filters.values())):
        # The first filter's doc hashes stand for the task's documents.
        if not (isinstance(doc_hash, str) and len(doc_hash) == 64 and _HEX.issuperset(doc_hash)):
            raise _TaskError(f"the sample of document {doc_id} has no sha256 doc_hash")
        hashes += bytes.fromhex(doc_hash)
    entry.doc_ids.append(doc_id)
    for metric in metrics:
        if not isinstance(metric, str) or len(metric) > MAX_TASK_NAME:
            raise _TaskError(f"the sample of document {doc_id} names a metric that is no name")
        if metric in entry.refused:
            continue
        values = entry.values.get(metric)
        if values is None:
            if position:
                entry.refused[metric] = "not every document has a value"
                continue
            if len(entry.values) + len(entry.refused) >= MAX_METRICS:
                raise _TaskError(f"more than {MAX_METRICS} metrics under filter {name!r}")
            values = entry.values[metric] = array("d")
        value = _value(sample.get(metric))
        if isinstance(value, str):
            entry.refused[metric] = value
            del entry.values[metric]
        elif len(values) != position:
            entry.refused[metric] = "not every document has a value"
            del entry.values[metric]
        else:
            values.append(value)


def _finish(filters: dict[str, _Filter], hashes: bytes) -> tuple[TaskItems, list[str]]:
    if not filters:
        raise _TaskError("the samples file is empty")
    first_name, first = next(iter(filters.items()))
    order = sorted(range(len(first.doc_ids)), key=first.doc_ids.__getitem__)
    doc_ids = tuple(first.doc_ids[i] for i in order)
    for name, entry in filters.items():
        ids = sorted(entry.doc_ids)
        for a, b in pairwise(ids):
            if a == b:
                raise _TaskError(f"document {a} appears twice under filter {name!r}")
        if tuple(ids) != doc_ids:
            raise _TaskError(f"filters {first_name!r} and {name!r} cover different documents")
    digest = docs_digest((first.doc_ids[i], hashes[32 * i : 32 * i + 32].hex()) for i in order)
    metrics: dict[str, MetricItems] = {}
    skipped: list[str] = []
    for name, entry in filters.items():
        own = order if entry is first else sorted(range(len(ids)), key=entry.doc_ids.__getitem__)
        for metric, values in entry.values.items():
            key = f"{metric},{name}"
            if len(values) != len(doc_ids):
                skipped.append(f"{key}: not every document has a value")
            elif len(metrics) >= MAX_METRICS:
                skipped.append(f"{key}: more than {MAX_METRICS} metrics in the task")
            else:
                metrics[key] = metric_items([values[i] for i in own])
        skipped.extend(f"{metric},{name}: {why}" for metric, why in entry.refused.items())
    return TaskItems(doc_ids, digest, metrics), sorted(skipped)


def read_task(path: str, max_lines: int = MAX_SAMPLE_LINES) -> tuple[TaskItems, list[str], int]:
    """One task's items from its samples file: (items, skipped metrics, lines read).

    Raises `_TaskError` (a message) for a file that gives no usable items,
    OSError when it cannot be read.
    """
    filters: dict[str, _Filter] = {}
    hashes = bytearray()
    lines = 0
    with open(path, "rb") as handle:
        while line := handle.readline(MAX_SAMPLE_LINE_BYTES + 1):
            if len(line) > MAX_SAMPLE_LINE_BYTES:
                raise _TaskError(f"a sample line exceeds {MAX_SAMPLE_LINE_BYTES} bytes")
            lines += 1
            if lines > max_lines:
                raise _TaskError(f"more than {max_lines} sample lines")
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
            except ValueError as exc:  # UnicodeDecodeError is one
                raise _TaskError(f"sample line {lines} is not JSON: {exc}") from exc
            _add_line(filters, sample, hashes)
    items, skipped = _finish(filters, bytes(hashes))
    return items, skipped, lines


def extract_items(files: Mapping[str, str], server: Mapping[str, str]) -> ItemScores:
    """`ItemScores` of every task's samples file (see `samples_files`).

    A task whose file cannot be used has no documents and says why in
    ``skipped`` (``"*: <why>"``), so that a reader learns of it.
    """
    tasks: dict[str, TaskItems] = {}
    skipped: dict[str, tuple[str, ...]] = {}
    budget = MAX_TOTAL_SAMPLE_LINES
    for task, path in sorted(files.items()):
        try:
            if budget <= 0:
                raise _TaskError(f"the run's samples exceed {MAX_TOTAL_SAMPLE_LINES} lines")
            items, reasons, lines = read_task(path, min(MAX_SAMPLE_LINES, budget))
            budget -= lines
        except (_TaskError, OSError) as exc:
            items = TaskItems((), docs_digest(()), {})
            reasons = [f"*: {str(exc)[:MAX_REASON]}"]
        tasks[task] = items
        if reasons:
            skipped[task] = tuple(reasons[:MAX_METRICS])
    return ItemScores(tasks=tasks, server=dict(server), skipped=skipped)


@dataclass(frozen=True)
class SendItems:
    """What the driver sends and says about a run's per-item scores."""

    markers: list[str]  # `items` marker lines, after the results
    details: FinalDetails  # the final marker's items_* fields
    note: str | None  # a line for the log (what was extracted, or why not)


def items_markers(
    results_file: str, run_dir: str, run_id: str, server: Mapping[str, str]
) -> SendItems | None:
    """Extract, store and encode the per-item scores of a finished run; None without samples."""
    from driver.protocol import encode_items

    files = samples_files(results_file)
    if not files:
        return None
    scores = extract_items(files, server)
    raw = encode_item_scores(scores)
    path = os.path.join(run_dir, ITEMS_FILE)
    details: FinalDetails = {
        "items_sha256": hashlib.sha256(raw).hexdigest(),
        "items_size": len(raw),
    }
    try:
        tmp = path + ".tmp"
        with open(tmp, "wb") as out:
            out.write(raw)
        os.replace(tmp, path)
        details["items_path"] = path
        where = f"read {path}"
    except OSError as exc:
        where = f"and {path} could not be written ({exc.strerror or exc})"
    count = sum(len(task.doc_ids) for task in scores.tasks.values())
    note = (
        f"per-item scores: {len(scores.tasks)} task(s), {count} document(s), {len(raw)} bytes"
        + "".join(f"; {t}: {', '.join(r)}" for t, r in scores.skipped.items())[:1000]
    )
    try:
        markers = encode_items(raw, run_id)
    except ValueError as exc:  # over the protocol's limits: the poller would refuse them
        details["items_chunks"] = 0
        details["items_note"] = f"{exc}: too large for the log; {where}"
        return SendItems([], details, note)
    details["items_chunks"] = len(markers)
    return SendItems(markers, details, note)


def prepare_items(
    results_file: str, run_dir: str, run_id: str, models: str | None, sink: Sink
) -> tuple[list[str], FinalDetails]:
    """The `items` markers of a finished run, not written yet, and its final
    marker's items_* fields. The caller writes them right after the results
    markers: everything slow (reading the samples, encoding) happens before
    the first of them, so that the kubelet cannot rotate the log between the
    results and the final marker while this runs.

    Never raises: per-item scores are an addition, a failure to extract them
    (a bug, MemoryError) is a note and ``items_note``, the results stand.
    """
    try:
        sent = items_markers(results_file, run_dir, run_id, {"models": models} if models else {})
    except Exception as exc:
        note = f"cannot extract per-item scores: {type(exc).__name__}: {exc}"[:1000]
        sink.note(note)
        return [], {"items_chunks": 0, "items_note": note}
    if sent is None:
        return [], {}
    if sent.note:
        sink.note(sent.note)
    return list(sent.markers), sent.details
