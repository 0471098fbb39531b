"""The paired statistics (`poller.results.pairedstats`) against independent implementations.

Checks: the exact McNemar p-value equals statsmodels' ``mcnemar(exact=True)``
and scipy's ``binomtest`` (also past the integer path, with lgamma); the
Newcombe interval and McNemar p equal the published values of Fagerland,
Lydersen and Laake's worked example (their R package's tests) and the
interval covers about 95 % in simulation; the bootstrap's percentile
interval agrees with ``scipy.stats.bootstrap`` within the stated Monte Carlo
tolerance; the sign-flip p equals ``scipy.stats.permutation_test`` exactly
when all sign patterns are enumerated and within Monte Carlo error when
sampled; the normal approximation equals statsmodels' z test and interval;
the work cap; draws stay uniform past 16-bit indices; symmetry (swapping
A and B negates the difference and its interval, same p), bounds and p = 1
on identical runs as properties (hypothesis); the gate rule's edges (a drop
of exactly max_drop, p exactly alpha, lower-is-better metrics); pairing on
document ids and each refusal with its reason; and the refusals read from
lm_eval's results JSONs.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.weightstats import DescrStatsW, ztest

from driver.itemscores import BINARY, FIXED, MetricItems, TaskItems
from poller.results import pairedstats as ps


def _binary_runs(both: int, a_only: int, b_only: int, neither: int) -> tuple[list[float], ...]:
    a = [1.0] * both + [1.0] * a_only + [0.0] * b_only + [0.0] * neither
    b = [1.0] * both + [0.0] * a_only + [1.0] * b_only + [0.0] * neither
    return a, b


# -- exact McNemar and Newcombe's interval -------------------------------------------

TABLES = [(59, 16, 6, 80), (10, 0, 0, 5), (3, 1, 0, 2), (500, 71, 27, 402), (0, 9, 1, 0)]


@pytest.mark.parametrize(("both", "a_only", "b_only", "neither"), TABLES)
def test_mcnemar_matches_statsmodels_and_scipy(
    both: int, a_only: int, b_only: int, neither: int
) -> None:
    a, b = _binary_runs(both, a_only, b_only, neither)
    result = ps.compare_paired(a, b, binary=True)
    table = [[both, a_only], [b_only, neither]]
    expected = mcnemar(table, exact=True).pvalue
    assert result.p_value == pytest.approx(expected, rel=1e-12, abs=1e-15)
    if a_only + b_only:
        assert result.p_value == pytest.approx(
            stats.binomtest(b_only, a_only + b_only).pvalue, rel=1e-12
        )
    assert ps.format_p(result.p_value) == ps.format_p(expected)
    assert (result.test, result.a_only, result.b_only, result.n) == (
        ps.MCNEMAR,
        a_only,
        b_only,
        both + a_only + b_only + neither,
    )
    assert result.difference == pytest.approx((b_only - a_only) / result.n)


@pytest.mark.parametrize(
    ("k", "n"), [(30_000, 60_500), (29_000, 60_000), (10, 60_001), (10_100, 20_400)]
)
def test_binomial_tail_beyond_the_integer_path(k: int, n: int) -> None:
    assert n > ps._EXACT_BINOMIAL_MAX  # the lgamma path
    assert ps._binomial_two_sided(k, n) == pytest.approx(
        stats.binomtest(k, n).pvalue, rel=1e-7, abs=1e-300
    )


def test_newcombe_interval_matches_the_published_example() -> None:
    # Cavo et al. 2012 in Fagerland, Lydersen, Laake, "Statistical Analysis of
    # Contingency Tables" (2017), ch. 8; their R package contingencytables
    # prints: estimate -0.0621 (95% CI -0.1186 to -0.0046), exact conditional
    # McNemar P = 0.052479. Rows are B, columns A: B right in 59 + 6.
    a, b = _binary_runs(both=59, a_only=16, b_only=6, neither=80)
    result = ps.compare_paired(a, b, binary=True)
    assert f"{result.difference:.4f}" == "-0.0621"
    assert (f"{result.ci_low:.4f}", f"{result.ci_high:.4f}") == ("-0.1186", "-0.0046")
    assert f"{result.p_value:.6f}" == "0.052479"
    assert ps.summary(result) == (
        "A=0.4658 B=0.4037 B-A=-0.0621 (95% CI -0.1186 to -0.0046), p=0.0525 (exact McNemar), "
        "flips 16 right->wrong, 6 wrong->right, n=161"
    )


def test_newcombe_interval_covers_close_to_nominal() -> None:
    # 2000 simulated paired runs of 60 items (A right 70 %, B flips 15 % of
    # them): the 95 % interval must cover the true difference 93-97 % of the time.
    rng = np.random.default_rng(7)
    n, p_a, flip = 60, 0.7, 0.15
    true_difference = (1 - p_a) * flip - p_a * flip
    covered = 0
    for _ in range(2000):
        a = (rng.random(n) < p_a).astype(float)
        b = np.where(rng.random(n) < flip, 1 - a, a)
        result = ps.compare_paired(a.tolist(), b.tolist(), binary=True)
        covered += result.ci_low <= true_difference <= result.ci_high
    assert 0.93 <= covered / 2000 <= 0.97


# -- bootstrap, sign flips, normal approximation ----------------------------------------


def _continuous(n: int, seed: int, shift: float = -0.02) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    a = [round(rng.random(), 6) for _ in range(n)]
    b = [round(min(1.0, max(0.0, x + rng.gauss(shift, 0.15))), 6) for x in a]
    return a, b


def test_bootstrap_interval_matches_scipy_within_monte_carlo_error() -> None:
    a, b = _continuous(400, seed=3)
    result = ps.compare_paired(a, b, binary=False, resamples=10_000, seed=1)
    assert (result.test, result.resamples) == (ps.BOOTSTRAP, 10_000)
    d = np.array(b) - np.array(a)
    reference = stats.bootstrap(
        (d,), np.mean, method="percentile", n_resamples=10_000, rng=np.random.default_rng(1)
    ).confidence_interval
    # Monte Carlo SE of a 2.5 % quantile from B resamples: about 2.7 bootstrap
    # SDs / sqrt(B); two independent estimates, 4 of their SEs.
    tolerance = 4 * math.sqrt(2) * 2.7 * (d.std(ddof=1) / math.sqrt(len(d))) / math.sqrt(10_000)
    assert result.ci_low == pytest.approx(reference.low, abs=tolerance)
    assert result.ci_high == pytest.approx(reference.high, abs=tolerance)
    assert result.difference == pytest.approx(d.mean(), abs=1e-12)
    assert result.a_only == int((d < 0).sum()) and result.b_only == int((d > 0).sum())


def test_sign_flip_p_matches_scipy_exactly_when_enumerated() -> None:
    a, b = _continuous(11, seed=5, shift=-0.1)
    result = ps.compare_paired(a, b, binary=False, resamples=2**11)
    d = np.array(b) - np.array(a)
    reference = stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=2**11
    ).pvalue
    assert result.p_value == pytest.approx(reference, rel=1e-12)


def test_sign_flip_p_matches_scipy_within_monte_carlo_error() -> None:
    a, b = _continuous(300, seed=11, shift=-0.015)
    result = ps.compare_paired(a, b, binary=False, resamples=10_000, seed=2)
    d = np.array(b) - np.array(a)
    reference = stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=10_000, rng=np.random.default_rng(2)
    ).pvalue
    assert 0.001 < reference < 0.5  # a p-value where Monte Carlo error shows
    tolerance = 4 * math.sqrt(2) * math.sqrt(reference * (1 - reference) / 10_000)
    assert result.p_value == pytest.approx(reference, abs=tolerance)


def test_the_work_cap_and_the_normal_approximation() -> None:
    a, b = _continuous(2000, seed=13)
    capped = ps.compare_paired(a, b, binary=False, max_draws=4_000_000)
    assert (capped.test, capped.resamples) == (ps.BOOTSTRAP, 2000)
    a, b = _continuous(30_000, seed=17, shift=-0.003)
    normal = ps.compare_paired(a, b, binary=False)  # 30,000 x 2000 > MAX_DRAWS
    assert (normal.test, normal.resamples) == (ps.NORMAL, 0)
    d = np.round(np.array(b) * 1e6) - np.round(np.array(a) * 1e6)
    assert normal.p_value == pytest.approx(ztest(d)[1], rel=1e-9)
    low, high = DescrStatsW(d / 1e6).zconfint_mean(alpha=0.05)
    assert (normal.ci_low, normal.ci_high) == (pytest.approx(low), pytest.approx(high))
    # Given the budget, the bootstrap agrees with it to its Monte Carlo error.
    boot = ps.compare_paired(a, b, binary=False, resamples=500, max_draws=None)
    assert boot.ci_low == pytest.approx(normal.ci_low, abs=0.001)
    assert boot.ci_high == pytest.approx(normal.ci_high, abs=0.001)


def test_resampling_is_uniform_past_16_bit_indices() -> None:
    # Over 32,768 items the draws use 32-bit indices and a mask: every item
    # must still be equally likely. Items of the upper half count 1, the
    # rest 0, so a skew towards either half moves the resampled means.
    n, resamples = 40_000, 200
    halves = [0] * (n // 2) + [1] * (n // 2)
    means = [s / n for s in ps._resample_sums(halves, resamples, random.Random(5))]
    centre = sum(means) / resamples
    spread = math.sqrt(sum((m - centre) ** 2 for m in means) / (resamples - 1))
    expected_spread = 0.5 / math.sqrt(n)
    assert abs(centre - 0.5) < 4 * expected_spread / math.sqrt(resamples)
    assert spread == pytest.approx(expected_spread, rel=0.2)


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="equally long"):
        ps.compare_paired([1.0], [1.0, 0.0], binary=True)
    with pytest.raises(ValueError, match="non-empty"):
        ps.compare_paired([], [], binary=True)
    with pytest.raises(ValueError, match="confidence"):
        ps.compare_paired([1.0], [1.0], binary=True, confidence=1.0)


# -- properties ---------------------------------------------------------------------------

bits = st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=200)
scores = st.lists(
    st.tuples(
        st.floats(0, 1, allow_nan=False).map(lambda v: round(v, 6)),
        st.floats(0, 1, allow_nan=False).map(lambda v: round(v, 6)),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(bits)
def test_binary_symmetry_and_bounds(pairs: list[tuple[bool, bool]]) -> None:
    a, b = [float(x) for x, _ in pairs], [float(y) for _, y in pairs]
    forward = ps.compare_paired(a, b, binary=True)
    backward = ps.compare_paired(b, a, binary=True)
    assert backward.difference == pytest.approx(-forward.difference, abs=1e-12)
    assert backward.ci_low == pytest.approx(-forward.ci_high, abs=1e-12)
    assert backward.ci_high == pytest.approx(-forward.ci_low, abs=1e-12)
    assert backward.p_value == forward.p_value
    assert (backward.a_only, backward.b_only) == (forward.b_only, forward.a_only)
    assert -1 <= forward.ci_low <= forward.difference <= forward.ci_high <= 1
    assert 0 < forward.p_value <= 1
    if forward.a_only == forward.b_only:
        assert forward.p_value == 1


@settings(max_examples=60, deadline=None)
@given(scores, st.integers(0, 2**32))
def test_bootstrap_symmetry_and_bounds(pairs: list[tuple[float, float]], seed: int) -> None:
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    forward = ps.compare_paired(a, b, binary=False, resamples=300, seed=seed)
    backward = ps.compare_paired(b, a, binary=False, resamples=300, seed=seed)
    assert backward.difference == pytest.approx(-forward.difference, abs=1e-12)
    assert backward.ci_low == pytest.approx(-forward.ci_high, abs=1e-9)
    assert backward.ci_high == pytest.approx(-forward.ci_low, abs=1e-9)
    assert backward.p_value == forward.p_value
    d = [y - x for x, y in pairs]
    assert min(d) - 1e-6 <= forward.ci_low <= forward.ci_high <= max(d) + 1e-6
    assert 0 < forward.p_value <= 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=80), st.booleans())
def test_identical_runs_have_p_one(values: list[float], binary: bool) -> None:
    if binary:
        values = [float(v > 0.5) for v in values]
    result = ps.compare_paired(values, values, binary=binary, resamples=500)
    assert result.p_value == 1.0
    assert (result.difference, result.a_only, result.b_only) == (0.0, 0, 0)
    assert result.ci_low <= 0 <= result.ci_high
    verdict = ps.gate_verdict(result, max_drop=0, alpha=0.05, higher_is_better=True)
    assert not verdict.regressed
    assert "drop 0.0000 <=" in verdict.message, verdict.message


# -- the gate rule -------------------------------------------------------------------------


def _result(difference: float, p: float) -> ps.PairedResult:
    return ps.PairedResult(
        ps.MCNEMAR, 200, 0.7, 0.7 + difference, difference, difference - 0.02,
        difference + 0.02, 0.95, p, 12, 2,
    )  # fmt: skip


def test_gate_verdict_edges() -> None:
    drop = ps.gate_verdict(_result(-0.05, 0.001), max_drop=0.0, alpha=0.05, higher_is_better=True)
    assert drop.regressed
    assert drop.message.startswith("regressed: drop 0.0500 > max drop 0 and p < alpha 0.05; ")
    assert (
        "A=0.7000 B=0.6500 B-A=-0.0500 (95% CI -0.0700 to -0.0300), p=0.0010 (exact McNemar)"
        in drop.message
    )
    assert "flips 12 right->wrong, 2 wrong->right, n=200" in drop.message
    # A drop of exactly max_drop is acceptable; so is a significant gain.
    exact = ps.gate_verdict(_result(-0.05, 0.001), max_drop=0.05, alpha=0.05, higher_is_better=True)
    assert not exact.regressed and "drop 0.0500 <= max drop 0.05" in exact.message
    gain = ps.gate_verdict(_result(0.05, 0.001), max_drop=0.0, alpha=0.05, higher_is_better=True)
    assert not gain.regressed
    # p equal to alpha is not significant.
    edge = ps.gate_verdict(_result(-0.05, 0.05), max_drop=0.0, alpha=0.05, higher_is_better=True)
    assert not edge.regressed and "not significant (p >= alpha 0.05)" in edge.message
    # Lower is better (an error rate): a rise is the drop.
    rise = ps.gate_verdict(_result(0.05, 0.001), max_drop=0.0, alpha=0.05, higher_is_better=False)
    assert rise.regressed and "drop 0.0500" in rise.message
    fall = ps.gate_verdict(_result(-0.05, 0.001), max_drop=0.0, alpha=0.05, higher_is_better=False)
    assert not fall.regressed


# -- pairing ---------------------------------------------------------------------------------


def _task(ids: list[int], values: dict[str, list[float]], digest: str = "a" * 64) -> TaskItems:
    kinds = {
        m: MetricItems(BINARY if set(v) <= {0.0, 1.0} else FIXED, tuple(float(x) for x in v))
        for m, v in values.items()
    }
    return TaskItems(tuple(ids), digest, kinds)


def test_pairing_aligns_on_document_ids_and_drops_undefined_values() -> None:
    a = _task([0, 1, 2, 3], {"acc,none": [1, 0, 1, 1], "f1,none": [0.5, math.nan, 1, 0.25]})
    b = _task([3, 2, 1, 0], {"acc,none": [0, 1, 1, 1], "f1,none": [0.75, 1, 0.5, 0.5]})
    paired = ps.pair_tasks(a, b, "acc,none")
    assert paired == ps.Paired((1.0, 0.0, 1.0, 1.0), (1.0, 1.0, 1.0, 0.0), True, (0, 1, 2, 3))
    fixed = ps.pair_tasks(a, b, "f1,none")
    assert (fixed.a, fixed.b, fixed.binary, fixed.doc_ids, fixed.dropped) == (
        (0.5, 1.0, 0.25),
        (0.5, 1.0, 0.75),
        False,
        (0, 2, 3),
        1,
    )


def test_pairing_refuses_with_the_reason() -> None:
    a = _task([0, 1, 2, 3], {"acc,none": [1, 0, 1, 1]})
    other_docs = _task([0, 1, 2, 3], {"acc,none": [1, 0, 1, 1]}, digest="b" * 64)
    with pytest.raises(ps.NotComparable, match="same 4 document ids but different documents"):
        ps.pair_tasks(a, other_docs, "acc,none")
    fewer = _task([0, 1, 5], {"acc,none": [1, 0, 1]})
    with pytest.raises(ps.NotComparable, match="2 only in A, 1 only in B, 2 in both"):
        ps.pair_tasks(a, fewer, "acc,none")
    both = _task([0, 1, 2, 3], {"acc,none": [1, 0, 1, 1], "f1,none": [0.5, 1, 1, 0]})
    with pytest.raises(
        ps.NotComparable, match=r"B has no per-item values of f1,none \(it has: acc"
    ):
        ps.pair_tasks(both, a, "f1,none")
    with pytest.raises(ps.NotComparable, match="A has no documents with per-item scores"):
        ps.pair_tasks(_task([], {}), a, "acc,none")
    undefined = _task([0], {"f1,none": [math.nan]})
    with pytest.raises(ps.NotComparable, match="no document has a defined value"):
        ps.pair_tasks(undefined, undefined, "f1,none")


def test_results_jsons_refuse_changed_task_configuration() -> None:
    base = {"task_hashes": {"t": "h1"}, "n-shot": {"t": 0}, "versions": {"t": 1.0}}
    ps.check_results_comparable("t", base, dict(base))
    ps.check_results_comparable("t", base, {"results": {}})  # nothing to compare with
    for key, other, words in (
        ("task_hashes", "h2", "different task hashes"),
        ("n-shot", 5, "different few-shot counts: 0 in A, 5 in B"),
        ("versions", 2.0, "different task versions: 1.0 in A, 2.0 in B"),
    ):
        changed = {**base, key: {"t": other}}
        with pytest.raises(ps.NotComparable, match=words):
            ps.check_results_comparable("t", base, changed)
        ps.check_results_comparable("u", base, changed)  # another task: not concerned
