"""The regression gate (spec.baseline, spec.gate): did this job's score drop against its baseline?

Why a module of its own: a pipeline that promotes a model wants one answer
it can wait on, and an aggregate score cannot give it (two runs differ by a
point or two by chance alone). So once a gated job and its baseline have
both succeeded, the poller pairs their per-item scores over the same
documents (`poller.results.pairedstats`) and sets condition ``Regressed``: True when
the score dropped by more than ``maxDrop`` with a p-value below ``alpha``,
False when the comparison ran and did not show that, Unknown with a reason
otherwise. Never a silent pass: only a computed comparison sets False.

The decision follows the cycle's rule "observe everything, decide once":

* `needs_items` says whether deciding needs both jobs' per-item scores (the
  reads are two bounded ConfigMap GETs, made by `poller.cycle.observe`); that is
  only when both jobs succeeded and no outcome that is kept exists (a
  verdict, or a final outcome for this spec generation and baseline object);
* `decide_gate` turns the job, its baseline's listed view and what was read
  into status.gate and the condition. Outcomes that depend on the baseline's
  state (WaitingForBaseline, BaselineMissing, BaselineFailed) need no read
  and are decided again every cycle (level-triggered); NoItemScores and
  NotComparable are final for the spec's generation and the baseline object
  (its UID) they were computed for.

A verdict (Regressed or NotRegressed) is a record, bound to the baseline
object it was computed from (status.gate.baselineUid): it is never decided
again, whatever happens to the baseline afterwards. The baseline is named,
not owned: anyone who may delete and create LMEvalJobs in the namespace can
put another job under its name, and deciding again would let them turn a
recorded NotRegressed into Regressed or Unknown. Before a verdict exists the
gate follows the name (the current object, whose UID it records). Each
outcome is written whole (`apply_gate`): no number of an earlier outcome
survives beside a new one.

Pure: no I/O, no clock; the scores arrive as the base64 text of the
ConfigMap's binaryData and are unpacked here within bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from driver.protocol import ITEM_SCORES_LIMITS, TaskItems, decode_item_scores, parse_results_json
from poller import api
from poller.decisions.draft import StatusDraft
from poller.decisions.views import JobView
from poller.results import lmeval, pairedstats

__all__ = [
    "BASELINE_FAILED",
    "BASELINE_MISSING",
    "INVALID_GATE",
    "JOB_NOT_SUCCEEDED",
    "NOT_COMPARABLE",
    "NOT_REGRESSED",
    "NO_ITEM_SCORES",
    "REGRESSED",
    "VERDICTS",
    "WAITING_FOR_BASELINE",
    "GateOutcome",
    "GateView",
    "ItemsRead",
    "apply_gate",
    "baseline_name",
    "decide_gate",
    "needs_items",
    "recorded_verdict",
    "results_of",
    "task_items",
    "unpack_items",
]

# Condition Regressed's reasons.
REGRESSED = "Regressed"
NOT_REGRESSED = "NotRegressed"
WAITING_FOR_BASELINE = "WaitingForBaseline"
BASELINE_MISSING = "BaselineMissing"
BASELINE_FAILED = "BaselineFailed"
NO_ITEM_SCORES = "NoItemScores"
NOT_COMPARABLE = "NotComparable"
JOB_NOT_SUCCEEDED = "JobNotSucceeded"
INVALID_GATE = "InvalidGate"

S = api.JobState
R = api.JobReason


@dataclass(frozen=True)
class ItemsRead:
    """One job's per-item scores as read from its results ConfigMap.

    `encoded` is the ConfigMap's binaryData value under `results.ITEMS_KEY`
    (base64 of gzip of the driver's JSON); `problem` says why there is none.
    `results` is lm_eval's results JSON beside them (data `results.RESULTS_KEY`,
    or the base64 of its gzip under binaryData ``RESULTS_KEY.gz`` when
    `results_packed`), whose task hashes say whether two runs' tasks agree.
    """

    encoded: str | None = None
    problem: str | None = None
    results: str | None = None
    results_packed: bool = False
    # The read itself failed (the API refused it): the outcome is not final,
    # the next cycle reads again.
    retry: bool = False


@dataclass(frozen=True)
class GateView:
    """A gated job's side of the gate: its baseline as listed, and what was read.

    `baseline` is None when no LMEvalJob of that name is listed in the job's
    namespace. `own` and `base` are filled by `poller.cycle.observe` when
    `needs_items` asked for them.
    """

    baseline: JobView | None
    own: ItemsRead | None = None
    base: ItemsRead | None = None


@dataclass(frozen=True)
class GateOutcome:
    """What the gate decided: the condition (None status: Unknown) and status.gate."""

    status: bool | None
    reason: str
    message: str
    fields: api.GateStatus


def baseline_name(job: JobView) -> str | None:
    """spec.baseline of a gated job (one with spec.gate), else None."""
    baseline = job.spec.get("baseline")
    if job.spec.get("gate") is None or not isinstance(baseline, str) or not baseline:
        return None
    return baseline


def _gate_spec(job: JobView) -> api.RegressionGate | str:
    try:
        return api.RegressionGate.model_validate(job.spec.get("gate"))
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"spec.gate.{where}: {first['msg']}"


VERDICTS = (REGRESSED, NOT_REGRESSED)


def recorded_verdict(job: JobView) -> bool:
    """Whether status.gate holds a verdict, which is never decided again: neither
    a baseline deleted or replaced under its name nor a later spec generation (an
    edit of a finished job's lifecycle fields bumps it) reopens it."""
    current = job.status.gate
    return current is not None and current.final and current.reason in VERDICTS


def _kept(job: JobView, view: GateView) -> bool:
    """Whether the job holds an outcome that is not decided again."""
    if recorded_verdict(job):
        return True
    current = job.status.gate
    if current is None or not current.final:
        return False
    if current.generation != job.generation or current.baseline != baseline_name(job):
        return False
    # NoItemScores and NotComparable stay when the baseline is deleted later,
    # and are decided again only for another object under that name (no
    # verdict was recorded yet: the gate follows the name).
    return view.baseline is None or view.baseline.uid == current.baseline_uid


def _listed_outcome(job: JobView, view: GateView) -> tuple[str, str] | None:
    """(reason, message) when the listing alone decides (no reads), else None."""
    name = baseline_name(job) or ""
    if name == job.name:
        return NOT_COMPARABLE, "spec.baseline names this job itself"
    if job.status.reason != R.SUCCEEDED:
        reason = (job.status.reason or R.NO_REASON).value
        return JOB_NOT_SUCCEEDED, f"this job ended {reason}: it has no scores to compare"
    baseline = view.baseline
    if baseline is None:
        return (
            BASELINE_MISSING,
            f"LMEvalJob {name} (spec.baseline) does not exist in namespace {job.namespace}",
        )
    if baseline.problem is not None:
        return BASELINE_FAILED, f"baseline {name} cannot be read: {baseline.problem}"
    if baseline.status.state != S.COMPLETE:
        state = (baseline.status.state or S.NEW).value
        return WAITING_FOR_BASELINE, f"waiting for baseline {name} to finish (it is {state})"
    if baseline.status.reason != R.SUCCEEDED:
        reason = (baseline.status.reason or R.NO_REASON).value
        said = f": {baseline.status.message}" if baseline.status.message else ""
        return BASELINE_FAILED, f"baseline {name} ended {reason}{said}"[:1024]
    return None


def needs_items(job: JobView, view: GateView) -> bool:
    """Whether deciding the gate needs both jobs' per-item scores read now. Pure."""
    if job.status.state != S.COMPLETE or baseline_name(job) is None or _kept(job, view):
        return False
    return not isinstance(_gate_spec(job), str) and _listed_outcome(job, view) is None


def unpack_items(encoded: str) -> bytes:
    """The driver's JSON from the ITEMS_KEY binaryData value: base64, then gzip, at
    most the decoder's byte limit (raises ValueError saying what is wrong)."""
    return lmeval.gunzip_base64(encoded, ITEM_SCORES_LIMITS.max_bytes, lmeval.ITEMS_KEY)


def results_of(read: ItemsRead | None) -> dict[str, Any] | None:
    """lm_eval's results JSON kept beside the items, or None (absent or unreadable:
    the task hashes are then not compared, the documents' digests still are)."""
    if read is None or read.results is None:
        return None
    try:
        if read.results_packed:
            return parse_results_json(lmeval.packed_results_text(read.results))
        return parse_results_json(read.results)
    except ValueError:
        return None


def task_items(read: ItemsRead | None, task: str, who: str) -> TaskItems | str:
    """The task's items from `read`, or why there are none (`who`: whose they are)."""
    if read is None or read.encoded is None:
        problem = read.problem if read is not None and read.problem else "nothing was read"
        return f"{who} has no per-item scores ({problem})"
    try:
        scores = decode_item_scores(unpack_items(read.encoded))
    except ValueError as error:
        return f"{who} has no usable per-item scores ({str(error)[:300]})"
    found = scores.tasks.get(task)
    if found is None:
        listed = ", ".join(sorted(scores.tasks)[:10]) or "none"
        return f"{who} has no per-item scores for task {task} (it has: {listed})"
    return found


def _noted(read: ItemsRead, job: JobView | None) -> ItemsRead:
    """`read`, its problem completed by what the job's status says of its items
    (status.itemScores: e.g. too large to keep, or none in the run)."""
    kept = job.status.item_scores if job is not None else None
    if read.encoded is not None or kept is None or not kept.message:
        return read
    problem = "; ".join(part for part in (read.problem, kept.message) if part)
    return ItemsRead(problem=problem[:600], retry=read.retry)


def _number(value: float | None) -> float | None:
    """A finite float for status (JSON has no NaN), else None."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def decide_gate(job: JobView, view: GateView) -> GateOutcome | None:
    """The gate's outcome for a Complete gated job; None to leave status as it is. Pure.

    None when the job is not gated, not Complete, already holds an outcome
    that is kept (a verdict, whatever became of its baseline since; or a
    final outcome for its spec generation and baseline object), or when the
    per-item scores it needs were not read (`needs_items`).
    """
    name = baseline_name(job)
    if name is None or job.status.state != S.COMPLETE or _kept(job, view):
        return None
    gate = _gate_spec(job)
    listed_base = view.baseline
    start = api.GateStatus(
        baseline=name,
        baseline_uid=listed_base.uid if listed_base is not None else None,
        generation=job.generation,
        task="",
        metric="",
        verdict="Unknown",
        reason=INVALID_GATE,
    )
    if isinstance(gate, str):
        return GateOutcome(None, INVALID_GATE, gate, start)
    start = start.model_copy(
        update={
            "task": gate.task,
            "metric": gate.metric,
            "max_drop": gate.max_drop,
            "alpha": gate.alpha,
        }
    )
    listed = _listed_outcome(job, view)
    if listed is not None:
        reason, message = listed
        final = reason == NOT_COMPARABLE  # naming itself: only a new spec changes it
        return GateOutcome(None, reason, message, _unknown(start, reason, final))
    if view.own is None or view.base is None:
        return None  # the scores were not read this cycle
    own = task_items(_noted(view.own, job), gate.task, "this job")
    theirs = task_items(_noted(view.base, view.baseline), gate.task, f"baseline {name}")
    if isinstance(own, str) or isinstance(theirs, str):
        message = "; ".join(p for p in (theirs, own) if isinstance(p, str))
        if isinstance(theirs, str):
            message += (
                f"; run baseline {name} with spec.logSamples: true (or spec.gate) so that "
                "its per-item scores are kept"
            )
        final = not (view.own.retry or view.base.retry)
        return GateOutcome(None, NO_ITEM_SCORES, message, _unknown(start, NO_ITEM_SCORES, final))
    return _compared(theirs, own, gate, start, (results_of(view.base), results_of(view.own)))


def _unknown(start: api.GateStatus, reason: str, final: bool) -> api.GateStatus:
    return start.model_copy(update={"verdict": "Unknown", "reason": reason, "final": final})


def _compared(
    baseline: TaskItems,
    candidate: TaskItems,
    gate: api.RegressionGate,
    start: api.GateStatus,
    documents: tuple[dict[str, Any] | None, dict[str, Any] | None],
) -> GateOutcome:
    """The paired comparison (A = baseline, B = this job) and its verdict; `documents`
    are both runs' results JSONs (A, B), when kept, for their task hashes."""
    try:
        a_results, b_results = documents
        if a_results is not None and b_results is not None:
            pairedstats.check_results_comparable(gate.task, a_results, b_results)
        paired = pairedstats.pair_tasks(baseline, candidate, gate.metric)
    except pairedstats.NotComparable as refused:
        status = _unknown(start, NOT_COMPARABLE, True)
        return GateOutcome(None, NOT_COMPARABLE, str(refused), status)
    result = pairedstats.compare_paired(paired.a, paired.b, binary=paired.binary)
    verdict = pairedstats.gate_verdict(
        result, max_drop=gate.max_drop, alpha=gate.alpha, higher_is_better=gate.higher_is_better
    )
    reason = REGRESSED if verdict.regressed else NOT_REGRESSED
    status = start.model_copy(
        update={
            "verdict": reason,
            "reason": reason,
            "final": True,
            "test": result.test,
            "paired": result.n,
            "baseline_score": _number(result.mean_a),
            "score": _number(result.mean_b),
            "difference": _number(result.difference),
            "ci_low": _number(result.ci_low),
            "ci_high": _number(result.ci_high),
            "confidence": _number(result.confidence),
            "p_value": _number(result.p_value),
            "baseline_only": result.a_only,
            "candidate_only": result.b_only,
        }
    )
    return GateOutcome(verdict.regressed, reason, verdict.message, status)


def apply_gate(draft: StatusDraft, outcome: GateOutcome) -> None:
    """Write `outcome` into `draft`: status.gate, condition Regressed, and an event
    when a verdict is first reached."""
    before = draft.job.status.gate
    draft.fields["gate"] = outcome.fields.model_dump(exclude_none=True)
    draft.condition(api.ConditionType.REGRESSED, outcome.status, outcome.reason, outcome.message)
    if outcome.status is not None and (before is None or before.reason != outcome.reason):
        kind = "Warning" if outcome.status else "Normal"
        draft.event(kind, outcome.reason, outcome.message)
