"""Where an evaluation's results go: the job's status and its results ConfigMap.

Status must stay small (every LIST of jobs carries it, and etcd objects are
capped at about 1.5 MiB), while a results JSON for a large task group is
dominated by the echoed task configs. So status gets the results reduced to a
budget, dropping the bulky, reproducible parts first, and the complete JSON
goes to a ConfigMap owned by the job (gzip'd into binaryData when it would
not fit as text). The numeric scores are read back out of a results JSON
once, when a job's view is built (`parse_scores`), so that neither the
decisions nor the metrics hold the text itself. How scores are read from
lm_eval's JSON is decided once, here (`iter_score_rows`): the metrics, the
CLI's tables and the sandbox's table all use it. Pure functions: the
actuator does the writing.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from sys import intern
from typing import Any

from driver.protocol import MAX_RESULTS_BYTES, parse_results_json, redact_json
from poller import api

__all__ = [
    "CONFIGMAP_DATA_MAX",
    "ITEMS_KEY",
    "LOG_ARCHIVE_KEY",
    "MAX_SCORES_PER_JOB",
    "PROVENANCE_KEY",
    "RESULTS_GZ_KEY",
    "RESULTS_KEY",
    "STATUS_RESULTS_BUDGET",
    "Score",
    "ScoreRow",
    "configmap_data_bytes",
    "gunzip_base64",
    "gzip_base64",
    "iter_score_rows",
    "packed_results_text",
    "parse_scores",
    "reduce_results",
    "results_configmap",
    "results_configmap_name",
    "score_rows",
    "without_secrets",
]

STATUS_RESULTS_BUDGET = 256 * 1024
# Scores read from one job's results (each becomes a metric series and a
# Score kept for every listed job). lm_eval's largest suites have a few
# hundred (MMLU: 62 tasks and groups, acc and its stderr each); a job's
# author could otherwise make 256 KB of status into about 10,000 series.
MAX_SCORES_PER_JOB = 1000
CONFIGMAP_TEXT_LIMIT = 900 * 1024
# What the apiserver accepts in one ConfigMap's data and binaryData together.
# Results whose compressed form is larger (possible for exec'd results, up to
# protocol.MAX_RESULTS_BYTES of text that need not compress) are stored
# reduced, as in status: a refused write would be retried every cycle.
CONFIGMAP_DATA_MAX = 1024 * 1024
RESULTS_KEY = "results.json"
# The results gzip'd into binaryData, when their text is too large for data.
RESULTS_GZ_KEY = RESULTS_KEY + ".gz"
# Beside the results: the per-item scores the driver sent (driver.itemscores'
# JSON, gzip'd) and the run's provenance (JSON text).
ITEMS_KEY = "items.json.gz"
PROVENANCE_KEY = "provenance.json"
LOG_ARCHIVE_KEY = "log-tail.txt"
# Dropped in this order until the JSON fits: echoed configs first, then
# provenance, never the scores themselves ("results", "groups").
_DROP_ORDER = (
    "configs",
    "config",
    "task_hashes",
    "samples",
    "git_hash",
    "pretty_env_info",
    "transformers_version",
    "upper_git_hash",
    "n-samples",
    "higher_is_better",
    "versions",
    "n-shot",
    "group_subtasks",
)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


# What of lm_eval's echo of its configuration is scanned for secrets: the run's
# "config" (model, model_args, gen_kwargs, seeds) and each task's entry in
# "configs" (dataset paths and kwargs), up to this many bytes of JSON in all.
# Redacting 1 MiB of text made to be slow took 0.9 s here (a key pattern tried
# at every position), and the rest is an echo: past the budget a task's
# config is left out (and counted) rather than kept unscanned. So is every
# task config past the first ECHO_SCAN_TASKS (lm_eval's largest suites have a few
# hundred tasks; 150,000 tiny ones, which the bytes allow, cost 1.4 s).
ECHO_SCAN_BUDGET = 1024 * 1024
ECHO_SCAN_TASKS = 2000
# The key under which "configs" says how many task configs were left out.
OMITTED_KEY = "(omitted)"
_PAST = "past the secret scan's budget"


def without_secrets(found: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of lm_eval's results with secrets hidden in its echoed configuration.

    lm_eval copies ``--model_args`` into ``config.model_args`` and dataset URLs
    into ``configs``: API keys, tokens and URL passwords a job's author put
    there. The results ConfigMap is read by more people than may read the
    job (any ConfigMap reader of the namespace, `lmeval results`), and
    status.results travels in every LIST of jobs, so both get this copy
    (driver.argv's redaction, the same as the started marker's argv).
    Scores, hashes and counts are untouched. Pure.
    """
    cleaned = dict(found)
    budget = ECHO_SCAN_BUDGET
    if "config" in found:
        size = len(_dumps(found["config"]))
        budget -= size
        cleaned["config"] = (
            redact_json(found["config"]) if budget >= 0 else f"(omitted: {size} bytes, {_PAST})"
        )
    configs = found.get("configs")
    if "configs" in found and not isinstance(configs, dict):
        cleaned["configs"] = "(omitted: not a mapping of task configs)"
    elif isinstance(configs, dict):
        kept: dict[str, Any] = {}
        for task, entry in configs.items():
            budget -= len(_dumps(entry))
            if len(kept) == ECHO_SCAN_TASKS or budget < 0:
                break
            kept[task] = redact_json(entry)
        if len(kept) < len(configs):
            kept[OMITTED_KEY] = f"{len(configs) - len(kept)} task configs, {_PAST}"
        cleaned["configs"] = kept
    return cleaned


def reduce_results(
    results: dict[str, Any], budget: int = STATUS_RESULTS_BUDGET
) -> tuple[str, bool]:
    """The results JSON as a string of at most `budget` bytes, and whether parts were dropped."""
    text = _dumps(results)
    if len(text.encode()) <= budget:
        return text, False
    reduced = dict(results)
    for key in _DROP_ORDER:
        if key in reduced:
            del reduced[key]
            text = _dumps(reduced)
            if len(text.encode()) <= budget:
                return text, True
    # Still too large (thousands of tasks): keep the scores of as many tasks as
    # fit. Sizes are added up task by task (re-serialising the kept scores for
    # each task took 25 s of CPU for 8000 tasks: results are the job author's).
    scores: dict[str, Any] = {}
    kept: dict[str, Any] = {"results": scores, "truncated": True}
    entries = results.get("results")
    size = len(_dumps(kept).encode())
    for task, metrics in (entries if isinstance(entries, dict) else {}).items():
        # '"task":{...}' and the comma before it (none before the first).
        entry = len(_dumps({task: metrics}).encode()) - 2 + (1 if scores else 0)
        if size + entry > budget:
            break
        scores[task] = metrics
        size += entry
    return _dumps(kept), True


def results_configmap_name(job_name: str) -> str:
    return f"{job_name[:245]}-results"


def results_configmap(
    *,
    namespace: str,
    job_name: str,
    job_uid: str,
    results: dict[str, Any] | None,
    labels: dict[str, str],
    extra_data: dict[str, str] | None = None,
    items: bytes | None = None,
    provenance: str | None = None,
    compress: bool = False,
) -> dict[str, Any]:
    """The ConfigMap that holds the complete results, owned by the job.

    Beside them, when given: the per-item scores (`items`, driver.itemscores
    JSON, stored gzip'd under ITEMS_KEY) and the provenance JSON text
    (PROVENANCE_KEY). The results go gzip'd into binaryData when their text
    is over CONFIGMAP_TEXT_LIMIT, or always with `compress` (to make room).
    """
    data: dict[str, str] = dict(extra_data or {})
    binary: dict[str, str] = {}
    if results is not None:
        text = json.dumps(results, indent=1, sort_keys=True)
        if len(text.encode()) <= CONFIGMAP_TEXT_LIMIT and not compress:
            data[RESULTS_KEY] = text
        else:
            binary[RESULTS_GZ_KEY] = gzip_base64(text.encode())
    if provenance is not None:
        data[PROVENANCE_KEY] = provenance
    if items is not None:
        binary[ITEMS_KEY] = gzip_base64(items)
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": results_configmap_name(job_name),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [api.job_owner_reference(job_name, job_uid)],
        },
        "data": data,
    }
    if binary:
        manifest["binaryData"] = binary
    return manifest


def gzip_base64(raw: bytes) -> str:
    """`raw` gzip'd (mtime 0: the same bytes every time) and base64'd, for binaryData."""
    return base64.b64encode(gzip.compress(raw, mtime=0)).decode()


def gunzip_base64(encoded: str, limit: int, key: str) -> bytes:
    """The inverse of `gzip_base64` for a binaryData value under `key`, inflated to
    at most `limit` bytes (a ConfigMap may hold a bomb: whoever can write one in
    the job's namespace may have made it). Raises ValueError saying what is wrong."""
    try:
        packed = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"{key} is not base64: {error}") from error
    inflate = zlib.decompressobj(wbits=31)  # gzip framing
    try:
        data = inflate.decompress(packed, limit + 1)
    except zlib.error as error:
        raise ValueError(f"{key} is not gzip: {error}") from error
    if len(data) > limit:
        raise ValueError(f"{key} holds more than {limit} bytes once decompressed")
    return data


def packed_results_text(encoded: str) -> str:
    """The results text under RESULTS_GZ_KEY, inflated to at most the results'
    own limit (protocol.MAX_RESULTS_BYTES). Raises ValueError saying what is wrong."""
    data = gunzip_base64(encoded, MAX_RESULTS_BYTES, RESULTS_GZ_KEY)
    try:
        return data.decode()
    except UnicodeDecodeError as error:
        raise ValueError(f"{RESULTS_GZ_KEY} is not UTF-8 text: {error}") from error


def configmap_data_bytes(manifest: dict[str, Any]) -> int:
    """The size the apiserver counts against CONFIGMAP_DATA_MAX (binaryData decoded)."""
    text = sum(len(value.encode()) for value in (manifest.get("data") or {}).values())
    binary = sum(len(value) * 3 // 4 for value in (manifest.get("binaryData") or {}).values())
    return text + binary


@dataclass(frozen=True, slots=True)
class Score:
    """One numeric score from lm_eval's results: ``results[task]["metric,filter"]``."""

    task: str
    metric: str
    filter: str
    value: float
    stderr: bool  # an ``<metric>_stderr`` value (metric holds the base name)


@dataclass(frozen=True, slots=True)
class ScoreRow:
    """One score as lm_eval wrote it, with its stderr: what a person reads in a table."""

    task: str
    metric: str
    filter: str
    value: Any  # a number, or whatever lm_eval wrote instead (a boolean, "N/A")
    stderr: Any  # ``results[task]["<metric>_stderr,filter"]``; None when absent

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def iter_score_rows(
    document: Mapping[str, Any], task_order: Iterable[str] | None = None
) -> Iterator[ScoreRow]:
    """Every (task, metric, filter) score of an lm_eval results JSON, with its stderr.

    The one reading of lm_eval's scores: the metrics (`parse_scores`), the
    CLI's tables and the sandbox's table all come from here, so they agree.
    Tasks are those of ``results`` and, for groups absent there (a results
    JSON may hold a group's scores only under ``groups``), those of
    ``groups``; ``results`` wins for a name in both (lm_eval 0.4.13 writes
    every group in ``results`` and the aggregating ones in ``groups`` too).
    Tasks named in `task_order` (the job's spec) come first, the rest in
    name order (so the cap on scores keeps the same ones every time).

    lm_eval 0.4 keys scores ``"metric,filter"``; keys without a comma
    (``alias``, ``name``, ``sample_len``) are metadata. Results older than
    0.4 have no filters at all: their numeric keys are scores, filter
    ``none``. ``<metric>_stderr`` keys are the stderr of ``<metric>``, never
    rows of their own. A task entry that is not an object is skipped.
    """
    tasks: dict[str, Any] = {}
    for section in ("groups", "results"):  # results win over groups
        entries = document.get(section)
        if isinstance(entries, dict):
            tasks.update(entries)
    first = [task for task in dict.fromkeys(task_order or ()) if task in tasks]
    named = set(first)
    for task in first + sorted(task for task in tasks if task not in named):
        entries = tasks[task]
        if not isinstance(entries, dict):
            continue
        filtered = any("," in key for key in entries)
        for key, value in entries.items():
            metric, comma, filter_name = key.partition(",")
            if metric.endswith("_stderr") or (filtered and not comma):
                continue
            if not filtered and not _is_number(value):
                continue
            filter_name = filter_name or "none"
            stderr = entries.get(f"{metric}_stderr,{filter_name}")
            yield ScoreRow(task, metric, filter_name, value, stderr)


def score_rows(
    document: Mapping[str, Any], task_order: Iterable[str] | None = None
) -> list[ScoreRow]:
    """`iter_score_rows` as a list."""
    return list(iter_score_rows(document, task_order))


def parse_scores(text: str | None) -> tuple[Score, ...]:
    """The numeric scores of an lm_eval results JSON, value and stderr apart.

    The rows of `iter_score_rows` whose value or stderr is a number (a
    boolean is not; ``"N/A"`` is skipped). Untrusted text (an admin may
    write any status): junk, and anything over the protocol's limits on
    results, gives () and never an exception; at most MAX_SCORES_PER_JOB
    scores are read.
    """
    if not text:
        return ()
    try:
        document = parse_results_json(text)
    except ValueError:  # junk, or deeper, wider or larger than results may be
        return ()
    scores: list[Score] = []
    for row in iter_score_rows(document):
        for value, stderr in ((row.value, False), (row.stderr, True)):
            if not _is_number(value):
                continue
            if len(scores) >= MAX_SCORES_PER_JOB:
                return tuple(scores)
            # Interned: every job of a suite repeats the same few names.
            task, metric, filter_name = intern(row.task), intern(row.metric), intern(row.filter)
            scores.append(Score(task, metric, filter_name, float(value), stderr))
    return tuple(scores)
