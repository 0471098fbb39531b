"""``lmeval suite list|get|run`` on the real control plane, and its pure parts.

Checks, on the cluster (the LMEvalSuite CRD applied by ``poller_installed``;
statuses written as the poller writes them, through the status subresource
as an admin):

- ``suite list``: one row per suite with the latest verdict, the triggers
  (cron and its zone, ``isvc/NAME``, ``manual`` for a suite with neither,
  ``(suspended)``), the last run's age, the active runs and the age; ``-A``
  adds NAMESPACE, ``-o wide`` MESSAGE, ``-o name`` prints
  ``lmevalsuite.<group>/NAME``, ``-o json`` a List; no suites is a remark on
  stderr (and an empty List in JSON);
- ``suite get NAME``: every run kept with its trigger, what it ran for
  (revision or scheduled time), state (a run going on with its job's own
  state, read by name and UID), verdict, reason and baseline, and each
  run's criteria with tier, verdict, p-value, difference, documents paired
  and minimum detectable drop; ``-o json`` / ``-o yaml`` print the object;
  a missing suite is exit 4 naming the suite it probably meant, after the
  others are shown;
- ``suite run NAME``: sets the run-requested annotation with a merge patch
  to a new value each time (other annotations kept), says how to follow
  it and what holds it (Forbid and a run going on, suspend), and the poller
  acts on it: a Manual run appears in the suite's status; a missing suite
  is refused (exit 4) and nothing is patched.

Pure: the 404 of an uninstalled LMEvalSuite API is exit 5, the user roles
grant suites too, tokens are new every time, the triggers' words.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
import yaml
from kubernetes import client
from lmeval_cli import suites, suiteview
from lmeval_cli.__main__ import build_parser
from lmeval_cli.errors import ApiError, ExitCode, explain, role_for

from poller import api
from poller.cycle.reconciler import Reconciler
from poller.timefmt import format_time
from tests.cli.conftest import Cli
from tests.poller_fixtures import Jobs, cycle_until

RESOURCE = f"lmevalsuite.{api.API_GROUP}"
NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


def _ago(**delta: float) -> str:
    return format_time(NOW - dt.timedelta(**delta))


class Suites:
    """LMEvalSuite CRUD as an admin, for one namespace; status as the poller writes it."""

    def __init__(self, admin_api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(admin_api)
        self.namespace = namespace

    def create(self, name: str, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": f"{api.API_GROUP}/{api.API_VERSION}",
            "kind": api.SUITE_KIND,
            "metadata": {"name": name},
            "spec": {
                "template": {"model": "dummy", "tasks": ["toy_mc"]},
                "criteria": [{"task": "toy_mc", "maxDrop": 0.05}],
                **spec,
            },
        }
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            api.API_GROUP, api.API_VERSION, self.namespace, api.SUITE_PLURAL, body
        )
        return created

    def set_status(self, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            api.API_GROUP, api.API_VERSION, self.namespace, api.SUITE_PLURAL, name,
            {"status": status},
        )  # fmt: skip

    def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            api.API_GROUP, api.API_VERSION, self.namespace, api.SUITE_PLURAL, name
        )
        return found


@pytest.fixture
def suite_crud(admin_api: client.ApiClient, cli: Cli) -> Suites:
    return Suites(admin_api, cli.namespace)


def _criterion(task: str, verdict: str, reason: str, **numbers: Any) -> dict[str, Any]:
    metric = "acc,none" if task == "toy_mc" else "exact_match,none"
    tier = "Must" if task == "toy_mc" else "Should"
    return {
        "task": task,
        "metric": metric,
        "tier": tier,
        "verdict": verdict,
        "reason": reason,
        "message": f"{task}: {reason}",
        **numbers,
    }


def _nightly_status(active_uid: str) -> dict[str, Any]:
    """Three runs as the poller records them: a Passed one on the schedule, a Regressed
    one on a new model revision (against the first), one going on by hand."""
    return {
        "observedGeneration": 1,
        "lastScheduleTime": _ago(days=1),
        "lastModelRevision": "llm-predictor-00002",
        "lastRunRequest": "20261201T000000Z-00000000",
        "lastVerdict": "Regressed",
        "active": ["nightly-c0ffee01"],
        "message": "run nightly-c0ffee01 started (Manual)",
        "runs": [
            {
                "name": "nightly-0a1b2c3d",
                "uid": "11111111-0000-0000-0000-000000000001",
                "trigger": "Schedule",
                "scheduledTime": _ago(days=1),
                "started": _ago(days=1),
                "finished": _ago(hours=23),
                "state": "Finished",
                "verdict": "Passed",
                "reason": "Passed",
                "message": "every Must criterion passed",
                "baseline": "prod-eval",
                "baselineUid": "11111111-0000-0000-0000-000000000000",
                "criteria": [
                    _criterion(
                        "toy_mc",
                        "Passed",
                        "NotRegressed",
                        pValue=0.62,
                        difference=0.0125,
                        paired=400,
                        minimumDetectableDrop=0.0412,
                    )
                ],
            },
            {
                "name": "nightly-9b8a7c6d",
                "uid": "11111111-0000-0000-0000-000000000002",
                "trigger": "ModelChange",
                "revision": "llm-predictor-00002",
                "started": _ago(hours=2),
                "finished": _ago(hours=1),
                "state": "Finished",
                "verdict": "Regressed",
                "reason": "Regressed",
                "message": "toy_mc acc,none regressed: drop 0.0725 > max drop 0.05, p=0.00031",
                "baseline": "nightly-0a1b2c3d",
                "baselineUid": "11111111-0000-0000-0000-000000000001",
                "criteria": [
                    _criterion(
                        "toy_mc",
                        "Regressed",
                        "Regressed",
                        pValue=0.00031,
                        difference=-0.0725,
                        paired=400,
                        minimumDetectableDrop=0.0412,
                    ),
                    _criterion(
                        "toy_gen",
                        "Inconclusive",
                        "Underpowered",
                        pValue=0.2,
                        difference=-0.02,
                        paired=50,
                        minimumDetectableDrop=0.2101,
                    ),
                ],
            },
            {
                "name": "nightly-c0ffee01",
                "uid": active_uid,
                "trigger": "Manual",
                "started": _ago(minutes=30),
                "state": "Active",
            },
        ],
        "conditions": [
            {
                "type": "Valid",
                "status": "True",
                "reason": "Valid",
                "message": "",
                "lastTransitionTime": _ago(days=2),
            },
            {
                "type": "Regressed",
                "status": "True",
                "reason": "Regressed",
                "message": "run nightly-9b8a7c6d regressed",
                "lastTransitionTime": _ago(hours=1),
            },
        ],
    }


def _row(stdout: str, name: str, column: int = 0) -> list[str]:
    """The cells of the first table row with `name` in `column` (cells are split on runs
    of 3 or more spaces: a cell holds single spaces)."""
    for line in stdout.splitlines():
        cells = re.split(r"\s{3,}", line.strip())
        if len(cells) > column and cells[column] == name:
            return cells
    raise AssertionError(f"no row {name!r} in:\n{stdout}")


def _schedule() -> dict[str, Any]:
    return {
        "schedule": {"cron": "0 3 * * *", "timeZone": "Europe/Berlin"},
        "modelChange": {"inferenceService": {"name": "llm"}},
    }


@pytest.mark.cluster
def test_list_and_get_show_the_suites_runs_and_verdicts(
    cli: Cli, suite_crud: Suites, jobs: Jobs
) -> None:
    empty = cli("suite", "list")
    assert empty.returncode == 0 and empty.stdout == "", empty.stderr
    assert f"No LMEvalSuites found in namespace {cli.namespace}." in empty.stderr
    empty_json = cli("suite", "list", "-o", "json")
    assert json.loads(empty_json.stdout)["items"] == []

    suite_crud.create("nightly", triggers=_schedule(), baseline={"pinned": "prod-eval"})
    suite_crud.create("by-hand", suspend=True)
    # The run going on is a job of its own: `get` reads its state by name and UID.
    running = jobs.create("nightly-c0ffee01")
    suite_crud.set_status("nightly", _nightly_status(running["metadata"]["uid"]))

    listed = cli("suite", "list")
    assert listed.returncode == 0, listed.stderr
    header = listed.stdout.splitlines()[0].split()
    assert header == ["NAME", "VERDICT", "TRIGGERS", "LAST", "RUN", "ACTIVE", "AGE"]
    nightly = _row(listed.stdout, "nightly")
    assert nightly[:3] == ["nightly", "Regressed", "0 3 * * * Europe/Berlin, isvc/llm"]
    assert re.fullmatch(r"3\dm", nightly[3]) and nightly[4] == "1", nightly
    assert _row(listed.stdout, "by-hand")[:5] == ["by-hand", "-", "manual (suspended)", "-", "0"]

    wide = cli("suite", "ls", "-o", "wide", "--no-headers")
    assert "run nightly-c0ffee01 started (Manual)" in _row(wide.stdout, "nightly")[-1]
    assert "NAME" not in wide.stdout
    everywhere = cli("suite", "list", "-A")
    assert _row(everywhere.stdout, "nightly", column=1)[:2] == [cli.namespace, "nightly"]
    names = cli("suite", "list", "-o", "name")
    assert names.stdout.split() == [f"{RESOURCE}/by-hand", f"{RESOURCE}/nightly"]

    shown = cli("suite", "get", "nightly")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    for words in (
        "Verdict:",
        "Schedule:",
        "0 3 * * * (Europe/Berlin)",
        "InferenceService llm",
        "lmeval suite run nightly",
        "LastPassed: the latest run that passed, else prod-eval",
        "Runs (oldest first):",
        "Run nightly-9b8a7c6d: Regressed, against nightly-0a1b2c3d",
        "toy_mc acc,none regressed: drop 0.0725 > max drop 0.05, p=0.00031",
    ):
        assert words in text, (words, text)
    # The runs: trigger, what it ran for, state, verdict, reason, baseline.
    scheduled = _row(text, "nightly-0a1b2c3d")
    assert scheduled[1:3] == ["Schedule", _ago(days=1)]
    assert scheduled[4:] == ["Finished", "Passed", "Passed", "prod-eval"]
    changed = _row(text, "nightly-9b8a7c6d")
    assert changed[1:3] == ["ModelChange", "llm-predictor-00002"]
    assert changed[4:] == ["Finished", "Regressed", "Regressed", "nightly-0a1b2c3d"]
    manual = _row(text, "nightly-c0ffee01")
    assert manual[1:3] == ["Manual", "-"]
    assert manual[4:] == ["Active (New)", "-", "-", "-"]
    # Each criterion of each run: tier, verdict, reason, difference, p, paired, MDD.
    rows = [
        re.split(r"\s{3,}", line.strip())
        for line in text.splitlines()
        if line.startswith(("toy_mc ", "toy_gen "))
    ]
    assert [
        "toy_mc", "acc,none", "Must", "Regressed", "Regressed", "-0.0725", "0.0003", "400",
        "0.0412",
    ] in rows  # fmt: skip
    assert [
        "toy_gen", "exact_match,none", "Should", "Inconclusive", "Underpowered", "-0.0200",
        "0.2000", "50", "0.2101",
    ] in rows  # fmt: skip
    assert ["toy_mc", "acc,none", "Must", "0.05", "0.05", "0.8", "higher"] in rows  # the spec's

    print(listed.stdout, wide.stdout, text, sep="\n")  # shown when a check fails
    as_json = cli("suite", "get", "nightly", "-o", "json")
    assert json.loads(as_json.stdout) == suite_crud.get("nightly")
    as_yaml = cli("suite", "get", f"{api.SUITE_SHORT_NAME}/by-hand", "-o", "yaml")
    assert yaml.safe_load(as_yaml.stdout)["spec"]["suspend"] is True

    both = cli("suite", "get", "nightly", "nightlyy")
    assert both.returncode == ExitCode.NOT_FOUND
    assert "Runs (oldest first):" in both.stdout
    assert (
        f'error: LMEvalSuite "nightlyy" not found in namespace "{cli.namespace}": '
        'did you mean "nightly"?'
    ) in both.stderr


@pytest.mark.cluster
def test_run_requests_a_run_the_poller_starts(
    cli: Cli, suite_crud: Suites, poller: Reconciler
) -> None:
    suite_crud.create("on-demand")
    keep = {"team": "nlp"}
    suite_crud.custom.patch_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, cli.namespace, api.SUITE_PLURAL, "on-demand",
        {"metadata": {"annotations": keep}},
    )  # fmt: skip

    first = cli("suite", "run", "on-demand")
    assert first.returncode == 0, first.stderr
    annotations = suite_crud.get("on-demand")["metadata"]["annotations"]
    token = annotations[api.RUN_REQUESTED_ANNOTATION]
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", token), token
    assert annotations["team"] == "nlp"  # a merge patch: the others stay
    lines = first.stdout.splitlines()
    assert lines[0] == (
        f"lmevalsuite/on-demand run requested in namespace {cli.namespace} "
        f"({api.RUN_REQUESTED_ANNOTATION}={token})"
    )
    assert lines[1].startswith("follow it: lmeval suite get on-demand (the run is listed")

    # The poller acts on the new value once: a Manual run, going on.
    def manual_run() -> dict[str, Any] | None:
        status = suite_crud.get("on-demand").get("status") or {}
        found = [r for r in status.get("runs") or [] if r.get("trigger") == "Manual"]
        return found[0] if found and status.get("lastRunRequest") == token else None

    run = cycle_until(poller, manual_run, what="a Manual run of on-demand")
    assert run["state"] == "Active"
    shown = cli("suite", "get", "on-demand")
    assert _row(shown.stdout, run["name"])[1] == "Manual", shown.stdout

    # Again: a new value, and the words say Forbid holds it behind the run going on.
    second = cli("suite", "run", "on-demand", "-o", "name")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == f"{RESOURCE}/on-demand"
    again = suite_crud.get("on-demand")["metadata"]["annotations"][api.RUN_REQUESTED_ANNOTATION]
    assert again != token
    assert f"{run['name']} is still running and concurrencyPolicy is Forbid" in second.stderr
    # Asked a third time before the poller saw the second: one run, not two, says so.
    third = cli("suite", "run", "on-demand", "-o", "name")
    assert f"the earlier request {again} had not been acted on yet" in third.stderr
    latest = suite_crud.get("on-demand")["metadata"]["annotations"][api.RUN_REQUESTED_ANNOTATION]
    pending = _row(cli("suite", "get", "on-demand").stdout, "Requested:")
    assert pending == ["Requested:", f"{latest} (not acted on yet)"]

    missing = cli("suite", "run", "on-demnd")
    assert missing.returncode == ExitCode.NOT_FOUND
    assert 'LMEvalSuite "on-demnd" not found' in missing.stderr
    assert 'did you mean "on-demand"?' in missing.stderr


@pytest.mark.cluster
def test_run_says_a_suspended_suite_holds_the_request(cli: Cli, suite_crud: Suites) -> None:
    suite_crud.create("paused", suspend=True)
    result = cli("suite", "run", "paused")
    assert result.returncode == 0, result.stderr
    assert "note: the suite is suspended: the run starts once spec.suspend is false" in (
        result.stderr
    )
    assert suite_crud.get("paused")["metadata"]["annotations"][api.RUN_REQUESTED_ANNOTATION]
    nothing = cli("suite", "get", "no-such-suite")
    assert nothing.returncode == ExitCode.NOT_FOUND
    assert 'LMEvalSuite "no-such-suite" not found' in nothing.stderr


# -- pure ------------------------------------------------------------------------------


def test_an_uninstalled_suite_api_is_exit_5_and_a_missing_suite_exit_4() -> None:
    collection = ApiError(404, {}, "list", api.SUITE_PLURAL, api.API_GROUP, "ns")
    assert explain(collection).code == ExitCode.NOT_INSTALLED
    assert "LMEvalSuite API not found" in explain(collection).message
    named = ApiError(
        404, {"details": {"name": "s"}}, "get", api.SUITE_PLURAL, api.API_GROUP, "ns", "s"
    )
    assert explain(named).code == ExitCode.NOT_FOUND
    assert explain(named).message.startswith('LMEvalSuite "s" not found in namespace "ns"')


def test_the_user_roles_grant_suites() -> None:
    assert role_for("list", api.SUITE_PLURAL, api.API_GROUP) == "lmeval-jobs-view"
    assert role_for("patch", api.SUITE_PLURAL, api.API_GROUP) == "lmeval-jobs-edit"
    assert role_for("patch", f"{api.SUITE_PLURAL}/status", api.API_GROUP) is None


def test_request_tokens_are_new_every_time() -> None:
    moment = dt.datetime(2026, 12, 1, 16, 3, 54, tzinfo=dt.UTC)
    tokens = {suites.request_token(moment) for _ in range(100)}
    assert len(tokens) == 100
    assert all(t.startswith("20261201T160354Z-") for t in tokens)


def test_the_triggers_in_words() -> None:
    def suite(**spec: Any) -> dict[str, Any]:
        return {"metadata": {"name": "s"}, "spec": spec}

    assert suiteview.triggers_text(suite()) == "manual"
    assert suiteview.triggers_text(suite(triggers={"schedule": {"cron": "@daily"}})) == "@daily"
    utc = {"schedule": {"cron": "0 3 * * *", "timeZone": "UTC"}}
    assert suiteview.triggers_text(suite(triggers=utc, suspend=True)) == "0 3 * * * (suspended)"
    model = {"modelChange": {"inferenceService": {"name": "m"}}}
    assert suiteview.triggers_text(suite(triggers=model)) == "isvc/m"
    # A partial or odd object never fails: the poller has not seen it, or wrote an older shape.
    assert suiteview.verdict({"status": "nonsense"}) == "-"
    assert suiteview.runs({"status": {"runs": ["x", {"name": "r"}]}}) == [{"name": "r"}]
    assert suiteview.run_criteria_grid({"criteria": [{"pValue": True}]})[1][0][6] == "-"


@pytest.mark.parametrize(
    ("command", "offered", "refused"),
    [
        (["suite", "list"], ["wide", "json", "yaml", "name", "jsonpath={.kind}"], ["csv"]),
        (["suite", "get", "x"], ["json", "yaml", "name", "custom-columns=N:.a"], ["wide"]),
        (["suite", "run", "x"], ["name", "json", "yaml"], ["table"]),
    ],
)
def test_suite_commands_offer_their_formats(
    command: list[str], offered: list[str], refused: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    for value in offered:
        assert parser.parse_args([*command, "-o", value]).output.name == value.partition("=")[0]
    for value in refused:
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([*command, "-o", value])
        assert exited.value.code == ExitCode.USAGE
        assert "unsupported output format" in capsys.readouterr().err
    # The cluster flags work after the nested command too, and `lmes` is `suite`.
    args = parser.parse_args(["lmes", "get", "x", "-n", "team-a"])
    assert (args.func, args.namespace) == (suites.cmd_suite_get, "team-a")
