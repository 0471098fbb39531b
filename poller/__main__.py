"""``lmeval-poller`` (also ``python -m poller``): the operator's entry point.

In a cluster it uses the pod's service account; elsewhere ``--kubeconfig``.
``--once`` runs a single cycle and exits (for scripts and tests: exit code 1
when the cycle failed or any job raised). Otherwise it cycles until SIGTERM
or SIGINT, which let the current cycle finish before exiting.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from poller import buildinfo, malloc
from poller.api.settings import SettingsTracker, install_defaults
from poller.cycle.reconciler import Reconciler
from poller.kube.client import Kube
from poller.kube.transport import ApiTransport
from poller.leader import LeaderElector
from poller.metrics import PollerMetrics, serve
from poller.service import PollingService

__all__ = ["main"]


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _setup_logging(level: str, json_logs: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # APScheduler logs every run at INFO; the poller's own cycle line is enough.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def _default_namespace() -> str:
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if path.exists():
        return path.read_text().strip()
    return os.environ.get("POD_NAMESPACE", "lmeval-system")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="lmeval-poller",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig file (default: in-cluster in a pod, else the first file of "
        "$KUBECONFIG, else ~/.kube/config)",
    )
    parser.add_argument(
        "--settings-namespace",
        default=None,
        help="namespace of ConfigMap lmeval-poller-config (default: the poller's own namespace)",
    )
    parser.add_argument(
        "--namespaces", default="", help="comma-separated namespaces to manage (default: all)"
    )
    parser.add_argument("--once", action="store_true", help="run one cycle and exit")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=8080,
        help="port of /metrics, /healthz and /readyz (default 8080; 0 disables)",
    )
    parser.add_argument(
        "--metrics-address",
        default="0.0.0.0",  # noqa: S104 (in a pod, Prometheus scrapes the pod IP)
        help="address the metrics server binds (default 0.0.0.0)",
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="act only while holding Lease lmeval-poller in the settings "
        "namespace (run two replicas with this)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=float,
        default=15.0,
        help="lease duration; a standby takes over within it (default 15)",
    )
    parser.add_argument(
        "--identity",
        default=None,
        help="this replica's name in the Lease (default: $POD_NAME or host-pid)",
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--json-logs", action="store_true", help="one JSON object per log line")
    parser.add_argument("--version", action=buildinfo.VersionAction)
    return parser.parse_args(argv)


# How long a thread may hold the GIL while another waits (Python's default: 5 ms).
# A scrape of 100,000 finished jobs' series is seconds of pure Python; a cycle
# beside it reads its pages over TLS, 16 KiB records, each read giving the GIL
# up and waiting for it again: at 5 ms, up to 1.6 s for a 5 MB page (320 records).
SWITCH_INTERVAL = 0.001


def main(argv: Sequence[str] | None = None) -> int:
    sys.setswitchinterval(SWITCH_INTERVAL)
    # Before any thread allocates: the arenas are fixed when threads first use them.
    tuned = malloc.tune_malloc()
    args = parse_args(argv)
    _setup_logging(args.log_level, args.json_logs)
    logging.getLogger("poller").debug("malloc settings: %s", tuned or "as they were")
    metrics = PollerMetrics()
    identity = (
        args.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    )
    # An explicit kubeconfig, else in-cluster in a pod, else the default kubeconfig.
    with ApiTransport.from_environment(args.kubeconfig) as transport:
        # The audit log tells replicas apart by their user agent.
        transport.user_agent = f"lmeval-poller/{identity}"
        return _run(args, Kube(transport, on_request=metrics.on_request), metrics, identity)


def _run(args: argparse.Namespace, kube: Kube, metrics: PollerMetrics, identity: str) -> int:
    log = logging.getLogger("poller")
    log.info("starting %s", buildinfo.describe("lmeval-poller"))
    namespaces = [n.strip() for n in args.namespaces.split(",") if n.strip()]
    settings_namespace = args.settings_namespace or _default_namespace()
    elector: LeaderElector | None = None
    if args.leader_elect and not args.once:
        elector = LeaderElector(
            kube,
            namespace=settings_namespace,
            identity=identity,
            lease_seconds=args.lease_seconds,
            on_change=metrics.set_leader,
        )
        metrics.set_leader(False)
    poller = Reconciler(
        kube,
        settings_namespace=settings_namespace,
        namespaces=namespaces,
        may_act=elector.is_leader if elector is not None else (lambda: True),
        tracker=SettingsTracker(install_defaults(os.environ)),
    )
    if args.once:
        report = poller.run_cycle()
        metrics.cycle_hook(poller)(report, None)
        log.info(
            "one cycle: %d jobs, %d pods, %d patches, %d pods created, %d errors",
            report.jobs,
            report.pods,
            report.patches,
            report.pods_created,
            report.errors,
        )
        return 1 if report.errors else 0

    service = PollingService(poller, on_cycle=metrics.cycle_hook(poller))
    server = serve(metrics, args.metrics_port, args.metrics_address) if args.metrics_port else None
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: finishing the current cycle", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    if elector is not None:
        elector.start()
    service.start()
    log.info("polling every %.1f s", service.interval)
    stop.wait()
    service.stop()
    if elector is not None:
        elector.stop()
    if server is not None:
        server.stop()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
