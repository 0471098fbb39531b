"""Sharded LMEvalJobs (``spec.parallelism``) on the real control plane, end to end.

The poller runs one cycle at a time; the shard pods and the merge pod land on
the sandbox's local node, where the local runner runs the real driver and the
real ``python -m driver.shards run|merge`` (real lm_eval 0.4.13) as local
processes; the shards share a claim (a static hostPath PersistentVolume,
pre-bound, named by ``spec.outputs.pvcName``). The toy tasks are the driver
tests' (tests/driver/shardtasks, 20 or 13 documents), from a ConfigMap
(``spec.customTasks``): two multiple-choice tasks in a group with aggregate
metrics, generation with exact_match and the corpus-level BLEU and chrF,
rolling-loglikelihood perplexities, and two-shot multiple choice with its
examples drawn at random. Checks:

1. a job with ``parallelism: 3`` ends Succeeded with ``shardsDone 3/3``, each
   shard Succeeded with a message, the shard pods gone and the merge pod as
   ``status.podName``; its results equal an unsharded job's, same spec
   otherwise, field by field for ``results``, ``groups``,
   ``group_subtasks``, ``n-samples``, ``versions``, ``n-shot`` and
   ``higher_is_better`` (every score and stderr exactly, the bootstrapped
   stderrs of BLEU and chrF included);
2. under a real Kueue (a ClusterQueue of cpu quota for one job, a
   ResourceFlavor without node labels), a higher-priority job preempts a
   2-shard job mid-run: its shard pods are deleted and it is Suspended with
   its shards Pending and no failure counted; once the other job finished it
   is admitted again, its shards resume from their response caches (their
   messages say how many requests the cache answered) and it ends Succeeded
   with the results of an uninterrupted run, having sent the model server no
   answered request twice (total requests = the uninterrupted run's plus the
   requests in flight when the shards were stopped, at most one per shard);
3. a shard whose requests the model server refuses (lm_eval exits 1) is
   retried, its ``failures`` counting up, and at its 4th failure the job
   ends Failed ``shard 1 of 2 failed 4 times; its last attempt: ...``
   (condition reason ShardFailed) while the other shard had succeeded;
4. bad input: ``parallelism: 33`` and ``parallelism: 2`` without a claim are
   refused by the apiserver's schema (422, the field named); a task with
   fewer documents than shards (``limit: 2``, ``parallelism: 3``) ends the
   job Failed at the first shard's refusal (exit code 2, not retried), with
   the driver's line naming spec.parallelism (condition reason ShardRefused);
5. deploy/samples/sharded-job.yaml runs as written (on the shared claim), its
   tasks' data files in the sample ConfigMap: every pod reads them at one path,
   as on a real node, so the merge takes the shards.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from lmeval_sandbox import model_server as toy
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.demo import SAMPLES_DIR
from lmeval_sandbox.kueue import KueueServer
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import LocalRunner, placement

from poller import api
from poller.cycle.reconciler import Reconciler
from poller.decisions import kueueadmission
from poller.jobpod import podspec
from poller.results.lmeval import RESULTS_GZ_KEY, RESULTS_KEY, packed_results_text
from tests.e2e.conftest import sample, submit
from tests.kueue_fixtures import KUEUE, apply
from tests.poller_fixtures import Jobs, cycle_until
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

LMEVAL_TIMEOUT = 420.0
TASKS_CONFIGMAP = "shard-tasks"
CLAIM = "shared-outputs"
COMPLETIONS = "POST /v1/completions"
# The results fields a merge must give exactly as one unsharded run does.
COMPARED = (
    "results",
    "groups",
    "group_subtasks",
    "n-samples",
    "versions",
    "n-shot",
    "higher_is_better",
)

# -- the toy tasks (a ConfigMap, mounted through spec.customTasks) ---------------------

# The driver tests' toy tasks (20 and 13 documents) and their data files, all in
# the ConfigMap, which every pod mounts at one path. (Named by this checkout's
# path instead, the data would be out of the pods' reach wherever the local
# runner maps that path into each pod's own root, as it does under /tmp: a
# clone in /tmp failed every test here.)
SHARDTASKS = Path(__file__).resolve().parents[1] / "driver" / "shardtasks"
TASKS_MOUNT = f"/opt/lmeval/tasks/{TASKS_CONFIGMAP}"
TASK_FILES = {
    **{
        path.name: path.read_text().replace("__SHARDTASKS__", TASKS_MOUNT)
        for path in sorted(SHARDTASKS.glob("*.yaml"))
    },
    **{path.name: path.read_text() for path in sorted(SHARDTASKS.glob("*.jsonl"))},
}
# Multiple choice in a group (acc weighted by size, acc_norm not), generation
# (exact_match, and the corpus-level bleu and chrf, with two filters), rolling
# loglikelihood (word and byte perplexity, bits per byte), and two-shot multiple
# choice with its examples drawn at random (the shards replay the draws).
ALL_TASKS = ["shard_grp", "shard_gen", "shard_roll", "shard_fs"]


def _tasks_configmap(jobs: Jobs) -> None:
    jobs.core.create_namespaced_config_map(
        jobs.namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name=TASKS_CONFIGMAP), data=TASK_FILES),
    )


# -- the shared claim ------------------------------------------------------------------


@pytest.fixture
def claim(jobs: Jobs, tmp_path: Path) -> Iterator[Path]:
    """Claim CLAIM of the test's namespace, Bound to a hostPath PersistentVolume
    (ReadWriteOnce, pre-bound: the controller-manager's binder binds them);
    the PV's directory, which the local runner mounts as the claim."""
    directory = tmp_path / "claim"
    directory.mkdir()
    volume = f"{jobs.namespace}-{CLAIM}"[:63]
    jobs.core.create_persistent_volume(
        {
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(directory), "type": "Directory"},
                "claimRef": {"namespace": jobs.namespace, "name": CLAIM},
            },
        }
    )
    jobs.core.create_namespaced_persistent_volume_claim(
        jobs.namespace,
        {
            "metadata": {"name": CLAIM},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )

    def bound() -> bool:
        found = jobs.core.read_namespaced_persistent_volume_claim(CLAIM, jobs.namespace)
        return bool(found.status and found.status.phase == "Bound")

    # Bound before any pod: the runner mounts an unbound claim elsewhere.
    wait_for(bound, timeout=60, what=f"claim {CLAIM} Bound")
    yield directory
    with contextlib.suppress(client.exceptions.ApiException):
        jobs.core.delete_persistent_volume(volume)


# -- jobs and what they say ------------------------------------------------------------


def _served_job(name: str, port: int, tasks: list[str], **spec: Any) -> dict[str, Any]:
    """The served-model sample (local-completions against the toy server on `port`),
    on `tasks` of the ConfigMap, writing to the shared claim, placed on the runner's node."""
    _, job = sample("served-model", port)
    job = copy.deepcopy(job)
    job["metadata"] = {"name": name}
    job["spec"].update(
        tasks=tasks, customTasks=[{"configMap": TASKS_CONFIGMAP}], outputs={"pvcName": CLAIM}
    )
    job["spec"].update(spec)
    return job


def _create(jobs: Jobs, job: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = jobs.custom.create_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, job
    )
    return created


def _complete(jobs: Jobs, *names: str) -> dict[str, dict[str, Any]] | None:
    statuses = {name: jobs.status(name) for name in names}
    if all(s.get("state") == "Complete" for s in statuses.values()):
        return statuses
    return None


def _results(jobs: Jobs, status: dict[str, Any]) -> dict[str, Any]:
    """The job's whole results JSON, from its results ConfigMap."""
    found = jobs.core.read_namespaced_config_map(status["resultsConfigMap"], jobs.namespace)
    if found.data and RESULTS_KEY in found.data:
        text = found.data[RESULTS_KEY]
    else:
        text = packed_results_text(found.binary_data[RESULTS_GZ_KEY])
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _assert_same_results(merged: dict[str, Any], whole: dict[str, Any]) -> None:
    for key in COMPARED:
        assert merged.get(key) == whole.get(key), (key, merged.get(key), whole.get(key))


def _shard_pods(jobs: Jobs, uid: str) -> list[str]:
    return [
        p.metadata.name
        for p in jobs.pods()
        if (p.metadata.labels or {}).get(podspec.LABEL_JOB_UID) == uid
        and podspec.LABEL_SHARD in (p.metadata.labels or {})
    ]


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


# -- 1. equal to an unsharded run ------------------------------------------------------


def test_three_shards_and_a_merge_give_the_unsharded_results(
    poller: Reconciler,
    jobs: Jobs,
    runner: LocalRunner,
    model_server: ModelServer,
    claim: Path,
) -> None:
    _tasks_configmap(jobs)
    _create(jobs, _served_job("whole", model_server.port, ALL_TASKS))
    made = _create(jobs, _served_job("sharded", model_server.port, ALL_TASKS, parallelism=3))
    uid = made["metadata"]["uid"]
    seen: list[str] = []

    def both_complete() -> dict[str, dict[str, Any]] | None:
        done = jobs.status("sharded").get("shardsDone")
        if done and (not seen or seen[-1] != done):
            seen.append(done)
        return _complete(jobs, "whole", "sharded")

    final = cycle_until(poller, both_complete, timeout=LMEVAL_TIMEOUT, what="both jobs Complete")
    whole, sharded = final["whole"], final["sharded"]
    assert whole["reason"] == "Succeeded", whole.get("message")
    assert sharded["reason"] == "Succeeded", sharded.get("message")
    assert sharded["shardsDone"] == "3/3"
    assert seen[0] == "0/3", seen
    records = sharded["shards"]
    assert [r["index"] for r in records] == [0, 1, 2]
    for record in records:
        assert record["state"] == "Succeeded", record
        assert record.get("failures", 0) == 0, record
        assert record.get("message", "").startswith(f"shard {record['index']}/3"), record

    # The shards' pods went as each succeeded; the merge pod is the job's pod.
    wait_for(lambda: not _shard_pods(jobs, uid), timeout=60, what="the shard pods deleted")
    assert sharded["podName"] == podspec.pod_name("sharded", uid)
    merge = jobs.pod(sharded["podName"])
    assert podspec.LABEL_SHARD not in (merge.metadata.labels or {})
    assert "merge" in merge.spec.containers[0].command
    assert merge.status.phase == "Succeeded"
    for index in range(3):
        assert (claim / "shards" / "sharded" / f"shard-{index}" / "done.json").is_file()

    merged, unsharded = _results(jobs, sharded), _results(jobs, whole)
    _assert_same_results(merged, unsharded)
    # Not vacuous: every kind of metric is there, with a stderr where lm_eval makes one.
    assert set(merged["results"]) == {"shard_grp", "shard_mc", "shard_mcb", *ALL_TASKS[1:]}
    assert merged["groups"]["shard_grp"]["acc_stderr,none"] not in (0, "N/A")
    assert merged["results"]["shard_gen"]["chrf_stderr,lower"] not in (0, "N/A")
    assert merged["results"]["shard_roll"]["word_perplexity,none"] > 1
    assert merged["n-samples"]["shard_mcb"] == {"original": 13, "effective": 13}
    assert merged["n-shot"]["shard_fs"] == 2


# -- 2. preempted by Kueue, admitted again, resumed ------------------------------------


class _Queue:
    """A ClusterQueue of `cpu` quota (a ResourceFlavor without node labels, so
    pods land where their own placement says), its LocalQueue, two priorities."""

    def __init__(self, plane: ControlPlane, jobs: Jobs) -> None:
        self.plane = plane
        stem = jobs.namespace[:50]
        self.flavor = f"runner-{stem}"
        self.cluster_queue = f"cq-{stem}"
        self.local_queue = "team"
        self.low, self.high = f"low-{stem}", f"high-{stem}"
        self.custom = jobs.custom
        self.namespace = jobs.namespace

    def create(self, cpu: str) -> None:
        apply(
            self.plane,
            {
                "apiVersion": KUEUE,
                "kind": "ResourceFlavor",
                "metadata": {"name": self.flavor},
                "spec": {},
            },
            {
                "apiVersion": KUEUE,
                "kind": "ClusterQueue",
                "metadata": {"name": self.cluster_queue},
                "spec": {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
                    },
                    "preemption": {"withinClusterQueue": "LowerPriority"},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu"],
                            "flavors": [
                                {
                                    "name": self.flavor,
                                    "resources": [{"name": "cpu", "nominalQuota": cpu}],
                                }
                            ],
                        }
                    ],
                },
            },
            {
                "apiVersion": KUEUE,
                "kind": "LocalQueue",
                "metadata": {"name": self.local_queue, "namespace": self.namespace},
                "spec": {"clusterQueue": self.cluster_queue},
            },
            {
                "apiVersion": KUEUE,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": self.low},
                "value": 100,
            },
            {
                "apiVersion": KUEUE,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": self.high},
                "value": 1000,
            },
        )

        def active() -> bool:
            found = self.custom.get_cluster_custom_object(
                kueueadmission.KUEUE_GROUP,
                kueueadmission.KUEUE_VERSION,
                "clusterqueues",
                self.cluster_queue,
            )
            return _condition(found.get("status") or {}, "Active").get("status") == "True"

        wait_for(active, timeout=60, what=f"ClusterQueue {self.cluster_queue} active")

    def label(self, job: dict[str, Any], priority: str) -> dict[str, Any]:
        job["metadata"]["labels"] = {
            kueueadmission.QUEUE_LABEL: self.local_queue,
            kueueadmission.PRIORITY_LABEL: priority,
        }
        return job

    def delete(self) -> None:
        for kind, name in (
            ("clusterqueue", self.cluster_queue),
            ("resourceflavor", self.flavor),
            ("workloadpriorityclass", self.low),
            ("workloadpriorityclass", self.high),
        ):
            self.plane.kubectl("delete", kind, name, "--wait=false", check=False)


@pytest.fixture
def cpu_queue(kueue: KueueServer, control_plane: ControlPlane, jobs: Jobs) -> Iterator[_Queue]:
    made = _Queue(control_plane, jobs)
    yield made
    made.delete()


def _cached_rows(claim: Path, job: str, index: int) -> int:
    """How many answers shard `index`'s response cache holds (0 before it exists)."""
    path = claim / "shards" / job / f"shard-{index}" / "cache" / "responses_rank0.db"
    if not path.is_file():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            (rows,) = db.execute("SELECT COUNT(*) FROM unnamed").fetchone()
    except sqlite3.Error:
        return 0  # created, its table not yet
    return int(rows)


def _with_cpu(job: dict[str, Any], cpu: str) -> dict[str, Any]:
    job["spec"]["pod"] = {**placement(), "resources": {"requests": {"cpu": cpu}}}
    return job


@pytest.mark.kueue
def test_preempted_shards_resume_from_their_caches_when_admitted_again(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    cpu_queue: _Queue,
    claim: Path,
    tmp_path: Path,
) -> None:
    tasks = ["shard_mcb", "shard_gen"]
    _tasks_configmap(jobs)
    # Quota for one job's pods: the 2 shards (100m each), or the urgent job (200m).
    cpu_queue.create("200m")
    with ModelServer() as server:
        # An uninterrupted run: its results, and how many requests it takes.
        _create(jobs, _served_job("reference", server.port, tasks))
        reference = cycle_until(
            poller,
            lambda: _complete(jobs, "reference"),
            timeout=LMEVAL_TIMEOUT,
            what="reference Complete",
        )["reference"]
        assert reference["reason"] == "Succeeded", reference.get("message")
        needed = server.count(COMPLETIONS)

        # Slow answers, so the shards are stopped mid-run.
        server.delay = 0.5
        job = _served_job("resumed", server.port, tasks, parallelism=2)
        made = _create(jobs, cpu_queue.label(_with_cpu(job, "100m"), cpu_queue.low))
        uid = made["metadata"]["uid"]

        def answered_some() -> list[int] | None:
            rows = [_cached_rows(claim, "resumed", k) for k in range(2)]
            return rows if min(rows) >= 3 else None

        cycle_until(poller, answered_some, timeout=LMEVAL_TIMEOUT, what="each shard cached 3")
        # From here, every answer waits: what the caches hold stays as it is.
        server.hold_file = tmp_path / "release"
        _, urgent = sample("dummy-model")
        urgent = copy.deepcopy(urgent)
        urgent["metadata"] = {"name": "urgent"}
        submit(
            admin_api, jobs.namespace, cpu_queue.label(_with_cpu(urgent, "200m"), cpu_queue.high)
        )

        def preempted() -> dict[str, Any] | None:
            status = jobs.status("resumed")
            if status.get("state") != "Suspended" or _shard_pods(jobs, uid):
                return None
            return status

        stopped = cycle_until(poller, preempted, timeout=120, what="resumed preempted, pods gone")
        # One workload for the job: its shards are one pod set, admitted together.
        workload = jobs.custom.get_namespaced_custom_object(
            kueueadmission.KUEUE_GROUP,
            kueueadmission.KUEUE_VERSION,
            jobs.namespace,
            "workloads",
            kueueadmission.workload_name("resumed", uid),
        )
        (pod_set,) = workload["spec"]["podSets"]
        assert pod_set["count"] == 2, pod_set
        assert pod_set["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == (
            "100m"
        )
        assert _condition(stopped, "Suspended").get("reason") == "KueuePreempted", stopped
        for record in stopped["shards"]:
            assert record["state"] == "Pending", record
            assert record.get("failures", 0) == 0, record
            assert record["attempt"] == 1, record
        sent_before = server.count(COMPLETIONS) - needed
        cached = [_cached_rows(claim, "resumed", k) for k in range(2)]
        # Requests the model server received but whose answers never reached a
        # cache: one per shard at most (lm_eval's local-completions sends one
        # request at a time, batch size 1, and caches each answer on arrival).
        in_flight = sent_before - sum(cached)
        assert 0 <= in_flight <= 2, (sent_before, cached)

        server.hold_file = None
        server.delay = 0.0
        final = cycle_until(
            poller,
            lambda: _complete(jobs, "urgent", "resumed"),
            timeout=LMEVAL_TIMEOUT,
            what="urgent, then resumed, Complete",
        )
        sent = server.count(COMPLETIONS) - needed

    assert final["urgent"]["reason"] == "Succeeded", final["urgent"].get("message")
    resumed = final["resumed"]
    assert resumed["reason"] == "Succeeded", resumed.get("message")
    assert final["urgent"]["completeTime"] <= resumed["completeTime"]
    _assert_same_results(_results(jobs, resumed), _results(jobs, reference))
    from_cache = []
    for record, rows in zip(resumed["shards"], cached, strict=True):
        assert record["state"] == "Succeeded" and record["attempt"] == 2, record
        assert record.get("failures", 0) == 0, record
        said = re.search(r"(\d+) answered from the cache \(resumed\)", record.get("message", ""))
        assert said is not None, record
        from_cache.append(int(said.group(1)))
        assert int(said.group(1)) == rows, (record, rows)
    # No answered request was sent again: the resumed shards sent exactly the
    # requests their caches did not hold, so all in all the uninterrupted
    # run's requests plus the ones in flight when the shards were stopped.
    assert sent == needed + in_flight, (sent, needed, in_flight, from_cache)
    assert sent <= needed + 2


# -- 3. a failing shard is retried, then fails the job ---------------------------------

POISON = "What is 1 plus 1?"  # document 1: shard 1 of 2


class _PoisonServer(ModelServer):
    """Refuses (400) every completion whose prompt holds document 1's question."""

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        prompts = toy._prompts(body.get("prompt"), self.tokenizer)
        if any(POISON in self.tokenizer.decode(p) for p in prompts):
            raise ValueError("this document is poisoned")
        return super().completions(body)


def test_a_failing_shard_is_retried_and_at_its_limit_fails_the_job(
    poller: Reconciler, jobs: Jobs, runner: LocalRunner, claim: Path
) -> None:
    _tasks_configmap(jobs)
    failures: list[int] = []
    with _PoisonServer() as server:
        job = _served_job("poisoned", server.port, ["shard_mc"], parallelism=2, limit="4")
        # lm_eval gives up on a refused request at once (it retries 3 times by default).
        job["spec"]["modelArgs"].append({"name": "max_retries", "value": "1"})
        _create(jobs, job)

        def failed() -> dict[str, Any] | None:
            status = jobs.status("poisoned")
            records = status.get("shards") or []
            if len(records) == 2:
                count = records[1].get("failures", 0)
                if not failures or failures[-1] != count:
                    failures.append(count)
            return status if status.get("state") == "Complete" else None

        final = cycle_until(poller, failed, timeout=LMEVAL_TIMEOUT, what="poisoned Complete")
    assert final["reason"] == "Failed", final
    assert failures == [0, 1, 2, 3, 4], failures
    message = final["message"]
    assert message.startswith("shard 1 of 2 failed 4 times; its last attempt: pod "), message
    assert re.search(r"pod poisoned-[0-9a-f]{6}-shard-1 exited with code 1: ", message), message
    # lm_eval's own last words: the model server's refusal of document 1.
    assert "400 Client Error" in message, message
    assert _condition(final, "Succeeded").get("reason") == "ShardFailed", final["conditions"]
    assert _condition(final, "Finished").get("reason") == "ShardFailed", final["conditions"]
    first, second = final["shards"]
    assert first["state"] == "Succeeded" and first.get("failures", 0) == 0, first
    assert second["state"] == "Failed" and second["failures"] == 4, second
    assert second["attempt"] == 4, second
    assert "results" not in final
    uid = jobs.get("poisoned")["metadata"]["uid"]
    wait_for(lambda: not _shard_pods(jobs, uid), timeout=60, what="the shard pods deleted")


# -- 4. bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"parallelism": 33, "outputs": {"pvcName": CLAIM}}, "should be less than or equal to 32"),
        ({"parallelism": 2}, "spec.parallelism above 1 needs spec.outputs.pvcName"),
    ],
    ids=["above-32", "no-claim"],
)
def test_the_schema_refuses_a_parallelism_it_cannot_run(
    jobs: Jobs, spec: dict[str, Any], said: str
) -> None:
    job = _served_job("refused", 8000, ["shard_mc"], **spec)
    if "outputs" not in spec:
        del job["spec"]["outputs"]
    with pytest.raises(client.exceptions.ApiException) as raised:
        _create(jobs, job)
    assert raised.value.status == 422
    assert "spec.parallelism" in raised.value.body, raised.value.body
    assert said in raised.value.body, raised.value.body


def test_fewer_documents_than_shards_fails_naming_spec_parallelism(
    poller: Reconciler, jobs: Jobs, runner: LocalRunner, model_server: ModelServer, claim: Path
) -> None:
    _tasks_configmap(jobs)
    _create(
        jobs, _served_job("too-many", model_server.port, ["shard_mc"], parallelism=3, limit="2")
    )
    final = cycle_until(
        poller, lambda: _complete(jobs, "too-many"), timeout=LMEVAL_TIMEOUT, what="too-many"
    )["too-many"]
    assert final["reason"] == "Failed", final
    # The driver's one line, at the first refusal: a shard refused is not retried
    # (the same spec would be refused again).
    refused = re.fullmatch(
        r"shard (\d) of 3: pod too-many-[0-9a-f]{6}-shard-\1 exited with code 2: task shard_mc "
        r"has 2 documents \(after spec\.limit\), fewer than the 3 shards of spec\.parallelism: "
        r"lower spec\.parallelism to 2 or less",
        final["message"],
    )
    assert refused is not None, final["message"]
    assert _condition(final, "Succeeded").get("reason") == "ShardRefused", final["conditions"]
    record = final["shards"][int(refused.group(1))]
    assert record["state"] == "Failed" and record["attempt"] == 1, record
    assert "results" not in final
    uid = jobs.get("too-many")["metadata"]["uid"]
    wait_for(lambda: not _shard_pods(jobs, uid), timeout=60, what="the shard pods deleted")


def test_the_sharded_sample_runs_as_written_with_its_tasks_data_in_a_configmap(
    poller: Reconciler,
    jobs: Jobs,
    admin_api: client.ApiClient,
    runner: LocalRunner,
    model_server: ModelServer,
    claim: Path,
) -> None:
    """deploy/samples/sharded-job.yaml, its tasks and their data files in the sample
    ConfigMap: every pod of the job reads the data at one path, as on a real node
    (the runner keeps one copy of a ConfigMap's files for the pods that mount it),
    so the shards' task configurations agree and the merge takes them."""
    _, job = sample(str(SAMPLES_DIR / "sharded-job.yaml"), model_server.port)
    job["spec"]["outputs"] = {"pvcName": CLAIM}  # the sample's pvcManaged needs a provisioner
    submit(admin_api, jobs.namespace, job)

    final = cycle_until(
        poller,
        lambda: _complete(jobs, "sharded-job"),
        timeout=LMEVAL_TIMEOUT,
        what="the sharded sample Complete",
    )["sharded-job"]
    assert final["reason"] == "Succeeded", final.get("message")
    assert final["shardsDone"] == "2/2"
    for shard in final["shards"]:
        assert "started clean" not in shard.get("message", ""), shard
    assert set(_results(jobs, final)["results"]) == {"sample_arith_mc", "sample_arith_gen"}
