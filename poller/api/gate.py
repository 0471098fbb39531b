"""The LMEvalJob API: the regression gate's spec.gate and status.gate.

Why a module of its own: the gate (`poller.decisions.regression`) has a spec block and a
status block of its own, and `poller.api` stays readable without them.
Re-exported by ``poller.api``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from poller.api.base import TASK_NAME, _Model

__all__ = ["DEFAULT_GATE_METRIC", "GATE_METRIC", "GateStatus", "RegressionGate"]

# A score's key in lm_eval's results: "<metric>,<filter>" (acc,none; exact_match,strict-match).
GATE_METRIC = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*,[A-Za-z0-9_][A-Za-z0-9_.-]*$"
DEFAULT_GATE_METRIC = "acc,none"


class RegressionGate(_Model):
    """spec.gate: which score of which task may not drop against spec.baseline, and how
    sure the poller must be that it did (a paired test over the same documents)."""

    task: Annotated[str, Field(pattern=TASK_NAME, max_length=256)] = Field(
        description="The task compared (one of spec.tasks, or a task of a group in it); at "
        "most 256 characters, as a task name in spec.tasks."
    )
    metric: Annotated[str, Field(pattern=GATE_METRIC, max_length=128)] = Field(
        default=DEFAULT_GATE_METRIC,
        description="The score compared, as lm_eval's results key <metric>,<filter> "
        f"(default {DEFAULT_GATE_METRIC}; e.g. exact_match,strict-match); at most 128 "
        "characters.",
    )
    max_drop: Annotated[float, Field(ge=0, le=1e9)] = Field(
        default=0.0,
        description="The largest acceptable drop, in the metric's units (0.02 is two points "
        "of accuracy); default 0, from 0 to 1e9 (a bound that keeps it a finite number).",
    )
    alpha: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=0.05,
        description="Significance level: a drop counts only when the paired test's p-value "
        "is below it; default 0.05, strictly between 0 and 1 (a probability).",
    )
    higher_is_better: bool = Field(
        default=True,
        description="Whether a higher value of the metric is better (true for accuracy and "
        "exact match; false for e.g. word_perplexity); default true.",
    )


class GateStatus(_Model):
    """The regression gate's last outcome (spec.gate), with the paired comparison's numbers."""

    baseline: str = Field(
        description="spec.baseline (the job compared with) when this was decided."
    )
    baseline_uid: str | None = Field(
        default=None,
        description="The UID of the baseline object this outcome is for: a verdict stays bound "
        "to it, whatever is later deleted or created under spec.baseline's name.",
    )
    task: str = Field(description="The task compared (spec.gate.task).")
    metric: str = Field(description="The score compared (spec.gate.metric).")
    verdict: str = Field(
        description="Regressed (the drop exceeds maxDrop with p < alpha), NotRegressed (the "
        "comparison ran and it does not) or Unknown (no comparison: reason says why)."
    )
    reason: str = Field(
        description="Condition Regressed's reason: the verdict, or why there is none "
        "(WaitingForBaseline, BaselineMissing, BaselineFailed, NoItemScores, NotComparable, "
        "JobNotSucceeded, InvalidGate)."
    )
    final: bool = Field(
        default=False,
        description="True when not computed again (default false): a verdict (Regressed, "
        "NotRegressed) never is; NoItemScores and NotComparable are final for this spec "
        "generation and baselineUid.",
    )
    generation: int | None = Field(
        default=None, description="The spec generation (metadata.generation) this outcome is for."
    )
    test: str | None = Field(
        default=None,
        description="The paired test used: exact McNemar for 0/1 metrics, a paired bootstrap "
        "otherwise.",
    )
    # Not "n": YAML 1.1 readers (kubectl's among them) take a bare n for false.
    paired: int | None = Field(
        default=None, description="How many documents both runs scored (n), the pairs compared."
    )
    baseline_score: float | None = Field(
        default=None, description="The baseline's mean over the pairs (A)."
    )
    score: float | None = Field(default=None, description="This job's mean over the pairs (B).")
    difference: float | None = Field(
        default=None,
        description="score - baselineScore (B - A); negative is a drop when higher is better.",
    )
    ci_low: float | None = Field(
        default=None, description="Lower end of the confidence interval of difference."
    )
    ci_high: float | None = Field(
        default=None, description="Upper end of the confidence interval of difference."
    )
    confidence: float | None = Field(
        default=None, description="The interval's confidence level, e.g. 0.95."
    )
    p_value: float | None = Field(
        default=None, description="The paired test's p-value, compared with alpha."
    )
    baseline_only: int | None = Field(
        default=None, description="Items better in the baseline (0/1: right there, wrong here)."
    )
    candidate_only: int | None = Field(
        default=None, description="Items better in this job (0/1: wrong there, right here)."
    )
    max_drop: float | None = Field(default=None, description="spec.gate.maxDrop applied.")
    alpha: float | None = Field(default=None, description="spec.gate.alpha applied.")
