"""kubectl's conventions in ``lmeval`` that need no cluster: ``--for``, ``--timeout``,
selections, the parser's ``-o`` per command, and the kubeconfig message.

Checks: ``--for`` accepts kubectl's ``condition=NAME[=true|false]`` (any
case, ``Complete`` for Finished), ``delete``, and the older ``succeeded`` /
``finished``, and refuses other conditions naming the job's; a condition is
met, unmet, or can no longer be met on the statuses the poller writes;
``--timeout`` is 30 s by default on ``wait``, ``0`` means check once and a
negative value a week, and ``submit --wait`` has no limit; names and
``-l`` are exclusive, ``-A`` goes with ``-l`` only; every command's ``-o``
offers its formats and refuses the rest; ``compare --json`` still works,
with a warning; a missing kubeconfig is reported with the files tried, and
advises setting ``KUBECONFIG`` only when it is not set.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from lmeval_cli import selection, waitfor
from lmeval_cli.__main__ import build_parser
from lmeval_cli.errors import CliError, ExitCode
from lmeval_cli.kubeconfig import connect


def _job(state: str = "", reason: str = "", **conditions: str) -> dict[str, Any]:
    status: dict[str, Any] = {"state": state, "reason": reason}
    status["conditions"] = [{"type": t, "status": s} for t, s in conditions.items()]
    return {"metadata": {"name": "j"}, "status": status}


def test_for_is_spelled_as_kubectl() -> None:
    parse = waitfor.parse_for
    assert parse("condition=Succeeded") == parse("succeeded") == waitfor.WaitFor("Succeeded")
    assert parse("condition=complete") == parse("finished") == waitfor.WaitFor("Finished")
    assert parse("Condition=RUNNING=false") == waitfor.WaitFor("Running", False)
    assert parse("condition=Regressed=True") == waitfor.WaitFor("Regressed", True)
    assert parse("delete").delete
    for bad, words in (
        ("condition=Ready", "has no condition 'Ready'"),
        ("jsonpath={.status.state}=Complete", "use condition=NAME"),
        ("condition=Running=maybe", "true or false"),
        ("create", "use condition=NAME"),
    ):
        with pytest.raises(CliError) as refused:
            parse(bad)
        assert refused.value.code == ExitCode.USAGE and words in refused.value.message


def test_conditions_met_unmet_and_never() -> None:
    succeeded = waitfor.WaitFor("Succeeded")
    done, failed = _job("Complete", "Succeeded"), _job("Complete", "Failed")
    running = _job("Running", Running="True", Scheduled="True")
    assert succeeded.met(done) and not succeeded.never(done)
    assert not succeeded.met(failed) and succeeded.never(failed)
    assert not succeeded.met(running) and not succeeded.never(running)
    assert waitfor.WaitFor("Succeeded", False).met(failed)
    assert not waitfor.WaitFor("Succeeded", False).met(running)
    finished = waitfor.WaitFor("Finished")
    assert finished.met(failed) and not finished.met(running)
    assert waitfor.WaitFor("Running").met(running)
    assert waitfor.WaitFor("Running").never(_job("Complete", "Failed", Running="False"))
    # Regressed is written after the end: a finished job may still get it.
    regressed = waitfor.WaitFor("Regressed")
    assert not regressed.met(done) and not regressed.never(done)
    assert regressed.met(_job("Complete", "Succeeded", Regressed="True"))


def test_timeouts_as_kubectl() -> None:
    assert waitfor.parse_timeout("1m30s") == 90
    assert waitfor.parse_timeout("0") == 0
    assert waitfor.parse_timeout("-1s") == waitfor.parse_timeout("-1") == 7 * 24 * 3600
    assert waitfor.parse_timeout(None) is None
    with pytest.raises(CliError, match="not a duration"):
        waitfor.parse_timeout("soon")
    parser = build_parser()
    assert parser.parse_args(["wait", "x"]).timeout == 30
    assert parser.parse_args(["wait", "x", "--timeout=0"]).timeout == 0
    assert parser.parse_args(["submit", "--model=dummy", "--wait"]).timeout is None
    assert parser.parse_args(["rerun", "x", "--wait"]).timeout is None
    assert parser.parse_args(["delete", "x"]).timeout is None


def _selection(*argv: str, command: str = "get") -> argparse.Namespace:
    return build_parser().parse_args([command, *argv])


def test_names_and_selectors_are_exclusive() -> None:
    selection.check_selection(_selection("a", "b"))
    selection.check_selection(_selection("-l", "team=nlp", "-A"))
    selection.check_selection(_selection("--all", command="delete"))
    for argv, command, words in (
        (("a", "-l", "team=nlp"), "get", "not both"),
        (("a", "--all"), "delete", "not both"),
        (("a", "-A"), "cancel", "-A selects with -l"),
        ((), "suspend", "name the jobs"),
        ((), "delete", "-l SELECTOR or --all"),
    ):
        with pytest.raises(CliError) as refused:
            selection.check_selection(_selection(*argv, command=command))
        assert refused.value.code == ExitCode.USAGE and words in refused.value.message


@pytest.mark.parametrize(
    ("command", "offered", "refused"),
    [
        (
            ["list"],
            ["wide", "json", "yaml", "name", "jsonpath={.kind}", "custom-columns=N:.a"],
            ["csv"],
        ),
        (["get", "x"], ["wide", "json", "yaml", "name", "jsonpath={.kind}"], ["table"]),
        (["submit", "--model=dummy"], ["json", "yaml", "name", "custom-columns=N:.a"], ["wide"]),
        (["rerun", "x"], ["name", "jsonpath={.metadata.name}"], ["csv"]),
        (["cancel", "x"], ["name", "json"], ["wide"]),
        (["delete", "x"], ["name"], ["json"]),
        (["results", "x"], ["table", "csv", "markdown", "json"], ["yaml", "name"]),
        (["compare", "a", "b"], ["table", "csv", "markdown", "json"], ["wide"]),
        (["version"], ["json", "yaml"], ["name"]),
    ],
)
def test_each_command_offers_its_formats(
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


def test_compare_json_is_a_deprecated_alias(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["compare", "a", "b", "--json"])
    assert args.output.name == "json"
    assert "--json is deprecated: use -o json" in capsys.readouterr().err
    assert "--json" not in build_parser().format_help()


def test_missing_kubeconfig_says_what_was_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    first, second = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    with pytest.raises(CliError) as set_but_absent:
        connect(None, None, None)
    message = set_but_absent.value.message
    assert set_but_absent.value.code == ExitCode.CLUSTER
    assert f"tried {first}, {second}" in message
    assert "set KUBECONFIG" not in message and "point KUBECONFIG at" in message

    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(CliError) as unset:
        connect(None, None, None)
    assert "tried ~/.kube/config" in unset.value.message
    assert "set KUBECONFIG or pass --kubeconfig" in unset.value.message
