"""What a person reads of an LMEvalSuite: its list row and its description, as plain values.

Why this module exists: ``lmeval suite list`` and ``lmeval suite get`` show
the same facts (the latest verdict, what triggers a run, the runs with
their baselines and each criterion's numbers) and must agree on them. Like
``facts`` for jobs, these functions read the suite as the API returns it (a
dict with camelCase keys), never through the operator's pydantic models,
which refuse unknown fields: a suite written by a newer poller, or not yet
seen by any, still prints. Nothing here makes a request; what the poller
wrote in ``status.runs`` is the record, so a run is shown as the status
names it (the CLI never looks runs up by the suite's label, which anyone
who may create an LMEvalJob can put on one). Free text (messages) is
passed through `render.safe`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from rich.text import Text

from lmeval_cli import facts, render
from poller.cliapi import api, pairedstats

__all__ = [
    "SUITES_RIGHT",
    "active",
    "criteria_grid",
    "details",
    "last_run_started",
    "run_criteria_grid",
    "run_for",
    "runs",
    "runs_grid",
    "suites_grid",
    "triggers_text",
    "verdict",
]

# The right-aligned columns of the suites table and of a run's criteria.
SUITES_RIGHT = ("ACTIVE", "LAST RUN", "AGE")
_CRITERIA_RIGHT = ("DIFF", "P", "PAIRED", "MDD", "MAX DROP", "ALPHA", "POWER")
_RUNS_RIGHT = ("STARTED",)
_NONE = "-"


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return _NONE if value in (None, "") else render.safe(str(value))


def _number(value: Any, spec: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _NONE
    return format(value, spec)


def _p_value(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _NONE
    return pairedstats.format_p(float(value))


# -- the facts ---------------------------------------------------------------------


def verdict(suite: dict[str, Any]) -> str:
    """status.lastVerdict (Passed, Regressed, Inconclusive), or - before the first."""
    return _text(facts.status(suite).get("lastVerdict"))


def triggers_text(suite: dict[str, Any]) -> str:
    """What starts a run: the cron line (and its zone unless UTC), isvc/NAME, or manual.

    A request by hand works on every suite; "manual" is shown only for a
    suite that has no other trigger. A suspended suite says so: its triggers
    start nothing.
    """
    triggers = _mapping(facts.spec(suite).get("triggers"))
    parts = []
    schedule = _mapping(triggers.get("schedule"))
    if schedule.get("cron"):
        zone = schedule.get("timeZone")
        parts.append(str(schedule["cron"]) + (f" {zone}" if zone and zone != "UTC" else ""))
    service = _mapping(_mapping(triggers.get("modelChange")).get("inferenceService"))
    if service.get("name"):
        parts.append(f"isvc/{service['name']}")
    text = ", ".join(parts) or "manual"
    return text + (" (suspended)" if facts.spec(suite).get("suspend") is True else "")


def runs(suite: dict[str, Any]) -> list[dict[str, Any]]:
    """status.runs, oldest first (as the poller keeps them)."""
    return _dicts(facts.status(suite).get("runs"))


def active(suite: dict[str, Any]) -> list[str]:
    """The runs going on (status.active)."""
    found = facts.status(suite).get("active")
    return [str(name) for name in found] if isinstance(found, list) else []


def last_run_started(suite: dict[str, Any]) -> str | None:
    """When the latest run was created (RFC 3339), if any."""
    kept = runs(suite)
    started = kept[-1].get("started") if kept else None
    return str(started) if started else None


def run_for(run: dict[str, Any]) -> str:
    """What the run was started for: the model's revision, the scheduled time, or -."""
    return _text(run.get("revision") or run.get("scheduledTime"))


# -- tables ------------------------------------------------------------------------


def suites_grid(
    suites: list[dict[str, Any]], *, all_namespaces: bool, wide: bool, now: dt.datetime
) -> render.Grid:
    """`lmeval suite list`: NAME, VERDICT, TRIGGERS, LAST RUN, ACTIVE, AGE (-o wide: MESSAGE)."""
    headers = ["NAME", "VERDICT", "TRIGGERS", "LAST RUN", "ACTIVE", "AGE"]
    if all_namespaces:
        headers.insert(0, "NAMESPACE")
    if wide:
        headers.append("MESSAGE")
    rows = []
    for suite in suites:
        meta = _mapping(suite.get("metadata"))
        row = [
            str(meta.get("name")),
            verdict(suite),
            triggers_text(suite),
            facts.age(last_run_started(suite), now),
            str(len(active(suite))),
            facts.age(meta.get("creationTimestamp"), now),
        ]
        if all_namespaces:
            row.insert(0, str(meta.get("namespace")))
        if wide:
            row.append(render.short(_text(facts.status(suite).get("message"))))
        rows.append(row)
    return headers, rows


def criteria_grid(suite: dict[str, Any]) -> render.Grid:
    """spec.criteria: what every run is judged by."""
    headers = ["TASK", "METRIC", "TIER", "MAX DROP", "ALPHA", "POWER", "BETTER"]
    rows = [
        [
            _text(c.get("task")),
            _text(c.get("metric") or api.DEFAULT_GATE_METRIC),
            _text(c.get("tier") or api.Tier.MUST.value),
            _number(c.get("maxDrop"), "g"),
            _number(c.get("alpha", 0.05), "g"),
            _number(c.get("power", 0.8), "g"),
            "lower" if c.get("higherIsBetter") is False else "higher",
        ]
        for c in _dicts(facts.spec(suite).get("criteria"))
    ]
    return headers, rows


def runs_grid(
    kept: list[dict[str, Any]], now: dt.datetime, live: Mapping[str, str] | None = None
) -> render.Grid:
    """status.runs: name, trigger, what it ran for, when, state, verdict, reason, baseline.

    `live` adds, for a run going on, its job's own state ("Running 40%"),
    when the caller read it.
    """
    headers = ["NAME", "TRIGGER", "FOR", "STARTED", "STATE", "VERDICT", "REASON", "BASELINE"]
    rows = []
    for run in kept:
        name = str(run.get("name"))
        state = _text(run.get("state"))
        if live and live.get(name):
            state += f" ({live[name]})"
        rows.append(
            [
                _text(name),
                _text(run.get("trigger")),
                run_for(run),
                facts.age(run.get("started"), now),
                state,
                _text(run.get("verdict")),
                _text(run.get("reason")),
                _text(run.get("baseline")),
            ]
        )
    return headers, rows


def run_criteria_grid(run: dict[str, Any]) -> render.Grid:
    """One run's criteria: tier, verdict, reason, the difference (run minus baseline),
    the paired test's p-value, the documents paired and the minimum detectable drop."""
    headers = ["TASK", "METRIC", "TIER", "VERDICT", "REASON", "DIFF", "P", "PAIRED", "MDD"]
    rows = []
    for c in _dicts(run.get("criteria")):
        rows.append(
            [
                _text(c.get("task")),
                _text(c.get("metric")),
                _text(c.get("tier")),
                _text(c.get("verdict")),
                _text(c.get("reason")),
                _number(c.get("difference"), "+.4f"),
                _p_value(c.get("pValue")),
                _number(c.get("paired"), "d"),
                _number(c.get("minimumDetectableDrop"), ".4f"),
            ]
        )
    return headers, rows


# -- the description (lmeval suite get NAME) ----------------------------------------


def _baseline_text(suite: dict[str, Any]) -> str:
    rule = _mapping(facts.spec(suite).get("baseline"))
    policy = str(rule.get("policy") or api.BaselinePolicy.LAST_PASSED.value)
    pinned = rule.get("pinned")
    if policy == api.BaselinePolicy.PINNED.value:
        return f"Pinned: always {pinned}"
    if pinned:
        return f"LastPassed: the latest run that passed, else {pinned}"
    return "LastPassed: the latest run that passed (none yet: the first run has no baseline)"


def _trigger_lines(suite: dict[str, Any]) -> list[tuple[str, str]]:
    triggers = _mapping(facts.spec(suite).get("triggers"))
    lines = []
    schedule = _mapping(triggers.get("schedule"))
    if schedule.get("cron"):
        text = f"{schedule['cron']} ({schedule.get('timeZone') or 'UTC'})"
        deadline = schedule.get("startingDeadlineSeconds")
        if deadline is not None:
            text += f", starting deadline {deadline} s"
        lines.append(("Schedule", _text(text)))
    service = _mapping(_mapping(triggers.get("modelChange")).get("inferenceService"))
    if service.get("name"):
        lines.append(("Model change", _text(f"InferenceService {service['name']}")))
    lines.append(("By hand", f"lmeval suite run {_mapping(suite.get('metadata')).get('name')}"))
    return lines


def _summary_pairs(suite: dict[str, Any], now: dt.datetime) -> list[tuple[str, str]]:
    meta = _mapping(suite.get("metadata"))
    the_spec, the_status = facts.spec(suite), facts.status(suite)
    created = meta.get("creationTimestamp")
    pairs = [
        ("Name", str(meta.get("name"))),
        ("Namespace", str(meta.get("namespace"))),
        ("Created", f"{created} ({facts.age(created, now)} ago)"),
        ("Verdict", verdict(suite)),
    ]
    if the_status.get("message"):
        pairs.append(("Message", _text(the_status["message"])))
    pairs += _trigger_lines(suite)
    if the_spec.get("suspend") is True:
        pairs.append(("Suspended", "true: no new runs (a run going on goes on)"))
    pairs.append(("Concurrency", _text(the_spec.get("concurrencyPolicy") or "Forbid")))
    pairs.append(("Baseline", _text(_baseline_text(suite))))
    passing = the_spec.get("passingRunsHistoryLimit", 3)
    failing = the_spec.get("failingRunsHistoryLimit", 1)
    pairs.append(("Runs kept", f"{passing} passed, {failing} not passed"))
    going = active(suite)
    pairs.append(("Active", _text(", ".join(going)) if going else "none"))
    for label, field in (
        ("Last scheduled", "lastScheduleTime"),
        ("Last revision", "lastModelRevision"),
        ("Last request", "lastRunRequest"),
    ):
        if the_status.get(field):
            pairs.append((label, _text(the_status[field])))
    requested = _mapping(meta.get("annotations")).get(api.RUN_REQUESTED_ANNOTATION)
    if requested and requested != the_status.get("lastRunRequest"):
        pairs.append(("Requested", f"{_text(requested)} (not acted on yet)"))
    attestation = _mapping(the_spec.get("attestation"))
    key = _mapping(attestation.get("signingKey"))
    if key:
        signed = f"signed with Secret {key.get('name')} (key {key.get('key')})"
        push = _mapping(attestation.get("push"))
        if push.get("reference"):
            signed += f", pushed beside {push['reference']}"
        pairs.append(("Attestation", _text(signed)))
    return pairs


def _run_heading(run: dict[str, Any]) -> str:
    words = f"Run {run.get('name')}: {run.get('verdict') or run.get('state') or '-'}"
    if run.get("reason") and run.get("reason") != run.get("verdict"):
        words += f" ({run['reason']})"
    if run.get("baseline"):
        words += f", against {run['baseline']}"
    return render.safe(words)


def _attestation_line(run: dict[str, Any]) -> str | None:
    signed = _mapping(run.get("attestation"))
    if not signed:
        return None
    parts = []
    if signed.get("configMap"):
        parts.append(f"ConfigMap {signed['configMap']}")
    if signed.get("payloadDigest"):
        parts.append(f"statement {signed['payloadDigest']}")
    if signed.get("pushed"):
        parts.append(f"pushed {signed['pushed']}")
    if signed.get("message"):
        parts.append(str(signed["message"]))
    return render.safe("Attestation: " + ", ".join(parts), 1000) if parts else None


def details(
    suite: dict[str, Any],
    events: list[dict[str, Any]] | None,
    events_note: str,
    now: dt.datetime,
    live: Mapping[str, str] | None = None,
) -> list[Any]:
    """The renderables of `lmeval suite get NAME`, in order."""
    parts: list[Any] = [render.kv_table(_summary_pairs(suite, now)), Text("")]
    template = _mapping(facts.spec(suite).get("template"))
    parts += [Text("Template:", style="bold")]
    parts.append(
        render.kv_table([("  " + k, v) for k, v in facts.spec_summary({"spec": template})])
    )
    parts += [Text(""), Text("Criteria:", style="bold")]
    criteria = criteria_grid(suite)
    parts.append(
        render.grid_table(criteria, right=_CRITERIA_RIGHT) if criteria[1] else Text("  <none>")
    )
    parts += [Text(""), Text("Conditions:", style="bold")]
    conditions = render.conditions_grid(suite, now)
    parts.append(render.grid_table(conditions) if conditions[1] else Text("  <none>"))
    kept = runs(suite)
    parts += [Text(""), Text("Runs (oldest first):", style="bold")]
    if not kept:
        parts.append(Text("  <none yet>"))
    else:
        parts.append(render.grid_table(runs_grid(kept, now, live), right=_RUNS_RIGHT))
    for run in kept:
        parts += [Text(""), Text(_run_heading(run), style="bold")]
        if run.get("message"):
            parts.append(Text("  " + render.safe(str(run["message"]), 1000)))
        grid = run_criteria_grid(run)
        if grid[1]:
            parts.append(render.grid_table(grid, right=_CRITERIA_RIGHT))
        line = _attestation_line(run)
        if line:
            parts.append(Text("  " + line))
    parts += [Text(""), Text("Events:", style="bold")]
    if events is None:
        parts.append(Text(f"  {events_note}"))
    else:
        grid = render.events_grid(events, now)
        parts.append(render.grid_table(grid) if grid[1] else Text("  <none>"))
    return parts
