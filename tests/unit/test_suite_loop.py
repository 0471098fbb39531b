"""The suites' half of a cycle (poller.cycle.suites) where it meets the API.

Checks: without the LMEvalSuite CRD (only the LMEvalJob one installed, or an
upgrade that applies it after the poller) the LIST of suites is a 404: the
suites' half reports no suite and raises nothing, so a cycle counts no error
and the jobs' half is unaffected; it warns once, and asks again every cycle
(the CRD may arrive later).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pytest

from poller.cycle.podproof import PodProof
from poller.cycle.suites import SuiteLoop
from poller.kube.errors import NotFound


class NoSuiteApi:
    """A Kube whose LMEvalSuite API answers 404, counting the LISTs."""

    def __init__(self) -> None:
        self.lists = 0

    def list_suites(self, namespace: str | None = None) -> list[dict[str, Any]]:
        self.lists += 1
        raise NotFound("lmevalsuites /apis/foundation-model-stack.github.com/v1beta1 not found")


def test_no_suite_api_is_no_suite_and_no_error(caplog: pytest.LogCaptureFixture) -> None:
    kube = NoSuiteApi()
    loop = SuiteLoop(kube, observer=None, proof=lambda: PodProof(b"k" * 32))  # type: ignore[arg-type]
    now = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
    with caplog.at_level(logging.WARNING, logger="poller.cycle.suites"):
        reports = [loop.run(now) for _ in range(3)]
    assert all(r.suites == 0 and not r.errors and not r.snapshot for r in reports)
    assert kube.lists == 3, "asked again every cycle"
    warnings = [r for r in caplog.records if "LMEvalSuite API is not installed" in r.message]
    assert len(warnings) == 1, "warned once"
