"""Paired comparison of two runs over the same documents: difference, interval, p-value, verdict.

Why this module exists: two aggregate scores cannot tell a regression from
noise (two runs of 500 items differ by a point or two by chance alone), but
two runs over the *same* documents can be compared item by item, which
removes the documents' own variation. Both the CLI (``lmeval compare``) and
the operator's regression gate use it, so it is pure and standard library
only: no numpy in the operator image. A is always the baseline and B the
candidate; every difference is B - A.

The tests (tests/unit/test_pairedstats.py check each against scipy and
statsmodels):

- 0/1 metrics (accuracy, exact match): the exact McNemar test, a two-sided
  exact binomial test on the discordant pairs (items right in one run and
  wrong in the other), p = 1 when there are none. The interval for the
  difference of the paired proportions is Newcombe's hybrid score interval
  (Newcombe 1998, method 10, "square-and-add": Wilson intervals of both
  proportions combined with the corrected phi correlation of the pairs, as
  Fagerland, Lydersen and Laake 2014 recommend it), whose coverage stays
  close to nominal even for few discordant pairs, where the Wald interval is
  too narrow (conservative when only one or two pairs are expected to be).
  p and the interval are different constructions, so on the edge one can
  exclude 0 while the other does not: verdicts use p.
- other metrics (F1, BLEU per item, ...): a paired bootstrap of the mean
  difference (``random.Random(seed)``, resampling items with replacement)
  for the percentile interval, and a sign-flip permutation test for p
  (exchanging A and B within random pairs: the null hypothesis that the two
  runs are interchangeable; exact over all 2**n sign patterns when there
  are no more than `resamples` of them). Differences are compared as
  integers at the item-score codec's precision (1e-6), so ties are exact.
  Work is bounded: at most `max_draws` item draws per test (default
  `MAX_DRAWS`, about 1.4 s for both here), so 10,000 items get 2,000
  resamples instead of 10,000 (all 10,000 take about 7 s). With B resamples
  the Monte Carlo standard error of p is sqrt(p(1-p)/B) (0.0049 at p = 0.05,
  B = 2000) and that of a 95 % interval end about 2.7/sqrt(B) bootstrap
  standard deviations (3 % of the interval's half-width at B = 2000). When
  even `MIN_RESAMPLES` would exceed the budget (more than 10,000 items by
  default) the normal approximation is used instead (mean difference +- z *
  sd / sqrt(n), two-sided z test): at that size it agrees with the bootstrap
  to well within its Monte Carlo error.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, product
from random import Random
from statistics import NormalDist
from typing import Any

from driver.protocol import BINARY, FIXED_SCALE, TaskItems

__all__ = [
    "BOOTSTRAP",
    "MAX_DRAWS",
    "MCNEMAR",
    "MIN_RESAMPLES",
    "NORMAL",
    "GateVerdict",
    "NotComparable",
    "Paired",
    "PairedResult",
    "check_results_comparable",
    "compare_paired",
    "format_p",
    "gate_verdict",
    "pair_tasks",
    "summary",
]

MCNEMAR = "exact McNemar"
BOOTSTRAP = "paired bootstrap"
NORMAL = "paired z (normal approximation)"
# Item draws one bootstrap may make (its sign-flip test makes as many, at half
# the cost): about 46 ns each here, so about 1.4 s for both at the cap.
MAX_DRAWS = 20_000_000
MIN_RESAMPLES = 2000
# Exact binomial tails with integers up to this many discordant pairs (at most
# 50 ms here); beyond it, lgamma and a float sum (relative error ~1e-9, < 1 ms).
_EXACT_BINOMIAL_MAX = 20_000
# Bytes mapped to 0 (keep the sign) or 1 (flip it), half each.
_HALF = bytes([0] * 128 + [1] * 128)


class NotComparable(ValueError):
    """Two runs cannot be paired; the message says why, in words a person can act on."""


@dataclass(frozen=True)
class Paired:
    """One task's metric in both runs, aligned on their common documents."""

    a: tuple[float, ...]
    b: tuple[float, ...]
    binary: bool
    doc_ids: tuple[int, ...] = ()
    dropped: int = 0  # documents left out because either value is NaN (undefined)


@dataclass(frozen=True)
class PairedResult:
    test: str  # MCNEMAR, BOOTSTRAP or NORMAL
    n: int
    mean_a: float
    mean_b: float
    difference: float  # mean_b - mean_a
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    a_only: int  # better in A (0/1: right in A, wrong in B)
    b_only: int  # better in B (0/1: wrong in A, right in B)
    ci_method: str = ""
    resamples: int = 0  # bootstrap and sign-flip resamples made (0: none)


@dataclass(frozen=True)
class GateVerdict:
    regressed: bool
    message: str


# -- pairing -------------------------------------------------------------------


def pair_tasks(a: TaskItems, b: TaskItems, metric: str) -> Paired:
    """`metric`'s values of A and B on the same documents, or NotComparable saying why."""
    for side, task in (("A", a), ("B", b)):
        if not task.doc_ids:  # the driver keeps a task whose samples it could not use, empty
            raise NotComparable(f"{side} has no documents with per-item scores in this task")
        if metric not in task.metrics:
            have = ", ".join(sorted(task.metrics)[:8]) or "none"
            raise NotComparable(f"{side} has no per-item values of {metric} (it has: {have})")
    ids_a, ids_b = set(a.doc_ids), set(b.doc_ids)
    if ids_a != ids_b:
        raise NotComparable(
            f"different documents: {len(ids_a - ids_b)} only in A, {len(ids_b - ids_a)} only "
            f"in B, {len(ids_a & ids_b)} in both (a --limit, --samples or a changed dataset); "
            "rerun both on the same documents"
        )
    if a.docs_sha256 != b.docs_sha256:
        raise NotComparable(
            f"same {len(ids_a)} document ids but different documents (docs digests "
            f"{a.docs_sha256[:12]} and {b.docs_sha256[:12]} differ): the task's data changed "
            "between the runs"
        )
    where_b = {doc: index for index, doc in enumerate(b.doc_ids)}
    values_a, values_b = a.metrics[metric].values, b.metrics[metric].values
    pairs = [(values_a[i], values_b[where_b[doc]], doc) for i, doc in enumerate(a.doc_ids)]
    kept = [p for p in pairs if not (math.isnan(p[0]) or math.isnan(p[1]))]
    if not kept:
        raise NotComparable(f"no document has a defined value of {metric} in both runs")
    kept.sort(key=operator.itemgetter(2))
    return Paired(
        a=tuple(p[0] for p in kept),
        b=tuple(p[1] for p in kept),
        binary=a.metrics[metric].kind == BINARY and b.metrics[metric].kind == BINARY,
        doc_ids=tuple(p[2] for p in kept),
        dropped=len(pairs) - len(kept),
    )


def _task_field(results: Mapping[str, Any], key: str, task: str) -> Any:
    found = results.get(key)
    return found.get(task) if isinstance(found, dict) else None


def check_results_comparable(
    task: str, a_results: Mapping[str, Any], b_results: Mapping[str, Any]
) -> None:
    """NotComparable when lm_eval's results JSONs say the task differed between the runs.

    lm_eval's ``task_hashes`` hash every document, prompt and target (only
    written with --log_samples), ``n-shot`` is the few-shot count and
    ``versions`` the task's version; each is compared when both runs have it.
    Call it after `pair_tasks`, whose reasons (which documents differ) are
    more specific than a differing hash.
    """
    # The most specific first: a different few-shot count changes the hash too.
    for key, words in (
        ("n-shot", "few-shot counts"),
        ("versions", "task versions"),
        ("task_hashes", "task hashes (documents, prompts or targets changed)"),
    ):
        in_a, in_b = _task_field(a_results, key, task), _task_field(b_results, key, task)
        if in_a is not None and in_b is not None and in_a != in_b:
            shown_a, shown_b = str(in_a)[:16], str(in_b)[:16]
            raise NotComparable(f"different {words}: {shown_a} in A, {shown_b} in B")


# -- the tests -------------------------------------------------------------------


def _binomial_two_sided(k: int, n: int) -> float:
    """P-value of the exact two-sided binomial test (p = 1/2) of k successes in n."""
    m = min(k, n - k)
    if 2 * m >= n:
        return 1.0
    if n <= _EXACT_BINOMIAL_MAX:
        term, tail = 1, 1  # C(n, 0)
        for i in range(m):
            term = term * (n - i) // (i + 1)
            tail += term
        return min(1.0, 2 * tail / (1 << n))
    # Down from the largest term of the tail (k = m), in units of it.
    log_top = math.lgamma(n + 1) - math.lgamma(m + 1) - math.lgamma(n - m + 1) - n * math.log(2)
    ratio_sum, ratio = 1.0, 1.0
    for i in range(m, 0, -1):
        ratio *= i / (n - i + 1)
        ratio_sum += ratio
        if ratio < 1e-17 * ratio_sum:
            break
    log_p = math.log(2) + log_top + math.log(ratio_sum)
    return min(1.0, math.exp(log_p)) if log_p > -745 else 0.0


def _wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _newcombe(both: int, a_only: int, b_only: int, neither: int, z: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval (method 10) for mean_b - mean_a of paired 0/1 values."""
    n = both + a_only + b_only + neither
    p_b, p_a = (both + b_only) / n, (both + a_only) / n
    low_b, high_b = _wilson(both + b_only, n, z)
    low_a, high_a = _wilson(both + a_only, n, z)
    # phi, the correlation of the pairs, with Newcombe's correction: a positive
    # numerator less n/2, never below 0 (as in Fagerland, Lydersen and Laake 2014).
    margins = (both + b_only) * (a_only + neither) * (both + a_only) * (b_only + neither)
    cross = both * neither - a_only * b_only
    numerator = cross - n / 2 if cross > n / 2 else min(cross, 0)
    phi = numerator / math.sqrt(margins) if margins else 0.0
    # How far B's proportion may lie below (above) its estimate, combined with
    # how far A's may lie above (below) its own, less their correlation.
    down_b, up_a = p_b - low_b, high_a - p_a
    up_b, down_a = high_b - p_b, p_a - low_a
    below = math.sqrt(max(0.0, down_b**2 - 2 * phi * down_b * up_a + up_a**2))
    above = math.sqrt(max(0.0, up_b**2 - 2 * phi * up_b * down_a + down_a**2))
    difference = p_b - p_a
    return max(-1.0, difference - below), min(1.0, difference + above)


def _percentile(ordered: Sequence[int], q: float) -> float:
    """numpy's default (linear) percentile of sorted `ordered` at fraction q."""
    h = (len(ordered) - 1) * q
    low = math.floor(h)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (h - low) * (ordered[high] - ordered[low]))


def _resample_sums(d: Sequence[int], resamples: int, rng: Random) -> list[int]:
    """Sums of `resamples` bootstrap resamples of `d` (n items drawn with replacement).

    Why it is fast: indices come from random bytes viewed as an array of
    unsigned integers, and a lookup table maps each to a value through C-level
    ``map``/``sum``. The table has 2**k slots; slot j holds item j mod n for
    the first n*floor(2**k/n) slots (so every item is equally likely) and a
    sentinel for the rest, a number larger than any sum of real values, so
    one ``sum`` gives both the sum of the accepted draws and how many were
    rejected; those are drawn again.
    """
    n = len(d)
    low = min(d)
    span = max(d) - low
    sentinel = n * span + 1
    bits = 16 if n <= 1 << 15 else (n - 1).bit_length() + 1
    slots = 1 << bits
    full = slots // n * n
    table = [d[j % n] - low for j in range(full)] + [sentinel] * (slots - full)
    code = "H" if bits == 16 else next(c for c in "IL" if array(c).itemsize == 4)
    width, mask = array(code).itemsize, slots - 1
    sums = []
    for _ in range(resamples):
        total, needed = 0, n
        while needed:
            raw = array(code, rng.randbytes(width * needed))
            picks = raw if bits == 16 else map(mask.__and__, raw)
            drawn = sum(map(table.__getitem__, picks))
            rejected, accepted = divmod(drawn, sentinel)
            total += accepted
            needed = rejected
        sums.append(total + n * low)
    return sums


def _sign_flip_sums(d: Sequence[int], resamples: int, rng: Random) -> tuple[list[int], bool]:
    """Sums of d under random sign flips; all 2**n patterns when there are few enough."""
    n = len(d)
    total = sum(d)
    if n < 63 and 2**n <= resamples:
        flipped = [sum(compress(d, signs)) for signs in product((0, 1), repeat=n)]
        return [total - 2 * s for s in flipped], True
    flips = (rng.randbytes(n).translate(_HALF) for _ in range(resamples))
    return [total - 2 * sum(compress(d, signs)) for signs in flips], False


def _permutation_p(null: Sequence[int], observed: int, exact: bool) -> float:
    """scipy.stats.permutation_test's two-sided p-value (the +1 adjustment when sampled)."""
    adjust = 0 if exact else 1
    less = sum(1 for s in null if s <= observed) + adjust
    greater = sum(1 for s in null if s >= observed) + adjust
    return min(1.0, 2 * min(less, greater) / (len(null) + adjust))


def _scaled(value: float) -> int:
    return round(value * FIXED_SCALE)


def compare_paired(
    a_values: Sequence[float],
    b_values: Sequence[float],
    *,
    binary: bool,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    max_draws: int | None = MAX_DRAWS,
) -> PairedResult:
    """The paired comparison of B against A (pure; deterministic for a seed)."""
    n = len(a_values)
    if n != len(b_values) or n == 0:
        raise ValueError(f"need two equally long, non-empty series, not {n} and {len(b_values)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence}")
    if resamples < 1:
        raise ValueError("resamples must be at least 1")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    mean_a, mean_b = math.fsum(a_values) / n, math.fsum(b_values) / n
    a_only = sum(map(operator.gt, a_values, b_values))
    b_only = sum(map(operator.lt, a_values, b_values))
    if binary:
        both = sum(1 for x, y in zip(a_values, b_values, strict=True) if x and y)
        low, high = _newcombe(both, a_only, b_only, n - both - a_only - b_only, z)
        return PairedResult(
            MCNEMAR,
            n,
            mean_a,
            mean_b,
            mean_b - mean_a,
            low,
            high,
            confidence,
            _binomial_two_sided(b_only, a_only + b_only),
            a_only,
            b_only,
            "Newcombe hybrid score",
        )
    d = [_scaled(y) - _scaled(x) for x, y in zip(a_values, b_values, strict=True)]
    used = resamples if max_draws is None else min(resamples, max_draws // n)
    if used < MIN_RESAMPLES and used < resamples:
        mean = math.fsum(d) / n
        sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
        half = z * sd / math.sqrt(n)
        if sd:
            p = 2 * (1 - NormalDist().cdf(abs(mean) / (sd / math.sqrt(n))))
        else:
            p = 1.0 if mean == 0 else 0.0
        low, high = (mean - half) / FIXED_SCALE, (mean + half) / FIXED_SCALE
        return PairedResult(
            NORMAL, n, mean_a, mean_b, mean_b - mean_a, low, high, confidence, p, a_only,
            b_only, "normal approximation",
        )  # fmt: skip
    rng = Random(seed)  # noqa: S311 - a reproducible resampling, not a secret
    sums = sorted(_resample_sums(d, used, rng))
    tail = (1 - confidence) / 2
    scale = n * FIXED_SCALE
    low, high = _percentile(sums, tail) / scale, _percentile(sums, 1 - tail) / scale
    null, exact = _sign_flip_sums(d, used, rng)
    return PairedResult(
        BOOTSTRAP,
        n,
        mean_a,
        mean_b,
        mean_b - mean_a,
        low,
        high,
        confidence,
        _permutation_p(null, sum(d), exact),
        a_only,
        b_only,
        "bootstrap percentile",
        used,
    )


# -- words -----------------------------------------------------------------------


def format_p(p: float) -> str:
    """p as the CLI and the gate print it: 4 decimals, or 2 significant digits below 1e-4."""
    return f"{p:.4f}" if p >= 1e-4 or p == 0 else f"{p:.1e}"


def summary(result: PairedResult) -> str:
    """The numbers of a comparison in one line (for condition messages and notes)."""
    flips = (
        f"{result.a_only} right->wrong, {result.b_only} wrong->right"
        if result.test == MCNEMAR
        else f"{result.a_only} lower in B, {result.b_only} higher in B"
    )
    return (
        f"A={result.mean_a:.4f} B={result.mean_b:.4f} "
        f"B-A={result.difference:+.4f} ({result.confidence:.0%} CI {result.ci_low:+.4f} to "
        f"{result.ci_high:+.4f}), p={format_p(result.p_value)} ({result.test}), "
        f"flips {flips}, n={result.n}"
    )


def gate_verdict(
    result: PairedResult, *, max_drop: float, alpha: float, higher_is_better: bool
) -> GateVerdict:
    """Regressed iff B dropped by more than `max_drop` and p < alpha (pure).

    The drop is signed by the metric's direction: A - B when higher is better.
    """
    drop = -result.difference if higher_is_better else result.difference
    significant = result.p_value < alpha
    regressed = drop > max_drop and significant
    # Rounded before printing, so that no change at all reads "0.0000", not "-0.0000".
    shown = f"{round(drop, 4) + 0.0:.4f}"
    if regressed:
        why = f"regressed: drop {shown} > max drop {max_drop:g} and p < alpha {alpha:g}"
    elif drop <= max_drop:
        why = f"no regression: drop {shown} <= max drop {max_drop:g}"
    else:
        why = f"no regression: drop {shown} not significant (p >= alpha {alpha:g})"
    return GateVerdict(regressed, f"{why}; {summary(result)}")
