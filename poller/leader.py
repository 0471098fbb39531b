"""Leader election on a coordination.k8s.io Lease, so two replicas never both act.

The client library's elector has no clean stop or release, and the poller
needs exactly three things: acquire a free or expired lease, renew it, and
know *locally and at once* whether it may still act. So this is a small,
explicit implementation of the usual protocol:

* The holder renews every `renew_every` seconds with an update carrying the
  Lease's resourceVersion (a lost race is a 409, never two holders).
* A standby takes the lease only when ``renewTime + leaseDurationSeconds``
  has passed.
* The holder considers itself leader only while its last successful renewal
  *started* less than `renew_deadline` ago (shorter than the lease), so it
  stops acting before any standby can take over, even if the API is
  unreachable.

All API calls go through `Kube`; the clocks are injected for tests.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from poller import timefmt
from poller.kube.client import Conflict, Kube, NotFound

__all__ = ["LeaderElector"]

log = logging.getLogger(__name__)


class LeaderElector:
    """Holds (or waits for) one Lease."""

    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        identity: str,
        name: str = "lmeval-poller",
        lease_seconds: float = 15.0,
        wall_clock: Callable[[], dt.datetime] = timefmt.now,
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.identity = identity
        self.name = name
        self.lease_seconds = lease_seconds
        self.renew_every = lease_seconds / 5
        self.renew_deadline = lease_seconds * 2 / 3
        self.wall_clock = wall_clock
        self.monotonic = monotonic
        self.on_change = on_change
        self._renewed_at: float | None = None
        self._was_leader = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        """True while this replica may act (checked before every action)."""
        renewed = self._renewed_at
        return renewed is not None and self.monotonic() - renewed < self.renew_deadline

    def _body(
        self, resource_version: str | None, transitions: int, acquired: str
    ) -> dict[str, Any]:
        now = timefmt.format_micro_time(self.wall_clock())
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": round(self.lease_seconds),
                "acquireTime": acquired or now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }
        if resource_version:
            body["metadata"]["resourceVersion"] = resource_version
        return body

    def try_acquire_or_renew(self) -> bool:
        """One attempt; returns whether this replica holds the lease now."""
        started = self.monotonic()
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
        except NotFound:
            lease = None
        try:
            if lease is None:
                self.kube.create_lease(self._body(None, 0, ""))
            else:
                spec = lease.get("spec") or {}
                holder = spec.get("holderIdentity")
                transitions = int(spec.get("leaseTransitions") or 0)
                if holder != self.identity:
                    renewed = timefmt.parse_time(spec.get("renewTime"))
                    duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
                    expired = (
                        renewed is None or (self.wall_clock() - renewed).total_seconds() > duration
                    )
                    if holder and not expired:
                        self._renewed_at = None
                        return self._note(False)
                    transitions += 1
                    acquired = ""
                else:
                    acquired = spec.get("acquireTime") or ""
                version = lease["metadata"]["resourceVersion"]
                self.kube.update_lease(self._body(version, transitions, acquired))
        except Conflict:
            self._renewed_at = None
            return self._note(False)
        self._renewed_at = started
        return self._note(True)

    def _note(self, leader: bool) -> bool:
        if leader != self._was_leader:
            log.info(
                "%s leadership of Lease %s/%s (%s)",
                "acquired" if leader else "lost",
                self.namespace,
                self.name,
                self.identity,
            )
            self._was_leader = leader
            if self.on_change is not None:
                self.on_change(leader)
        return leader

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception as error:  # the API may be briefly unreachable
                log.warning("lease %s/%s: %s", self.namespace, self.name, error)
                if not self.is_leader():
                    self._note(False)
            self._stop.wait(self.renew_every)

    def start(self) -> None:
        """Keep acquiring/renewing in a background thread."""
        self._thread = threading.Thread(target=self._loop, name="lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and give the lease up so a standby need not wait."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.is_leader():
            try:
                lease = self.kube.get_lease(self.namespace, self.name)
                body = self._body(
                    lease["metadata"]["resourceVersion"],
                    int(lease["spec"].get("leaseTransitions") or 0),
                    "",
                )
                body["spec"]["leaseDurationSeconds"] = 1
                body["spec"]["renewTime"] = timefmt.format_micro_time(
                    self.wall_clock() - dt.timedelta(seconds=5)
                )
                self.kube.update_lease(body)
            except Exception as error:  # the standby will wait out the lease instead
                log.warning("could not release lease %s/%s: %s", self.namespace, self.name, error)
        self._renewed_at = None
        self._note(False)
