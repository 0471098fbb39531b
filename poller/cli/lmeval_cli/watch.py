"""``lmeval list -w`` and ``lmeval get -w``: the table, then a line per change.

Why this module exists: kubectl's ``-w/--watch`` is how people keep an eye
on running work, and it needs state a one-shot print does not (what was
already shown, the table's column widths). It polls, like ``wait`` and
``logs -f``, rather than opening the API's watch stream: every interval it
lists the jobs again (one paged request per namespace, answered from the
apiserver's cache of a handful of objects) and prints a row for each job
whose row changed. Polling needs no reconnect logic, survives proxies and
load balancers that cut idle long-lived connections (a watch would stop
printing silently), never has to handle an expired resourceVersion (410)
by listing again anyway, and uses only the requests and the ``list`` right
the rest of the CLI already relies on. What it gives up is instant
delivery: a change shows within ``--interval`` seconds (1 by default), and
a job that changes twice within one interval is printed once, in its
latest state. A row changes when any of its cells but AGE does (AGE moves
every second and would print every job on every poll). Jobs that are
deleted are dropped silently, as kubectl does. In json, yaml, name and
jsonpath formats each changed job is printed whole (its resourceVersion
changed). The command runs until interrupted (Ctrl-C: exit 130).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from lmeval_cli import output, render, selection
from lmeval_cli.client import Cluster
from lmeval_cli.errors import ApiError, explain
from poller.cliapi import timefmt

__all__ = ["selected_now", "watch_jobs"]

COLUMN_GAP = 3  # as rich's tables (render.grid_table) and kubectl's tabwriter


def _line(cells: Sequence[str], widths: list[int], right: Sequence[bool]) -> str:
    padded = [
        cell.rjust(width) if on_right else cell.ljust(width)
        for cell, width, on_right in zip(cells, widths, right, strict=True)
    ]
    return (" " * COLUMN_GAP).join(padded).rstrip()


def selected_now(cluster: Cluster, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The jobs `get` selects, read again: by -l, or the named ones that exist."""
    if not args.names:
        return selection.select_jobs(cluster, args).jobs
    wanted = selection.refs(args, cluster)
    jobs: list[dict[str, Any]] = []
    for namespace in dict.fromkeys(space for space, _ in wanted):
        try:
            listed = cluster.list_jobs(namespace)
        except ApiError as error:
            raise explain(error) from error
        names = {name for space, name in wanted if space == namespace}
        jobs += [j for j in listed if j["metadata"]["name"] in names]
    order = {ref: number for number, ref in enumerate(wanted)}
    return sorted(jobs, key=lambda j: order[(j["metadata"]["namespace"], j["metadata"]["name"])])


class _Rows:
    """Turns jobs into the lines of the table format (jobs table, wide, custom-columns)."""

    def __init__(self, fmt: output.Format | None, *, all_namespaces: bool) -> None:
        self.fmt = fmt
        self.all_namespaces = all_namespaces
        self.widths: list[int] = []
        self.right: list[bool] = []
        self.age_column = -1

    def grid(self, jobs: list[dict[str, Any]]) -> render.Grid:
        if self.fmt is not None and self.fmt.name == "custom-columns":
            return output.columns_grid(self.fmt.columns, jobs)
        wide = self.fmt is not None and self.fmt.name == "wide"
        return render.jobs_grid(
            jobs, all_namespaces=self.all_namespaces, wide=wide, now=timefmt.now()
        )

    def size(self, grid: render.Grid) -> None:
        headers, rows = grid
        self.widths = [max(len(c) for c in column) for column in zip(headers, *rows, strict=True)]
        self.right = [h in render.JOBS_RIGHT and self._jobs_table() for h in headers]
        self.age_column = headers.index("AGE") if "AGE" in headers and self._jobs_table() else -1

    def _jobs_table(self) -> bool:
        return self.fmt is None or self.fmt.name == "wide"

    def line(self, cells: Sequence[str]) -> str:
        return _line(cells, self.widths, self.right)

    def key(self, cells: Sequence[str]) -> tuple[str, ...]:
        return tuple(c for number, c in enumerate(cells) if number != self.age_column)


def watch_jobs(
    out: render.Output,
    args: argparse.Namespace,
    fetch: Callable[[], list[dict[str, Any]]],
    *,
    all_namespaces: bool,
) -> int:
    """Print the jobs `fetch` returns, then every change, until interrupted."""
    fmt: output.Format | None = args.output
    table = fmt is None or fmt.name in ("wide", "custom-columns")
    rows = _Rows(fmt, all_namespaces=all_namespaces)
    shown: dict[str, tuple[str, ...]] = {}
    jobs = fetch()
    if table:
        grid = rows.grid(jobs)
        rows.size(grid)
        if not args.no_headers:
            out.write(rows.line(grid[0]))
    first = True
    while True:
        cells_of = dict(zip(_uids(jobs), rows.grid(jobs)[1], strict=True)) if table else {}
        for uid, job in zip(_uids(jobs), jobs, strict=True):
            key = rows.key(cells_of[uid]) if table else (_version(job),)
            if shown.get(uid) == key:
                continue
            shown[uid] = key
            if first and args.watch_only:
                continue
            if table:
                out.write(rows.line(cells_of[uid]))
            else:
                assert fmt is not None
                output.print_objects(out, fmt, [job], single=True)
        for uid in set(shown) - set(_uids(jobs)):  # deleted: forgotten, as kubectl
            del shown[uid]
        first = False
        time.sleep(args.interval)
        jobs = fetch()


def _uids(jobs: list[dict[str, Any]]) -> list[str]:
    return [str(j["metadata"].get("uid") or j["metadata"]["name"]) for j in jobs]


def _version(job: dict[str, Any]) -> str:
    return str(job["metadata"].get("resourceVersion") or "")
