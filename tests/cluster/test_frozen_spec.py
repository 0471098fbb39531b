"""A started job's spec, edited anyway, ends the job: the poller's own check.

The admission policy refuses such edits (tests/deploy/test_admission.py); a
cluster without it must still never pair results with a spec that did not
produce them. On the real apiserver, with kwok's pods (the policy is not
bound in this module's namespace):

- the first pod records ``status.specDigest``;
- a running job whose spec no longer matches the recorded digest (as after
  an edit the policy did not stop; played by rewriting the digest, since the
  policy may be bound cluster-wide on this shared plane) ends Failed (cause
  SpecChanged) naming ``spec``, and its pod is deleted;
- suspending and resuming a started job (its switches) changes nothing of
  the kind: it is scheduled again and keeps the first digest.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from poller import api
from poller.cycle.reconciler import Reconciler
from poller.decisions.views import spec_digest
from tests.poller_fixtures import Jobs, cycle_until, cycle_until_state, wait_pod_gone

pytestmark = pytest.mark.cluster


def _patch_spec(admin_api: client.ApiClient, jobs: Jobs, name: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(admin_api).patch_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, name, {"spec": spec}
    )


def test_an_edited_running_job_fails_and_its_pod_goes(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    created = jobs.create("edited")
    running = cycle_until_state(poller, jobs, "edited", "Running")
    assert running["specDigest"] == spec_digest(created["spec"])
    pod_uid = running["podUID"]
    # On this shared plane another module may have bound the admission policy
    # cluster-wide, which refuses the edit itself; so the edit is played from
    # the other side: the digest recorded at start becomes that of another
    # spec, which is what the poller sees after an edit no policy stopped.
    edited = {**created["spec"], "limit": "7"}
    client.CustomObjectsApi(admin_api).patch_namespaced_custom_object_status(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "edited",
        {"status": {"specDigest": spec_digest(edited)}},
    )
    final = cycle_until_state(poller, jobs, "edited", "Complete")
    assert final["reason"] == "Failed", final
    assert final["message"].startswith("spec: changed after the job started")
    finished = [c for c in final["conditions"] if c["type"] == "Finished"]
    assert finished[0]["reason"] == "SpecChanged"
    wait_pod_gone(jobs, pod_uid, "the edited job's pod deleted")


def test_its_switches_are_not_edits(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    jobs.create("switched")
    first = cycle_until_state(poller, jobs, "switched", "Running")
    _patch_spec(admin_api, jobs, "switched", {"suspend": True, "ttlSecondsAfterFinished": 600})
    cycle_until_state(poller, jobs, "switched", "Suspended")
    _patch_spec(admin_api, jobs, "switched", {"suspend": False})
    again = cycle_until(
        poller,
        lambda: (s := jobs.status("switched")).get("podAttempt") == 2 and s,
        what="switched scheduled again",
    )
    assert again["state"] in ("Scheduled", "Running"), again
    assert again["specDigest"] == first["specDigest"]
