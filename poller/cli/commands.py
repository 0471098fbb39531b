"""The commands that read and steer jobs: submit, list, get, results, compare,
cancel, suspend and resume (logs and wait, which poll, are in ``follow``).

Why this module exists: each command is a short script over ``Cluster``
(requests), ``facts`` (facts) and ``render`` (printing), and they share one
rule: a job named by a person is looked up with ``client.fetch_job``, so a
missing job is reported with the names it was probably meant to be (difflib
over the namespace's jobs) or the namespace it lives in, never as a bare
404. Results come from the job's status, or from its results ConfigMap when
status holds a reduced copy and the complete document is asked for; the
ConfigMap is read only through ``client.results_configmap``, which refuses
one the job does not control (exit 8) before anything of it is shown. Every
command returns its exit code; errors travel as ``CliError``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from poller import api, timefmt
from poller.cli import facts, follow, paired, render, rerun, submit
from poller.cli.client import Cluster, fetch_job, results_configmap, split_ref
from poller.cli.errors import ApiError, CliError, ExitCode, explain
from poller.results import RESULTS_GZ_KEY, RESULTS_KEY, packed_results_text

__all__ = [
    "cmd_compare",
    "cmd_get",
    "cmd_list",
    "cmd_patch",
    "cmd_rerun",
    "cmd_results",
    "cmd_submit",
]


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except ApiError as error:
        raise explain(error) from error


# -- submit --------------------------------------------------------------------


def cmd_submit(args: argparse.Namespace, cluster: Cluster | None, out: render.Output) -> int:
    from_flags = not args.filename
    jobs = [submit.build_from_flags(args)] if from_flags else submit.load_files(args)
    for number, job in enumerate(jobs, start=1):
        where = "" if len(jobs) == 1 else f"job {number}"
        submit.validate(job, from_flags=from_flags, where=where)
    if args.wait and len(jobs) != 1:
        raise CliError("--wait follows one job; the file holds several", ExitCode.USAGE)
    if args.dry_run == "client":
        for job in jobs:
            if args.namespace:
                job["metadata"]["namespace"] = args.namespace
        fmt = "json" if args.output == "json" else "yaml"
        if len(jobs) == 1:
            out.write(render.dump(jobs[0], fmt))
        elif fmt == "json":
            out.write(render.dump({"apiVersion": "v1", "kind": "List", "items": jobs}, fmt))
        else:
            out.write("---\n".join(render.dump(job, fmt) for job in jobs))
        return ExitCode.OK
    assert cluster is not None
    created_jobs = []
    for job in jobs:
        namespace = str(job["metadata"].get("namespace") or cluster.namespace)
        created = _call(cluster.create_job, job, namespace, server_dry_run=args.dry_run == "server")
        created_jobs.append(created)
        meta = created["metadata"]
        if args.output in ("yaml", "json"):
            out.write(render.dump(created, args.output))
        elif args.output == "name":
            out.write(f"lmevaljob/{meta['name']}")
        else:
            suffix = " (server dry run)" if args.dry_run == "server" else ""
            out.write(f"lmevaljob/{meta['name']} created in namespace {meta['namespace']}{suffix}")
    if args.wait and args.dry_run is None:
        meta = created_jobs[0]["metadata"]
        return follow.wait_job(
            cluster,
            out,
            str(meta["name"]),
            str(meta["namespace"]),
            want=args.wait_for,
            timeout=follow.timeout_seconds(args.timeout),
            interval=args.interval,
        )
    return ExitCode.OK


# -- rerun ---------------------------------------------------------------------


def cmd_rerun(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    namespace, name = split_ref(args.name, cluster.namespace)
    job = fetch_job(cluster, name, namespace)
    if facts.state(job) != api.JobState.COMPLETE.value:
        raise CliError(
            f"lmevaljob/{name} has not finished (state {facts.state(job) or 'New'}): rerun "
            "copies finished jobs; cancel it first, or wait for it",
            ExitCode.USAGE,
        )
    body = rerun.rerun_body(job, args.new_name)
    submit.validate(body, from_flags=False)
    created = _call(cluster.create_job, body, namespace, server_dry_run=args.dry_run == "server")
    meta = created["metadata"]
    if args.output in ("yaml", "json"):
        out.write(render.dump(created, args.output))
    elif args.output == "name":
        out.write(f"lmevaljob/{meta['name']}")
    else:
        suffix = " (server dry run)" if args.dry_run == "server" else ""
        out.write(
            f"lmevaljob/{meta['name']} created in namespace {meta['namespace']}, "
            f"a rerun of {name}{suffix}"
        )
    if args.wait and args.dry_run is None:
        return follow.wait_job(
            cluster,
            out,
            str(meta["name"]),
            str(meta["namespace"]),
            want=args.wait_for,
            timeout=follow.timeout_seconds(args.timeout),
            interval=args.interval,
        )
    return ExitCode.OK


# -- list and get --------------------------------------------------------------


def cmd_list(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    namespace = None if args.all_namespaces else cluster.namespace
    jobs = _call(cluster.list_jobs, namespace, args.selector)
    jobs.sort(key=lambda j: (j["metadata"].get("namespace", ""), j["metadata"]["name"]))
    if args.output in ("json", "yaml"):
        out.write(render.dump({"apiVersion": "v1", "kind": "List", "items": jobs}, args.output))
        return ExitCode.OK
    if not jobs:
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        out.note(f"No LMEvalJobs found in {where}.")
        return ExitCode.OK
    grid = render.jobs_grid(
        jobs, all_namespaces=namespace is None, wide=args.output == "wide", now=timefmt.now()
    )
    out.show(render.grid_table(grid, right=("PROGRESS", "AGE")))
    return ExitCode.OK


def cmd_get(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    namespace, name = split_ref(args.name, cluster.namespace)
    job = fetch_job(cluster, name, namespace)
    if args.output in ("json", "yaml"):
        out.write(render.dump(job, args.output))
        return ExitCode.OK
    events: list[dict[str, Any]] | None
    note = ""
    try:
        events = cluster.list_events(name, namespace, str(job["metadata"].get("uid") or ""))
    except ApiError as error:
        events, note = None, f"(not shown: {explain(error).message})"
    for part in render.details(job, events, note, timefmt.now()):
        out.show(part)
    return ExitCode.OK


# -- results and compare -------------------------------------------------------


def _results_configmap(cluster: Cluster, job: dict[str, Any]) -> dict[str, Any] | None:
    """The job's results ConfigMap, or None (absent, or no right to read it).

    One that is not the job's is an error (CliError, exit 8), never None: the
    command stops before it shows anything, rather than fall back quietly.
    """
    try:
        return results_configmap(cluster, job)
    except ApiError:
        return None


def _configmap_results(
    cluster: Cluster, job: dict[str, Any], found: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    found = found if found is not None else _results_configmap(cluster, job)
    if not found:
        return None
    text = (found.get("data") or {}).get(RESULTS_KEY)
    packed = (found.get("binaryData") or {}).get(RESULTS_GZ_KEY)
    try:
        if text is None and isinstance(packed, str):
            text = packed_results_text(packed)
        parsed = json.loads(text) if text else None
    except ValueError:  # not JSON, or a packed value that is no gzip of results
        return None
    return parsed if isinstance(parsed, dict) else None


def results_of(cluster: Cluster, job: dict[str, Any], *, complete: bool = False) -> dict[str, Any]:
    """The job's results JSON: status first, the ConfigMap when status is reduced."""
    results = facts.job_results(job)
    reduced = bool(facts.status(job).get("resultsReduced"))
    if results is None or results.get("truncated") or (reduced and complete):
        results = _configmap_results(cluster, job) or results
    if results is None:
        name = job["metadata"]["name"]
        state, reason = facts.state(job), facts.reason(job)
        shown = f"{state}/{reason}" if reason else state
        message = facts.status(job).get("message")
        raise CliError(
            f"LMEvalJob {name} has no results (state {shown})"
            + (f": {message}" if message and reason != "Succeeded" else ""),
            ExitCode.NOT_FOUND,
        )
    return results


def _print_grid(out: render.Output, grid: render.Grid, fmt: str, right: tuple[str, ...]) -> None:
    if fmt == "csv":
        out.write(render.grid_csv(grid))
    elif fmt == "markdown":
        out.write(render.grid_markdown(grid))
    else:
        out.show(render.grid_table(grid, right=right))


def cmd_results(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    namespace, name = split_ref(args.name, cluster.namespace)
    job = fetch_job(cluster, name, namespace)
    results = results_of(cluster, job, complete=args.output == "json")
    if args.output == "json":
        out.write(json.dumps(results, indent=2))
        return ExitCode.OK
    rows = facts.score_rows(results, facts.spec(job).get("tasks"))
    _print_grid(out, render.scores_grid(rows), args.output, ("VALUE", "STDERR"))
    return ExitCode.OK


def _score_table(
    labels: list[str], columns: list[dict[tuple[str, str, str], facts.ScoreRow]]
) -> tuple[list[tuple[str, str, str]], list[dict[str, Any]]]:
    order: list[tuple[str, str, str]] = []
    for column in columns:
        order += [key for key in column if key not in order]
    table = [
        {
            "task": task,
            "metric": metric,
            "filter": filt,
            "values": {
                label: (
                    col[(task, metric, filt)].as_dict() if (task, metric, filt) in col else None
                )
                for label, col in zip(labels, columns, strict=True)
            },
        }
        for task, metric, filt in order
    ]
    return order, table


def _side(cluster: Cluster, job: dict[str, Any], label: str) -> tuple[paired.Side, str]:
    """One job for the paired comparison, and why it cannot be paired ("" when it can)."""
    state = facts.state(job)
    if state != api.JobState.COMPLETE.value:
        return paired.Side(label, None, None), f"{label} has not finished (state {state})"
    configmap = _results_configmap(cluster, job)
    results = _configmap_results(cluster, job, configmap) if configmap else None
    items, why = facts.item_scores(job, configmap)
    side = paired.Side(
        label, results or facts.job_results(job), items, facts.provenance(job, configmap)
    )
    return side, why and f"{label}: {why}"


def cmd_compare(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    refs = [split_ref(ref, cluster.namespace) for ref in args.names]
    labels = [name if space == cluster.namespace else f"{space}/{name}" for space, name in refs]
    fetched = [fetch_job(cluster, name, space) for space, name in refs]
    columns: list[dict[tuple[str, str, str], facts.ScoreRow]] = []
    for job, label in zip(fetched, labels, strict=True):
        try:
            rows = facts.score_rows(results_of(cluster, job), facts.spec(job).get("tasks"))
        except CliError as error:
            if error.code != ExitCode.NOT_FOUND:  # a results ConfigMap not the job's
                raise
            out.note(f"{label}: {error.message}")
            rows = []
        columns.append({(r.task, r.metric, r.filter): r for r in rows})
    order, table = _score_table(labels, columns)
    report: paired.Report | None = None
    if len(fetched) != 2:
        why_not = "a paired test compares exactly two jobs"
    else:
        sides = [_side(cluster, job, label) for job, label in zip(fetched, labels, strict=True)]
        why_not = "; ".join(why for _, why in sides if why)
        if not why_not:
            report = paired.compare_sides(
                sides[0][0],
                sides[1][0],
                tasks=args.task or (),
                metrics=args.metric or (),
                confidence=args.confidence,
                task_order=[str(t) for t in facts.spec(fetched[0]).get("tasks") or []],
            )
    if report is None and not order:
        raise CliError("none of these jobs has results to compare", ExitCode.NOT_FOUND)
    if args.output == "json":
        document: dict[str, Any] = {"jobs": labels, "scores": table}
        if report is not None:
            document["paired"] = [row.as_dict() for row in report.rows]
            document["warnings"] = report.warnings
        else:
            document["paired"] = None
            document["noPairedTest"] = why_not
        out.write(json.dumps(document, indent=2))
        return ExitCode.OK
    if report is None:
        headers = ["TASK", "METRIC", "FILTER", *labels]
        grid_rows = []
        for key in order:
            values = [facts.format_value(col[key].value) if key in col else "-" for col in columns]
            grid_rows.append([*key, *values])
        _print_grid(out, (headers, grid_rows), args.output, tuple(labels))
        out.note(f"no paired test: {why_not}")
        return ExitCode.OK
    if not report.rows:
        raise CliError(
            "no per-item scores match --task/--metric (in either job)", ExitCode.NOT_FOUND
        )
    grid, notes = render.paired_grid(report, footnotes=args.output == "table")
    if args.output == "table":
        out.write(render.paired_heading(labels[0], labels[1], args.confidence))
    _print_grid(out, grid, args.output, render.PAIRED_RIGHT)
    if args.output == "table":
        for line in render.paired_notes(report, notes):
            out.write(line)
    else:
        for warning in report.warnings:
            out.note(f"warning: {render.safe(warning)}")
    return ExitCode.OK


# -- cancel, suspend, resume ---------------------------------------------------

_PATCHES = {
    "cancel": ({"spec": {"cancel": True}}, "cancel requested: the poller stops it"),
    "suspend": ({"spec": {"suspend": True}}, "suspend requested: the poller deletes its pod"),
    "resume": ({"spec": {"suspend": False}}, "resumed: the poller starts a fresh pod"),
}


def cmd_patch(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    patch, words = _PATCHES[args.command]
    for ref in args.names:
        namespace, name = split_ref(ref, cluster.namespace)
        job = fetch_job(cluster, name, namespace)
        if facts.state(job) == api.JobState.COMPLETE.value:
            out.note(
                f"lmevaljob/{name} already finished ({facts.reason(job) or 'Complete'}): "
                f"nothing to {args.command}"
            )
            continue
        _call(cluster.patch_job, name, namespace, patch)
        out.write(f"lmevaljob/{name} {words}")
    return ExitCode.OK
