"""A tiny kubelet for the sandbox: run one node's pods as local processes.

kwok simulates pods: cheap, good for scale tests, but nothing runs. For true
end-to-end runs (the real driver, real lm_eval, real exit codes) the sandbox
has one more node, ``lmeval-sandbox``, that kwok leaves alone (it lacks kwok's
``type=kwok`` label) and that this runner serves instead. A pod lands there
only when it asks to (the node is tainted): the sample jobs carry a
nodeSelector and a toleration for it.

This module is the kubelet's loop, which polls the node's pods and decides
what each needs next. The work it decides on lives beside it, so that the
loop reads as the pod lifecycle: podsetup.py (what comes before a container
starts), runtime.py (the container runtime: start, exit, kill), node.py (what
the API server sees: the node and the pods' status), localproc.py (the
processes) and podfs.py (the pure path and field rules). For each pod bound
to the node the runner:

* prepares it (podsetup): volumes materialised in a per-pod directory that
  plays the container's root filesystem, and every container path that a
  volume provides (and their parent directories) rewritten to the local path
  in the command line, in environment values and in configMap file contents,
  so ``--output-root=/outputs`` and an absolute ``data_files`` path in a task
  YAML both work; what is missing yet is CreateContainerConfigError, retried;
* runs ``python`` as this interpreter and ``lmeval-driver`` as
  ``<this interpreter> -m driver``; init containers that only copy files
  (``cp ...``, the poller's ``install-driver``) are reported Completed
  without running, since the driver is already installed here;
* starts each container in its own session with the pod's environment
  (``valueFrom`` secrets and configMaps resolved, ``$(VAR)`` expanded) and
  writes its output in the container runtime's log format to a file that a
  kwok ``Logs`` object serves, so ``kubectl logs`` and the poller's
  ``pods/log`` reads work exactly as on a real node (the node's status sends
  the apiserver to kwok's kubelet port);
* reports the pod's status through ``pods/status``: Running with
  ``startedAt``, then terminated with the real exit code, ``signal`` when it
  was killed, ``finishedAt``, the log tail as message for
  ``FallbackToLogsOnError``, and phase Succeeded or Failed;
* on deletion sends SIGTERM to the container's main process, SIGKILL to
  everything it started once the pod's grace period is over (as a cgroup
  kill would), reports the termination, then removes the pod with grace
  period 0, as the kubelet finalises a deletion.

Run it with ``python -m lmeval_sandbox.runner --kubeconfig K --workdir D
--kwok-port P`` or in-process with ``LocalRunner(...).start()``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from lmeval_sandbox import node
from lmeval_sandbox.identities import api_client
from lmeval_sandbox.localproc import (
    Container,
    LocalPod,
    process_table,
    remember_family,
)
from lmeval_sandbox.node import NODE_LABEL, NODE_NAME, NODE_TAINT, placement
from lmeval_sandbox.podfs import (
    ConfigError,
    PathMapper,
    copies_only,
    expand_vars,
    local_argv,
    termination_message,
)
from lmeval_sandbox.podsetup import ApiError, JsonApi, PodSetup
from lmeval_sandbox.runtime import collect, kill, start, terminate
from poller import timefmt

__all__ = [
    "NODE_LABEL",
    "NODE_NAME",
    "NODE_TAINT",
    "LocalRunner",
    "PathMapper",
    "expand_vars",
    "local_argv",
    "placement",
    "termination_message",
]

log = logging.getLogger(__name__)

NODE_REFRESH_SECONDS = 20.0
CONFIG_RETRY_SECONDS = 2.0


class LocalRunner:
    """Serve node `node_name`: run its pods as local processes, report like a kubelet."""

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        kwok_port: int,
        *,
        node_name: str = NODE_NAME,
        interval: float = 0.3,
        python: str = sys.executable,
        tainted: bool = True,
    ) -> None:
        self.tainted = tainted
        self.kubeconfig = kubeconfig
        self.workdir = workdir.resolve()
        self.kwok_port = kwok_port
        self.node_name = node_name
        self.interval = interval
        self.python = python
        self._api_client: client.ApiClient | None = None
        self._pods: dict[str, LocalPod] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._node_refreshed = 0.0
        self.errors = 0

    # -- lifecycle -------------------------------------------------------------------

    @property
    def api(self) -> JsonApi:
        if self._api_client is None:
            self._api_client = api_client(self.kubeconfig)
        return JsonApi(self._api_client)

    @property
    def pod_setup(self) -> PodSetup:
        return PodSetup(self.api, self.workdir)

    def start(self) -> LocalRunner:
        """Register the node and serve it from a background thread."""
        self.ensure_node()
        self._thread = threading.Thread(target=self.serve, name="sandbox-runner", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving: running pods are stopped (and reported) first."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> LocalRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve(self) -> None:
        """Poll until stopped (runs in the calling thread)."""
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    self.sync()
                except Exception:  # the API may be briefly unreachable
                    self.errors += 1
                    log.exception("runner sync failed")
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
        finally:
            self._shutdown()
            if self._api_client is not None:
                self._api_client.close()  # type: ignore[no-untyped-call]
                self._api_client = None

    # -- queries for tests and tools --------------------------------------------------

    def pid(self, namespace: str, name: str, container: str | None = None) -> int | None:
        """PID of a pod's (main) container process, if it was started."""
        with self._lock:
            for pod in self._pods.values():
                if (pod.namespace, pod.name) != (namespace, name):
                    continue
                for c in pod.main:
                    if (container is None or c.name == container) and c.proc is not None:
                        return c.proc.pid
        return None

    def pod_root(self, namespace: str, name: str) -> Path | None:
        """The directory that plays a pod's root filesystem."""
        with self._lock:
            for pod in self._pods.values():
                if (pod.namespace, pod.name) == (namespace, name):
                    return pod.root
        return None

    def ensure_node(self, ready: bool = True) -> None:
        """Create the node if needed and (re)write its status."""
        node.ensure_node(self.api, self.node_name, self.kwok_port, ready, tainted=self.tainted)
        self._node_refreshed = time.monotonic()

    # -- one poll --------------------------------------------------------------------

    def sync(self) -> None:
        """One poll: list the node's pods, move each one along."""
        if time.monotonic() - self._node_refreshed > NODE_REFRESH_SECONDS:
            self.ensure_node()
        listed = self.api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node_name}")
        objects = {obj["metadata"]["uid"]: obj for obj in listed.get("items") or []}
        table: dict[int, tuple[int, str]] | None = None
        for uid, obj in objects.items():
            pod = self._pods.get(uid)
            if pod is None:
                pod = self._admit(obj)
                if pod is None:
                    continue
            pod.obj = obj
            if pod.running() and table is None:
                table = process_table()
            try:
                self._advance(pod, table or {})
            except ApiError as error:
                if error.status not in (404, 409):  # gone, or a new pod of that name
                    self.errors += 1
                    log.warning("pod %s: %s", pod.key, error)
            except Exception:
                self.errors += 1
                log.exception("pod %s", pod.key)
        for uid in list(self._pods):
            if uid not in objects:
                # Force-deleted, or finalised by us: nothing may keep running.
                pod = self._pods[uid]
                kill(pod, process_table())
                with self._lock:
                    del self._pods[uid]

    def _admit(self, obj: dict[str, Any]) -> LocalPod | None:
        meta = obj["metadata"]
        status = obj.get("status") or {}
        deleting = bool(meta.get("deletionTimestamp"))
        if status.get("phase") in ("Succeeded", "Failed"):
            if deleting:
                self._finalize(meta["namespace"], meta["name"], meta["uid"])
            return None
        pod_dir = self.workdir / "pods" / meta["namespace"] / f"{meta['name']}-{meta['uid'][:8]}"
        pod = LocalPod(obj, pod_dir)
        started_elsewhere = any(
            "running" in (cs.get("state") or {}) or "terminated" in (cs.get("state") or {})
            for cs in status.get("containerStatuses") or []
        )
        if started_elsewhere:
            # A previous runner started it; its processes are gone with it.
            pod.lost = True
            for c in pod.main:
                c.exit_code, c.reason = 137, "ContainerStatusUnknown"
                c.message = "The container could not be located when the pod was terminated"
                c.finished_at = timefmt.now()
        elif deleting:
            self._finalize(pod.namespace, pod.name, pod.uid)
            return None
        with self._lock:
            self._pods[pod.uid] = pod
        log.info("admitted pod %s", pod.key)
        return pod

    def _advance(self, pod: LocalPod, table: dict[int, tuple[int, str]]) -> None:
        meta = pod.obj["metadata"]
        deleting = bool(meta.get("deletionTimestamp"))
        for c in pod.running():
            remember_family(c, table)
        if deleting and not pod.finished():
            self._terminate(pod, meta, table)
        elif not pod.prepared and not pod.lost and time.monotonic() >= pod.retry_at:
            self._try_prepare(pod)
        self._start_next(pod)
        collect(pod, table)
        self._report(pod)
        if deleting and (pod.finished() or not pod.running()) and not pod.deleted:
            self._finalize(pod.namespace, pod.name, pod.uid)
            pod.deleted = True

    def _terminate(
        self, pod: LocalPod, meta: dict[str, Any], table: dict[int, tuple[int, str]]
    ) -> None:
        if not pod.term_sent:
            grace = meta.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = (pod.obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            pod.term_sent = True
            pod.kill_at = time.monotonic() + float(grace)
            log.info("pod %s deleted: SIGTERM, SIGKILL in %s s", pod.key, grace)
            # Like a container runtime: SIGTERM to the main process only (it
            # owns the orderly shutdown); containers not started never will be.
            terminate(pod)
        elif pod.kill_at is not None and time.monotonic() >= pod.kill_at and not pod.killed:
            kill(pod, table)

    # -- set-up ----------------------------------------------------------------------

    def _try_prepare(self, pod: LocalPod) -> None:
        try:
            self.pod_setup.prepare(pod)
        except ConfigError as error:
            log.info("pod %s cannot start yet: %s", pod.key, error)
            for c in pod.containers():
                if c.state == "waiting":
                    c.waiting_reason, c.waiting_message = "CreateContainerConfigError", str(error)
            pod.retry_at = time.monotonic() + CONFIG_RETRY_SECONDS
            return
        pod.prepared = True
        pod.start_time = timefmt.now()

    # -- processes -------------------------------------------------------------------

    def _start_next(self, pod: LocalPod) -> None:
        """Start the next init container, or every main container once init is done."""
        if not pod.prepared or pod.term_sent or pod.lost or time.monotonic() < pod.retry_at:
            return
        for c in pod.init:
            if c.state == "terminated":
                if c.exit_code != 0:
                    return  # restartPolicy Never: the pod has failed
                continue
            if c.state == "running":
                return
            if copies_only(c.spec):
                # The driver is installed in this environment already.
                c.started_at = c.finished_at = timefmt.now()
                c.exit_code, c.reason = 0, "Completed"
                continue
            self._spawn(pod, c)
            return
        for c in pod.main:
            if c.state == "waiting":
                self._spawn(pod, c)

    def _spawn(self, pod: LocalPod, c: Container) -> None:
        try:
            env = self.pod_setup.env(pod, c)
        except ConfigError as error:
            c.waiting_reason, c.waiting_message = "CreateContainerConfigError", str(error)
            pod.retry_at = time.monotonic() + CONFIG_RETRY_SECONDS
            return
        c.waiting_reason = c.waiting_message = ""
        start(pod, c, env, self.python)

    # -- reporting -------------------------------------------------------------------

    def _report(self, pod: LocalPod) -> None:
        status = node.pod_status(pod)
        comparable = json.loads(json.dumps(status))
        for condition in comparable["conditions"]:
            condition.pop("lastTransitionTime", None)
        if comparable == pod.reported:
            return
        self.api.request(
            "PATCH",
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status",
            body={"metadata": {"uid": pod.uid}, "status": status},
            content_type="application/strategic-merge-patch+json",
        )
        pod.reported = comparable
        log.info("pod %s: reported phase %s", pod.key, status["phase"])

    def _finalize(self, namespace: str, name: str, uid: str) -> None:
        """Remove a deleted pod for good, as the kubelet does once it has stopped."""
        try:
            self.api.request(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
            )
            log.info("pod %s/%s finalised", namespace, name)
        except ApiError as error:
            if error.status not in (404, 409):
                raise

    def _shutdown(self) -> None:
        """Stop every running pod; report what happened when the API still answers."""
        running = [pod for pod in self._pods.values() if pod.running()]
        for pod in running:
            terminate(pod)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(p.running() for p in running):
            table = process_table()
            for pod in running:
                collect(pod, table)
            time.sleep(0.1)
        table = process_table()
        for pod in running:
            kill(pod, table)
            for c in pod.running():
                assert c.proc is not None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(5)
            collect(pod, table)
            with contextlib.suppress(Exception):
                self._report(pod)
        with contextlib.suppress(Exception):
            self.ensure_node(ready=False)


# -- process plumbing ------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lmeval_sandbox.runner",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kubeconfig", type=Path, required=True, help="an admin kubeconfig")
    parser.add_argument("--workdir", type=Path, required=True, help="where pod files go")
    parser.add_argument(
        "--kwok-port", type=int, required=True, help="kwok's kubelet port (serves pod logs)"
    )
    parser.add_argument("--node-name", default=NODE_NAME)
    parser.add_argument("--interval", type=float, default=0.3, help="seconds between polls")
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--untainted",
        action="store_true",
        help="create the node without its taint: jobs without placement land here",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    runner = LocalRunner(
        args.kubeconfig,
        args.workdir,
        args.kwok_port,
        node_name=args.node_name,
        interval=args.interval,
        tainted=not args.untainted,
    )

    def request_stop(signum: int, _frame: object) -> None:
        log.info("received %s: stopping pods and exiting", signal.Signals(signum).name)
        runner._stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    runner.ensure_node()
    log.info("serving node %s (kwok port %d)", runner.node_name, runner.kwok_port)
    runner.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
