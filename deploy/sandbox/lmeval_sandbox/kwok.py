"""kwok's part of the sandbox: fake nodes, pod lifecycle stages, logs and exec.

kwok plays the kubelet for nodes it manages. Its stages here are kwok's "fast"
pod stages with two additions that let a test (or the scale benchmark) steer a
pod the way a real kubelet would report it, using nothing but annotations:

* ``sandbox.lmeval.io/waiting-reason`` (and ``-message``): the pod stays
  Pending with its containers Waiting for that reason (ErrImagePull,
  CreateContainerConfigError, ...), as a kubelet reports it.
* ``sandbox.lmeval.io/exit-code`` (and ``exit-reason``, ``exit-message``):
  once Running, every container terminates with that code; phase Succeeded
  for 0, Failed otherwise. Set it at creation or patch it in at the moment
  the test chooses.

The stages themselves are in ``kwok-stages.yaml`` beside this module.
Logs and exec are served by kwok's ``Logs``/``Exec`` resources; the helpers
below create them so that a file in the CRI log format becomes a container's
log and a local command answers `kubectl exec`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from poller import timefmt

__all__ = [
    "ANNOTATION_EXIT_CODE",
    "ANNOTATION_EXIT_MESSAGE",
    "ANNOTATION_EXIT_REASON",
    "ANNOTATION_WAITING_MESSAGE",
    "ANNOTATION_WAITING_REASON",
    "KWOK_NODE_LABEL",
    "cri_log_lines",
    "exec_body",
    "kwok_config_yaml",
    "logs_body",
    "node_body",
]

ANNOTATION_PREFIX = "sandbox.lmeval.io/"
ANNOTATION_WAITING_REASON = ANNOTATION_PREFIX + "waiting-reason"
ANNOTATION_WAITING_MESSAGE = ANNOTATION_PREFIX + "waiting-message"
ANNOTATION_EXIT_CODE = ANNOTATION_PREFIX + "exit-code"
ANNOTATION_EXIT_REASON = ANNOTATION_PREFIX + "exit-reason"
ANNOTATION_EXIT_MESSAGE = ANNOTATION_PREFIX + "exit-message"
# kwok manages exactly the nodes with this label, never the sandbox's own
# local-process node.
KWOK_NODE_LABEL = ("type", "kwok")
# Pods that mean to run on kwok tolerate this (benchmarks, scale tests).
KWOK_NODE_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


STAGES_FILE = Path(__file__).with_name("kwok-stages.yaml")


def kwok_config_yaml() -> str:
    """kwok's ``--config`` file: the pod stages (nodes keep kwok's defaults)."""
    return STAGES_FILE.read_text()


def node_body(
    name: str, *, labels: Mapping[str, str] | None = None, tainted: bool = False
) -> dict[str, Any]:
    """A fake node that kwok will manage and initialise (Ready, kubelet port).

    `tainted` keeps ordinary pods off it (`KWOK_NODE_TAINT`): where a real
    node runs pods, a job without placement must land there, never "run" on
    a node that runs nothing.
    """
    all_labels = {
        KWOK_NODE_LABEL[0]: KWOK_NODE_LABEL[1],
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **(labels or {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": all_labels,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"taints": [KWOK_NODE_TAINT]} if tainted else {},
    }


def cri_log_lines(lines: Iterable[str], *, stream: str = "stdout") -> str:
    """Render lines in the container runtime's log format, which kwok serves."""
    now = timefmt.format_micro_time(timefmt.now())
    return "".join(f"{now} {stream} F {line}\n" for line in lines)


def logs_body(
    namespace: str, pod: str, log_file: Path, *, containers: Iterable[str] = ()
) -> dict[str, Any]:
    """A kwok ``Logs`` object: serve `log_file` as the pod's container log."""
    entry: dict[str, Any] = {"logsFile": str(log_file), "follow": False}
    if containers:
        entry["containers"] = list(containers)
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": pod, "namespace": namespace},
        "spec": {"logs": [entry]},
    }


def exec_body(
    namespace: str,
    pod: str,
    work_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    containers: Iterable[str] = (),
) -> dict[str, Any]:
    """A kwok ``Exec`` object: `kubectl exec` into the pod runs locally in `work_dir`."""
    target: dict[str, Any] = {
        "local": {
            "workDir": str(work_dir),
            "envs": [{"name": k, "value": v} for k, v in (env or {}).items()],
        }
    }
    if containers:
        target["containers"] = list(containers)
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Exec",
        "metadata": {"name": pod, "namespace": namespace},
        "spec": {"execs": [target]},
    }
