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
import time
from typing import Any

from lmeval_cli import facts, follow, output, paired, render, rerun, selection, submit, watch
from lmeval_cli.client import Cluster, fetch_job, results_configmap, split_ref
from lmeval_cli.errors import ApiError, CliError, ExitCode, explain
from poller.cliapi import RESULTS_GZ_KEY, RESULTS_KEY, api, packed_results_text, timefmt

__all__ = [
    "cmd_compare",
    "cmd_delete",
    "cmd_get",
    "cmd_list",
    "cmd_patch",
    "cmd_rerun",
    "cmd_results",
    "cmd_submit",
]


_YAML = output.Format("yaml")


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
        output.print_objects(out, args.output or _YAML, jobs, single=len(jobs) == 1)
        return ExitCode.OK
    assert cluster is not None
    created_jobs = []
    for job in jobs:
        namespace = str(job["metadata"].get("namespace") or cluster.namespace)
        created = _call(cluster.create_job, job, namespace, server_dry_run=args.dry_run == "server")
        created_jobs.append(created)
        meta = created["metadata"]
        if args.output is not None:
            output.print_objects(out, args.output, [created], single=True)
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
            timeout=args.timeout,
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
    if args.output is not None:
        output.print_objects(out, args.output, [created], single=True)
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
            timeout=args.timeout,
            interval=args.interval,
        )
    return ExitCode.OK


# -- list and get --------------------------------------------------------------


def _is_table(fmt: output.Format | None) -> bool:
    return fmt is None or fmt.name == "wide"


def _print_jobs(
    out: render.Output,
    args: argparse.Namespace,
    jobs: list[dict[str, Any]],
    *,
    all_namespaces: bool,
    single: bool = False,
) -> None:
    """Jobs as `list` prints them: a table (wide), or in an object format."""
    fmt = args.output
    if not _is_table(fmt):
        output.print_objects(out, fmt, jobs, single=single, no_headers=args.no_headers)
        return
    grid = render.jobs_grid(
        jobs,
        all_namespaces=all_namespaces,
        wide=fmt is not None and fmt.name == "wide",
        now=timefmt.now(),
    )
    out.show(render.grid_table(grid, right=render.JOBS_RIGHT, show_header=not args.no_headers))


def cmd_list(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    namespace = None if args.all_namespaces else cluster.namespace

    def fetch() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = _call(cluster.list_jobs, namespace, args.selector)
        return sorted(
            found, key=lambda j: (j["metadata"].get("namespace", ""), j["metadata"]["name"])
        )

    if args.watch or args.watch_only:
        return watch.watch_jobs(out, args, fetch, all_namespaces=namespace is None)
    jobs = fetch()
    # Like kubectl: an empty List in json/yaml/jsonpath, a remark on stderr otherwise.
    if not jobs and (args.output is None or args.output.name not in ("json", "yaml", "jsonpath")):
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        out.note(f"No LMEvalJobs found in {where}.")
        return ExitCode.OK
    _print_jobs(out, args, jobs, all_namespaces=namespace is None)
    return ExitCode.OK


def cmd_get(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    if args.watch or args.watch_only:
        if args.names:  # as kubectl, a name that matches no job is an error first
            chosen = selection.select_jobs(cluster, args)
            if not chosen.jobs:
                return selection.report_missing(out, chosen)
            selection.report_missing(out, chosen)
        return watch.watch_jobs(
            out,
            args,
            lambda: watch.selected_now(cluster, args),
            all_namespaces=args.all_namespaces,
        )
    chosen = selection.select_jobs(cluster, args)
    selection.none_found(out, chosen)
    if args.output is not None:
        # As kubectl: a selector that matched nothing is an empty List in json/yaml/jsonpath.
        empty_list = not args.names and args.output.name in ("json", "yaml", "jsonpath")
        if chosen.jobs or empty_list:
            _print_jobs(
                out,
                args,
                chosen.jobs,
                all_namespaces=args.all_namespaces,
                single=chosen.single,
            )
        return selection.report_missing(out, chosen)
    for number, job in enumerate(chosen.jobs):
        if number:
            out.write("")  # a blank line between two jobs' descriptions
        _describe(cluster, out, job)
    return selection.report_missing(out, chosen)


def _describe(cluster: Cluster, out: render.Output, job: dict[str, Any]) -> None:
    meta = job["metadata"]
    name, namespace = str(meta["name"]), str(meta["namespace"])
    events: list[dict[str, Any]] | None
    note = ""
    try:
        events = cluster.list_events(name, namespace, str(meta.get("uid") or ""))
    except ApiError as error:
        events, note = None, f"(not shown: {explain(error).message})"
    for part in render.details(job, events, note, timefmt.now()):
        out.show(part)


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


def _print_grid(
    out: render.Output,
    grid: render.Grid,
    fmt: str,
    right: tuple[str, ...],
    *,
    no_headers: bool = False,
) -> None:
    """A table in `fmt` (table, csv, markdown); --no-headers drops the header row."""
    if fmt == "csv":
        out.write(render.grid_csv(grid, show_header=not no_headers))
    elif fmt == "markdown":  # a Markdown table has no rows without its header
        out.write(render.grid_markdown(grid))
    else:
        out.show(render.grid_table(grid, right=right, show_header=not no_headers))


def _table_format(args: argparse.Namespace) -> str:
    fmt: output.Format | None = args.output
    return fmt.name if fmt is not None else "table"


def cmd_results(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    namespace, name = split_ref(args.name, cluster.namespace)
    job = fetch_job(cluster, name, namespace)
    fmt = _table_format(args)
    results = results_of(cluster, job, complete=fmt == "json")
    if fmt == "json":
        out.write(json.dumps(results, indent=2))
        return ExitCode.OK
    rows = facts.score_rows(results, facts.spec(job).get("tasks"))
    _print_grid(out, render.scores_grid(rows), fmt, ("VALUE", "STDERR"), no_headers=args.no_headers)
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
    fmt = _table_format(args)
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
    if fmt == "json":
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
        _print_grid(out, (headers, grid_rows), fmt, tuple(labels), no_headers=args.no_headers)
        out.note(f"no paired test: {why_not}")
        return ExitCode.OK
    if not report.rows:
        raise CliError(
            "no per-item scores match --task/--metric (in either job)", ExitCode.NOT_FOUND
        )
    grid, notes = render.paired_grid(report, footnotes=fmt == "table")
    if fmt == "table" and not args.no_headers:
        out.write(render.paired_heading(labels[0], labels[1], args.confidence))
    _print_grid(out, grid, fmt, render.PAIRED_RIGHT, no_headers=args.no_headers)
    if fmt == "table":
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
    chosen = selection.select_jobs(cluster, args)
    selection.none_found(out, chosen)
    patched = []
    for job in chosen.jobs:
        meta = job["metadata"]
        name, namespace = str(meta["name"]), str(meta["namespace"])
        if facts.state(job) == api.JobState.COMPLETE.value:
            out.note(
                f"lmevaljob/{name} already finished ({facts.reason(job) or 'Complete'}): "
                f"nothing to {args.command}"
            )
            continue
        patched.append(_call(cluster.patch_job, name, namespace, patch))
        if args.output is None:
            out.write(f"lmevaljob/{name} {words}")
    if args.output is not None and patched:
        output.print_objects(out, args.output, patched, single=chosen.single)
    return selection.report_missing(out, chosen)


# -- delete --------------------------------------------------------------------


def cmd_delete(args: argparse.Namespace, cluster: Cluster, out: render.Output) -> int:
    """kubectl delete's ways: names (NotFound is exit 4 unless --ignore-not-found) or -l/--all.

    Each job is deleted by its own request, and ``lmevaljob.<group>/NAME
    deleted`` printed; with --wait (the default) the command returns once
    every deleted job is gone (a finalizer can hold one).
    """
    selection.check_selection(args)
    if args.names:
        targets = selection.refs(args, cluster)
    else:
        chosen = selection.select_jobs(cluster, args)
        if selection.none_found(out, chosen):
            return ExitCode.OK
        targets = [
            (str(j["metadata"]["namespace"]), str(j["metadata"]["name"])) for j in chosen.jobs
        ]
    code = int(ExitCode.OK)
    gone: list[tuple[str, str, str]] = []
    for namespace, name in targets:
        try:
            deleted = cluster.delete_job(name, namespace)
        except ApiError as error:
            if error.status != 404 or not error.details.get("name"):
                raise explain(error) from error
            if args.ignore_not_found:
                continue
            code = _not_found(cluster, out, name, namespace) or code
            continue
        uid = str((deleted.get("metadata") or {}).get("uid") or "")
        gone.append((namespace, name, uid if deleted.get("kind") == api.KIND else ""))
        shown = f"{output.RESOURCE}/{name}"
        out.write(shown if args.output is not None else f"{shown} deleted")
    if args.wait and gone and not _wait_gone(cluster, out, gone, args.timeout, args.interval):
        return ExitCode.TIMEOUT
    return code


def _not_found(cluster: Cluster, out: render.Output, name: str, namespace: str) -> int:
    """Report a name that matched no job, with the names it probably meant."""
    try:
        fetch_job(cluster, name, namespace)
    except CliError as error:
        if error.code != ExitCode.NOT_FOUND:
            raise
        out.note(f"error: {error.message}")
        return int(ExitCode.NOT_FOUND)
    return int(ExitCode.OK)  # created again meanwhile: not the job that was asked for


def _wait_gone(
    cluster: Cluster,
    out: render.Output,
    jobs: list[tuple[str, str, str]],
    timeout: float | None,
    interval: float,
) -> bool:
    """Poll until each (namespace, name, uid) is gone (or replaced by a new job of its name)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(jobs)
    while True:
        for namespace, name, uid in list(pending):
            try:
                found = cluster.get_job(name, namespace)
            except ApiError as error:
                if error.status != 404:
                    raise explain(error) from error
                found = None
            if found is None or (uid and found["metadata"].get("uid") != uid):
                pending.remove((namespace, name, uid))
        if not pending:
            return True
        if deadline is not None and time.monotonic() >= deadline:
            for _, name, _ in pending:
                out.note(
                    f"timed out waiting for lmevaljob/{name} to be deleted (its finalizers: "
                    f"{', '.join(_finalizers(cluster, pending)) or 'none'})"
                )
            return False
        pause = interval
        if deadline is not None:
            pause = max(0.0, min(interval, deadline - time.monotonic()))
        time.sleep(pause)


def _finalizers(cluster: Cluster, pending: list[tuple[str, str, str]]) -> list[str]:
    found: list[str] = []
    for namespace, name, _ in pending:
        try:
            job = cluster.get_job(name, namespace)
        except ApiError:
            continue
        found += [str(f) for f in job["metadata"].get("finalizers") or [] if str(f) not in found]
    return found
