"""The merge of a sharded job: one results file from the shards' per-sample outputs.

Why this module exists: an unsharded lm_eval run computes its results from
per-document metric values (``evaluate`` collects them, then
``evaluator_utils._process_results`` aggregates tasks and groups). The
shards (:mod:`driver.shards`) wrote exactly those values, per document, in
their samples files. The merge reads them back, checks that the shards
are complete, were made for this job's inputs and cover every task's
documents exactly once, sorts them by document (an unsharded run's order:
bootstrap standard errors resample by position, and float sums depend on
order), and calls lm_eval's own aggregation on them, groups included. The
results file and the samples files go where lm_eval's EvaluationTracker
puts an unsharded run's, under ``--output_path``; what the shards did is in
``shards.json`` beside them, not in the results (which equal an unsharded
run's).

The sums are lm_eval 0.4.13's private ``_process_results`` and ``EvalAcc``:
tests/driver/test_shards.py checks the merged results against an unsharded
run's, field by field.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from driver.contract import SHARDS_RECORD
from driver.shardplan import (
    DONE_FILE,
    OUTPUT_PREFIX,
    SAMPLES_FILE,
    Job,
    ShardingRefusedError,
    changed_inputs,
    check_shardable,
    digest,
    job_inputs,
    lm_eval_module,
    load_job,
    parse_lm_eval_args,
    read_json,
    shard_dir,
    shard_samples,
    termination_message,
)

SHARDS_FILE = SHARDS_RECORD
# The keys of an lm_eval results file that the merge computes; the others
# (config, versions of the environment...) come from shard 0's.
_COMPUTED = (
    "results",
    "groups",
    "group_subtasks",
    "configs",
    "versions",
    "n-shot",
    "higher_is_better",
    "n-samples",
)


@dataclass
class Shard:
    """One finished shard's outputs."""

    index: int
    done: dict[str, Any]
    results: dict[str, Any]  # its lm_eval results file
    rows: dict[str, list[dict[str, Any]]]  # task -> its samples file's rows


def _refuse(message: str) -> ShardingRefusedError:
    return ShardingRefusedError(message)


def _plain_name(value: object) -> str | None:
    """`value` if it names a file of the directory itself (no path), else None."""
    if isinstance(value, str) and value and os.path.basename(value) == value and value != "..":
        return value
    return None


def read_rows(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def read_done(root: str, index: int, count: int) -> dict[str, Any]:
    """Shard `index`'s done.json; refused when the shard has not finished as one of `count`."""
    directory = shard_dir(root, index)
    done = read_json(os.path.join(directory, DONE_FILE))
    if not isinstance(done, dict):
        raise _refuse(
            f"shard {index} has not finished: no {DONE_FILE} in {directory} (run the shard again)"
        )
    if done.get("index") != index or done.get("count") != count:
        raise _refuse(
            f"shard {index}'s outputs are those of shard {done.get('index')} of "
            f"{done.get('count')}, not of {count}: run the shard again"
        )
    return done


def read_shard(
    root: str, index: int, done: dict[str, Any], job: Job, inputs: dict[str, Any]
) -> Shard:
    """Shard `index`'s outputs, checked against this merge's job; refused when unusable."""
    directory = shard_dir(root, index)
    count = int(done["count"])
    record = done.get("inputs")
    made_for = record.get("job") if isinstance(record, dict) else None
    if made_for != inputs:
        changed = changed_inputs(made_for if isinstance(made_for, dict) else {}, inputs)
        raise _refuse(
            f"shard {index} was evaluated with other {', '.join(changed) or 'inputs'} than this "
            "merge's: run the shard again"
        )
    output = _plain_name(done.get("output"))
    results_name = _plain_name(done.get("results"))
    if output is None or not output.startswith(OUTPUT_PREFIX) or results_name is None:
        raise _refuse(f"shard {index}'s {DONE_FILE} is incomplete: run the shard again")
    out = os.path.join(directory, output)
    samples = read_json(os.path.join(out, SAMPLES_FILE))
    if samples is None or digest(samples) != done.get("samples_sha256"):
        raise _refuse(f"shard {index}'s document list is missing or changed: run it again")
    if samples != shard_samples(job, index, count):
        raise _refuse(
            f"shard {index} evaluated other documents than its share of {count} shards "
            "(the tasks' sizes changed?): run it again"
        )
    results = read_json(os.path.join(out, results_name))
    names = done.get("samples")
    if not isinstance(results, dict) or not isinstance(names, dict):
        raise _refuse(f"shard {index}'s results file is missing: run it again")
    rows: dict[str, list[dict[str, Any]]] = {}
    for task in job.tasks:
        name = _plain_name(names.get(task))
        try:
            rows[task] = read_rows(os.path.join(out, name)) if name else []
        except (OSError, ValueError):
            rows[task] = []
        by_filter: dict[str, list[int]] = defaultdict(list)
        for row in rows[task]:
            by_filter[str(row.get("filter"))].append(row.get("doc_id", -1))
        if not by_filter or any(ids != samples[task] for ids in by_filter.values()):
            raise _refuse(
                f"shard {index}'s samples of task {task} are not the documents it was given: "
                "run it again"
            )
    return Shard(index, done, results, rows)


def check_partition(job: Job, shards: Sequence[Shard]) -> None:
    """Refuse unless the shards' documents are each task's documents, each exactly once."""
    for name, plan in job.plans.items():
        ids = sorted(doc for shard in shards for doc in {row["doc_id"] for row in shard.rows[name]})
        if ids != list(range(plan.documents)):
            raise _refuse(
                f"the shards' documents of task {name} are not its {plan.documents} documents "
                "each exactly once: run the shards again"
            )


def merge_rows(job: Job, shards: Sequence[Shard]) -> dict[str, list[dict[str, Any]]]:
    """Each task's rows as an unsharded run orders them: by filter, then by document."""
    merged: dict[str, list[dict[str, Any]]] = {}
    for name in job.tasks:
        rows = [row for shard in shards for row in shard.rows[name]]
        filters = list(dict.fromkeys(str(row["filter"]) for row in shards[0].rows[name]))
        merged[name] = [
            row
            for key in filters
            for row in sorted((r for r in rows if r["filter"] == key), key=lambda r: r["doc_id"])
        ]
    return merged


def aggregate(job: Job, rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """lm_eval's own aggregation of the per-document values, as its evaluator calls it."""
    accumulators: dict[str, Any] = {}
    for name, task in job.tasks.items():
        raw: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for row in rows[name]:
            for metric in row["metrics"]:
                raw[(metric, row["filter"])].append(row[metric])
        accumulators[name] = {"task": task, "raw_metrics": raw, "logged_samples": rows[name]}
    evaluator = lm_eval_module("lm_eval.evaluator")
    evaluator_utils = lm_eval_module("lm_eval.evaluator_utils")
    # lm_eval's CLI never sets bootstrap_iters: simple_evaluate's default applies.
    iters = inspect.signature(evaluator.simple_evaluate).parameters["bootstrap_iters"].default
    eval_acc = evaluator_utils._process_results(accumulators, job.groups, iters)
    merged: dict[str, Any] = eval_acc._to_eval_results(samples=None)
    return merged


def compose(job: Job, computed: dict[str, Any], shards: Sequence[Shard]) -> dict[str, Any]:
    """The results file's content: `computed`, then the rest as shard 0 has it."""
    base = shards[0].results
    tracker_fields = {f.name for f in dataclasses.fields(_tracker_class())}
    results = dict(computed)
    # Metrics that lm_eval's process_results adds to a task at run time (a
    # metric returning a dict) are unknown to the merge's fresh tasks.
    for task, directions in base.get("higher_is_better", {}).items():
        if isinstance(directions, dict):
            for metric, value in directions.items():
                results["higher_is_better"].setdefault(task, {}).setdefault(metric, value)
    for key, value in base.items():
        if key not in _COMPUTED and key not in tracker_fields and key != "task_hashes":
            results[key] = value
    config = dict(base.get("config") or {})
    config.update(limit=job.cfg.limit, use_cache=job.cfg.use_cache)  # the job's, not a shard's
    results["config"] = config
    dates = [s.results["date"] for s in shards if isinstance(s.results.get("date"), int | float)]
    if dates:
        results["date"] = min(dates)
    return results


def _tracker_class() -> Any:
    return lm_eval_module("lm_eval.loggers.evaluation_tracker").GeneralConfigTracker


def write_outputs(
    job: Job, results: dict[str, Any], rows: dict[str, list[dict[str, Any]]], base: dict[str, Any]
) -> str:
    """Write the results (and samples) files as lm_eval's CLI does; the results file's path."""
    loggers = lm_eval_module("lm_eval.loggers")
    utils = lm_eval_module("lm_eval.utils")
    cfg = job.cfg
    tracker = loggers.EvaluationTracker(output_path=cfg.output_path)
    general = tracker.general_config_tracker
    for field in dataclasses.fields(general):
        if field.name != "total_evaluation_time_seconds" and field.name in base:
            setattr(general, field.name, base[field.name])
    # task_hashes come from the samples, which lm_eval's CLI passes with --log_samples only.
    tracker.save_results_aggregated(results=results, samples=rows if cfg.log_samples else None)
    date_id = getattr(tracker, "date_id", None)
    directory = os.path.join(str(cfg.output_path), str(general.model_name_sanitized))
    path = os.path.join(directory, f"results_{date_id}.json")
    if date_id is None or not os.path.isfile(path):
        raise RuntimeError(f"lm_eval could not write the merged results under {cfg.output_path}")
    if cfg.log_samples:
        for task in results["configs"]:
            with open(
                os.path.join(directory, f"samples_{task}_{date_id}.jsonl"), "w", encoding="utf-8"
            ) as out:
                for row in rows[task]:  # as read: lm_eval's sanitized rows, dumped as it dumps them
                    out.write(
                        json.dumps(row, default=utils.handle_non_serializable, ensure_ascii=False)
                        + "\n"
                    )
    return path


def merge_shards(count: int, root: str, lm_args: Sequence[str]) -> int:
    """Merge the `count` shards under `root` into the job's results."""
    lm_eval_module("lm_eval.utils").setup_logging()
    args = parse_lm_eval_args(lm_args)
    done = [read_done(root, index, count) for index in range(count)]  # before the slow part
    job = load_job(args)
    check_shardable(job, count)
    inputs = job_inputs(job)
    shards = [read_shard(root, index, done[index], job, inputs) for index in range(count)]
    check_partition(job, shards)
    rows = merge_rows(job, shards)
    results = compose(job, aggregate(job, rows), shards)
    path = write_outputs(job, results, rows, shards[0].results)
    documents = sum(plan.documents for plan in job.plans.values())
    requests = sum(int(s.done.get("requests") or 0) for s in shards)
    cached = sum(int(s.done.get("cached") or 0) for s in shards)
    summary = (
        f"merged {count} shards: {len(job.tasks)} tasks, {documents} documents; "
        f"{cached} of {requests} requests were answered from the shards' caches"
    )
    keep = (
        "documents",
        "requests",
        "cached",
        "sent",
        "rejected",
        "resumed",
        "started_clean",
        "samples_sha256",
    )
    record = {
        "count": count,
        "results": os.path.basename(path),
        "summary": summary,
        "shards": [
            {
                "index": s.index,
                **{key: s.done.get(key) for key in keep},
                "rows": {task: len(task_rows) for task, task_rows in s.rows.items()},
                "shard_summary": s.done.get("summary"),
                "evaluation_seconds": s.results.get("total_evaluation_time_seconds"),
            }
            for s in shards
        ],
    }
    with open(os.path.join(os.path.dirname(path), SHARDS_FILE), "w", encoding="utf-8") as out:
        json.dump(record, out, indent=1, ensure_ascii=False)
    print(f"shards: {summary}", file=sys.stderr, flush=True)
    termination_message(summary)
    return 0
