"""Statistical power: how large a drop a paired comparison of n documents can see.

Why this module exists: "no regression" from the regression gate only means
that the comparison did not show a drop larger than ``maxDrop`` with a
p-value below ``alpha``. On 30 documents that is nearly always the answer,
whatever the model did, because 30 documents cannot tell a drop of a few
points from noise. An evaluation suite that reports Passed must know that
its comparison *could* have seen a drop of ``maxDrop``; this module says how
large a drop n documents can see, and how many documents a ``maxDrop``
needs. Pure, standard library only (``statistics.NormalDist``), like
`poller.results.pairedstats`.

The numbers, and what they assume (in words):

- The minimum detectable drop (MDD) is the smallest true mean drop that the
  gate's two-sided paired test at level ``alpha`` finds significant with
  probability ``power`` on n paired documents:
  ``(z(1 - alpha/2) + z(power)) * sd / sqrt(n)``, where ``sd`` is the
  standard deviation of the per-document differences (run minus baseline)
  and ``z`` the standard normal quantile. It is the normal approximation:
  close for the hundreds of documents a useful comparison has; for 0/1
  metrics with few changed documents the exact McNemar test the gate runs is
  a little less powerful than it says.
- Too few documents can never give p < alpha, whatever the scores: the
  smallest two-sided p of both of the gate's exact tests (McNemar, sign
  flips) on n documents is 2 / 2**n. Then the MDD is infinite (no drop is
  detectable): 6 documents at least for alpha 0.05; fewer than 2 always.
- What a Passed then guarantees: the gate flags a drop only when the
  observed drop exceeds ``maxDrop`` *and* is significant, so a true drop of
  exactly ``maxDrop`` is flagged about half the time. With MDD <= maxDrop, a
  true drop of ``maxDrop + z(power) * sd / sqrt(n)`` (at most about 1.3 times
  ``maxDrop`` for alpha 0.05 and power 0.8) is flagged with probability at
  least ``power``.
- After a run, ``sd`` is the observed sd of the paired differences
  (`observed_sd_of_differences`). Before a run only the baseline's
  per-document values may be known, and `assumed_sd_of_differences` takes
  sqrt(2) times their sd: the sd of the difference of two runs whose errors
  are independent. Two runs of similar models over the same documents
  usually get the same documents right and wrong, so their differences vary
  less than that: the assumption errs towards "not enough documents".
  Without any values it takes sqrt(2) * 0.5, 0.5 being the largest sd of a
  metric bounded in [0, 1] (accuracy, exact match, F1); a metric on another
  scale (BLEU from 0 to 100) needs the baseline's values.
- For a 0/1 metric an observed sd can be misleadingly small: two identical
  runs have sd 0, which would make any drop "detectable" on any number of
  documents. But a true drop of ``maxDrop`` on a 0/1 metric means at least a
  ``maxDrop`` share of the documents went from right to wrong, so the
  differences' sd is then at least sqrt(maxDrop * (1 - maxDrop))
  (`least_sd_of_binary_drop`); callers judging a 0/1 metric use no smaller sd.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

__all__ = [
    "BOUNDED_WORST_SD",
    "PowerCheck",
    "assumed_sd_of_differences",
    "check_power",
    "describe",
    "documents_needed",
    "least_documents",
    "least_sd_of_binary_drop",
    "minimum_detectable_drop",
    "observed_sd_of_differences",
]

# The largest standard deviation of a metric bounded in [0, 1] (half the
# values 0, half 1).
BOUNDED_WORST_SD = 0.5


def _check_levels(alpha: float, power: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, not {alpha}")
    if not 0 < power < 1:
        raise ValueError(f"power must be between 0 and 1, not {power}")


def _check_sd(sd: float) -> None:
    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f"the sd of the differences must be a finite number >= 0, not {sd}")


def least_documents(alpha: float) -> int:
    """The fewest documents on which the gate's exact tests can reach p < alpha.

    Both the exact McNemar test and the sign-flip test give at best
    p = 2 / 2**n (every document changed the same way), so n must make that
    smaller than alpha; and never fewer than 2 (an sd needs two differences).
    """
    _check_levels(alpha, 0.5)
    n = 2
    while 2.0 ** (1 - n) >= alpha:
        n += 1
    return n


def _z_sum(alpha: float, power: float) -> float:
    """z(1 - alpha/2) + z(power), never below 0 (a power below alpha/2 asks for nothing)."""
    normal = NormalDist()
    return max(0.0, normal.inv_cdf(1 - alpha / 2) + normal.inv_cdf(power))


def minimum_detectable_drop(n: int, sd_difference: float, *, alpha: float, power: float) -> float:
    """The smallest true mean drop that n paired documents detect with probability `power`.

    The gate's two-sided paired test at level `alpha`, in the normal
    approximation: (z(1 - alpha/2) + z(power)) * sd / sqrt(n). math.inf when
    n is too small for any p < alpha (`least_documents`; n < 2 always).
    """
    _check_levels(alpha, power)
    _check_sd(sd_difference)
    if n < least_documents(alpha):
        return math.inf
    return _z_sum(alpha, power) * sd_difference / math.sqrt(n)


def documents_needed(max_drop: float, sd_difference: float, *, alpha: float, power: float) -> int:
    """The fewest paired documents whose minimum detectable drop is at most `max_drop`.

    The exact inverse of `minimum_detectable_drop`: MDD(n) <= max_drop, and
    MDD(n - 1) > max_drop unless n is `least_documents(alpha)`.
    """
    _check_levels(alpha, power)
    _check_sd(sd_difference)
    if not (math.isfinite(max_drop) and max_drop > 0):
        raise ValueError(f"max drop must be a finite number > 0, not {max_drop}")
    least = least_documents(alpha)
    estimate = (_z_sum(alpha, power) * sd_difference / max_drop) ** 2
    n = max(least, math.ceil(estimate))

    def enough(k: int) -> bool:
        return minimum_detectable_drop(k, sd_difference, alpha=alpha, power=power) <= max_drop

    # The closed form, then a step either way for its rounding.
    while n > least and enough(n - 1):
        n -= 1
    while not enough(n):
        n += 1
    return n


def observed_sd_of_differences(a: Sequence[float], b: Sequence[float]) -> float:
    """The sample standard deviation (n - 1) of the paired differences b - a.

    Needs at least two pairs, of equal length; NaN values are not expected
    (`pairedstats.pair_tasks` drops them).
    """
    n = len(a)
    if n != len(b):
        raise ValueError(f"need two equally long series, not {n} and {len(b)}")
    if n < 2:
        raise ValueError(f"the sd of differences needs at least 2 pairs, not {n}")
    differences = [y - x for x, y in zip(a, b, strict=True)]
    mean = math.fsum(differences) / n
    return math.sqrt(math.fsum((d - mean) ** 2 for d in differences) / (n - 1))


def assumed_sd_of_differences(values: Sequence[float] | None) -> float:
    """The sd of two runs' differences assumed before a run, from one run's values.

    sqrt(2) times the sample sd of `values` (the baseline's per-document
    values; NaN, an undefined value, left out): the two runs' errors taken as
    independent, which overstates the sd of the usual, correlated runs. None
    or fewer than two values: sqrt(2) * 0.5, the worst case of a metric
    bounded in [0, 1].
    """
    defined = [v for v in values or () if not math.isnan(v)]
    if len(defined) < 2:
        return math.sqrt(2) * BOUNDED_WORST_SD
    mean = math.fsum(defined) / len(defined)
    variance = math.fsum((v - mean) ** 2 for v in defined) / (len(defined) - 1)
    return math.sqrt(2) * math.sqrt(variance)


def least_sd_of_binary_drop(max_drop: float) -> float:
    """The smallest sd of paired 0/1 differences whose mean is a drop of `max_drop`.

    The differences are -1, 0 or 1; a mean of -max_drop needs at least a
    max_drop share of -1s, and the sd is least when there are no +1s:
    sqrt(max_drop * (1 - max_drop)). A drop of 1 or more: 0.
    """
    share = min(max(max_drop, 0.0), 1.0)
    return math.sqrt(share * (1 - share))


@dataclass(frozen=True)
class PowerCheck:
    """Whether n paired documents can see a drop of `max_drop`, with the numbers."""

    n: int
    sd: float
    alpha: float
    power: float
    max_drop: float
    minimum_detectable_drop: float  # math.inf when n can never give p < alpha
    documents_needed: int  # for max_drop at this sd, alpha and power
    enough: bool  # minimum_detectable_drop <= max_drop


def check_power(n: int, sd: float, *, alpha: float, power: float, max_drop: float) -> PowerCheck:
    """The minimum detectable drop at n and whether it is at most `max_drop`."""
    mdd = minimum_detectable_drop(n, sd, alpha=alpha, power=power)
    needed = documents_needed(max_drop, sd, alpha=alpha, power=power)
    return PowerCheck(n, sd, alpha, power, max_drop, mdd, needed, mdd <= max_drop)


def describe(check: PowerCheck) -> str:
    """One line with the numbers, e.g. "200 documents detect a drop of 0.0886 or more
    (alpha 0.05, power 0.8, sd 0.4472); maxDrop 0.05 needs 628"."""
    documents = f"{check.n} document{'' if check.n == 1 else 's'}"
    levels = f"alpha {check.alpha:g}, power {check.power:g}, sd {check.sd:.4f}"
    if math.isinf(check.minimum_detectable_drop):
        least = least_documents(check.alpha)
        seen = f"{documents} can detect no drop ({levels}: p < alpha needs {least} or more)"
    else:
        seen = (
            f"{documents} detect a drop of {check.minimum_detectable_drop:.4f} or more ({levels})"
        )
    return f"{seen}; maxDrop {check.max_drop:g} needs {check.documents_needed}"
