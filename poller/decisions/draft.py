"""The next status of a job, drafted field by field and written only if it changed.

`decide` builds a `StatusDraft` from the job's current status, moves its
state, conditions and progress, and asks it for the actions at the end: no
action at all when the draft equals the current status (which is what keeps
an idle cycle from writing anything), else one status patch guarded by the
resourceVersion the job was read at, followed by one Event per state change.
Conditions follow the Kubernetes convention: `lastTransitionTime` moves only
when a condition's status flips, and `observedGeneration` says which spec
generation the condition reflects. Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from enum import StrEnum

from driver import protocol
from poller import api
from poller.decisions.actions import Action, PatchStatus, PostEvent
from poller.decisions.views import JobView
from poller.timefmt import format_time

__all__ = ["StatusDraft", "set_condition"]

C = api.ConditionType
S = api.JobState
R = api.JobReason

# Progress text kept in status (the driver sends at most 160 characters of phase).
MAX_PHASE_CHARS = 200
# A status message and each condition's: they may quote a driver's final
# marker or lm_eval's error line (job-controlled text), and they travel in
# every LIST of jobs, three conditions repeating the message of a finished one.
MAX_MESSAGE_CHARS = 2048


_SHORTENED = " ... (shortened)"


def _bounded(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - len(_SHORTENED)] + _SHORTENED


def _finite(value: object) -> float | None:
    """`value` as a finite float; None for anything else (bool, text, NaN, 1e999, 10**400)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return number if math.isfinite(number) else None


def set_condition(
    conditions: list[api.Condition],
    kind: StrEnum,
    status: bool | None,
    reason: str,
    message: str,
    now: str,
    generation: int,
) -> list[api.Condition]:
    """Conditions with `kind` set (status None: Unknown); lastTransitionTime moves
    only when status flips."""
    wanted = "Unknown" if status is None else "True" if status else "False"
    out: list[api.Condition] = []
    previous: api.Condition | None = None
    for condition in conditions:
        if condition.type == kind.value:
            previous = condition
        else:
            out.append(condition)
    moved = previous is None or previous.status != wanted
    out.append(
        api.Condition(
            type=kind.value,
            status=wanted,
            reason=reason,
            message=_bounded(message),
            last_transition_time=now
            if moved or previous is None
            else previous.last_transition_time,
            observed_generation=generation,
        )
    )
    # Keep a stable order so that an unchanged set compares equal.
    order = {member.value: index for index, member in enumerate(type(kind))}
    return sorted(out, key=lambda c: order.get(c.type, len(order)))


class StatusDraft:
    """A mutable draft of the next status, compared with the current one at the end."""

    def __init__(self, job: JobView, now: dt.datetime) -> None:
        self.job = job
        self.moment = now
        self.now = format_time(now)
        self.fields = job.status.model_dump(exclude_none=True)
        self.conditions = list(job.status.conditions or [])
        self.events: list[PostEvent] = []

    def condition(
        self, kind: api.ConditionType, status: bool | None, reason: str, message: str = ""
    ) -> None:
        self.conditions = set_condition(
            self.conditions, kind, status, reason, message, self.now, self.job.generation
        )

    def state(
        self, state: api.JobState, reason: api.JobReason, message: str, event: str | None = None
    ) -> None:
        if self.fields.get("state") != state.value:
            kind = "Warning" if reason == R.FAILED else "Normal"
            default = reason.value if state == S.COMPLETE else state.value
            self.events.append(PostEvent(kind, event or default, _bounded(message)))
        self.fields.update(state=state, reason=reason, message=_bounded(message))

    def event(self, kind: str, reason: str, message: str) -> None:
        """Post an Event with the patch (only if the status changes)."""
        self.events.append(PostEvent(kind, reason, _bounded(message)))

    def finish(self, reason: api.JobReason, message: str, cause: str | None = None) -> None:
        self.state(S.COMPLETE, reason, message, event=cause)
        self.fields.setdefault("complete_time", self.now)
        self.fields.pop("suspend_time", None)
        self.condition(C.RUNNING, False, "Finished", message)
        self.condition(C.FINISHED, True, cause or reason.value, message)
        self.condition(C.SUCCEEDED, reason == R.SUCCEEDED, cause or reason.value, message)
        if any(c.type == C.SUSPENDED.value for c in self.conditions):
            self.condition(C.SUSPENDED, False, "Finished", message)

    def progress(self, marker: Mapping[str, object]) -> None:
        """Take a driver progress marker (untrusted: only its numbers and a short text).

        A number that is not finite (NaN or Infinity, which JSON cannot carry
        in a status patch), or not between 0 and 100 for the percentage, is
        left out rather than written.
        """
        fields = protocol.read_fields(marker, protocol.ProgressFields)
        value = _finite(fields.get("percent"))
        if value is not None and not 0.0 <= value <= 100.0:
            value = None
        phase = (fields.get("phase") or "")[:MAX_PHASE_CHARS]
        n, total = fields.get("n"), fields.get("total")
        finite = _finite(n) is not None and _finite(total) is not None
        counts = f" ({n}/{total})" if finite else ""
        line = f"{value:.0f}% {phase}{counts}".strip() if value is not None else phase
        current = self.fields.get("progress") or {}
        if current.get("percent") == value and current.get("phase") == (phase or None):
            return
        self.fields["progress"] = {
            "percent": value,
            "phase": phase or None,
            "line": line[:MAX_PHASE_CHARS] or None,
            "update_time": self.now,
        }

    def actions(self, before: list[Action] | None = None) -> list[Action]:
        self.fields["conditions"] = self.conditions
        self.fields["observed_generation"] = self.job.generation
        new = api.LMEvalJobStatus.model_validate(self.fields)
        if new == self.job.status:
            return list(before or [])
        return [*(before or []), PatchStatus(new, self.job.resource_version), *self.events]
