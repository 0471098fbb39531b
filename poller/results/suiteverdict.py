"""An evaluation suite's verdict: each criterion judged against the baseline, then the whole.

Why a module of its own: the regression gate answers "did the score drop?"
and its "no" may only mean "too few documents to tell". A suite that
promotes models must not read that as a pass. So each criterion of a suite
run (a task's metric, a largest acceptable drop, the test's alpha and power,
a tier) gets one of three verdicts:

- Regressed: the gate's rule (`pairedstats.gate_verdict`): the drop exceeds
  maxDrop and p < alpha.
- Passed: compared, not regressed, and the comparison had the power to see a
  drop of maxDrop: its minimum detectable drop (`poller.results.power`, with
  the observed sd of the paired differences and the number of paired
  documents; for a 0/1 metric never an sd below what a drop of maxDrop
  implies) is at most maxDrop.
- Inconclusive: not regressed but underpowered (reason Underpowered), or not
  compared at all (NotComparable: different documents or task; NoItemScores:
  a side has no per-item scores for the task).

The suite's verdict (`suite_verdict`) counts the Must criteria: any Regressed
makes the suite Regressed, else any Inconclusive makes it Inconclusive; Should
criteria only turn Passed into PassedWithWarnings, Info criteria never count.
`precheck` asks the power question before a run, from its document limit.

Pure: the per-item scores arrive decoded (`driver.protocol.TaskItems`); the
pairing and the test are pairedstats', exactly as the regression gate runs
them (`poller.decisions.regression`, a layer above, which this module cannot
import).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver.protocol import TaskItems
from poller.results import pairedstats, power

__all__ = [
    "INCONCLUSIVE",
    "INFO",
    "MUST",
    "NOT_COMPARABLE",
    "NOT_REGRESSED",
    "NO_CRITERIA",
    "NO_ITEM_SCORES",
    "PASSED",
    "PASSED_WITH_WARNINGS",
    "REGRESSED",
    "SHOULD",
    "TIERS",
    "UNDERPOWERED",
    "VERDICTS",
    "Criterion",
    "CriterionResult",
    "judge",
    "not_compared",
    "precheck",
    "suite_verdict",
]

# Tiers: how much a criterion counts.
MUST = "Must"
SHOULD = "Should"
INFO = "Info"
TIERS = (MUST, SHOULD, INFO)

# Verdicts, of a criterion and of the suite.
PASSED = "Passed"
REGRESSED = "Regressed"
INCONCLUSIVE = "Inconclusive"
VERDICTS = (PASSED, REGRESSED, INCONCLUSIVE)

# A criterion's reasons (the regression gate's words where they mean the same).
NOT_REGRESSED = "NotRegressed"
UNDERPOWERED = "Underpowered"
NOT_COMPARABLE = "NotComparable"
NO_ITEM_SCORES = "NoItemScores"
# The suite's reasons besides REGRESSED and a Must criterion's reason.
PASSED_WITH_WARNINGS = "PassedWithWarnings"
NO_CRITERIA = "NoCriteria"

MESSAGE_MAX = 1024  # a condition's message, and status' one line


@dataclass(frozen=True)
class Criterion:
    """One criterion in plain values (the caller converts spec.criteria[])."""

    task: str
    metric: str
    max_drop: float
    alpha: float = 0.05
    power: float = 0.8
    higher_is_better: bool = True
    tier: str = MUST

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"tier must be one of {', '.join(TIERS)}, not {self.tier!r}")
        if not (math.isfinite(self.max_drop) and self.max_drop > 0):
            raise ValueError(f"maxDrop must be a finite number > 0, not {self.max_drop}")
        if not (0 < self.alpha < 1 and 0 < self.power < 1):
            raise ValueError(f"alpha and power must be in (0, 1), not {self.alpha}, {self.power}")


@dataclass(frozen=True)
class CriterionResult:
    """One criterion's verdict in one run, with the numbers (None: not computed)."""

    criterion: Criterion
    verdict: str  # PASSED, REGRESSED or INCONCLUSIVE
    reason: str  # REGRESSED, NOT_REGRESSED, UNDERPOWERED, NOT_COMPARABLE or NO_ITEM_SCORES
    message: str  # one line, at most MESSAGE_MAX characters
    p_value: float | None = None
    difference: float | None = None  # run minus baseline
    paired: int | None = None  # documents both runs scored
    # The smallest drop the test detects with the criterion's power at `paired`
    # documents; None when not compared, or when no drop is detectable at all.
    minimum_detectable_drop: float | None = None


def _line(text: str) -> str:
    """`text` on one line of at most MESSAGE_MAX characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MESSAGE_MAX else flat[: MESSAGE_MAX - 3] + "..."


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _judging_sd(sd: float, binary: bool, max_drop: float) -> float:
    """The sd the power is judged with: for a 0/1 metric, never below what a true drop
    of max_drop implies (two identical runs have sd 0, yet do not show that a drop
    would have been seen; `power.least_sd_of_binary_drop`)."""
    return max(sd, power.least_sd_of_binary_drop(max_drop)) if binary else sd


def not_compared(criterion: Criterion, reason: str, message: str) -> CriterionResult:
    """Inconclusive without a comparison: `reason` NOT_COMPARABLE or NO_ITEM_SCORES,
    `message` saying why (for callers that found out before `judge`, e.g. reading
    the scores)."""
    if reason not in (NOT_COMPARABLE, NO_ITEM_SCORES):
        raise ValueError(f"a criterion is not compared for {NOT_COMPARABLE} or {NO_ITEM_SCORES}")
    return CriterionResult(criterion, INCONCLUSIVE, reason, _line(message))


def judge(
    criterion: Criterion,
    baseline: TaskItems | None,
    run: TaskItems | None,
    *,
    baseline_results: Mapping[str, Any] | None = None,
    run_results: Mapping[str, Any] | None = None,
) -> CriterionResult:
    """The criterion's verdict for `run` against `baseline` (A = baseline, B = run). Pure.

    `baseline` and `run` are the criterion's task's per-item scores (None: that
    side has none). `baseline_results` and `run_results`, lm_eval's results
    JSONs when kept, add the gate's check of task versions, few-shot counts and
    task hashes.
    """
    c = criterion
    if baseline is None or run is None:
        sides = (("the baseline", baseline), ("this run", run))
        missing = [who for who, items in sides if items is None]
        message = f"{' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no "
        message += f"per-item scores for task {c.task}"
        return not_compared(c, NO_ITEM_SCORES, message)
    try:
        if baseline_results is not None and run_results is not None:
            pairedstats.check_results_comparable(c.task, baseline_results, run_results)
        paired = pairedstats.pair_tasks(baseline, run, c.metric)
    except pairedstats.NotComparable as refused:
        return not_compared(c, NOT_COMPARABLE, str(refused))
    result = pairedstats.compare_paired(paired.a, paired.b, binary=paired.binary)
    verdict = pairedstats.gate_verdict(
        result, max_drop=c.max_drop, alpha=c.alpha, higher_is_better=c.higher_is_better
    )
    observed = power.observed_sd_of_differences(paired.a, paired.b) if result.n >= 2 else 0.0
    check = power.check_power(
        result.n,
        _judging_sd(observed, paired.binary, c.max_drop),
        alpha=c.alpha,
        power=c.power,
        max_drop=c.max_drop,
    )
    if verdict.regressed:
        outcome, reason, message = REGRESSED, REGRESSED, verdict.message
    elif not check.enough:
        message = f"underpowered: {power.describe(check)}; {verdict.message}"
        outcome, reason = INCONCLUSIVE, UNDERPOWERED
    else:
        outcome, reason = PASSED, NOT_REGRESSED
        message = f"{verdict.message}; {power.describe(check)}"
    return CriterionResult(
        c,
        outcome,
        reason,
        _line(message),
        p_value=_finite(result.p_value),
        difference=_finite(result.difference),
        paired=result.n,
        minimum_detectable_drop=_finite(check.minimum_detectable_drop),
    )


def _named(result: CriterionResult) -> str:
    """A criterion's outcome in a few words, for the suite's message."""
    c = result.criterion
    said = f"{c.tier} {c.task} {c.metric}: {result.verdict} ({result.reason}"
    if result.difference is not None:
        said += f", B-A {result.difference:+.4f}"
    if result.p_value is not None:
        said += f", p={pairedstats.format_p(result.p_value)}"
    if result.reason == UNDERPOWERED:
        mdd = result.minimum_detectable_drop
        seen = "no drop" if mdd is None else f"drops of {mdd:.4f}+"
        said += f", {result.paired} documents detect {seen}, maxDrop {c.max_drop:g}"
    return said + ")"


def suite_verdict(results: Sequence[CriterionResult]) -> tuple[str, str, str]:
    """(verdict, reason, message) of a run from its criteria's results. Pure.

    Must criteria decide: any Regressed -> Regressed (reason Regressed); else
    any Inconclusive -> Inconclusive (the first one's reason); else Passed,
    reason PassedWithWarnings when a Should criterion regressed or is
    inconclusive, else Passed. Info criteria never count. No criteria at all:
    Inconclusive (NoCriteria). The message names each criterion that did not
    pass (Info ones too, marked as not counted).
    """
    if not results:
        return INCONCLUSIVE, NO_CRITERIA, "the suite has no criteria to judge a run by"
    must = [r for r in results if r.criterion.tier == MUST]
    should = [r for r in results if r.criterion.tier == SHOULD]
    failing = [r for r in results if r.verdict != PASSED]
    must_regressed = [r for r in must if r.verdict == REGRESSED]
    must_inconclusive = [r for r in must if r.verdict == INCONCLUSIVE]
    if must_regressed:
        verdict, reason = REGRESSED, REGRESSED
        head = f"{len(must_regressed)} of {len(must)} Must criteria regressed"
    elif must_inconclusive:
        verdict, reason = INCONCLUSIVE, must_inconclusive[0].reason
        head = f"{len(must_inconclusive)} of {len(must)} Must criteria inconclusive"
    elif any(r.verdict != PASSED for r in should):
        verdict, reason = PASSED, PASSED_WITH_WARNINGS
        warned = sum(1 for r in should if r.verdict != PASSED)
        head = f"all {len(must)} Must criteria passed; {warned} of {len(should)} Should did not"
    else:
        verdict, reason = PASSED, PASSED
        head = f"all {len(must)} Must and {len(should)} Should criteria passed"
    named = [
        _named(r) + (" [Info, not counted]" if r.criterion.tier == INFO else "") for r in failing
    ]
    return verdict, reason, _line("; ".join([head, *named]))


def precheck(
    criterion: Criterion, n_max: int | None, baseline_values: Sequence[float] | None
) -> power.PowerCheck | None:
    """Whether a run of at most `n_max` documents can pass `criterion`, before it starts.

    None when the number of documents is not known (no whole-number limit).
    Else the power check at n = n_max, with the sd of differences assumed from
    the baseline's per-item values (`power.assumed_sd_of_differences`, which
    errs towards asking for more documents; the [0, 1] worst case without values), and for
    values that are all 0 or 1 (or none) never below what a drop of maxDrop
    implies. A task with fewer documents than the limit gets fewer: `judge`
    checks the power again with the documents the run actually scored.
    """
    if n_max is None:
        return None
    binary = all(v in (0, 1) for v in baseline_values or () if not math.isnan(v))
    sd = _judging_sd(power.assumed_sd_of_differences(baseline_values), binary, criterion.max_drop)
    return power.check_power(
        n_max, sd, alpha=criterion.alpha, power=criterion.power, max_drop=criterion.max_drop
    )
