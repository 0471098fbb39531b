"""Without Kueue installed, a job labelled for a Kueue queue runs exactly as today.

The poller notices that Workloads are not served (its one LIST of them, made
only because a job carries the label, answers 404) and decides for the job
as it always did: no error, no wait. Runs only while the session has not
started Kueue yet (the Kueue tests come later in a full run).
"""

from __future__ import annotations

import pytest
from lmeval_sandbox.controlplane import ControlPlane

from poller.cycle.reconciler import Reconciler
from poller.decisions.kueueadmission import QUEUE_LABEL
from tests.poller_fixtures import Jobs, cycle_until, job_body

pytestmark = pytest.mark.cluster


def test_a_labelled_job_runs_as_today_without_kueue(
    poller: Reconciler, jobs: Jobs, control_plane: ControlPlane
) -> None:
    found = control_plane.kubectl("get", "crd", "workloads.kueue.x-k8s.io", check=False)
    if found.returncode == 0:
        pytest.skip("Kueue was installed earlier in this session")
    body = job_body("labelled")
    body["metadata"]["labels"] = {QUEUE_LABEL: "team"}
    jobs.custom.create_namespaced_custom_object(
        "foundation-model-stack.github.com", "v1beta1", jobs.namespace, "lmevaljobs", body
    )
    # cycle_until asserts that no cycle counts an error.
    cycle_until(poller, lambda: jobs.status("labelled").get("state") == "Running", what="Running")
    assert jobs.status("labelled")["podName"]
