"""What ``wait`` (and ``submit --wait``, ``rerun --wait``) waits for, and for how long.

Why this module exists: ``--for`` and ``--timeout`` are spelled as kubectl
spells them, and three commands share them, so they are parsed once here.

``--for``:

- ``condition=Succeeded`` (the default; ``succeeded`` is the older
  spelling): the job ended Complete with reason Succeeded;
- ``condition=Finished`` (``finished``; ``condition=Complete`` as kubectl's
  users write it for Jobs): the job ended, however;
- ``condition=Scheduled``, ``condition=Running``, ``condition=Suspended``,
  ``condition=Regressed``, ``condition=ResultsPushed``: that condition of
  ``status.conditions`` is True;
- ``condition=TYPE=false`` (or ``=true``): the condition has that status;
- ``delete``: the job is gone.

Condition names and values are compared case-insensitively, as kubectl does.
Finished and Succeeded are read from ``status.state`` and ``status.reason``,
which those conditions mirror. Unlike kubectl, a job that ended without
meeting the condition stops the wait at once (exit 1): a finished job's
state and its Scheduled, Running, Suspended, Finished and Succeeded
conditions never change again, so waiting longer could only end in a
timeout (Regressed and ResultsPushed are written after the end: for those
the wait goes on).

``--timeout`` takes a duration (``30s``, ``5m``, ``1h30m``): ``0`` checks
once and does not wait, a negative value waits a week, as in kubectl.
``wait`` gives up after 30 s by default (kubectl's default); ``submit
--wait`` and ``rerun --wait`` follow the new job without a limit unless
``--timeout`` is given, since an evaluation takes as long as it takes.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from lmeval_cli import facts
from lmeval_cli.errors import CliError, ExitCode
from poller.cliapi import api, parse_duration

__all__ = [
    "WAIT_DEFAULT_TIMEOUT",
    "WEEK_SECONDS",
    "WaitFor",
    "add_wait_flags",
    "parse_for",
    "parse_timeout",
    "timeout_arg",
]

WAIT_DEFAULT_TIMEOUT = "30s"
WEEK_SECONDS = 7 * 24 * 3600.0
_CONDITIONS = {c.value.lower(): c.value for c in api.ConditionType}
# kubectl's users wait for Jobs with condition=complete.
_ALIASES = {"complete": api.ConditionType.FINISHED.value}
_OLD_SPELLINGS = {
    "succeeded": api.ConditionType.SUCCEEDED.value,
    "finished": api.ConditionType.FINISHED.value,
}
# Conditions a finished job no longer changes. Regressed and ResultsPushed are
# written after the job ends (the gate's verdict, the push to a registry).
_SETTLED_WHEN_FINISHED = {
    api.ConditionType.SCHEDULED.value,
    api.ConditionType.RUNNING.value,
    api.ConditionType.FINISHED.value,
    api.ConditionType.SUCCEEDED.value,
    api.ConditionType.SUSPENDED.value,
}


@dataclass(frozen=True)
class WaitFor:
    """One parsed ``--for``: a condition type and the status wanted, or deletion."""

    condition: str  # a api.ConditionType value, or "" for deletion
    status: bool = True

    @property
    def delete(self) -> bool:
        return not self.condition

    def describe(self) -> str:
        """For messages: 'to be succeeded', 'to have condition Running=True'..."""
        if self.delete:
            return "to be deleted"
        if self.status and self.condition in ("Succeeded", "Finished"):
            return f"to be {self.condition.lower()}"
        return f"to have condition {self.condition}={self.status}"

    def met(self, job: dict[str, Any]) -> bool:
        """Whether the job (as read) meets it; deletion is checked by the caller."""
        finished = facts.state(job) == api.JobState.COMPLETE.value
        if self.condition == api.ConditionType.FINISHED.value:
            return finished == self.status
        if self.condition == api.ConditionType.SUCCEEDED.value:
            succeeded = finished and facts.reason(job) == api.JobReason.SUCCEEDED.value
            return succeeded if self.status else finished and not succeeded
        for condition in facts.conditions(job):
            if str(condition.get("type")) == self.condition:
                return str(condition.get("status")).lower() == str(self.status).lower()
        return False

    def never(self, job: dict[str, Any]) -> bool:
        """The job ended without meeting it: it never will (a finished job stays so)."""
        return (
            self.condition in _SETTLED_WHEN_FINISHED
            and facts.state(job) == api.JobState.COMPLETE.value
            and not self.met(job)
        )


def parse_for(text: str) -> WaitFor:
    """``--for`` as kubectl spells it (plus the older ``succeeded``/``finished``)."""
    value = text.strip()
    lowered = value.lower()
    if lowered in _OLD_SPELLINGS:
        return WaitFor(_OLD_SPELLINGS[lowered])
    if lowered == "delete":
        return WaitFor("")
    kind, equals, rest = value.partition("=")
    if kind.lower() != "condition" or not equals:
        raise CliError(
            f"--for {text!r}: use condition=NAME[=true|false] (NAME: "
            f"{', '.join(_CONDITIONS.values())}, or Complete), delete, succeeded or finished",
            ExitCode.USAGE,
        )
    name, _, wanted = rest.partition("=")
    canonical = _ALIASES.get(name.lower()) or _CONDITIONS.get(name.lower())
    if canonical is None:
        raise CliError(
            f"--for {text!r}: an LMEvalJob has no condition {name!r} "
            f"(its conditions: {', '.join(_CONDITIONS.values())}; Complete means Finished)",
            ExitCode.USAGE,
        )
    if wanted.lower() not in ("", "true", "false"):
        raise CliError(
            f"--for {text!r}: a condition's status is true or false, not {wanted!r}",
            ExitCode.USAGE,
        )
    return WaitFor(canonical, wanted.lower() != "false")


def parse_timeout(text: str | None) -> float | None:
    """'10m' -> 600; '0' -> 0 (check once); negative -> a week; None -> no limit."""
    if text is None:
        return None
    value = text.strip()
    negative = value.startswith("-")
    try:
        seconds = parse_duration(value.removeprefix("-"))
    except ValueError as error:
        raise CliError(f"--timeout: {error}", ExitCode.USAGE) from error
    return WEEK_SECONDS if negative and seconds > 0 else seconds


def _for_type(text: str) -> WaitFor:
    try:
        return parse_for(text)
    except CliError as error:
        raise argparse.ArgumentTypeError(error.message) from None


def timeout_arg(text: str) -> float | None:
    try:
        return parse_timeout(text)
    except CliError as error:
        raise argparse.ArgumentTypeError(error.message.removeprefix("--timeout: ")) from None


def add_wait_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    timeout_default: str | None,
    prefix: str = "",
) -> None:
    """``--for`` and ``--timeout`` (`prefix` heads their help, e.g. 'with --wait: ')."""
    parser.add_argument(
        "--for",
        dest="wait_for",
        type=_for_type,
        # A string: argparse parses it like a typed value (and --help shows it so).
        default="condition=Succeeded",
        metavar="CONDITION",
        help=f"{prefix}condition=Succeeded (default: exit 1 if the job ends otherwise), "
        "condition=Finished (or Complete: ended, however), condition=Running, "
        "condition=NAME=false, delete",
    )
    limit = (
        f"default {timeout_default}" if timeout_default else "default: no limit"
    ) + "; 0 checks once, negative waits a week"
    parser.add_argument(
        "--timeout",
        type=timeout_arg,
        default=timeout_default,
        metavar="DURATION",
        help=f"{prefix}give up after this long, e.g. 10m ({limit})",
    )
