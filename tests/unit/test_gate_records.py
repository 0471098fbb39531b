"""A recorded gate verdict stays bound to the baseline it was computed from, and is written whole.

Through `decide`, as a cycle runs it: once status.gate holds a verdict
(Regressed or NotRegressed, with the baseline's UID), no later listing
decides it again (a baseline deleted, or replaced under its name by a job
that is running, failed, or finished with other scores, or a new spec
generation): no reads are asked for and nothing is written. Before a
verdict exists, a replaced baseline is compared as the current object and
its UID recorded. And the status patch (`statuswrites.merge_patch`, the
JSON merge patch the apiserver applies) turns the stored status into the
decided one exactly: a key of an earlier status.gate that the new outcome
lacks (a score, a p-value) is sent as null, so none survives beside it.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from poller import api
from poller.cycle.statuswrites import StatusWrites, merge_patch
from poller.decisions import decide, regression
from poller.decisions.actions import Needs, PatchStatus
from poller.decisions.observed import Observed
from poller.decisions.regression import GateView, ItemsRead
from poller.decisions.views import JobView
from poller.kube.client import Kube
from tests.unit.test_decide import NOW, SETTINGS
from tests.unit.test_gate import GATE, RIGHT, WORSE, baseline, candidate, read, view


def _stored(job: JobView, patch: PatchStatus) -> JobView:
    """`job` as the apiserver holds it once `patch` was written."""
    return view(
        status=patch.status.model_dump(by_alias=True, exclude_none=True, mode="json"),
        generation=job.generation,
        **dict(job.spec),
    )


def _patch(job: JobView, listed: GateView) -> PatchStatus:
    actions = decide.decide(Observed(job, None, gate=listed), SETTINGS, NOW).actions
    patches = [a for a in actions if isinstance(a, PatchStatus)]
    assert len(patches) == 1, actions
    return patches[0]


def _not_decided_again(job: JobView, listed: GateView) -> None:
    assert decide.what_to_observe(Observed(job, None, gate=listed), SETTINGS, NOW) == Needs()
    assert decide.decide(Observed(job, None, gate=listed), SETTINGS, NOW).actions == []


@pytest.mark.parametrize("first", [(RIGHT, RIGHT), (RIGHT, WORSE)], ids=["not", "regressed"])
def test_a_recorded_verdict_is_never_decided_again(first: tuple[list[float], list[float]]) -> None:
    base_values, own_values = first
    job = candidate()
    written = _patch(job, GateView(baseline(), own=read(own_values), base=read(base_values)))
    done = _stored(job, written)
    recorded = done.status.gate
    assert recorded is not None and recorded.reason in regression.VERDICTS
    assert recorded.baseline_uid == "uid-b" and recorded.final

    # The baseline deleted, or another job created under its name: running,
    # failed, or finished with scores that would turn the verdict around.
    replaced = baseline(uid="uid-b2")
    other_scores = read(WORSE if base_values == RIGHT else RIGHT)
    for listed in (
        GateView(None),
        GateView(baseline({"state": "Running"}, uid="uid-b2")),
        GateView(baseline({"state": "Complete", "reason": "Failed"}, uid="uid-b2")),
        GateView(replaced),
        GateView(replaced, own=read(own_values), base=other_scores),
        GateView(replaced, own=read(own_values), base=ItemsRead(problem="no ConfigMap")),
    ):
        _not_decided_again(done, listed)
    # Nor after a new spec generation (an edit of ttlSecondsAfterFinished bumps it).
    bumped = view(
        status=done.status.model_dump(by_alias=True, exclude_none=True, mode="json"),
        generation=done.generation + 1,
        baseline="base",
        gate=GATE,
    )
    _not_decided_again(bumped, GateView(replaced, own=read(own_values), base=other_scores))


def test_a_baseline_replaced_before_any_verdict_is_compared_as_the_current_object() -> None:
    job = candidate()
    waiting = _stored(job, _patch(job, GateView(baseline({"state": "Running"}))))
    assert waiting.status.gate is not None
    assert waiting.status.gate.reason == regression.WAITING_FOR_BASELINE
    assert waiting.status.gate.baseline_uid == "uid-b"
    replaced = baseline(uid="uid-b2")
    assert decide.what_to_observe(
        Observed(waiting, None, gate=GateView(replaced)), SETTINGS, NOW
    ) == Needs(gate_items=True)
    verdict = _patch(waiting, GateView(replaced, own=read(WORSE), base=read(RIGHT)))
    assert verdict.status.gate is not None
    assert (verdict.status.gate.reason, verdict.status.gate.baseline_uid) == (
        regression.REGRESSED,
        "uid-b2",
    )


def _merged(target: Any, patch: Any) -> Any:
    """RFC 7386: what a merge patch makes of `target` (as the apiserver applies it)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merged(out.get(key), value)
    return out


class _Recorder:
    """Stands for `Kube`: keeps the status patches instead of sending them."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def patch_job_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> None:
        self.patches.append(status)


# An Unknown status.gate that still carries the numbers of an earlier verdict,
# as a merge patch of only the new outcome's keys left it (issue 28).
STALE_GATE = {
    "baseline": "base",
    "baselineUid": "uid-b",
    "task": "arith",
    "metric": "exact_match,none",
    "verdict": "Unknown",
    "reason": "WaitingForBaseline",
    "final": False,
    "generation": 2,
    "test": "exact McNemar",
    "paired": 150,
    "baselineScore": 1.0,
    "score": 0.7,
    "difference": -0.3,
    "pValue": 1e-12,
    "baselineOnly": 45,
    "candidateOnly": 0,
}


def test_the_gate_status_is_written_whole() -> None:
    stored = {
        "state": "Complete",
        "reason": "Succeeded",
        "message": "done",
        "gate": STALE_GATE,
    }
    job = candidate(stored)
    action = _patch(job, GateView(None))  # the baseline is gone: BaselineMissing
    recorder = _Recorder()
    assert StatusWrites(cast(Kube, recorder)).patch(job, action)
    (sent,) = recorder.patches
    for key in ("test", "paired", "baselineScore", "score", "difference", "pValue"):
        assert sent["gate"][key] is None, key
    after = _merged(job.status.model_dump(by_alias=True, exclude_none=True, mode="json"), sent)
    assert after == action.status.model_dump(by_alias=True, exclude_none=True, mode="json")
    written = api.LMEvalJobStatus.model_validate(after).gate
    assert written is not None and written.reason == regression.BASELINE_MISSING
    assert written.p_value is None and written.score is None and written.paired is None


def test_a_merge_patch_removes_what_the_new_status_lacks_at_every_depth() -> None:
    old = {"a": 1, "gone": 2, "m": {"k": 1, "x": {"deep": 1, "kept": 2}}, "l": [{"p": 1}]}
    new = {"a": 1, "m": {"k": 2, "x": {"kept": 2}}, "l": [{"q": 2}], "n": {"z": 1}}
    patch = merge_patch(old, new)
    assert patch == {
        "gone": None,
        "a": 1,
        "m": {"k": 2, "x": {"deep": None, "kept": 2}},
        "l": [{"q": 2}],
        "n": {"z": 1},
    }
    assert _merged(old, patch) == new
