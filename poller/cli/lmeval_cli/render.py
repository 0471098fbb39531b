"""Printing: rich tables on a terminal, the same tables as plain text in a pipe.

Why this module exists: people read ``lmeval`` output in a terminal, and
scripts and CI read it from a pipe. Rich gives the first; for the second it
must not emit colour codes or size itself to an unknown width, so a console
that is not a terminal gets no colour and a fixed width (``COLUMNS``, else
120). Tables are never wrapped or cut, as with kubectl: one that is wider
than that is rendered at its natural width. They are borderless so that
``grep``/``awk`` work on them. Markup is off everywhere: job messages and log
lines are data and may contain ``[brackets]``. Machine formats (JSON, YAML,
CSV, Markdown) are written as plain text, never through rich.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import sys
import unicodedata
from collections.abc import Sequence
from typing import Any, TextIO

import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from lmeval_cli import facts, paired
from poller.cliapi import pairedstats

__all__ = [
    "JOBS_RIGHT",
    "PAIRED_RIGHT",
    "Grid",
    "Output",
    "conditions_grid",
    "details",
    "dump",
    "events_grid",
    "grid_csv",
    "grid_markdown",
    "grid_table",
    "jobs_grid",
    "kv_table",
    "make_console",
    "paired_grid",
    "paired_heading",
    "paired_notes",
    "safe",
    "scores_grid",
    "short",
]

PIPE_WIDTH = 120
# The right-aligned columns of the jobs table (list, get -o wide, -w).
JOBS_RIGHT = ("PROGRESS", "AGE")
MESSAGE_WIDTH = 60

Grid = tuple[list[str], list[list[str]]]


def make_console(stream: TextIO) -> Console:
    """A console for `stream`: rich on a terminal, plain fixed-width text otherwise."""
    terminal = stream.isatty()
    width = None
    if not terminal:
        try:
            width = int(os.environ.get("COLUMNS") or PIPE_WIDTH)
        except ValueError:
            width = PIPE_WIDTH
    return Console(
        file=stream,
        width=width,
        markup=False,
        highlight=False,
        emoji=False,
        soft_wrap=False,
        force_terminal=terminal,
        no_color=not terminal or None,
    )


class Output:
    """Where a command writes: results to stdout, notes and errors to stderr."""

    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.out = make_console(self.stdout)
        self.err = make_console(self.stderr)

    def write(self, text: str) -> None:
        """Raw text to stdout (machine formats, log lines), newline-terminated."""
        self.stdout.write(text if text.endswith("\n") else text + "\n")
        self.stdout.flush()

    def note(self, message: str) -> None:
        """A remark for the person, not the pipe: stderr."""
        self.stderr.write(message.rstrip("\n") + "\n")
        self.stderr.flush()

    def show(self, renderable: Any) -> None:
        """A rich renderable, never wrapped or cut (like kubectl: a long line stays one line).

        Console.print caps its width at the console's, so a table wider than the
        terminal (or than the pipe's default width) is rendered on a wider console.
        In a pipe, the padding rich adds at the end of lines is removed too.
        """
        wide_open = self.out.options.update_width(10_000)
        width = max(self.out.width, self.out.measure(renderable, options=wide_open).maximum)
        if self.out.is_terminal:
            if width <= self.out.width:
                self.out.print(renderable)
            else:
                Console(
                    file=self.stdout,
                    width=width,
                    force_terminal=True,
                    markup=False,
                    highlight=False,
                    emoji=False,
                ).print(renderable)
            return
        buffer = io.StringIO()
        wide = Console(file=buffer, width=width, markup=False, highlight=False, no_color=True)
        wide.print(renderable)
        self.write("\n".join(line.rstrip() for line in buffer.getvalue().splitlines()))


def dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=2, sort_keys=False) + "\n"
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)


def grid_table(grid: Grid, *, right: Sequence[str] = (), show_header: bool = True) -> Table:
    """A borderless, kubectl-style table of `grid`; `right` names right-aligned columns.

    Without `show_header` (``--no-headers``) the rows alone are printed.
    """
    headers, rows = grid
    table = Table(
        box=None,
        show_edge=False,
        pad_edge=False,
        header_style="bold",
        padding=(0, 3, 0, 0),
        show_header=show_header,
    )
    for header in headers:
        table.add_column(header, justify="right" if header in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def grid_csv(grid: Grid, *, show_header: bool = True) -> str:
    headers, rows = grid
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if show_header:
        writer.writerow([h.lower() for h in headers])
    writer.writerows(rows)
    return buffer.getvalue()


def grid_markdown(grid: Grid) -> str:
    headers, rows = grid

    def cells(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    lines = [cells([h.lower() for h in headers]), "|" + "---|" * len(headers)]
    lines += [cells(row) for row in rows]
    return "\n".join(lines) + "\n"


def short(text: str, width: int = MESSAGE_WIDTH) -> str:
    """`text` on one line, cut to `width` characters (a table cell)."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def jobs_grid(
    jobs: list[dict[str, Any]], *, all_namespaces: bool, wide: bool, now: dt.datetime
) -> Grid:
    headers = ["NAME", "STATE", "REASON", "PROGRESS", "AGE", "MODEL", "TASKS", "SCORE"]
    if all_namespaces:
        headers.insert(0, "NAMESPACE")
    if wide:
        headers += ["POD", "MESSAGE"]
    rows = []
    for job in jobs:
        meta = job.get("metadata") or {}
        row = [
            str(meta.get("name")),
            facts.state(job),
            facts.reason(job) or "-",
            facts.progress_text(job),
            facts.age(meta.get("creationTimestamp"), now),
            facts.model_text(job),
            facts.tasks_text(job),
            facts.headline(job),
        ]
        if all_namespaces:
            row.insert(0, str(meta.get("namespace")))
        if wide:
            the_status = facts.status(job)
            row += [
                str(the_status.get("podName") or "-"),
                short(str(the_status.get("message") or "-")),
            ]
        rows.append(row)
    return headers, rows


def scores_grid(rows: list[facts.ScoreRow]) -> Grid:
    headers = ["TASK", "METRIC", "FILTER", "VALUE", "STDERR"]
    return headers, [
        [
            r.task,
            r.metric,
            r.filter,
            facts.format_value(r.value),
            facts.format_value(r.stderr),
        ]
        for r in rows
    ]


# -- the paired comparison (lmeval compare A B) -------------------------------------

PAIRED_RIGHT = ("N", "A", "B", "B-A", "P", "DOWN", "UP")
_SHORT_TEST = {
    pairedstats.MCNEMAR: "McNemar",
    pairedstats.BOOTSTRAP: "bootstrap",
    pairedstats.NORMAL: "normal",
}


def safe(text: str, width: int = 300) -> str:
    """Task names, metric names and reasons come from the job's pod: no control
    characters (a terminal would obey an escape sequence), bounded."""
    clean = "".join("?" if unicodedata.category(c).startswith("C") else c for c in text)
    return clean if len(clean) <= width else clean[: width - 3] + "..."


def paired_heading(a: str, b: str, confidence: float) -> str:
    return (
        f"A = {a} (baseline), B = {b} (candidate); {confidence:.0%} intervals, "
        f"significant when p < {1 - confidence:.2g}"
    )


def paired_grid(report: paired.Report, *, footnotes: bool) -> tuple[Grid, list[str]]:
    """The table of `report`; refusals point to numbered notes when `footnotes`."""
    confidence = next((r.result.confidence for r in report.rows if r.result), 0.95)
    headers = ["TASK", "METRIC", "N", "A", "B", "B-A", f"{confidence:.0%} CI", "P", "DOWN", "UP"]
    headers += ["TEST", "VERDICT"]
    rows, notes = [], []
    for row in report.rows:
        r = row.result
        if r is None:
            if footnotes:
                notes.append(f"{row.task} {row.metric}: {row.reason}")
                refused = f"not compared ({len(notes)})"
            else:
                refused = f"not compared: {row.reason}"
            rows.append([safe(row.task), safe(row.metric), *["-"] * 9, safe(refused)])
            continue
        direction = "" if row.higher_is_better is not None else " (assumed higher is better)"
        rows.append(
            [
                safe(row.task),
                safe(row.metric),
                str(r.n),
                f"{r.mean_a:.4f}",
                f"{r.mean_b:.4f}",
                f"{r.difference:+.4f}",
                f"[{r.ci_low:+.4f},{r.ci_high:+.4f}]",
                pairedstats.format_p(r.p_value),
                str(r.a_only),
                str(r.b_only),
                _SHORT_TEST.get(r.test, r.test),
                row.verdict + direction,
            ]
        )
    return (headers, rows), notes


def paired_notes(report: paired.Report, notes: list[str]) -> list[str]:
    """The lines under the paired table: why pairs were refused, what differs between the runs."""
    lines, warnings = [], report.warnings
    left_out = [
        f"  {row.task} {row.metric}: {row.dropped} documents without a value in both runs"
        for row in report.rows
        if row.dropped
    ]
    if left_out:
        lines += ["", "Left out (lm_eval wrote NaN):", *left_out]
    if notes:
        lines += ["", "Not compared:"]
        lines += [f"  ({number}) {note}" for number, note in enumerate(notes, start=1)]
    if warnings:
        lines += ["", "Warnings (provenance differs):"]
        lines += [f"  {warning}" for warning in warnings]
    return [safe(line, 1000) for line in lines]


def kv_table(pairs: list[tuple[str, str]]) -> Table:
    """``Label:  value`` lines, as kubectl describe aligns them (jobs and suites)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in pairs:
        table.add_row(Text(label + ":"), Text(value))
    return table


def _status_pairs(job: dict[str, Any], now: dt.datetime) -> list[tuple[str, str]]:
    meta = job.get("metadata") or {}
    the_status = facts.status(job)
    state = facts.state(job)
    reason = facts.reason(job)
    created = meta.get("creationTimestamp")
    pairs = [
        ("Name", str(meta.get("name"))),
        ("Namespace", str(meta.get("namespace"))),
        ("Created", f"{created} ({facts.age(created, now)} ago)"),
        ("State", f"{state} ({reason})" if reason else state),
    ]
    if the_status.get("message"):
        pairs.append(("Message", str(the_status["message"])))
    progress = the_status.get("progress") or {}
    if isinstance(progress, dict) and (progress.get("line") or progress.get("percent") is not None):
        pairs.append(("Progress", str(progress.get("line") or facts.progress_text(job))))
    for label, key in (
        ("Pod", "podName"),
        ("Started", "startTime"),
        ("Completed", "completeTime"),
        ("Results ConfigMap", "resultsConfigMap"),
        ("Results artifact", "resultsArtifact"),
        ("Results not pushed", "resultsArtifactError"),
    ):
        if the_status.get(key):
            pairs.append((label, str(the_status[key])))
    gate = facts.gate_condition(job)
    if gate is not None:
        pairs.append(
            (
                "Regressed",
                f"{gate.get('status')} ({gate.get('reason') or '-'}): {gate.get('message') or ''}",
            )
        )
    items = facts.item_scores_text(job)
    if items:
        pairs.append(("Per-item scores", items))
    for source in the_status.get("taskSources") or []:
        if isinstance(source, dict):
            where = f"{source.get('url')}" + (
                f" ({source['branch']})" if source.get("branch") else ""
            )
            pairs.append((f"Tasks {source.get('name')}", f"{where} at {source.get('commit')}"))
    return pairs


def conditions_grid(job: dict[str, Any], now: dt.datetime) -> Grid:
    """The object's status.conditions (a job's or a suite's), messages cut at 80."""
    headers = ["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]
    rows = [
        [
            str(c.get("type")),
            str(c.get("status")),
            str(c.get("reason") or "-"),
            facts.age(c.get("lastTransitionTime"), now),
            short(str(c.get("message") or ""), 80),
        ]
        for c in facts.conditions(job)
    ]
    return headers, rows


def _event_time(event: dict[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def events_grid(events: list[dict[str, Any]], now: dt.datetime) -> Grid:
    """Events, oldest first, messages cut at 80."""
    headers = ["AGE", "TYPE", "REASON", "MESSAGE"]
    ordered = sorted(events, key=_event_time)
    rows = [
        [
            facts.age(_event_time(e), now),
            str(e.get("type") or "-"),
            str(e.get("reason") or "-"),
            short(str(e.get("message") or ""), 80),
        ]
        for e in ordered
    ]
    return headers, rows


def details(
    job: dict[str, Any],
    events: list[dict[str, Any]] | None,
    events_note: str,
    now: dt.datetime,
) -> list[Any]:
    """The renderables of `lmeval get NAME`, in order."""
    parts: list[Any] = [kv_table(_status_pairs(job, now)), Text(""), Text("Spec:", style="bold")]
    parts.append(kv_table([("  " + k, v) for k, v in facts.spec_summary(job)]))
    provenance = facts.provenance_pairs(job)
    if provenance:
        parts += [Text(""), Text("Provenance:", style="bold")]
        parts.append(kv_table([("  " + k, v) for k, v in provenance]))
    parts += [Text(""), Text("Conditions:", style="bold")]
    cond = conditions_grid(job, now)
    parts.append(grid_table(cond) if cond[1] else Text("  <none>"))
    parts += [Text(""), Text("Events:", style="bold")]
    if events is None:
        parts.append(Text(f"  {events_note}"))
    else:
        grid = events_grid(events, now)
        parts.append(grid_table(grid) if grid[1] else Text("  <none>"))
    parts += [Text(""), Text("Results:", style="bold")]
    results = facts.job_results(job)
    rows = facts.score_rows(results, facts.spec(job).get("tasks")) if results else []
    if rows:
        parts.append(grid_table(scores_grid(rows), right=("VALUE", "STDERR")))
        if facts.status(job).get("resultsReduced"):
            parts.append(
                Text("  (status holds reduced results; `lmeval results -o json` reads all)")
            )
    else:
        parts.append(Text("  <none yet>" if facts.state(job) != "Complete" else "  <none>"))
    return parts
