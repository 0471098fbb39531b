"""A run's per-item scores: checked once, counted, and stored beside its results.

Why a module of its own: the per-item scores (driver.itemscores, sent
through the log after the results) are what a paired comparison and the
regression gate read back, from the job's results ConfigMap; they share
that ConfigMap, and its limit (results.CONFIGMAP_DATA_MAX, data and
binaryData together), with the results and the provenance. The order of
what gives way is decided here (`results_manifest`): the results come first
(gzip'd to make room when their text would not leave it), then the
provenance, then the per-item scores, which are left out when they do not
fit, and status.itemScores says so and where the pod wrote them.

The scores come from the pod's log, so from whoever controls the job:
`check` decodes them (bounded, `driver.itemscores.decode_item_scores`)
before anything is stored or counted; scores that do not decode are not
stored, and the job still succeeds with its results. Pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from driver.decoder import DecodedLog
from driver.protocol import ItemScores, decode_item_scores
from poller import api
from poller.results import lmeval

__all__ = ["ITEMS_DECODE_MAX", "CheckedItems", "check", "results_manifest"]

# Per-item scores larger than this (their JSON, as the log carried it) are
# not decoded, so not stored: decoding holds every value as a Python float
# (2 MiB of 0/1 bits is 12 million values, about 100 MB for a moment). A
# 10,000-item task's scores are a few KB (0/1 metrics) to about 110 KB.
ITEMS_DECODE_MAX = 2 * 1024 * 1024


@dataclass(frozen=True)
class CheckedItems:
    """The per-item scores of a log: raw JSON and decoded when valid, and status.itemScores."""

    raw: bytes | None = None
    scores: ItemScores | None = None
    # status.itemScores (snake_case, as api.ItemScoresStatus takes it); None
    # when the log says nothing of per-item scores (a driver that predates them).
    summary: dict[str, Any] | None = None


def _summary(fields: dict[str, Any]) -> dict[str, Any]:
    message = fields.get("message")
    if isinstance(message, str) and len(message) > api.PROVENANCE_MESSAGE_MAX:
        fields["message"] = message[: api.PROVENANCE_MESSAGE_MAX - 4] + " ..."
    return fields


def check(decoded: DecodedLog) -> CheckedItems:
    """Decode the log's per-item scores once: count them, or say why there are none."""
    outcome = decoded.outcome
    note = outcome.items_note if outcome is not None else None
    raw = decoded.items
    if raw is None:
        why = note or decoded.items_error
        if not why:
            return CheckedItems()
        return CheckedItems(summary=_summary({"stored": "None", "message": why}))
    summary: dict[str, Any] = {"stored": "None", "bytes": len(raw)}
    if len(raw) > ITEMS_DECODE_MAX:
        summary["message"] = (
            f"per-item scores not stored: {len(raw)} bytes, over the {ITEMS_DECODE_MAX} "
            "the poller reads"
        )
        return CheckedItems(summary=summary)
    try:
        scores = decode_item_scores(raw)
    except ValueError as error:
        summary["message"] = f"per-item scores not stored, invalid: {error}"
        return CheckedItems(summary=_summary(summary))
    summary.update(
        stored="ConfigMap",
        tasks=len(scores.tasks),
        items=sum(len(task.doc_ids) for task in scores.tasks.values()),
    )
    if note:
        summary["message"] = note
    return CheckedItems(raw, scores, _summary(summary))


def results_manifest(
    *,
    namespace: str,
    job_name: str,
    job_uid: str,
    labels: dict[str, str],
    found: dict[str, Any],
    reduced_text: str,
    provenance: str,
    items: CheckedItems,
    items_path: str | None,
    outputs: str | None,
) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    """The results ConfigMap; status.itemScores; a note for the message when the results
    themselves had to be reduced.

    Tried in order, the first that fits CONFIGMAP_DATA_MAX wins: results (as
    text when small enough), provenance and items; the same with the results
    gzip'd; results and provenance without the items; the reduced results
    (`reduced_text`, what status holds) and the provenance.
    """

    def manifest_of(kept: dict[str, Any], raw: bytes | None, compress: bool) -> dict[str, Any]:
        return lmeval.results_configmap(
            namespace=namespace,
            job_name=job_name,
            job_uid=job_uid,
            results=kept,
            labels=labels,
            items=raw,
            provenance=provenance,
            compress=compress,
        )

    def fits(candidate: dict[str, Any]) -> bool:
        return lmeval.configmap_data_bytes(candidate) <= lmeval.CONFIGMAP_DATA_MAX

    summary = dict(items.summary) if items.summary is not None else None
    manifest = manifest_of(found, items.raw, False)
    if items.raw is not None and not fits(manifest):
        manifest = manifest_of(found, items.raw, True)
        if not fits(manifest):
            manifest = manifest_of(found, None, False)
            if summary is not None:
                why = _left_out(manifest, items.raw, items_path, outputs)
                summary.update(stored="None", message=why)
                summary = _summary(summary)
    size = lmeval.configmap_data_bytes(manifest)
    if fits(manifest):
        return manifest, summary, None
    # The apiserver would refuse it, every cycle: keep what status keeps.
    manifest = manifest_of(json.loads(reduced_text), None, False)
    if summary is not None and summary.get("stored") == "ConfigMap":
        why = _left_out(manifest, items.raw or b"", items_path, outputs)
        summary = _summary({**summary, "stored": "None", "message": why})
    note = (
        f"the full results, {size} bytes compressed, exceed what a ConfigMap holds: "
        f"{lmeval.results_configmap_name(job_name)} holds the reduced results"
    )
    return manifest, summary, note


def _left_out(
    manifest: dict[str, Any], raw: bytes, items_path: str | None, outputs: str | None
) -> str:
    """Why the per-item scores are not in the ConfigMap, and where they are instead."""
    packed = len(lmeval.gzip_base64(raw)) * 3 // 4
    used = lmeval.configmap_data_bytes(manifest)
    message = (
        f"per-item scores not stored: {len(raw)} bytes ({packed} gzip'd) do not fit beside "
        f"the results and provenance ({used} bytes) in a ConfigMap "
        f"({lmeval.CONFIGMAP_DATA_MAX} bytes)"
    )
    if items_path and outputs:
        return f"{message}; the pod wrote them to {items_path} in its outputs claim ({outputs})"
    return f"{message}; the job has no outputs claim that keeps them"
