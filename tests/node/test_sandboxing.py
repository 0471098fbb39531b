"""Inside a running job container, as runc made it.

Checks, by ``kubectl exec`` (through the apiserver and the kubelet) into the
evaluation container while lm_eval runs, with the image's own UID and with
an arbitrary UID in group 0 (an OpenShift namespace's range):

- no ServiceAccount token: ``/var/run/secrets/kubernetes.io`` is absent;
- not root; group 0; the UID is the image's 1001, or the namespace's;
- the root filesystem is read-only, and the only writable disk mounts are the
  pod's emptyDirs (/tmp, HF_HOME, /outputs) and the files the kubelet itself
  manages (/etc/hosts, /etc/hostname, /etc/resolv.conf, termination log);
- and the evaluation, which ran under all of that, succeeded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.node.conftest import NodeCluster, served_job
from tests.waiting import wait_for

pytestmark = [pytest.mark.node, pytest.mark.lmeval]

OPENSHIFT_UID = 1000680000
EMPTY_DIRS = {"/tmp", "/cache/huggingface", "/outputs"}
KUBELET_FILES = {"/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/dev/termination-log"}
# Pseudo filesystems are not where an evaluation could leave data behind.
PSEUDO = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "tmpfs"}

PROBE = r"""
import json, os
mounts = []
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    sep = fields.index("-")
    mounts.append({"point": fields[4], "options": fields[5].split(","), "fstype": fields[sep + 1]})
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "token": os.path.exists("/var/run/secrets/kubernetes.io"),
    "root_writable": os.access("/", os.W_OK),
    "opt_writable": os.access("/opt/lmeval", os.W_OK),
    "mounts": mounts,
}))
"""


def _probe_running_job(cluster: NodeCluster, namespace: str) -> dict[str, Any]:
    configmap, job = served_job(cluster, "probed", delay="0.5")
    cluster.apply(configmap, job, namespace=namespace)

    def probe() -> dict[str, Any] | None:
        pod = cluster.job_status(namespace, "probed").get("podName")
        if not pod:
            return None
        out = cluster.plane.kubectl(
            "exec",
            "-n",
            namespace,
            pod,
            "-c",
            "lmeval",
            "--",
            "python",
            "-c",
            PROBE,
            check=False,
        )
        return json.loads(out.stdout) if out.returncode == 0 else None

    seen = wait_for(probe, timeout=180, interval=1, what="exec into the running evaluation")
    status = cluster.wait_final(namespace, "probed")
    assert status["reason"] == "Succeeded", status.get("message")
    return seen


def _check_sandbox(seen: dict[str, Any], uid: int) -> None:
    assert seen["uid"] == uid
    assert seen["uid"] != 0
    assert seen["gid"] == 0 or 0 in seen["groups"], seen
    assert seen["token"] is False
    assert seen["root_writable"] is False
    assert seen["opt_writable"] is False
    root = next(m for m in seen["mounts"] if m["point"] == "/")
    assert "ro" in root["options"], root
    writable = {
        m["point"] for m in seen["mounts"] if "rw" in m["options"] and m["fstype"] not in PSEUDO
    }
    assert writable >= EMPTY_DIRS, writable
    assert writable <= EMPTY_DIRS | KUBELET_FILES, writable - EMPTY_DIRS - KUBELET_FILES


def test_job_container_is_sandboxed_as_the_image_user(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    _check_sandbox(_probe_running_job(node_cluster, job_namespace), 1001)


@pytest.mark.parametrize(
    "job_namespace",
    [{"openshift.io/sa.scc.uid-range": f"{OPENSHIFT_UID}/10000"}],
    indirect=True,
)
def test_job_container_with_an_arbitrary_uid_in_group_0(
    node_cluster: NodeCluster, job_namespace: str
) -> None:
    _check_sandbox(_probe_running_job(node_cluster, job_namespace), OPENSHIFT_UID)
