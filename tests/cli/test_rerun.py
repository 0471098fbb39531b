"""``lmeval rerun`` on the real control plane.

Checks: rerunning a finished job creates a new job (named by the server
after the original unless ``--name`` is given) with the same spec, the
original's labels except a GitOps tool's claim, and annotations naming the
original and its UID; the poller runs it as any new job (it gets a pod)
while the original keeps its status and results; a rerun of a rerun is
named after the first job; a cancelled job's rerun does not carry the
``cancel`` that ended it; a job that has not finished is refused (exit 3)
and an unknown one is reported (exit 4); ``--dry-run=server`` creates
nothing, ``-o name`` prints only the name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_cli.rerun import RERUN_OF, RERUN_OF_UID

from poller import api
from poller.cycle.reconciler import Reconciler
from tests.cli.conftest import Cli, finish, pod_when
from tests.poller_fixtures import CapturedRun, Jobs, cycle_until

pytestmark = pytest.mark.cluster
# What -o name prints, as kubectl: the resource with its group.
RESOURCE = f"lmevaljob.{api.API_GROUP}"


def _all(jobs: Jobs) -> dict[str, dict[str, Any]]:
    listed = jobs.custom.list_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL
    )["items"]
    return {j["metadata"]["name"]: j for j in listed}


def test_rerun_copies_a_finished_job(
    cli: Cli,
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    succeeded_run: CapturedRun,
    tmp_path: Path,
) -> None:
    spec = {"limit": "3", "numFewShot": 1, "ttlSecondsAfterFinished": 3600}
    final = finish(poller, jobs, admin_api, "orig", succeeded_run, tmp_path, **spec)
    assert final["reason"] == "Succeeded"
    labels = {"team": "nlp", "app.kubernetes.io/instance": "argo-app"}
    jobs.custom.patch_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, "orig",
        {"metadata": {"labels": labels}},
    )  # fmt: skip
    original = jobs.get("orig")

    dry = cli("rerun", "orig", "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    assert "(server dry run)" in dry.stdout and set(_all(jobs)) == {"orig"}

    result = cli("rerun", "orig")
    assert result.returncode == 0, result.stderr
    created = set(_all(jobs)) - {"orig"}
    assert len(created) == 1
    (new,) = created
    assert new.startswith("orig-") and len(new) == len("orig-") + 5
    assert result.stdout.strip() == (
        f"lmevaljob/{new} created in namespace {jobs.namespace}, a rerun of orig"
    )
    copy = jobs.get(new)
    assert copy["spec"] == original["spec"]
    assert copy["metadata"]["annotations"] == {
        RERUN_OF: "orig",
        RERUN_OF_UID: original["metadata"]["uid"],
    }
    assert copy["metadata"]["labels"] == {"team": "nlp"}
    # A new run: the poller gives it a pod; the original keeps its record.
    pod_when(poller, jobs, new, state="Running")
    assert jobs.status("orig")["results"] == final["results"]

    named = cli("rerun", "orig", "--name=again", "-o", "name")
    assert (named.returncode, named.stdout.strip()) == (0, f"{RESOURCE}/again"), named.stderr
    # again is not finished yet: refused, with what to do.
    early = cli("rerun", "again")
    assert early.returncode == 3
    assert "lmevaljob/again has not finished" in early.stderr, early.stderr
    # A rerun of a rerun is named after the first job.
    jobs.custom.patch_namespaced_custom_object_status(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, "again",
        {"status": {"state": "Complete", "reason": "Succeeded"}},
    )  # fmt: skip
    second = cli("rerun", "again", "-o", "name")
    assert second.returncode == 0, second.stderr
    name = second.stdout.strip().removeprefix(f"{RESOURCE}/")
    assert name.startswith("orig-")
    assert jobs.get(name)["metadata"]["annotations"][RERUN_OF] == "again"

    missing = cli("rerun", "no-such-job")
    assert missing.returncode == 4, missing.stderr


def test_rerun_of_a_cancelled_job_is_not_cancelled(
    cli: Cli, poller: Reconciler, jobs: Jobs
) -> None:
    jobs.create("stopped", cancel=True)
    cycle_until(
        poller,
        lambda: jobs.status("stopped").get("reason") == "Cancelled",
        what="stopped Cancelled",
    )
    result = cli("rerun", "stopped", "--name=restarted")
    assert result.returncode == 0, result.stderr
    copy = jobs.get("restarted")
    assert "cancel" not in copy["spec"]
    assert copy["spec"] == {k: v for k, v in jobs.get("stopped")["spec"].items() if k != "cancel"}
    pod_when(poller, jobs, "restarted", state="Scheduled")
