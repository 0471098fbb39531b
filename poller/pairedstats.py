"""PRIVATE STUB of helper "stats"'s paired statistics (replaced when h19-stats is merged).

Only what the regression gate calls, with the brief's API: exact McNemar for
0/1 metrics, a paired bootstrap otherwise, and the gate's rule. Pure, stdlib.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver.itemscores import BINARY, TaskItems

__all__ = [
    "GateVerdict",
    "NotComparable",
    "Paired",
    "PairedResult",
    "check_results_comparable",
    "compare_paired",
    "gate_verdict",
    "pair_tasks",
]


class NotComparable(ValueError):
    """Two runs that must not be paired (the reason is the message)."""


@dataclass(frozen=True)
class Paired:
    a: tuple[float, ...]
    b: tuple[float, ...]
    binary: bool


@dataclass(frozen=True)
class PairedResult:
    test: str
    n: int
    mean_a: float
    mean_b: float
    difference: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    a_only: int
    b_only: int


@dataclass(frozen=True)
class GateVerdict:
    regressed: bool
    message: str


def pair_tasks(a: TaskItems, b: TaskItems, metric: str) -> Paired:
    if a.docs_sha256 != b.docs_sha256 or a.doc_ids != b.doc_ids:
        raise NotComparable("the two runs evaluated different documents")
    if metric not in a.metrics or metric not in b.metrics:
        raise NotComparable(f"metric {metric} is missing")
    ma, mb = a.metrics[metric], b.metrics[metric]
    pairs = [
        (x, y)
        for x, y in zip(ma.values, mb.values, strict=True)
        if not (math.isnan(x) or math.isnan(y))
    ]
    if not pairs:
        raise NotComparable("no documents to pair")
    return Paired(
        tuple(p[0] for p in pairs),
        tuple(p[1] for p in pairs),
        ma.kind == BINARY and mb.kind == BINARY,
    )


def check_results_comparable(
    task: str, a_results: Mapping[str, Any], b_results: Mapping[str, Any]
) -> None:
    for key in ("task_hashes", "n-shot", "versions"):
        found_a, found_b = a_results.get(key), b_results.get(key)
        in_a = found_a.get(task) if isinstance(found_a, dict) else None
        in_b = found_b.get(task) if isinstance(found_b, dict) else None
        if in_a is not None and in_b is not None and in_a != in_b:
            raise NotComparable(f"different {key}: {str(in_a)[:16]} in A, {str(in_b)[:16]} in B")


def _binom_two_sided(k: int, n: int) -> float:
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n
    return float(min(1.0, 2 * tail))


def compare_paired(
    a_values: Sequence[float],
    b_values: Sequence[float],
    *,
    binary: bool,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> PairedResult:
    n = len(a_values)
    diffs = [y - x for x, y in zip(a_values, b_values, strict=True)]
    mean_a, mean_b = sum(a_values) / n, sum(b_values) / n
    difference = mean_b - mean_a
    a_only = sum(1 for x, y in zip(a_values, b_values, strict=True) if x > y)
    b_only = sum(1 for x, y in zip(a_values, b_values, strict=True) if y > x)
    rng = random.Random(seed)  # noqa: S311 (resampling, not secrets)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo = means[int((1 - confidence) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + confidence) / 2 * resamples))]
    if binary:
        p = _binom_two_sided(min(a_only, b_only), a_only + b_only)
        test = "mcnemar-exact"
    else:
        centred = [m - difference for m in means]
        p = sum(1 for m in centred if abs(m) >= abs(difference)) / resamples
        test = "paired-bootstrap"
    return PairedResult(test, n, mean_a, mean_b, difference, lo, hi, confidence, p, a_only, b_only)


def gate_verdict(
    result: PairedResult, *, max_drop: float, alpha: float, higher_is_better: bool
) -> GateVerdict:
    drop = -result.difference if higher_is_better else result.difference
    regressed = drop > max_drop and result.p_value < alpha
    message = (
        f"{'regressed' if regressed else 'no significant regression'}: "
        f"{result.mean_a:.4f} -> {result.mean_b:.4f} (difference {result.difference:+.4f}, "
        f"{result.confidence:.0%} CI [{result.ci_low:+.4f}, {result.ci_high:+.4f}], "
        f"p={result.p_value:.4g}, n={result.n}, {result.a_only} worse / {result.b_only} better)"
    )
    return GateVerdict(regressed, message)
