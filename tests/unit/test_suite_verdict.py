"""A suite run's verdict (`poller.results.suiteverdict`) on synthetic per-item scores.

Checks `judge` on each outcome: Regressed for a clear drop on 2000 documents
(and for a rise of a lower-is-better metric); Passed for equal scores on
4000 documents with a maxDrop of 0.05, whether the runs agree item by item
or only on average; Inconclusive (Underpowered) for equal scores on 30
documents, including two identical 0/1 runs, whose sd of 0 must not count as
power; Passed on a non-0/1 metric with little noise; Inconclusive with
NotComparable for different document sets or differing task versions, and
with NoItemScores for a side without scores. Then `suite_verdict` over a
table of tiers (Must decides, Should only warns, Info never counts), its
message and its bound, and `precheck` before a run, from the limit and the
baseline's values.
"""

from __future__ import annotations

import math
import random

import pytest

from driver.itemscores import BINARY, FIXED, MetricItems, TaskItems
from poller.results import power
from poller.results import suiteverdict as sv

ACC = "acc,none"


def _task(values: list[float], *, ids: list[int] | None = None, metric: str = ACC) -> TaskItems:
    kind = BINARY if set(values) <= {0.0, 1.0} else FIXED
    doc_ids = tuple(ids if ids is not None else range(len(values)))
    return TaskItems(doc_ids, "a" * 64, {metric: MetricItems(kind, tuple(map(float, values)))})


def _correct(n: int, share: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [1.0 if rng.random() < share else 0.0 for _ in range(n)]


def _criterion(**changes: object) -> sv.Criterion:
    fields: dict[str, object] = {"task": "arc_easy", "metric": ACC, "max_drop": 0.05}
    fields.update(changes)
    return sv.Criterion(**fields)  # type: ignore[arg-type]


def test_a_clear_drop_on_2000_documents_regresses() -> None:
    baseline = _correct(2000, 0.8, seed=1)
    rng = random.Random(2)
    # A fifth of the right answers become wrong: a drop of about 0.16.
    run = [0.0 if v and rng.random() < 0.2 else v for v in baseline]
    result = sv.judge(_criterion(), _task(baseline), _task(run))
    assert (result.verdict, result.reason) == (sv.REGRESSED, sv.REGRESSED)
    assert result.paired == 2000
    assert result.difference is not None and result.difference < -0.1
    assert result.p_value is not None and result.p_value < 1e-10
    assert result.message.startswith("regressed: drop 0.1")


def test_lower_is_better_regresses_when_it_rises() -> None:
    rng = random.Random(3)
    baseline = [round(rng.uniform(1.0, 3.0), 3) for _ in range(300)]
    run = [v + 0.5 + rng.uniform(-0.1, 0.1) for v in baseline]
    metric = "perplexity,none"
    criterion = _criterion(metric=metric, max_drop=0.2, higher_is_better=False)
    result = sv.judge(criterion, _task(baseline, metric=metric), _task(run, metric=metric))
    assert (result.verdict, result.reason) == (sv.REGRESSED, sv.REGRESSED)
    flipped = sv.judge(criterion, _task(run, metric=metric), _task(baseline, metric=metric))
    assert (flipped.verdict, flipped.reason) == (sv.PASSED, sv.NOT_REGRESSED)


def test_equal_scores_on_4000_documents_pass() -> None:
    baseline = _correct(4000, 0.7, seed=4)
    identical = sv.judge(_criterion(), _task(baseline), _task(baseline))
    assert (identical.verdict, identical.reason) == (sv.PASSED, sv.NOT_REGRESSED)
    assert identical.difference == 0.0 and identical.p_value == 1.0
    # Even two identical runs are judged with the least sd a drop of 0.05 has.
    floor = power.minimum_detectable_drop(
        4000, power.least_sd_of_binary_drop(0.05), alpha=0.05, power=0.8
    )
    assert identical.minimum_detectable_drop == pytest.approx(floor)
    # Same accuracy on average, different documents right: a larger sd, still enough.
    other = random.Random(5).sample(baseline, len(baseline))
    shuffled = sv.judge(_criterion(), _task(baseline), _task(other))
    assert (shuffled.verdict, shuffled.reason) == (sv.PASSED, sv.NOT_REGRESSED)
    assert shuffled.minimum_detectable_drop is not None
    assert identical.minimum_detectable_drop < shuffled.minimum_detectable_drop <= 0.05
    assert (
        "no regression" in shuffled.message and "4000 documents detect a drop" in shuffled.message
    )


def test_equal_scores_on_30_documents_are_underpowered() -> None:
    baseline = _correct(30, 0.7, seed=6)
    for run in (baseline, random.Random(7).sample(baseline, 30)):
        result = sv.judge(_criterion(), _task(baseline), _task(run))
        assert (result.verdict, result.reason) == (sv.INCONCLUSIVE, sv.UNDERPOWERED)
        assert result.paired == 30
        assert result.minimum_detectable_drop is not None
        assert result.minimum_detectable_drop > 0.05
        assert result.message.startswith("underpowered: 30 documents detect a drop of 0.")
        assert "maxDrop 0.05 needs" in result.message and "no regression" in result.message
        assert len(result.message) <= sv.MESSAGE_MAX and "\n" not in result.message


def test_a_larger_max_drop_makes_30_documents_enough() -> None:
    baseline = _correct(30, 0.7, seed=6)
    result = sv.judge(_criterion(max_drop=0.5), _task(baseline), _task(baseline))
    assert (result.verdict, result.reason) == (sv.PASSED, sv.NOT_REGRESSED)


def test_too_few_documents_for_any_p_below_alpha_detect_nothing() -> None:
    result = sv.judge(_criterion(max_drop=0.9), _task([1, 0, 1]), _task([1, 0, 1]))
    assert (result.verdict, result.reason) == (sv.INCONCLUSIVE, sv.UNDERPOWERED)
    assert result.minimum_detectable_drop is None  # infinite: not a number status can hold
    assert "3 documents can detect no drop" in result.message


def test_a_continuous_metric_with_little_noise_passes() -> None:
    rng = random.Random(8)
    metric = "f1,none"
    baseline = [round(rng.random(), 6) for _ in range(200)]
    run = [round(min(1.0, max(0.0, v + rng.gauss(0, 0.02))), 6) for v in baseline]
    result = sv.judge(
        _criterion(metric=metric), _task(baseline, metric=metric), _task(run, metric=metric)
    )
    assert (result.verdict, result.reason) == (sv.PASSED, sv.NOT_REGRESSED)
    assert result.minimum_detectable_drop is not None and result.minimum_detectable_drop < 0.01


def test_different_documents_are_not_comparable() -> None:
    baseline = _task(_correct(100, 0.7, seed=9))
    run = _task(_correct(100, 0.7, seed=9), ids=list(range(50, 150)))
    result = sv.judge(_criterion(), baseline, run)
    assert (result.verdict, result.reason) == (sv.INCONCLUSIVE, sv.NOT_COMPARABLE)
    assert "50 only in A, 50 only in B, 50 in both" in result.message
    assert (result.p_value, result.difference, result.paired) == (None, None, None)


def test_differing_task_versions_in_the_results_are_not_comparable() -> None:
    items = _task(_correct(500, 0.7, seed=10))
    old, new = {"versions": {"arc_easy": 1.0}}, {"versions": {"arc_easy": 2.0}}
    result = sv.judge(_criterion(), items, items, baseline_results=old, run_results=new)
    assert (result.verdict, result.reason) == (sv.INCONCLUSIVE, sv.NOT_COMPARABLE)
    assert "different task versions" in result.message
    same = sv.judge(_criterion(), items, items, baseline_results=old, run_results=old)
    assert same.reason == sv.NOT_REGRESSED


def test_a_side_without_item_scores_is_inconclusive() -> None:
    items = _task(_correct(100, 0.7, seed=11))
    for baseline, run, said in [
        (None, items, "the baseline has no per-item scores for task arc_easy"),
        (items, None, "this run has no per-item scores for task arc_easy"),
        (None, None, "the baseline and this run have no per-item scores"),
    ]:
        result = sv.judge(_criterion(), baseline, run)
        assert (result.verdict, result.reason) == (sv.INCONCLUSIVE, sv.NO_ITEM_SCORES)
        assert said in result.message
    missing_metric = sv.judge(_criterion(metric="acc_norm,none"), items, items)
    assert missing_metric.reason == sv.NOT_COMPARABLE


def test_not_compared_carries_the_callers_reason() -> None:
    long = "the run has no\nscores " + "x" * 2000
    result = sv.not_compared(_criterion(), sv.NO_ITEM_SCORES, long)
    assert (result.verdict, result.reason) == (sv.INCONCLUSIVE, sv.NO_ITEM_SCORES)
    assert len(result.message) == sv.MESSAGE_MAX and "\n" not in result.message
    assert result.minimum_detectable_drop is None and result.paired is None
    with pytest.raises(ValueError, match="not compared"):
        sv.not_compared(_criterion(), sv.UNDERPOWERED, "a comparison ran")


def test_criterion_refuses_impossible_values() -> None:
    with pytest.raises(ValueError, match="tier"):
        _criterion(tier="Could")
    with pytest.raises(ValueError, match="maxDrop"):
        _criterion(max_drop=0.0)
    with pytest.raises(ValueError, match="alpha and power"):
        _criterion(power=1.0)


# -- the suite's verdict -------------------------------------------------------------------


def _outcome(
    tier: str, verdict: str, reason: str | None = None, task: str = "t"
) -> sv.CriterionResult:
    reasons = {
        sv.PASSED: sv.NOT_REGRESSED,
        sv.REGRESSED: sv.REGRESSED,
        sv.INCONCLUSIVE: sv.UNDERPOWERED,
    }
    return sv.CriterionResult(
        sv.Criterion(task, ACC, 0.05, tier=tier),
        verdict,
        reason or reasons[verdict],
        "numbers",
        p_value=0.5,
        difference=-0.01,
        paired=100,
        minimum_detectable_drop=0.14,
    )


P, R, INC = sv.PASSED, sv.REGRESSED, sv.INCONCLUSIVE
M, S, INFO = sv.MUST, sv.SHOULD, sv.INFO


@pytest.mark.parametrize(
    ("outcomes", "verdict", "reason"),
    [
        ([(M, P)], P, "Passed"),
        ([(M, P), (S, P), (INFO, P)], P, "Passed"),
        ([(M, R)], R, "Regressed"),
        ([(M, P), (M, R), (M, INC)], R, "Regressed"),
        ([(M, INC), (M, R)], R, "Regressed"),
        ([(M, INC)], INC, "Underpowered"),
        ([(M, P), (M, INC, sv.NOT_COMPARABLE), (M, INC)], INC, "NotComparable"),
        ([(M, INC, sv.NO_ITEM_SCORES), (M, INC, sv.NOT_COMPARABLE)], INC, "NoItemScores"),
        ([(M, P), (S, R)], P, "PassedWithWarnings"),
        ([(M, P), (S, INC)], P, "PassedWithWarnings"),
        ([(M, INC), (S, R)], INC, "Underpowered"),
        ([(M, P), (INFO, R), (INFO, INC)], P, "Passed"),
        ([(S, P)], P, "Passed"),
        ([(S, R)], P, "PassedWithWarnings"),
        ([(INFO, R)], P, "Passed"),
        ([], INC, "NoCriteria"),
    ],
)
def test_suite_verdict_by_tier(outcomes: list[tuple[str, ...]], verdict: str, reason: str) -> None:
    results = [
        _outcome(tier, v, *rest, task=f"task{i}") for i, (tier, v, *rest) in enumerate(outcomes)
    ]
    assert sv.suite_verdict(results)[:2] == (verdict, reason)


def test_suite_message_names_each_criterion_that_did_not_pass() -> None:
    results = [
        _outcome(M, P, task="arc_easy"),
        _outcome(M, R, task="hellaswag"),
        _outcome(S, INC, task="piqa"),
        _outcome(INFO, R, task="winogrande"),
    ]
    verdict, reason, message = sv.suite_verdict(results)
    assert (verdict, reason) == (R, "Regressed")
    assert message.startswith("1 of 2 Must criteria regressed; ")
    assert "Must hellaswag acc,none: Regressed (Regressed, B-A -0.0100, p=0.5000)" in message
    assert "Should piqa acc,none: Inconclusive (Underpowered" in message
    assert "100 documents detect drops of 0.1400+, maxDrop 0.05" in message
    assert "Info winogrande acc,none: Regressed" in message and "not counted" in message
    assert "arc_easy" not in message
    assert sv.suite_verdict([_outcome(M, P)])[2] == "all 1 Must and 0 Should criteria passed"


def test_suite_message_is_bounded() -> None:
    results = [_outcome(M, R, task="t" * 200 + str(i)) for i in range(32)]
    message = sv.suite_verdict(results)[2]
    assert len(message) == sv.MESSAGE_MAX and message.endswith("...")


# -- before a run --------------------------------------------------------------------------


def test_precheck_without_a_limit_says_nothing() -> None:
    assert sv.precheck(_criterion(), None, [1.0, 0.0]) is None


def test_precheck_without_baseline_values_assumes_the_worst() -> None:
    check = sv.precheck(_criterion(), 30, None)
    assert check is not None and not check.enough
    assert check.sd == pytest.approx(math.sqrt(2) * 0.5)
    # (2.8016 * 0.7071 / 0.05)**2 = 1569.8
    assert check.documents_needed == 1570
    enough = sv.precheck(_criterion(), 1570, None)
    assert enough is not None and enough.enough


def test_precheck_from_the_baseline_values() -> None:
    values = [1.0] * 80 + [0.0] * 20  # sd 0.402: sqrt(2) * 0.402 = 0.5685
    check = sv.precheck(_criterion(), 500, values)
    assert check is not None and not check.enough
    assert check.sd == pytest.approx(math.sqrt(2) * 0.40202, rel=1e-4)
    after = sv.precheck(_criterion(), check.documents_needed, values)
    assert after is not None and after.enough and check.documents_needed > 500
    # A baseline that got everything right has sd 0; a drop of 0.05 would not.
    perfect = sv.precheck(_criterion(), 100, [1.0] * 100)
    assert perfect is not None and not perfect.enough
    assert perfect.sd == pytest.approx(power.least_sd_of_binary_drop(0.05))
    # Values that are not 0/1 have no such floor.
    flat = sv.precheck(_criterion(), 100, [0.5] * 100)
    assert flat is not None and flat.enough and flat.sd == 0.0
