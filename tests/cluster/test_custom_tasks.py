"""Custom-task ConfigMaps that name code, and the snapshots pods mount, on the real control plane.

Checks: a job whose task ConfigMap has a ``!function`` tag ends Failed before
any pod or snapshot exists, with a message naming spec.customTasks[i], the
ConfigMap, the key and the switches to set, while a job with plain task
files beside it gets its pod; with spec.allowCodeExecution and the
allow-code-execution setting both on, the job gets its pod, which mounts an
immutable snapshot owned by the job at /opt/lmeval/tasks/<source>; the
snapshot keeps its content when the source is edited afterwards (and
refuses edits itself), a second attempt adopts it while the content is
unchanged and fails once it differs; a ConfigMap squatting the snapshot's
name (foreign, or claiming the job as controller with other files) ends the
job Failed naming it; the snapshot is garbage-collected with its job.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from poller import api
from poller.cycle import tasksnapshot
from poller.cycle.reconciler import Reconciler
from poller.decisions.views import JobView
from poller.jobpod import podspec
from tests.poller_fixtures import BASE_SETTINGS, Jobs, cycle_until, set_settings
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

PLAIN_TASK = """\
task: toy_plain
dataset_path: json
dataset_kwargs: {data_files: {test: /opt/lmeval/tasks/plain-tasks/data.jsonl}}
test_split: test
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: answer
"""
CODE_TASK = PLAIN_TASK.replace("toy_plain", "toy_code") + "process_docs: !function utils.keep\n"
UTILS = "def keep(dataset):\n    return dataset\n"


def _configmap(jobs: Jobs, name: str, data: dict[str, str], **meta: Any) -> None:
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, **meta), data=data)
    jobs.core.create_namespaced_config_map(jobs.namespace, body)


def _configmaps(jobs: Jobs) -> dict[str, client.V1ConfigMap]:
    return {c.metadata.name: c for c in jobs.core.list_namespaced_config_map(jobs.namespace).items}


def _finished(poller: Reconciler, jobs: Jobs, name: str) -> dict[str, Any]:
    status: dict[str, Any] = cycle_until(
        poller,
        lambda: jobs.status(name).get("state") == "Complete" and jobs.status(name),
        what=f"{name} Complete",
    )
    return status


def _pod_name(poller: Reconciler, jobs: Jobs, name: str) -> str:
    pod: str = cycle_until(poller, lambda: jobs.status(name).get("podName"), what=f"{name} pod")
    return pod


def _snapshot_name(jobs: Jobs, job: str, source: str) -> str:
    return podspec.task_snapshot_name(job, jobs.get(job)["metadata"]["uid"], source)


def test_task_code_fails_before_any_pod_exists(poller: Reconciler, jobs: Jobs) -> None:
    _configmap(jobs, "code-tasks", {"task.yaml": CODE_TASK, "utils.py": UTILS})
    _configmap(jobs, "plain-tasks", {"task.yaml": PLAIN_TASK, "data.jsonl": "{}\n"})
    jobs.create(
        "with-code",
        tasks=["toy_code"],
        customTasks=[{"configMap": "plain-tasks"}, {"configMap": "code-tasks"}],
    )
    jobs.create("plain", tasks=["toy_plain"], customTasks=[{"configMap": "plain-tasks"}])
    final = _finished(poller, jobs, "with-code")
    assert final["reason"] == "Failed"
    message = final["message"]
    for words in (
        "spec.customTasks[1]: ConfigMap code-tasks",
        "key task.yaml line 9: YAML tag !function: !function utils.keep",
        "key utils.py: a Python file",
        "spec.allowCodeExecution: true",
        'allow-code-execution: "true" in ConfigMap lmeval-poller-config',
    ):
        assert words in message, message
    # No pod, and no snapshot either (not even of the plain ConfigMap).
    assert not [
        p for p in jobs.pods() if p.metadata.labels.get(podspec.LABEL_JOB_NAME) == "with-code"
    ]
    leftovers = [
        name
        for name, cm in _configmaps(jobs).items()
        if (cm.metadata.annotations or {}).get(tasksnapshot.ANNOTATION_SOURCE)
        and cm.metadata.owner_references[0].name == "with-code"
    ]
    assert leftovers == []
    # Plain task files need no switch.
    pod = jobs.pod(_pod_name(poller, jobs, "plain"))
    (volume,) = [v for v in pod.spec.volumes if v.config_map]
    assert volume.config_map.name == _snapshot_name(jobs, "plain", "plain-tasks")


def test_code_runs_with_both_switches_from_an_immutable_snapshot(
    poller: Reconciler, jobs: Jobs, admin_api: client.ApiClient
) -> None:
    set_settings(admin_api, {**BASE_SETTINGS, "allow-code-execution": "true"})
    _configmap(jobs, "code-tasks", {"task.yaml": CODE_TASK, "utils.py": UTILS})
    jobs.create(
        "trusted",
        tasks=["toy_code"],
        allowCodeExecution=True,
        customTasks=[{"configMap": "code-tasks"}],
    )
    pod = jobs.pod(_pod_name(poller, jobs, "trusted"))
    snapshot_name = _snapshot_name(jobs, "trusted", "code-tasks")
    (volume,) = [v for v in pod.spec.volumes if v.config_map]
    assert volume.config_map.name == snapshot_name
    (mount,) = [m for m in pod.spec.containers[0].volume_mounts if m.name == volume.name]
    assert (mount.mount_path, mount.read_only) == ("/opt/lmeval/tasks/code-tasks", True)

    source = jobs.core.read_namespaced_config_map("code-tasks", jobs.namespace)
    snapshot = jobs.core.read_namespaced_config_map(snapshot_name, jobs.namespace)
    assert snapshot.immutable is True
    assert snapshot.data == {"task.yaml": CODE_TASK, "utils.py": UTILS}
    assert snapshot.metadata.labels[podspec.LABEL_MANAGED_BY] == podspec.MANAGED_BY
    annotations = snapshot.metadata.annotations
    assert annotations[tasksnapshot.ANNOTATION_SOURCE] == "code-tasks"
    assert annotations[tasksnapshot.ANNOTATION_SOURCE_VERSION] == source.metadata.resource_version
    assert annotations[tasksnapshot.ANNOTATION_DIGEST].startswith("sha256:")
    (owner,) = snapshot.metadata.owner_references
    assert (owner.kind, owner.name, owner.controller) == (api.KIND, "trusted", True)

    # A second attempt (a retried cycle, a resume) adopts the same content.
    settings = poller.settings
    job = JobView.from_object(jobs.get("trusted"))
    assert tasksnapshot.prepare_custom_tasks(poller.kube, job, settings) is None

    # The source changes after the pod was made: what the pod mounts does not.
    source.data = {"task.yaml": CODE_TASK.replace("utils.keep", "evil.run"), "evil.py": "1"}
    jobs.core.replace_namespaced_config_map("code-tasks", jobs.namespace, source)
    again = jobs.core.read_namespaced_config_map(snapshot_name, jobs.namespace)
    assert again.data == snapshot.data
    with pytest.raises(client.exceptions.ApiException) as refused:
        jobs.core.patch_namespaced_config_map(
            snapshot_name, jobs.namespace, {"data": {"utils.py": "import os"}}
        )
    assert refused.value.status == 422 and "immutable" in str(refused.value.body)
    # A later attempt no longer matches the source: it refuses to run either.
    problem = tasksnapshot.prepare_custom_tasks(poller.kube, job, settings)
    assert problem is not None and snapshot_name in problem and "changed since" in problem

    # The snapshot goes with its job (the controller-manager's garbage collector).
    jobs.custom.delete_namespaced_custom_object(
        api.API_GROUP, api.API_VERSION, jobs.namespace, api.PLURAL, "trusted"
    )
    wait_for(
        lambda: snapshot_name not in _configmaps(jobs),
        timeout=60,
        what="snapshot garbage-collected with its job",
    )


def test_a_squatted_snapshot_name_fails_the_job_naming_it(poller: Reconciler, jobs: Jobs) -> None:
    _configmap(jobs, "plain-tasks", {"task.yaml": PLAIN_TASK, "data.jsonl": "{}\n"})
    jobs.create("squatted", customTasks=[{"configMap": "plain-tasks"}])
    forged = jobs.create("forged", customTasks=[{"configMap": "plain-tasks"}])
    squat = _snapshot_name(jobs, "squatted", "plain-tasks")
    _configmap(jobs, squat, {"task.yaml": PLAIN_TASK + "process_docs: !function u.f\n"})
    # One that claims the job as its controller, immutable, but with other files.
    fake = _snapshot_name(jobs, "forged", "plain-tasks")
    owner = client.V1OwnerReference(
        api_version=f"{api.API_GROUP}/{api.API_VERSION}",
        kind=api.KIND,
        name="forged",
        uid=forged["metadata"]["uid"],
        controller=True,
    )
    jobs.core.create_namespaced_config_map(
        jobs.namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=fake, owner_references=[owner]),
            data={"task.yaml": PLAIN_TASK + "x: !function u.f\n"},
            immutable=True,
        ),
    )
    for name, object_name, why in (
        ("squatted", squat, "was not made by this job"),
        ("forged", fake, "holds other files"),
    ):
        final = _finished(poller, jobs, name)
        assert final["reason"] == "Failed"
        assert f"spec.customTasks[0]: ConfigMap {jobs.namespace}/{object_name}" in final["message"]
        assert why in final["message"], final["message"]
    assert not jobs.pods()
