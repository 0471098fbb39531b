"""The generated references (`python -m lmeval_sandbox.docs`) say what the code says.

Checks the generator on copies in a temporary directory (a block is replaced
inside its markers only, a page without its block is an error naming the file
and the block, ``--check`` names each stale page), that every setting has a
description and every key is in the settings table, that the metrics table
lists every family of a fresh registry with its labels, that the CLI
reference has every command whatever the terminal's width, that the API
reference has every field of the CRD and its CEL rules, that the extraction
of status messages from the source finds the known ones and notices a new
call site (direct, or through a writer such as `StatusWrites.fail`), and
finally that the repository's pages are current (this needs
deploy/CONFIGURE.md, deploy/METRICS.md and deploy/TROUBLESHOOTING.md with
their blocks).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lmeval_sandbox import crd, docs

from poller.api import settings

REPO = Path(__file__).resolve().parents[2]


def _page(name: str, inside: str = "stale\n") -> str:
    return (
        f"# Title\n\nBefore.\n\n<!-- BEGIN GENERATED {name}: python -m lmeval_sandbox.docs; "
        f"do not edit -->\n{inside}<!-- END GENERATED {name} -->\n\nAfter.\n"
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A checkout-like directory with each hand-written page holding only its block."""
    for name, page in docs.BLOCKS.items():
        target = tmp_path / page
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_page(name))
    return tmp_path


# -- blocks and pages ----------------------------------------------------------------------


def test_a_block_is_replaced_inside_its_markers_only() -> None:
    text = _page("settings", "old line\n")
    out = docs.replace_block(text, "settings", "new table")
    assert "old line" not in out
    assert out.startswith("# Title\n\nBefore.\n\n<!-- BEGIN GENERATED settings:")
    assert "-->\nnew table\n<!-- END GENERATED settings -->\n\nAfter.\n" in out
    # Replacing again is a fixed point.
    assert docs.replace_block(out, "settings", "new table") == out


def test_a_missing_or_repeated_block_is_an_error_naming_it() -> None:
    with pytest.raises(
        docs.DocsError, match=r"deploy/METRICS.md needs exactly one block `metrics`"
    ):
        docs.replace_block("# no block\n", "metrics", "x", "deploy/METRICS.md")
    twice = _page("metrics") + _page("metrics")
    with pytest.raises(docs.DocsError, match="BEGIN GENERATED metrics"):
        docs.replace_block(twice, "metrics", "x")


def test_write_then_check_on_a_copy(root: Path) -> None:
    stale = docs.check(root)
    # Every page is named: the two whole files are missing, the three blocks stale.
    run = "out of date: run `python -m lmeval_sandbox.docs`"
    assert sorted(stale) == sorted(
        [
            f"crds/REFERENCE.md: {run}",
            f"poller/cli/REFERENCE.md: {run}",
            *(f"{page}: block `{name}` {run}" for name, page in docs.BLOCKS.items()),
        ]
    )
    written, problems = docs.write(root)
    assert problems == []
    assert {str(p) for p in written} == {
        "crds/REFERENCE.md",
        "poller/cli/REFERENCE.md",
        *docs.BLOCKS.values(),
    }
    assert docs.check(root) == []
    # Outside the block nothing moved.
    configure = (root / docs.BLOCKS["settings"]).read_text()
    assert configure.startswith("# Title\n\nBefore.\n") and configure.endswith("\n\nAfter.\n")
    assert "| `poll-interval` |" in configure
    # A hand edit inside a block is drift, named with its file and block.
    (root / docs.BLOCKS["metrics"]).write_text(
        (root / docs.BLOCKS["metrics"]).read_text().replace("lmeval_leader", "lmeval_lead")
    )
    assert docs.check(root) == [f"deploy/METRICS.md: block `metrics` {run}"]
    assert docs.main(["--check", "--root", str(root)]) == 1
    assert docs.main(["--root", str(root)]) == 0
    assert docs.main(["--check", "--root", str(root)]) == 0


def test_a_page_without_its_block_fails_both_modes(root: Path) -> None:
    page = root / docs.BLOCKS["reasons"]
    page.write_text("# Troubleshooting\n\nNo block here.\n")
    for problems in (docs.check(root), docs.write(root)[1]):
        named = [p for p in problems if p.startswith("deploy/TROUBLESHOOTING.md")]
        assert len(named) == 1
        assert "needs exactly one block `reasons`" in named[0]
        assert "<!-- BEGIN GENERATED reasons:" in named[0]
    assert len(docs.write(root)[1]) == 1  # the others were written
    # Write mode left the page as it was, and wrote the others.
    assert page.read_text() == "# Troubleshooting\n\nNo block here.\n"
    assert (root / docs.CRD_REFERENCE).exists()
    page.unlink()
    assert any("deploy/TROUBLESHOOTING.md: missing" in p for p in docs.check(root))
    assert docs.main(["--root", str(root)]) == 1


def test_markdown_cells_escape_pipes_and_html() -> None:
    assert docs._cell("a|b <x> `c|<d>`") == "a\\|b &lt;x> `c\\|<d>`"
    assert docs._code("^(a|b)$") == "`^(a\\|b)$`"
    assert docs._code("uses `x`") == "`` uses `x` ``"
    table = docs._table(["A", "B"], [["1", ""]])
    assert table == "| A | B |\n|---|---|\n| 1 |   |\n"


# -- settings ------------------------------------------------------------------------------


def test_every_setting_has_a_description() -> None:
    for name, info in settings.Settings.model_fields.items():
        assert info.description and len(info.description) > 20, name


def test_the_settings_table_has_every_key_with_its_default_and_bounds() -> None:
    table = docs.render_settings()
    for name, info in settings.Settings.model_fields.items():
        key = info.alias or name
        row = next(line for line in table.splitlines() if line.startswith(f"| `{key}` |"))
        assert docs._cell(info.description or "") in row
    rows = {line.split(" | ")[0]: line for line in table.splitlines()}
    assert "| `2s` | 500ms to 1h |" in rows["| `poll-interval`"]
    assert "one of `Always`, `IfNotPresent`, `Never`" in rows["| `image-pull-policy`"]
    assert "`LMEVAL_DEFAULT_POD_IMAGE`" in rows["| `pod-image`"]
    keys = [line.split(" | ")[0] for line in table.splitlines()[2:]]
    assert keys == sorted(keys)


# -- metrics -------------------------------------------------------------------------------


def test_the_metrics_table_lists_every_family_with_its_labels() -> None:
    from prometheus_client import CollectorRegistry

    from poller import metrics

    registry = CollectorRegistry()
    metrics.PollerMetrics(registry, version="", revision="")
    table = docs.render_metrics()
    rows = {line.split(" | ")[0].strip("| `"): line for line in table.splitlines()[2:]}
    # Counters are exposed with _total, info families with _info.
    assert set(rows) == {
        f"{f.name}_total"
        if f.type == "counter"
        else f"{f.name}_info"
        if f.type == "info"
        else f.name
        for f in registry.collect()
    }
    assert {"lmeval_build_info", "lmeval_job_info", "lmeval_poll_cycles_total"} <= set(rows)
    assert "`code`, `resource`, `verb`" in rows["lmeval_kube_requests_total"]
    assert "`filter`, `lmevaljob`, `metric`, `namespace`, `task`" in rows["lmeval_job_result"]
    assert "`namespace`, `state`" in rows["lmeval_jobs"]
    assert "histogram" in rows["lmeval_job_duration_seconds"]


# -- the CLI reference ---------------------------------------------------------------------


@pytest.fixture
def narrow_terminal() -> Iterator[None]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "37"
    yield
    if before is None:
        os.environ.pop("COLUMNS", None)
    else:
        os.environ["COLUMNS"] = before


def test_the_cli_reference_has_every_command_at_a_fixed_width(narrow_terminal: None) -> None:
    from lmeval_cli.__main__ import build_parser

    page = docs.render_cli_reference()
    assert os.environ["COLUMNS"] == "37"  # put back
    os.environ["COLUMNS"] = "250"
    assert docs.render_cli_reference() == page
    parser = build_parser("lmeval")
    commands: dict[str, Any] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands.update(action.choices)
    assert len(commands) > 5
    for name, sub in commands.items():
        assert f"`lmeval {name}`" in page, name
        for action in sub._actions:
            if action.help == argparse.SUPPRESS:
                continue  # hidden from --help, so from the reference too
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in page or f", {option}" in page, (name, option)
    assert "| `3` |" in page  # the exit codes


# -- the API reference ---------------------------------------------------------------------


def _paths(schema: dict[str, Any], path: str) -> Iterator[str]:
    for name, sub in schema.get("properties", {}).items():
        child = f"{path}.{name}" if path else name
        yield child
        inner, inner_path = sub, child
        while True:
            if inner.get("type") == "array" and isinstance(inner.get("items"), dict):
                inner, inner_path = inner["items"], inner_path + "[]"
            elif "properties" not in inner and isinstance(inner.get("additionalProperties"), dict):
                inner, inner_path = inner["additionalProperties"], inner_path + ".*"
            else:
                break
        yield from _paths(inner, inner_path)


def test_the_api_reference_has_every_field_and_rule() -> None:
    manifest = crd.crd_manifest()
    root = manifest["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    page = docs.render_crd_reference()
    paths = list(_paths(root, ""))
    assert "spec.pod.resources" in paths and "status.conditions[].reason" in paths
    for path in paths:
        assert f"| `{path}` |" in page, path
    messages = []

    def rules(schema: Any) -> None:
        if isinstance(schema, dict):
            messages.extend(r.get("message", r["rule"]) for r in schema.get(docs._VALIDATIONS, []))
            for value in schema.values():
                rules(value)
        elif isinstance(schema, list):
            for value in schema:
                rules(value)

    rules(root)
    assert messages
    for message in messages:
        assert docs._cell(message) in page, message
    assert "spec.baseline names this job itself" in page


# -- status messages -----------------------------------------------------------------------


def _find(messages: list[docs.StatusMessage], template: str) -> docs.StatusMessage:
    found = [m for m in messages if m.template == template]
    assert found, f"{template!r} not extracted"
    return found[0]


def test_the_known_status_messages_are_extracted() -> None:
    messages = docs.status_messages()
    suspended = _find(messages, "suspended: spec.suspend is true")
    assert (suspended.reason, suspended.state, suspended.module) == (
        "NoReason",
        "Suspended",
        "poller.decisions.decide",
    )
    running = _find(messages, "evaluation running")
    assert (running.reason, running.state) == ("NoReason", "Running")
    # Through a wrapper (_stop, then StatusDraft.finish), with the cause passed along.
    evicted = _find(messages, "pod <pod.name> was evicted: <pod.message or 'no message'>")
    assert (evicted.reason, evicted.state, evicted.causes) == ("Failed", "Complete", ("Evicted",))
    # Built by a helper in another module: followed into its return.
    foreign = [
        m for m in messages if m.module == "poller.decisions.ownership" and "ForeignPod" in m.causes
    ]
    assert foreign and all(m.reason == "Failed" for m in foreign)
    # Through StatusWrites.fail (poller.cycle.act), and a queue place (a variable followed).
    _find(messages, "the job pod was refused: <error.message>")
    queued = _find(messages, "waiting for a free slot: <place> (max-running-jobs: <slot.limit>)")
    assert queued.module == "poller.decisions.scheduling"
    assert {m.reason for m in messages} >= {"NoReason", "Succeeded", "Failed", "Cancelled"}


def test_a_new_call_site_is_noticed(tmp_path: Path) -> None:
    package = tmp_path / "poller"
    ignored = shutil.ignore_patterns("cli", "sandbox", "__pycache__", "*.md")
    shutil.copytree(REPO / "poller", package, ignore=ignored)
    (package / "newwriter.py").write_text(
        "from poller import api\n"
        "from poller.decisions.draft import StatusDraft\n"
        "S = api.JobState\n"
        "R = api.JobReason\n"
        "\n"
        "def brand_new(job, now, name):\n"
        "    draft = StatusDraft(job, now)\n"
        '    message = f"a brand new message about {name}"\n'
        "    draft.state(S.RUNNING, R.NO_REASON, message)\n"
        "\n"
        "def through_the_writer(job, now, writes):\n"
        '    writes.fail(job, now, "failed through the status writer", cause="Brand")\n'
    )
    before = docs.status_messages(REPO / "poller")
    after = docs.status_messages(package)
    new = [m for m in after if m not in before]
    assert sorted((m.template, m.reason, m.state, m.module, m.causes) for m in new) == [
        ("a brand new message about <name>", "NoReason", "Running", "poller.newwriter", ()),
        (
            "failed through the status writer",
            "Failed",
            "Complete",
            "poller.newwriter",
            ("Brand",),
        ),
    ]


def test_condition_reasons_are_extracted() -> None:
    found = {(r.condition, r.reason) for r in docs.condition_reasons()}
    assert {
        ("Scheduled", "Queued"),
        ("Scheduled", "PodCreated"),
        ("Running", "ContainerRunning"),
        ("Finished", "PodDeleted"),
        ("Succeeded", "TaskSourceMismatch"),
        ("Regressed", "NotRegressed"),
        ("Regressed", "WaitingForBaseline"),
        ("ResultsPushed", "PushFailed"),
    } <= found


# -- the repository ------------------------------------------------------------------------


def test_the_repository_pages_are_current() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lmeval_sandbox.docs", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
