"""The regression gate's reads on the real control plane, as the poller's ServiceAccount.

Finished jobs are made by hand (status written as an admin, results
ConfigMaps owned by the jobs holding per-item scores encoded as the driver
encodes them), so this checks the poller's side alone, whatever runs in the
pods: the poller GETs both jobs' ``<job>-results`` ConfigMaps and sets
condition ``Regressed`` True with the paired numbers; a baseline whose
ConfigMap holds no items gives NoItemScores naming the baseline and
``logSamples``; a ConfigMap under the baseline's results name that the
baseline does not own is never read as its items; and a final verdict is
not computed again (no more GETs, no more writes).
"""

from __future__ import annotations

import base64
import gzip
from typing import Any

import pytest
from kubernetes import client

from driver.itemscores import ItemScores, TaskItems, docs_digest, encode_item_scores, metric_items
from poller import api
from poller.cycle.reconciler import Reconciler
from poller.results import lmeval
from tests.poller_fixtures import Jobs, cycle_until

pytestmark = pytest.mark.cluster

N = 200
METRIC = "acc,none"
RIGHT = [1.0] * N
WORSE = [0.0 if i % 4 == 0 else 1.0 for i in range(N)]  # 25% wrong


def _items(values: list[float]) -> str:
    ids = tuple(range(N))
    task = TaskItems(ids, docs_digest((i, f"h{i}") for i in ids), {METRIC: metric_items(values)})
    return base64.b64encode(
        gzip.compress(encode_item_scores(ItemScores({"toy_mc": task})))
    ).decode()


def _finished(
    jobs: Jobs, name: str, items: list[float] | None, owned: bool = True, **spec: Any
) -> None:
    """A job that ended Succeeded, with a results ConfigMap (owned by it unless not `owned`)."""
    created = jobs.create(name, suspend=True, **spec)
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
                "completeTime": "2026-12-01T00:00:00Z",
            }
        },
    )
    owner = client.V1OwnerReference(
        api_version=f"{api.API_GROUP}/{api.API_VERSION}",
        kind=api.KIND,
        name=name,
        uid=created["metadata"]["uid"],
        controller=True,
    )
    jobs.core.create_namespaced_config_map(
        jobs.namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name=lmeval.results_configmap_name(name),
                owner_references=[owner] if owned else None,
            ),
            data={lmeval.RESULTS_KEY: "{}"},
            binary_data={lmeval.ITEMS_KEY: _items(items)} if items is not None else None,
        ),
    )


def _condition(jobs: Jobs, name: str) -> dict[str, Any] | None:
    found = jobs.status(name).get("conditions") or []
    return next((c for c in found if c["type"] == "Regressed"), None)


def test_the_poller_reads_both_jobs_items_and_decides_once(poller: Reconciler, jobs: Jobs) -> None:
    gate = {"task": "toy_mc"}
    _finished(jobs, "base", RIGHT, logSamples=True)
    _finished(jobs, "cand", WORSE, baseline="base", gate=gate)
    _finished(jobs, "plain", None)
    _finished(jobs, "cand-plain", WORSE, baseline="plain", gate=gate)
    _finished(jobs, "forged", RIGHT, owned=False)
    _finished(jobs, "cand-forged", WORSE, baseline="forged", gate=gate)

    def decided() -> bool:
        return all(
            (c := _condition(jobs, name)) is not None
            and c["reason"] in ("Regressed", "NoItemScores")
            for name in ("cand", "cand-plain", "cand-forged")
        )

    cycle_until(poller, decided, what="the three gates decided")
    condition = _condition(jobs, "cand")
    assert condition is not None and (condition["status"], condition["reason"]) == (
        "True",
        "Regressed",
    )
    numbers = jobs.status("cand")["gate"]
    assert (numbers["paired"], numbers["baselineScore"], numbers["score"]) == (N, 1.0, 0.75)
    assert (numbers["baselineOnly"], numbers["candidateOnly"]) == (50, 0)
    assert numbers["pValue"] < 1e-10 and numbers["final"] is True

    plain = _condition(jobs, "cand-plain")
    assert plain is not None and (plain["status"], plain["reason"]) == ("Unknown", "NoItemScores")
    assert "baseline plain has no per-item scores" in plain["message"]
    assert "spec.logSamples: true" in plain["message"]
    forged = _condition(jobs, "cand-forged")
    assert forged is not None and forged["reason"] == "NoItemScores"
    assert "is not owned by LMEvalJob forged" in forged["message"]

    # Final: the next cycle reads no ConfigMap and writes nothing.
    before = {
        name: jobs.get(name)["metadata"]["resourceVersion"] for name in ("cand", "cand-plain")
    }
    requests: list[tuple[str, str]] = []
    hook = poller.kube.on_request
    poller.kube.on_request = lambda verb, resource, code: requests.append((verb, resource))
    try:
        report = poller.run_cycle()
    finally:
        poller.kube.on_request = hook
    assert report.errors == 0, report.error_messages
    assert requests.count(("get", "configmaps")) == 1  # the settings, no results ConfigMap
    assert {name: jobs.get(name)["metadata"]["resourceVersion"] for name in before} == before
