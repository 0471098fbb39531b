"""A recorded gate verdict survives its baseline being replaced, on the real control plane.

Finished jobs are made by hand as in ``test_regression_gate_reads`` (status
written as an admin, results ConfigMaps owned by the jobs holding per-item
scores), the poller runs as its own ServiceAccount. Checks:

- once ``cand`` has its verdict (NotRegressed against ``base``, whose UID
  status.gate records), ``base`` is deleted and another LMEvalJob is created
  under its name, first unfinished, then finished with scores that would make
  ``cand`` Regressed; each time ``cand`` is edited (a new
  ttlSecondsAfterFinished, which bumps its generation) so that the sweep
  makes the cycle read and decide it again. Its status.gate (verdict,
  baselineUid, numbers) and condition Regressed stay exactly as recorded, and
  the poller writes nothing to it; a job gated on the new ``base`` is
  Regressed against it, with the new UID, so the poller did see the new
  baseline;
- a job whose status.gate holds an Unknown outcome with the numbers of an
  earlier verdict beside it (what a merge patch of the new keys only left
  behind) gets its next outcome written whole: the stale keys are gone.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from poller import api, timefmt
from poller.cycle.reconciler import Reconciler
from poller.cycle.retained import compact_version
from poller.results import lmeval
from tests.cluster.test_regression_gate_reads import RIGHT, WORSE, N, _condition, _items
from tests.poller_fixtures import Jobs, cycle_until
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

GATE = {"task": "toy_mc"}
# Long enough that no TTL deletes a job during the test.
WEEK = 7 * 24 * 3600


def _complete(
    jobs: Jobs, name: str, items: list[float], status: dict[str, Any] | None = None
) -> str:
    """End job `name` Succeeded by hand, with a results ConfigMap it owns; its UID."""
    uid: str = jobs.get(name)["metadata"]["uid"]
    now = timefmt.format_time(timefmt.now() - dt.timedelta(seconds=5))
    jobs.custom.patch_namespaced_custom_object_status(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        name,
        {
            "status": {
                "state": "Complete",
                "reason": "Succeeded",
                "message": "done by hand",
                "completeTime": now,
                **(status or {}),
            }
        },
    )
    owner = client.V1OwnerReference(
        api_version=f"{api.API_GROUP}/{api.API_VERSION}",
        kind=api.KIND,
        name=name,
        uid=uid,
        controller=True,
    )
    jobs.core.create_namespaced_config_map(
        jobs.namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name=lmeval.results_configmap_name(name), owner_references=[owner]
            ),
            data={lmeval.RESULTS_KEY: "{}"},
            binary_data={lmeval.ITEMS_KEY: _items(items)},
        ),
    )
    return uid


def _delete(jobs: Jobs, name: str) -> None:
    """Delete job `name` and its results ConfigMap, and wait until both are gone."""
    jobs.custom.delete_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, name
    )
    try:
        jobs.core.delete_namespaced_config_map(lmeval.results_configmap_name(name), jobs.namespace)
    except ApiException as error:
        if error.status != 404:
            raise

    def gone() -> bool:
        try:
            jobs.get(name)
        except ApiException as error:
            return bool(error.status == 404)
        return False

    wait_for(gone, what=f"LMEvalJob {name} deleted")


def _decided_again(
    poller: Reconciler, jobs: Jobs, name: str, ttl: int, recorded: dict[str, Any]
) -> dict[str, Any]:
    """Edit job `name` (a new TTL, a new generation) so that the sweep marks it and
    the cycle reads and decides it again (or, if it does, until its status.gate is no
    longer `recorded`); the object as edited."""
    edited: dict[str, Any] = jobs.custom.patch_namespaced_custom_object(  # type: ignore[assignment]
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        name,
        {"spec": {"ttlSecondsAfterFinished": ttl}},
    )
    poller.sweep_finished(whole_round=True)
    uid = edited["metadata"]["uid"]
    version = compact_version(edited["metadata"]["resourceVersion"])

    def read_again() -> bool:
        record = poller.retained.get(uid)
        if record is not None and not record.follow and record.resource_version == version:
            return True
        return bool(jobs.status(name).get("gate") != recorded)

    cycle_until(poller, read_again, what=f"the cycle read {name} again")
    for _ in range(2):  # and the cycles after it
        report = poller.run_cycle()
        assert report.errors == 0, report.error_messages
    return edited


def test_a_verdict_stays_when_its_baseline_is_replaced(poller: Reconciler, jobs: Jobs) -> None:
    jobs.create("base", suspend=True, logSamples=True)
    first_uid = _complete(jobs, "base", WORSE)
    jobs.create("cand", suspend=True, baseline="base", gate=GATE, ttlSecondsAfterFinished=WEEK)
    _complete(jobs, "cand", WORSE)
    cycle_until(
        poller,
        lambda: (c := _condition(jobs, "cand")) is not None and c["reason"] == "NotRegressed",
        what="cand NotRegressed",
    )
    recorded = jobs.status("cand")["gate"]
    condition = _condition(jobs, "cand")
    assert recorded["baselineUid"] == first_uid and recorded["final"] is True
    assert (recorded["verdict"], recorded["paired"], recorded["pValue"]) == ("NotRegressed", N, 1.0)

    # Another job under the baseline's name, not finished: no WaitingForBaseline.
    _delete(jobs, "base")
    jobs.create("base", suspend=True, logSamples=True)
    edited = _decided_again(poller, jobs, "cand", WEEK + 1, recorded)
    assert jobs.status("cand")["gate"] == recorded
    assert _condition(jobs, "cand") == condition
    assert jobs.get("cand")["metadata"]["resourceVersion"] == edited["metadata"]["resourceVersion"]

    # ... then finished with scores that would make cand Regressed: still the record.
    second_uid = _complete(jobs, "base", RIGHT)
    assert second_uid != first_uid
    edited = _decided_again(poller, jobs, "cand", WEEK + 2, recorded)
    assert jobs.status("cand")["gate"] == recorded
    assert _condition(jobs, "cand") == condition
    assert jobs.get("cand")["metadata"]["resourceVersion"] == edited["metadata"]["resourceVersion"]

    # The poller does see the new baseline: a job gated on it now is Regressed.
    jobs.create("cand-new", suspend=True, baseline="base", gate=GATE)
    _complete(jobs, "cand-new", WORSE)
    poller.sweep_finished(whole_round=True)  # finished behind the cycle: the sweep notes it
    cycle_until(
        poller,
        lambda: (c := _condition(jobs, "cand-new")) is not None and c["reason"] == "Regressed",
        what="cand-new Regressed",
    )
    assert jobs.status("cand-new")["gate"]["baselineUid"] == second_uid
    assert jobs.status("cand")["gate"] == recorded


# status.gate as a merge patch of only the new outcome's keys left it (issue 28):
# Unknown, with an earlier verdict's numbers beside it.
STALE_GATE = {
    "baseline": "gone",
    "baselineUid": "uid-of-a-deleted-job",
    "task": "toy_mc",
    "metric": "acc,none",
    "verdict": "Unknown",
    "reason": "WaitingForBaseline",
    "final": False,
    "test": "exact McNemar",
    "paired": N,
    "baselineScore": 1.0,
    "score": 0.75,
    "difference": -0.25,
    "ciLow": -0.31,
    "ciHigh": -0.19,
    "confidence": 0.95,
    "pValue": 1e-12,
    "baselineOnly": 50,
    "candidateOnly": 0,
}
NUMBERS = ("test", "paired", "baselineScore", "score", "difference", "ciLow", "ciHigh")


def test_a_new_outcome_leaves_no_stale_key_in_status_gate(poller: Reconciler, jobs: Jobs) -> None:
    jobs.create("stale", suspend=True, baseline="gone", gate=GATE)
    _complete(jobs, "stale", WORSE, status={"gate": STALE_GATE})
    assert jobs.status("stale")["gate"]["pValue"] == 1e-12
    cycle_until(
        poller,
        lambda: (c := _condition(jobs, "stale")) is not None and c["reason"] == "BaselineMissing",
        what="stale BaselineMissing",
    )
    written = jobs.status("stale")["gate"]
    assert written["reason"] == "BaselineMissing" and written["verdict"] == "Unknown"
    assert "baselineUid" not in written
    for key in (*NUMBERS, "confidence", "pValue", "baselineOnly", "candidateOnly"):
        assert key not in written, (key, written)
    assert set(written) == {
        "baseline",
        "task",
        "metric",
        "verdict",
        "reason",
        "final",
        "generation",
        "maxDrop",
        "alpha",
    }
