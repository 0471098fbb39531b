"""Custom-task code in a real lm_eval run, through the job's snapshot.

Checks, with the poller, the real driver and real lm_eval on the sandbox's
local node: a task whose ``process_docs`` is a ``!function`` from a ``.py``
file in its ConfigMap runs when spec.allowCodeExecution and the
allow-code-execution setting are both on, and lm_eval really ran that code
(it keeps 1 document of 3, and the results say 1 sample) from the pod's
mount of the job's immutable snapshot, not of the ConfigMap itself.
"""

from __future__ import annotations

import copy
import json

import pytest
from kubernetes import client
from lmeval_sandbox.runner import LocalRunner

from poller import api
from poller.cycle.reconciler import Reconciler
from poller.jobpod import podspec
from tests.e2e.conftest import sample
from tests.poller_fixtures import BASE_SETTINGS, Jobs, cycle_until, set_settings

pytestmark = [pytest.mark.cluster, pytest.mark.lmeval]

LMEVAL_TIMEOUT = 240.0
TASK = """\
task: toy_first_only
dataset_path: json
dataset_kwargs: {data_files: {test: /opt/lmeval/tasks/code-tasks/data.jsonl}}
test_split: test
output_type: multiple_choice
process_docs: !function first_only.keep_first
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""
CODE = "def keep_first(dataset):\n    return dataset.select([0])\n"
DATA = "".join(
    json.dumps({"question": f"{n} + {n}?", "choices": [str(2 * n), "0"], "answer": 0}) + "\n"
    for n in (1, 2, 3)
)


def test_task_code_runs_from_the_snapshot_with_both_switches(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient, runner: LocalRunner
) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, "allow-code-execution": "true"})
    jobs.core.create_namespaced_config_map(
        jobs.namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="code-tasks"),
            data={"task.yaml": TASK, "first_only.py": CODE, "data.jsonl": DATA},
        ),
    )
    _, job = sample("dummy-model")
    job = copy.deepcopy(job)
    job["metadata"]["name"] = "task-code"
    job["spec"].update(
        tasks=["toy_first_only"],
        customTasks=[{"configMap": "code-tasks"}],
        allowCodeExecution=True,
    )
    job["spec"].pop("limit", None)
    created = jobs.custom.create_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, job
    )
    final = cycle_until(
        poller,
        lambda: jobs.status("task-code").get("state") == "Complete" and jobs.status("task-code"),
        timeout=LMEVAL_TIMEOUT,
        what="task-code Complete",
    )
    assert final["reason"] == "Succeeded", final.get("message")
    results = json.loads(final["results"])
    assert results["n-samples"]["toy_first_only"] == {"original": 1, "effective": 1}
    pod = jobs.pod(final["podName"])
    (volume,) = [v for v in pod.spec.volumes if v.config_map]
    snapshot = podspec.task_snapshot_name("task-code", created["metadata"]["uid"], "code-tasks")
    assert volume.config_map.name == snapshot
