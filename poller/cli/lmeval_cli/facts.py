"""What a person wants to read from an LMEvalJob, as plain values.

Why this module exists: the list, get, results, compare and wait commands
all show the same facts (state and reason, progress, age, the model, the
headline score, the score rows of lm_eval's results JSON) and must agree on
them. These pure functions read the job as the API returns it (a dict with
camelCase keys) and never fail on a partial object: a job the poller has not
seen yet has no status at all, and results may be absent, reduced or
malformed. Score rows are read by `poller.results.lmeval.score_rows` (re-exported
here), the one reading of lm_eval's scores that the metrics and the sandbox
use too. The per-item scores and the provenance a paired comparison reads
come from the job's results ConfigMap (decompressed with a bound: the job's
author wrote them), else from status. Rendering (rich tables, CSV, Markdown)
is in ``render``.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from driver.itemscores import ITEM_SCORES_LIMITS, ItemScores, decode_item_scores
from poller.cliapi import (
    ITEMS_KEY,
    PROVENANCE_KEY,
    ScoreRow,
    api,
    gunzip_base64,
    parse_time,
    score_rows,
)

__all__ = [
    "ScoreRow",
    "age",
    "conditions",
    "format_value",
    "headline",
    "item_scores",
    "job_results",
    "model_text",
    "parse_time",
    "progress_text",
    "provenance",
    "reason",
    "score_rows",
    "spec_summary",
    "state",
    "status",
]

# lm_eval model args that name the model itself, most specific first.
_MODEL_NAME_ARGS = ("pretrained", "model", "engine", "model_name", "path")


def status(job: dict[str, Any]) -> dict[str, Any]:
    found = job.get("status")
    return found if isinstance(found, dict) else {}


def spec(job: dict[str, Any]) -> dict[str, Any]:
    found = job.get("spec")
    return found if isinstance(found, dict) else {}


def state(job: dict[str, Any]) -> str:
    """The lifecycle state; a job the poller has not picked up yet is New."""
    return str(status(job).get("state") or api.JobState.NEW.value)


def reason(job: dict[str, Any]) -> str:
    found = str(status(job).get("reason") or "")
    return "" if found == api.JobReason.NO_REASON.value else found


def percent(job: dict[str, Any]) -> float | None:
    progress = status(job).get("progress") or {}
    value = progress.get("percent") if isinstance(progress, dict) else None
    if state(job) == api.JobState.COMPLETE.value and reason(job) == "Succeeded":
        return 100.0
    return float(value) if isinstance(value, int | float) else None


def progress_text(job: dict[str, Any]) -> str:
    """The percentage, or while a sharded job's shards run, how many are done (3/8 shards)."""
    shards = status(job).get("shardsDone")
    sharding = isinstance(shards, str) and not status(job).get("podName")
    if sharding and state(job) != api.JobState.COMPLETE.value:
        return f"{shards} shards"
    value = percent(job)
    return "-" if value is None else f"{value:.0f}%"


def age(text: Any, now: dt.datetime) -> str:
    """kubectl's short ages: 45s, 3m12s, 42m, 5h3m, 20h, 3d4h, 12d."""
    when = parse_time(text)
    if when is None:
        return "-"
    seconds = max(0, int((now - when).total_seconds()))
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d"


def model_text(job: dict[str, Any]) -> str:
    """The model type and, when one of its args names it, the model: 'hf (gpt2)'."""
    the_spec = spec(job)
    model = str(the_spec.get("model") or "-")
    args = {
        str(a.get("name")): str(a.get("value"))
        for a in the_spec.get("modelArgs") or []
        if isinstance(a, dict)
    }
    for key in _MODEL_NAME_ARGS:
        if args.get(key) and args[key] != model:
            return f"{model} ({args[key]})"
    return model


def tasks_text(job: dict[str, Any]) -> str:
    return ",".join(str(t) for t in spec(job).get("tasks") or []) or "-"


def job_results(job: dict[str, Any]) -> dict[str, Any] | None:
    """lm_eval's results JSON from status, or None when absent or unreadable."""
    text = status(job).get("results")
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def headline(job: dict[str, Any]) -> str:
    """The first task's first numeric score, e.g. 'acc=0.2500'; '-' when none."""
    results = job_results(job)
    if results is None:
        return "-"
    order = [str(t) for t in spec(job).get("tasks") or []]
    for row in score_rows(results, order):
        if isinstance(row.value, int | float) and not isinstance(row.value, bool):
            suffix = "" if row.filter == "none" else f"[{row.filter}]"
            return f"{row.metric}{suffix}={format_value(row.value)}"
    return "-"


def conditions(job: dict[str, Any]) -> list[dict[str, Any]]:
    found = status(job).get("conditions") or []
    return [c for c in found if isinstance(c, dict)]


def _pairs(items: Any) -> str:
    return ",".join(f"{i.get('name')}={i.get('value')}" for i in items or [] if isinstance(i, dict))


def _gate_text(gate: Any) -> str:
    """spec.gate in one line, with the API's defaults filled in."""
    if not isinstance(gate, dict):
        return ""
    higher = "" if gate.get("higherIsBetter", True) else ", lower is better"
    return (
        f"{gate.get('task')} {gate.get('metric') or api.DEFAULT_GATE_METRIC}: regressed if it "
        f"drops by more than {gate.get('maxDrop', 0)} with p < {gate.get('alpha', 0.05)}{higher}"
    )


def spec_summary(job: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines that describe what the job evaluates, set fields only."""
    the_spec = spec(job)
    lines = [("Model", str(the_spec.get("model") or "-"))]
    optional: list[tuple[str, Any]] = [
        ("Model args", _pairs(the_spec.get("modelArgs"))),
        ("Tasks", ", ".join(str(t) for t in the_spec.get("tasks") or [])),
        ("Limit", the_spec.get("limit")),
        ("Few-shot", the_spec.get("numFewShot")),
        ("Batch size", the_spec.get("batchSize")),
        ("Gen args", _pairs(the_spec.get("genArgs"))),
        ("Log samples", the_spec.get("logSamples")),
        (
            "Custom tasks",
            ", ".join(
                str(c.get("configMap") or (c.get("git") or {}).get("url"))
                for c in the_spec.get("customTasks") or []
            ),
        ),
        (
            "Env secrets",
            ", ".join(
                f"{e.get('env')}={(e.get('secretRef') or {}).get('name')}:"
                f"{(e.get('secretRef') or {}).get('key')}"
                for e in the_spec.get("envSecrets") or []
            ),
        ),
        ("Baseline", the_spec.get("baseline")),
        ("Gate", _gate_text(the_spec.get("gate"))),
        ("Deadline", the_spec.get("activeDeadlineSeconds")),
        ("TTL after finished", the_spec.get("ttlSecondsAfterFinished")),
        ("Suspend", the_spec.get("suspend")),
        ("Cancel", the_spec.get("cancel")),
    ]
    for label, value in optional:
        if value not in (None, "", []):
            text = format_value(value)
            if label in {"Deadline", "TTL after finished"}:
                text += " s"
            lines.append((label, text))
    return lines


# -- per-item scores and provenance (issue 19) -----------------------------------

# Why a job has no per-item scores when its status does not say.
NO_ITEMS_HINT = "its results ConfigMap holds no per-item scores (submit with --log-samples)"


def item_scores(
    job: dict[str, Any], configmap: dict[str, Any] | None
) -> tuple[ItemScores | None, str]:
    """The job's decoded per-item scores, or None and why there are none."""
    packed = ((configmap or {}).get("binaryData") or {}).get(ITEMS_KEY)
    if not packed:
        stored = status(job).get("itemScores")
        message = stored.get("message") if isinstance(stored, dict) else None
        return None, str(message) if message else NO_ITEMS_HINT
    try:
        raw = gunzip_base64(str(packed), ITEM_SCORES_LIMITS.max_bytes, ITEMS_KEY)
        return decode_item_scores(raw), ""
    except ValueError as error:
        return None, f"its per-item scores cannot be read: {str(error)[:200]}"


def provenance(job: dict[str, Any], configmap: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's provenance: the full copy in the results ConfigMap, else status.provenance."""
    text = ((configmap or {}).get("data") or {}).get(PROVENANCE_KEY)
    if isinstance(text, str) and len(text) <= ITEM_SCORES_LIMITS.max_bytes:
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    found = status(job).get("provenance")
    return found if isinstance(found, dict) else {}


_SEEDS = ("random", "numpy", "torch", "fewshot")


def _seed_order(item: tuple[str, Any]) -> tuple[int, str]:
    """lm_eval's order of its seeds (the API server returns keys sorted by name)."""
    return (_SEEDS.index(item[0]) if item[0] in _SEEDS else len(_SEEDS), item[0])


def provenance_pairs(job: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines of status.provenance for `lmeval get`, set fields only."""
    found = status(job).get("provenance")
    if not isinstance(found, dict):
        return []
    seeds = found.get("seeds")
    hashes = found.get("taskHashes")
    argv = found.get("argv")
    lines: list[tuple[str, Any]] = [
        ("lm_eval version", found.get("lmEvalVersion")),
        ("Driver version", found.get("driverVersion")),
        ("Image", found.get("image")),
        ("Image ID", found.get("imageID")),
        ("Model", found.get("model")),
        ("Model name", found.get("modelName")),
        ("Server models", found.get("serverModels")),
        (
            "Seeds",
            " ".join(f"{k}={v}" for k, v in sorted(seeds.items(), key=_seed_order))
            if isinstance(seeds, dict)
            else seeds,
        ),
        (
            "Task hashes",
            ", ".join(f"{k}={str(v)[:16]}" for k, v in hashes.items())
            if isinstance(hashes, dict)
            else hashes,
        ),
        ("Argv", " ".join(str(a) for a in argv) if isinstance(argv, list) else argv),
    ]
    return [(label, str(value)) for label, value in lines if value not in (None, "", [], {})]


def item_scores_text(job: dict[str, Any]) -> str:
    """status.itemScores in words: where they are kept and how many, or why none."""
    found = status(job).get("itemScores")
    if not isinstance(found, dict):
        return ""
    stored = str(found.get("stored") or "None")
    counts = (
        f"{found.get('tasks', 0)} tasks, {found.get('items', 0)} items, "
        f"{found.get('bytes', 0)} bytes"
    )
    message = str(found.get("message") or "")
    if stored == "None":
        return f"none{': ' + message if message else ''}"
    return f"{stored} ({counts}){': ' + message if message else ''}"


def gate_condition(job: dict[str, Any]) -> dict[str, Any] | None:
    """The regression gate's condition (type Regressed), when the job has one."""
    return next((c for c in conditions(job) if c.get("type") == "Regressed"), None)
