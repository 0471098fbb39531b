"""The regression gate's pure decisions (`poller.decisions.regression`), without a cluster.

Checks every outcome of condition Regressed: True and False with the numbers
(A = baseline, B = this job), and each Unknown reason (BaselineMissing,
WaitingForBaseline, BaselineFailed, JobNotSucceeded, NoItemScores for
either side, NotComparable for a job naming itself and for a refused
pairing, including lm_eval's task hashes kept beside the items,
InvalidGate); that the per-item scores are asked for only when both jobs
succeeded and no outcome is kept; that a verdict is kept (no reads, no
write) whatever becomes of the baseline or the spec generation, while a
final Unknown is decided again after a spec change or for a new baseline
object (whose UID it then records); that
through `decide` a finished gated job gets status.gate, the condition and an
event, once; the bounded unpacking of the stored scores; and that a gated
job's pod runs lm_eval with --log_samples.
"""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import pytest

from driver.itemscores import ItemScores, TaskItems, docs_digest, encode_item_scores, metric_items
from poller import api
from poller.decisions import decide, regression
from poller.decisions.actions import Needs, PatchStatus, PatchWorkloadStatus, PostEvent
from poller.decisions.kueueadmission import KueueView, WorkloadView
from poller.decisions.observed import Observed
from poller.decisions.regression import GateView, ItemsRead
from poller.decisions.views import JobView
from poller.jobpod import podspec
from tests.unit.test_decide import NOW, SETTINGS

N = 150
GATE = {"task": "arith", "metric": "exact_match,none"}
SUCCEEDED = {"state": "Complete", "reason": "Succeeded", "message": "done"}


def view(
    name: str = "candidate",
    *,
    uid: str = "uid-c",
    generation: int = 2,
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> JobView:
    return JobView.from_object(
        {
            "metadata": {
                "namespace": "ns",
                "name": name,
                "uid": uid,
                "generation": generation,
                "resourceVersion": "7",
            },
            "spec": {"model": "local-completions", "tasks": ["arith"], **spec},
            "status": SUCCEEDED if status is None else status,
        }
    )


def candidate(status: dict[str, Any] | None = None, **spec: Any) -> JobView:
    return view(status=status, **{"baseline": "base", "gate": GATE, **spec})


def baseline(status: dict[str, Any] | None = None, uid: str = "uid-b") -> JobView:
    return view("base", uid=uid, status=status)


def encoded(values: list[float], *, task: str = "arith", digest_salt: str = "") -> str:
    """What the poller keeps in binaryData: base64 of gzip of the driver's JSON."""
    ids = tuple(range(len(values)))
    items = TaskItems(
        ids,
        docs_digest((i, f"doc{i}{digest_salt}") for i in ids),
        {"exact_match,none": metric_items(values)},
    )
    raw = encode_item_scores(ItemScores({task: items}))
    return base64.b64encode(gzip.compress(raw)).decode()


RIGHT = [1.0] * N
# 30% of the items answered wrongly (every third document and a few more).
WORSE = [0.0 if i % 10 in (0, 3, 7) else 1.0 for i in range(N)]


def read(values: list[float], **kwargs: Any) -> ItemsRead:
    return ItemsRead(encoded=encoded(values, **kwargs))


def decided(job: JobView, gate_view: GateView) -> regression.GateOutcome:
    found = regression.decide_gate(job, gate_view)
    assert found is not None
    return found


# -- verdicts -------------------------------------------------------------------------


def test_a_significant_drop_is_regressed_with_the_numbers() -> None:
    outcome = decided(candidate(), GateView(baseline(), own=read(WORSE), base=read(RIGHT)))
    assert (outcome.status, outcome.reason) == (True, regression.REGRESSED)
    fields = outcome.fields
    assert fields.verdict == "Regressed" and fields.final and fields.generation == 2
    assert (fields.baseline, fields.baseline_uid) == ("base", "uid-b")
    assert fields.paired == N and fields.baseline_score == 1.0
    assert fields.score == pytest.approx(0.7)
    assert fields.difference == pytest.approx(-0.3)
    assert fields.baseline_only == 45 and fields.candidate_only == 0
    assert fields.p_value is not None and fields.p_value < 1e-10
    assert fields.ci_low is not None and fields.ci_high is not None
    assert fields.ci_low < -0.3 < fields.ci_high < 0
    assert "0.7" in outcome.message and "p=" in outcome.message


def test_the_same_scores_are_not_regressed() -> None:
    outcome = decided(candidate(), GateView(baseline(), own=read(WORSE), base=read(WORSE)))
    assert (outcome.status, outcome.reason) == (False, regression.NOT_REGRESSED)
    assert outcome.fields.difference == 0 and outcome.fields.p_value == 1.0
    assert outcome.fields.final


def test_a_drop_within_max_drop_is_not_regressed_however_significant() -> None:
    job = candidate(gate={**GATE, "maxDrop": 0.35})
    outcome = decided(job, GateView(baseline(), own=read(WORSE), base=read(RIGHT)))
    assert outcome.status is False and outcome.fields.max_drop == 0.35


def test_an_insignificant_drop_is_not_regressed() -> None:
    slightly = [0.0 if i in (3, 77) else 1.0 for i in range(N)]
    outcome = decided(candidate(), GateView(baseline(), own=read(slightly), base=read(RIGHT)))
    assert outcome.status is False
    assert outcome.fields.p_value is not None and outcome.fields.p_value > 0.05


def test_lower_is_better_turns_the_drop_around() -> None:
    job = candidate(gate={**GATE, "higherIsBetter": False})
    # The "candidate" scores lower: better when lower is better.
    outcome = decided(job, GateView(baseline(), own=read(WORSE), base=read(RIGHT)))
    assert outcome.status is False
    outcome = decided(job, GateView(baseline(), own=read(RIGHT), base=read(WORSE)))
    assert outcome.status is True


# -- Unknown, from the listing alone (no reads) ----------------------------------------


@pytest.mark.parametrize(
    ("base", "reason", "words"),
    [
        (None, regression.BASELINE_MISSING, "LMEvalJob base (spec.baseline) does not exist"),
        ({"state": "Running"}, regression.WAITING_FOR_BASELINE, "waiting for baseline base"),
        ({}, regression.WAITING_FOR_BASELINE, "(it is New)"),
        (
            {"state": "Complete", "reason": "Failed", "message": "OOMKilled"},
            regression.BASELINE_FAILED,
            "baseline base ended Failed: OOMKilled",
        ),
        (
            {"state": "Complete", "reason": "Cancelled"},
            regression.BASELINE_FAILED,
            "baseline base ended Cancelled",
        ),
    ],
)
def test_the_baselines_state_decides_without_reads(
    base: dict[str, Any] | None, reason: str, words: str
) -> None:
    listed = GateView(None if base is None else baseline(base))
    job = candidate()
    assert not regression.needs_items(job, listed)
    assert decide.what_to_observe(Observed(job, None, gate=listed), SETTINGS, NOW) == Needs()
    outcome = decided(job, listed)
    assert (outcome.status, outcome.reason) == (None, reason)
    assert words in outcome.message
    assert outcome.fields.verdict == "Unknown" and not outcome.fields.final


def test_a_job_that_did_not_succeed_has_nothing_to_compare() -> None:
    job = candidate({"state": "Complete", "reason": "Failed"})
    listed = GateView(baseline())
    assert not regression.needs_items(job, listed)
    outcome = decided(job, listed)
    assert (outcome.status, outcome.reason) == (None, regression.JOB_NOT_SUCCEEDED)
    assert "ended Failed" in outcome.message


def test_a_job_naming_itself_is_not_comparable() -> None:
    job = view("base", baseline="base", gate=GATE)
    outcome = decided(job, GateView(job))
    assert (outcome.status, outcome.reason) == (None, regression.NOT_COMPARABLE)
    assert "names this job itself" in outcome.message


def test_an_unfinished_or_ungated_job_has_no_gate_outcome() -> None:
    assert regression.decide_gate(candidate({"state": "Running"}), GateView(baseline())) is None
    assert regression.decide_gate(view(), GateView(baseline())) is None
    assert regression.baseline_name(view(baseline="base")) is None  # a baseline without a gate


def test_an_invalid_gate_says_why() -> None:
    job = candidate(gate={"task": "arith", "alpha": 2})
    outcome = decided(job, GateView(baseline()))
    assert (outcome.status, outcome.reason) == (None, regression.INVALID_GATE)
    assert outcome.message.startswith("spec.gate.alpha")


# -- reading the items ----------------------------------------------------------------


def test_items_are_read_only_when_both_succeeded() -> None:
    listed = GateView(baseline())
    job = candidate()
    assert regression.needs_items(job, listed)
    assert decide.what_to_observe(Observed(job, None, gate=listed), SETTINGS, NOW) == Needs(
        gate_items=True
    )
    # Not read (yet): nothing is decided.
    assert regression.decide_gate(job, listed) is None


def test_a_baseline_without_items_says_how_to_get_them() -> None:
    problem = ItemsRead(problem="ConfigMap base-results has no items.json.gz")
    outcome = decided(candidate(), GateView(baseline(), own=read(RIGHT), base=problem))
    assert (outcome.status, outcome.reason) == (None, regression.NO_ITEM_SCORES)
    assert "baseline base has no per-item scores (ConfigMap base-results" in outcome.message
    assert "spec.logSamples: true" in outcome.message
    assert "this job" not in outcome.message
    assert outcome.fields.final


def test_the_baselines_status_says_why_it_kept_no_items() -> None:
    noted = view(
        "base",
        uid="uid-b",
        status={**SUCCEEDED, "itemScores": {"stored": "None", "message": "too large to keep"}},
    )
    problem = ItemsRead(problem="ConfigMap base-results has no items.json.gz")
    outcome = decided(candidate(), GateView(noted, own=read(RIGHT), base=problem))
    assert "(ConfigMap base-results has no items.json.gz; too large to keep)" in outcome.message


def test_a_refused_read_is_not_final() -> None:
    refused = ItemsRead(problem="ConfigMap base-results cannot be read: 403", retry=True)
    outcome = decided(candidate(), GateView(baseline(), own=read(RIGHT), base=refused))
    assert outcome.reason == regression.NO_ITEM_SCORES and not outcome.fields.final
    assert regression.needs_items(_with_outcome(candidate(), outcome), GateView(baseline()))


def test_this_job_without_items_is_named_too() -> None:
    outcome = decided(
        candidate(), GateView(baseline(), own=ItemsRead(problem="no ConfigMap"), base=read(RIGHT))
    )
    assert outcome.reason == regression.NO_ITEM_SCORES
    assert outcome.message == "this job has no per-item scores (no ConfigMap)"


def test_items_without_the_task_or_unreadable_are_no_item_scores() -> None:
    outcome = decided(
        candidate(), GateView(baseline(), own=read(RIGHT, task="other"), base=read(RIGHT))
    )
    assert "this job has no per-item scores for task arith (it has: other)" in outcome.message
    junk = ItemsRead(encoded=base64.b64encode(gzip.compress(b"{not json")).decode())
    outcome = decided(candidate(), GateView(baseline(), own=read(RIGHT), base=junk))
    assert outcome.reason == regression.NO_ITEM_SCORES
    assert "baseline base has no usable per-item scores" in outcome.message


def test_different_documents_are_not_comparable() -> None:
    other_docs = read(RIGHT, digest_salt="x")
    outcome = decided(candidate(), GateView(baseline(), own=read(RIGHT), base=other_docs))
    assert (outcome.status, outcome.reason) == (None, regression.NOT_COMPARABLE)
    assert outcome.message and outcome.fields.final


def test_different_task_hashes_are_not_comparable_in_either_stored_form() -> None:
    def with_results(values: list[float], digest: str, packed: bool) -> ItemsRead:
        text = json.dumps({"results": {}, "task_hashes": {"arith": digest}})
        if packed:
            zipped = base64.b64encode(gzip.compress(text.encode())).decode()
            return ItemsRead(encoded=encoded(values), results=zipped, results_packed=True)
        return ItemsRead(encoded=encoded(values), results=text)

    for packed in (False, True):
        listed = GateView(
            baseline(),
            own=with_results(RIGHT, "aaaa", packed),
            base=with_results(RIGHT, "bbbb", packed),
        )
        outcome = decided(candidate(), listed)
        assert (outcome.status, outcome.reason) == (None, regression.NOT_COMPARABLE)
        assert "task_hashes" in outcome.message or "task hashes" in outcome.message
        same = GateView(
            baseline(),
            own=with_results(RIGHT, "aaaa", packed),
            base=with_results(RIGHT, "aaaa", packed),
        )
        assert decided(candidate(), same).status is False
    # Unreadable results JSON: the documents' digests are still compared.
    junk = ItemsRead(encoded=encoded(WORSE), results="{")
    assert decided(candidate(), GateView(baseline(), own=junk, base=read(RIGHT))).status is True


def test_a_missing_metric_is_not_comparable() -> None:
    job = candidate(gate={**GATE, "metric": "acc,none"})
    outcome = decided(job, GateView(baseline(), own=read(RIGHT), base=read(RIGHT)))
    assert outcome.reason == regression.NOT_COMPARABLE


def test_unpacking_is_bounded() -> None:
    assert regression.unpack_items(encoded(RIGHT)).startswith(b"{")
    bomb = base64.b64encode(gzip.compress(b" " * (64 * 1024 * 1024))).decode()
    with pytest.raises(ValueError, match="holds more than"):
        regression.unpack_items(bomb)
    with pytest.raises(ValueError, match="not base64"):
        regression.unpack_items("%%%")
    with pytest.raises(ValueError, match="not gzip"):
        regression.unpack_items(base64.b64encode(b"plain").decode())


# -- a final outcome is kept -----------------------------------------------------------


def _with_outcome(job: JobView, outcome: regression.GateOutcome) -> JobView:
    draft_status = job.status.model_copy(update={"gate": outcome.fields})
    return JobView.from_object(
        {
            "metadata": {
                "namespace": job.namespace,
                "name": job.name,
                "uid": job.uid,
                "generation": job.generation,
                "resourceVersion": "8",
            },
            "spec": job.spec,
            "status": draft_status.model_dump(by_alias=True, exclude_none=True, mode="json"),
        }
    )


def test_a_verdict_is_kept_whatever_becomes_of_the_baseline() -> None:
    outcome = decided(candidate(), GateView(baseline(), own=read(WORSE), base=read(RIGHT)))
    done = _with_outcome(candidate(), outcome)
    assert not regression.needs_items(done, GateView(baseline()))
    assert regression.decide_gate(done, GateView(baseline())) is None
    # Kept when the baseline is deleted afterwards, or replaced under its name
    # (finished, or not yet), or after a new spec generation: a record.
    for later in (None, baseline(uid="uid-b2"), baseline({"state": "Running"}, uid="uid-b3")):
        assert not regression.needs_items(done, GateView(later))
        assert (
            regression.decide_gate(done, GateView(later, own=read(RIGHT), base=read(RIGHT))) is None
        )
    bumped = view(
        status=done.status.model_dump(by_alias=True, exclude_none=True, mode="json"),
        generation=3,
        baseline="base",
        gate=GATE,
    )
    assert not regression.needs_items(bumped, GateView(baseline(uid="uid-b2")))


def test_a_final_unknown_is_decided_again_for_a_new_baseline_object_or_spec() -> None:
    missing = decided(candidate(), GateView(baseline(), own=read(WORSE), base=ItemsRead()))
    assert missing.reason == regression.NO_ITEM_SCORES and missing.fields.final
    done = _with_outcome(candidate(), missing)
    assert not regression.needs_items(done, GateView(baseline()))
    assert regression.decide_gate(done, GateView(None)) is None  # kept when the baseline goes
    # Another object under the baseline's name before any verdict: decided
    # against it, and its UID recorded.
    assert regression.needs_items(done, GateView(baseline(uid="uid-b2")))
    again = decided(done, GateView(baseline(uid="uid-b2"), own=read(WORSE), base=read(RIGHT)))
    assert again.reason == regression.REGRESSED and again.fields.baseline_uid == "uid-b2"
    bumped = view(
        status=done.status.model_dump(by_alias=True, exclude_none=True, mode="json"),
        generation=3,
        baseline="base",
        gate=GATE,
    )
    assert regression.needs_items(bumped, GateView(baseline()))


def test_an_unknown_outcome_from_the_listing_is_decided_again_every_cycle() -> None:
    waiting = decided(candidate(), GateView(baseline({"state": "Running"})))
    job = _with_outcome(candidate(), waiting)
    assert regression.needs_items(job, GateView(baseline()))


# -- through decide ---------------------------------------------------------------------


def test_decide_writes_status_gate_the_condition_and_one_event() -> None:
    job = candidate()
    listed = GateView(baseline(), own=read(WORSE), base=read(RIGHT))
    actions = decide.decide(Observed(job, None, gate=listed), SETTINGS, NOW).actions
    patch = next(a for a in actions if isinstance(a, PatchStatus))
    condition = next(c for c in patch.status.conditions or [] if c.type == "Regressed")
    assert (condition.status, condition.reason) == ("True", "Regressed")
    assert condition.observed_generation == 2 and "p=" in condition.message
    assert patch.status.gate is not None and patch.status.gate.verdict == "Regressed"
    events = [a for a in actions if isinstance(a, PostEvent)]
    assert [(e.type, e.reason) for e in events] == [("Warning", "Regressed")]
    # The written status yields nothing more.
    written = _with_outcome(job, decided(job, listed))
    written = JobView.from_object(
        {
            "metadata": {"namespace": "ns", "name": "candidate", "uid": "uid-c", "generation": 2},
            "spec": dict(written.spec),
            "status": patch.status.model_dump(by_alias=True, exclude_none=True, mode="json"),
        }
    )
    assert (
        decide.what_to_observe(Observed(written, None, gate=GateView(baseline())), SETTINGS, NOW)
        == Needs()
    )
    assert (
        decide.decide(Observed(written, None, gate=GateView(baseline())), SETTINGS, NOW).actions
        == []
    )


def test_unknown_is_written_as_condition_status_unknown_and_kept_quiet() -> None:
    job = candidate()
    actions = decide.decide(Observed(job, None, gate=GateView(None)), SETTINGS, NOW).actions
    patch = next(a for a in actions if isinstance(a, PatchStatus))
    condition = next(c for c in patch.status.conditions or [] if c.type == "Regressed")
    assert (condition.status, condition.reason) == ("Unknown", "BaselineMissing")
    assert not [a for a in actions if isinstance(a, PostEvent)]
    again = JobView.from_object(
        {
            "metadata": {"namespace": "ns", "name": "candidate", "uid": "uid-c", "generation": 2},
            "spec": dict(job.spec),
            "status": patch.status.model_dump(by_alias=True, exclude_none=True, mode="json"),
        }
    )
    assert decide.decide(Observed(again, None, gate=GateView(None)), SETTINGS, NOW).actions == []


def test_a_finished_gated_jobs_view_keeps_its_gate_and_conditions() -> None:
    job = candidate({**SUCCEEDED, "conditions": [_condition("Succeeded")], "results": "{}"})
    assert job.spec["gate"] == GATE and job.spec["baseline"] == "base"
    assert job.status.conditions and job.status.results is None
    plain = view(status={**SUCCEEDED, "conditions": [_condition("Succeeded")]})
    assert plain.status.conditions is None


def _condition(kind: str) -> dict[str, Any]:
    return {"type": kind, "status": "True", "lastTransitionTime": "2026-11-29T12:00:00Z"}


def test_a_gated_job_runs_lm_eval_with_log_samples() -> None:
    spec = api.LMEvalJobSpec.model_validate(
        {"model": "dummy", "tasks": ["arith"], "baseline": "base", "gate": GATE}
    )
    manifest = podspec.build_pod(
        name="candidate", namespace="ns", uid="u", spec=spec, settings=SETTINGS
    )
    assert "--log_samples" in manifest["spec"]["containers"][0]["command"]
    assert spec.gate is not None and spec.gate.metric == "exact_match,none"
    assert api.RegressionGate(task="t").metric == "acc,none"
    with pytest.raises(ValueError, match=r"spec\.gate needs spec\.baseline"):
        api.LMEvalJobSpec.model_validate({"model": "dummy", "tasks": ["t"], "gate": GATE})


def test_under_kueue_a_gated_jobs_workload_is_marked_finished_once() -> None:
    workload = WorkloadView(
        namespace="ns",
        name="wl",
        resource_version="5",
        owner_uid="uid-c",
        deleting=False,
        conditions=(),
        quota_reserved=True,
        cluster_queue="cq",
        flavors=(),
    )
    actions = decide.decide(
        Observed(candidate(), None, kueue=KueueView(workload), gate=GateView(None)), SETTINGS, NOW
    ).actions
    assert len([a for a in actions if isinstance(a, PatchWorkloadStatus)]) == 1
    assert len([a for a in actions if isinstance(a, PatchStatus)]) == 1
