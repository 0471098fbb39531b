"""Per-item scores: each task's per-document metric values, as the driver sends them.

Why a module of its own: an aggregate score cannot tell a regression from
noise, a paired test over the same documents can, and that needs every
document's value of every metric. The driver reads them from lm_eval's
``samples_*.jsonl`` (written with ``--log_samples``), encodes them here and
sends the encoded bytes through the marker protocol (event ``items``, chunked
like the results); the poller stores them beside the results and the
comparison (``lmeval compare``, the regression gate) decodes them here. One
module, used by both sides, standard library only.

The encoding is compact because it travels in a log and is kept in a
ConfigMap: a metric whose values are all 0 or 1 (accuracy, exact match) is a
bit string, one bit per document; any other is an array of 64-bit integers
at a fixed precision of 1e-6 (`FIXED_SCALE`). Both are base64 inside a small
JSON document, which the protocol compresses as a whole. Documents are keyed
by lm_eval's ``doc_id`` (a range when they are 0..n-1, as they are unless
``--samples`` picks documents); `TaskItems.docs_sha256` is a digest of every
``(doc_id, doc_hash)`` pair, so two runs pair only over the same documents.

Everything decoded here may come from a job's author: `decode_item_scores`
bounds the JSON before parsing it and checks every length, and raises only
ValueError with a message fit for a status.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver.boundedjson import JsonLimits, UntrustedJsonError, parse_untrusted_json

__all__ = [
    "BINARY",
    "FIXED",
    "FIXED_SCALE",
    "FORMAT_VERSION",
    "ITEM_SCORES_LIMITS",
    "MAX_ITEMS_PER_TASK",
    "MAX_TASKS",
    "ItemScores",
    "MetricItems",
    "TaskItems",
    "decode_item_scores",
    "docs_digest",
    "encode_item_scores",
    "metric_items",
]

FORMAT_VERSION = 1
BINARY = "binary"
FIXED = "fixed"
# Fixed precision of non-binary values: 1e-6, as int64 (values up to 9.2e12).
FIXED_SCALE = 1_000_000
_NAN = -(2**63)  # the int64 that stands for NaN (lm_eval writes NaN for undefined values)
_FIXED_MAX = (2**63 - 1) / FIXED_SCALE
# What one document may hold: tasks and items (a 2-million-item task is far
# beyond any lm_eval task; MMLU is 14,042 items over 57 tasks).
MAX_TASKS = 5000
MAX_ITEMS_PER_TASK = 2_000_000
MAX_METRICS_PER_TASK = 64
MAX_SERVER_FIELDS = 16
MAX_SERVER_CHARS = 512
# The decoded JSON: 8 MiB (the protocol caps what it carries well below),
# nested 5 deep (document, tasks, task, metrics, metric).
ITEM_SCORES_LIMITS = JsonLimits(max_bytes=8 * 1024 * 1024, max_depth=8, max_elements=2_000_000)


@dataclass(frozen=True)
class MetricItems:
    """One metric's value for each document of a task, in the task's `doc_ids` order."""

    kind: str  # BINARY (every value 0 or 1) or FIXED (any number, 1e-6 precision; NaN kept)
    values: tuple[float, ...]


@dataclass(frozen=True)
class TaskItems:
    """A task's documents and its per-document metric values.

    Metric names are lm_eval's results keys, ``<metric>,<filter>`` (for
    example ``acc,none`` or ``exact_match,strict-match``).
    """

    doc_ids: tuple[int, ...]
    docs_sha256: str  # docs_digest of (doc_id, doc_hash): equal only over the same documents
    metrics: Mapping[str, MetricItems]


@dataclass(frozen=True)
class ItemScores:
    """Everything the driver extracted from one run's samples."""

    tasks: Mapping[str, TaskItems]
    # What the model server says it is (for API models), e.g. {"models": "m1"}.
    server: Mapping[str, str] = field(default_factory=dict)
    # task -> metrics that have no per-item value to pair (tuples such as
    # bleu's or perplexity's), each "<metric>: <why>".
    skipped: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def metric_items(values: Sequence[float]) -> MetricItems:
    """The compact kind for `values`: BINARY when every value is 0 or 1."""
    kind = BINARY if all(v == 0 or v == 1 for v in values) else FIXED
    return MetricItems(kind, tuple(float(v) for v in values))


def docs_digest(pairs: Iterable[tuple[int, str]]) -> str:
    """sha256 over ``doc_id:doc_hash`` lines in doc_id order (lm_eval's doc_hash)."""
    digest = hashlib.sha256()
    for doc_id, doc_hash in sorted(pairs):
        digest.update(f"{doc_id}:{doc_hash}\n".encode())
    return digest.hexdigest()


def _bits(values: Sequence[float]) -> str:
    packed = bytearray((len(values) + 7) // 8)
    for index, value in enumerate(values):
        if value:
            packed[index >> 3] |= 0x80 >> (index & 7)
    return base64.b64encode(bytes(packed)).decode("ascii")


def _fixed(values: Sequence[float]) -> str:
    ints = []
    for value in values:
        if math.isnan(value):
            ints.append(_NAN)
        elif abs(value) > _FIXED_MAX:
            raise ValueError(
                f"value {value} exceeds the fixed-precision range (|v| <= {_FIXED_MAX:.3g})"
            )
        else:
            ints.append(round(value * FIXED_SCALE))
    return base64.b64encode(struct.pack(f"<{len(ints)}q", *ints)).decode("ascii")


def _doc_ids(ids: Sequence[int]) -> object:
    if ids and list(ids) == list(range(ids[0], ids[0] + len(ids))):
        return {"start": ids[0]}
    return list(ids)


def encode_item_scores(scores: ItemScores) -> bytes:
    """The compact JSON bytes of `scores` (raises ValueError for an unencodable value)."""
    tasks: dict[str, Any] = {}
    for name, task in scores.tasks.items():
        metrics: dict[str, Any] = {}
        for metric, items in task.metrics.items():
            if len(items.values) != len(task.doc_ids):
                raise ValueError(
                    f"{name} {metric}: {len(items.values)} values for {len(task.doc_ids)} documents"
                )
            data = _bits(items.values) if items.kind == BINARY else _fixed(items.values)
            metrics[metric] = {"kind": items.kind, "data": data}
        tasks[name] = {
            "n": len(task.doc_ids),
            "doc_ids": _doc_ids(task.doc_ids),
            "docs_sha256": task.docs_sha256,
            "metrics": metrics,
        }
    document = {
        "format": FORMAT_VERSION,
        "tasks": tasks,
        "server": dict(scores.server),
        "skipped": {name: list(reasons) for name, reasons in scores.skipped.items()},
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def _fail(message: str) -> UntrustedJsonError:
    return UntrustedJsonError(f"per-item scores: {message}")


def _decode_bits(data: str, n: int) -> tuple[float, ...]:
    packed = base64.b64decode(data, validate=True)
    if len(packed) != (n + 7) // 8:
        raise _fail(f"{len(packed)} bytes of bits for {n} documents")
    return tuple(1.0 if packed[i >> 3] & (0x80 >> (i & 7)) else 0.0 for i in range(n))


def _decode_fixed(data: str, n: int) -> tuple[float, ...]:
    raw = base64.b64decode(data, validate=True)
    if len(raw) != 8 * n:
        raise _fail(f"{len(raw)} bytes of values for {n} documents")
    return tuple(math.nan if v == _NAN else v / FIXED_SCALE for v in struct.unpack(f"<{n}q", raw))


def _decode_task(name: str, body: object) -> TaskItems:
    if not isinstance(body, dict):
        raise _fail(f"task {name!r} is not an object")
    n, ids, digest, metrics = (body.get(k) for k in ("n", "doc_ids", "docs_sha256", "metrics"))
    if type(n) is not int or not 0 <= n <= MAX_ITEMS_PER_TASK:
        raise _fail(f"task {name!r}: n must be an integer from 0 to {MAX_ITEMS_PER_TASK}")
    if isinstance(ids, dict) and type(ids.get("start")) is int and ids["start"] >= 0:
        doc_ids = tuple(range(ids["start"], ids["start"] + n))
    elif isinstance(ids, list) and len(ids) == n and all(type(i) is int and i >= 0 for i in ids):
        doc_ids = tuple(ids)
    else:
        raise _fail(f"task {name!r}: doc_ids must be {{'start': k}} or {n} integers")
    if len(set(doc_ids)) != n:
        raise _fail(f"task {name!r}: doc_ids repeat")
    if not (
        isinstance(digest, str)
        and len(digest) == 64
        and all(c in "0123456789abcdef" for c in digest)
    ):
        raise _fail(f"task {name!r}: docs_sha256 is not a sha256 hex digest")
    if not isinstance(metrics, dict) or len(metrics) > MAX_METRICS_PER_TASK:
        raise _fail(f"task {name!r}: metrics must be an object of at most {MAX_METRICS_PER_TASK}")
    decoded: dict[str, MetricItems] = {}
    for metric, item in metrics.items():
        if not isinstance(item, dict) or not isinstance(item.get("data"), str):
            raise _fail(f"task {name!r} metric {metric!r} has no data")
        try:
            if item.get("kind") == BINARY:
                decoded[metric] = MetricItems(BINARY, _decode_bits(item["data"], n))
            elif item.get("kind") == FIXED:
                decoded[metric] = MetricItems(FIXED, _decode_fixed(item["data"], n))
            else:
                raise _fail(f"task {name!r} metric {metric!r}: unknown kind {item.get('kind')!r}")
        except (ValueError, struct.error) as exc:
            if isinstance(exc, UntrustedJsonError):
                raise
            raise _fail(f"task {name!r} metric {metric!r}: {exc}") from exc
    return TaskItems(doc_ids, digest, decoded)


def decode_item_scores(raw: bytes | str) -> ItemScores:
    """`ItemScores` from untrusted bytes; raises ValueError saying what is wrong."""
    document = parse_untrusted_json(raw, ITEM_SCORES_LIMITS)
    if not isinstance(document, dict) or document.get("format") != FORMAT_VERSION:
        raise _fail(f"not a format {FORMAT_VERSION} document")
    tasks = document.get("tasks")
    if not isinstance(tasks, dict) or len(tasks) > MAX_TASKS:
        raise _fail(f"tasks must be an object of at most {MAX_TASKS}")
    server = document.get("server", {})
    if not isinstance(server, dict) or len(server) > MAX_SERVER_FIELDS:
        raise _fail("server must be a small object")
    skipped = document.get("skipped", {})
    if not isinstance(skipped, dict):
        raise _fail("skipped must be an object")
    return ItemScores(
        tasks={name: _decode_task(name, body) for name, body in tasks.items()},
        server={
            str(k)[:MAX_SERVER_CHARS]: v[:MAX_SERVER_CHARS]
            for k, v in server.items()
            if isinstance(v, str)
        },
        skipped={
            str(name): tuple(str(r)[:MAX_SERVER_CHARS] for r in reasons[:MAX_METRICS_PER_TASK])
            for name, reasons in skipped.items()
            if isinstance(reasons, list) and name in tasks
        },
    )
