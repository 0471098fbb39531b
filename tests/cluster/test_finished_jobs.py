"""Finished jobs cost nothing per cycle, and no transition is missed for it.

On the real control plane: a cycle lists only jobs that are not Complete
(the CRD's selectable status.state, in one page of up to 2,000) and pods
that have not ended, as the apiserver's audit log shows; finished jobs'
series still reach the metrics from the store of finished jobs. Between the
hot cycle and the sweep nothing is lost: a job finished behind the poller's
back is read by name in the next cycle; a finished job deleted is dropped by
the end of a sweep round; a finished job whose spec changes (a TTL set
afterwards) is seen by the sweep and decided by the cycle; a TTL expires for
a job that finished before the poller started; and the pod of a running job
that ended is found although the LIST of live pods no longer returns it.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox.controlplane import ControlPlane

from poller import api, timefmt
from poller.cycle.observe import HOT_PAGE_SIZE
from poller.cycle.reconciler import CycleReport, Reconciler
from poller.kube.client import PAGE_SIZE, Kube
from tests.poller_fixtures import POLLER_NS, CapturedRun, Jobs, cycle_until, serve_log, terminate
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

POLLER_USER = f"system:serviceaccount:{POLLER_NS}:lmeval-poller"


def _finish(jobs: Jobs, name: str, *, ago: float = 60.0, reason: str = "Succeeded") -> None:
    """Write a final status as another controller (or a restore) would."""
    when = timefmt.format_time(timefmt.now() - dt.timedelta(seconds=ago))
    status = {
        "state": "Complete",
        "reason": reason,
        "message": "finished elsewhere",
        "completeTime": when,
        "results": '{"results": {"toy_mc": {"acc,none": 0.5}}}',
    }
    jobs.custom.patch_namespaced_custom_object_status(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, name, {"status": status}
    )


def _retained(report: CycleReport) -> set[str]:
    return {series.name for series in report.retained}


def _names(jobs: Jobs) -> set[str]:
    listed = jobs.custom.list_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL
    )
    return {item["metadata"]["name"] for item in listed["items"]}


def _cycle(poller: Reconciler) -> CycleReport:
    report = poller.run_cycle()
    assert report.errors == 0, report.error_messages
    return report


def test_a_cycle_lists_only_what_can_change(
    poller: Reconciler, jobs: Jobs, control_plane: ControlPlane
) -> None:
    for name in ("old-a", "old-b", "old-c"):
        jobs.create(name)
        _finish(jobs, name)
    jobs.create("fresh")
    first = _cycle(poller)  # the first cycle also runs the sweep's first round
    assert _retained(first) == {"old-a", "old-b", "old-c"}
    mark = control_plane.audit.mark()
    report = _cycle(poller)
    assert report.jobs == 1  # only "fresh" was listed
    assert report.jobs_read == 0  # nothing finished was due
    assert _retained(report) == {"old-a", "old-b", "old-c"}

    def lists() -> list[dict[str, list[str]]]:
        calls = control_plane.audit.calls_by(POLLER_USER, since=mark)
        return [
            urllib.parse.parse_qs(urllib.parse.urlparse(c.uri).query)
            for c in calls
            if c.verb == "list" and c.resource in (api.PLURAL, "pods")
        ]

    seen = wait_for(lambda: (found := lists()) and len(found) >= 2 and found, what="audit")
    # A set: a cycle lists metadata first, then whole objects when many changed
    # (observe.BY_NAME_COST), with the same selectors.
    selectors = sorted({q.get("fieldSelector", [""])[0] for q in seen})
    assert selectors == [
        "status.phase!=Succeeded,status.phase!=Failed",
        "status.state!=Complete",
    ]
    # Active jobs in one page as far as it goes (observe.HOT_PAGE_SIZE): a
    # continue page of a quiet resource is read from etcd, past every finished job.
    limits = {q["fieldSelector"][0]: q["limit"][0] for q in seen}
    assert limits == {
        "status.state!=Complete": str(HOT_PAGE_SIZE),
        "status.phase!=Succeeded,status.phase!=Failed": str(PAGE_SIZE),
    }


def test_a_job_finished_behind_the_pollers_back_is_not_lost(poller: Reconciler, jobs: Jobs) -> None:
    jobs.create("elsewhere")
    cycle_until(poller, lambda: jobs.status("elsewhere").get("podName"), what="scheduled")
    _finish(jobs, "elsewhere")
    report = _cycle(poller)  # it left the hot listing: read by name, kept
    assert report.jobs == 0 and report.jobs_read == 1
    assert "elsewhere" in _retained(report)
    # Settled: the next cycles read nothing.
    assert _cycle(poller).jobs_read in (0, 1)  # one confirming read at most
    assert _cycle(poller).jobs_read == 0


def test_a_deleted_finished_job_leaves_at_the_end_of_a_sweep_round(
    poller: Reconciler, jobs: Jobs
) -> None:
    jobs.create("kept")
    jobs.create("removed")
    for name in ("kept", "removed"):
        _finish(jobs, name)
    assert _retained(_cycle(poller)) == {"kept", "removed"}
    jobs.custom.delete_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, "removed"
    )
    wait_for(lambda: "removed" not in _names(jobs), what="deleted")
    step = poller.sweep_finished(whole_round=True)
    assert step.round_ended and step.removed == 1 and not step.full
    assert _retained(_cycle(poller)) == {"kept"}


def test_a_ttl_set_after_the_job_finished_is_seen_by_the_sweep(
    poller: Reconciler, jobs: Jobs
) -> None:
    jobs.create("forever")
    _finish(jobs, "forever", ago=3600)
    _cycle(poller)
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP,
        api.API_VERSION,
        jobs.namespace,
        api.PLURAL,
        "forever",
        {"spec": {"ttlSecondsAfterFinished": 60}},
    )
    assert _cycle(poller).jobs_read == 0  # the hot cycle alone does not see it
    step = poller.sweep_finished(whole_round=True)
    assert step.changed == 1
    cycle_until(poller, lambda: "forever" not in _names(jobs), what="deleted by its new TTL")


def test_a_ttl_expires_for_a_job_finished_before_the_poller_started(
    poller_kube: Kube, jobs: Jobs
) -> None:
    jobs.create("ancient", ttlSecondsAfterFinished=30)
    jobs.create("recent", ttlSecondsAfterFinished=3600)
    _finish(jobs, "ancient", ago=600)
    _finish(jobs, "recent", ago=600)
    fresh = Reconciler(poller_kube, settings_namespace=POLLER_NS, namespaces=[jobs.namespace])
    cycle_until(fresh, lambda: "ancient" not in _names(jobs), what="ancient deleted")
    assert "recent" in _names(jobs)


def test_the_pod_of_a_running_job_is_found_when_it_ended(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Any,
) -> None:
    jobs.create("ends")
    pod = cycle_until(
        poller,
        lambda: jobs.status("ends").get("state") == "Running" and jobs.status("ends")["podName"],
        what="running",
    )
    serve_log(admin_api, jobs.namespace, pod, succeeded_run.log, tmp_path)
    terminate(admin_api, jobs.namespace, pod, 0)
    wait_for(lambda: jobs.pod(pod).status.phase == "Succeeded", what="pod Succeeded")
    report = _cycle(poller)
    assert report.pods == 0 and report.pods_read == 1  # not listed: read by name
    assert jobs.status("ends")["reason"] == "Succeeded"
    # Finished: neither the job nor its pod is read again once settled.
    _cycle(poller)
    idle = _cycle(poller)
    assert (idle.jobs, idle.pods, idle.jobs_read, idle.pods_read) == (0, 0, 0, 0)
    assert "ends" in _retained(idle)
